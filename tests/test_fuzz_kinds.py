"""Property tests for the cluster's own kinds: PyTorchJob, TrainJob (with its runtime) and JobSet.

Valid documents of each kind are broken at random: a field deleted, replaced by a value of another
type, a list emptied or an item repeated, a key renamed, a number made negative, huge or a string.
Whatever comes out, reading the file raises nothing but :class:`SpecError` (one line per problem,
the file named), and a job that passes the checks expands and renders for every target, or is
refused by that target with a SpecError. ``TORCHJOB_FUZZ_EXAMPLES`` runs more examples (thousands,
by hand); the committed count keeps these tests within seconds.
"""

from __future__ import annotations

import copy
import json
import os
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import crds
from torchjob.errors import SpecError
from torchjob.expand import Expansion
from torchjob.jobs import load_jobs_from_text
from torchjob.render import dump, list_of
from torchjob.spec.kinds import is_runtime
from torchjob.spec.kinds.runtimes import Runtimes
from torchjob.spec.source import parse_documents
from torchjob.targets import for_cluster, target_names

pytestmark = pytest.mark.timeout(300)

FUZZ = settings(
    max_examples=int(os.environ.get("TORCHJOB_FUZZ_EXAMPLES", "60")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
FILE = "kinds.yaml"


def _container(name: str, command: list[str]) -> dict[str, Any]:
    return {
        "name": name,
        "image": "torchjob-examples:latest",
        "imagePullPolicy": "IfNotPresent",
        "command": command,
        "env": [{"name": "OMP_NUM_THREADS", "value": "1"}],
        "ports": [{"containerPort": 23456, "name": "pytorchjob-port"}],
        "resources": {"requests": {"cpu": "1"}, "limits": {"memory": "1Gi"}},
    }


PYTORCHJOB: dict[str, Any] = {
    "apiVersion": "kubeflow.org/v1",
    "kind": "PyTorchJob",
    "metadata": {"name": "fuzz-pytorchjob", "labels": {"team": "ml"}},
    "spec": {
        "nprocPerNode": "2",
        "runPolicy": {"backoffLimit": 3, "activeDeadlineSeconds": 600, "cleanPodPolicy": "None"},
        "pytorchReplicaSpecs": {
            "Master": {
                "replicas": 1,
                "restartPolicy": "OnFailure",
                "template": {"spec": {"containers": [_container("pytorch", ["python", "train.py"])]}},
            },
            "Worker": {
                "replicas": 2,
                "restartPolicy": "OnFailure",
                "template": {"spec": {"containers": [_container("pytorch", ["python", "train.py"])]}},
            },
        },
    },
}

ELASTIC: dict[str, Any] = {
    "apiVersion": "kubeflow.org/v1",
    "kind": "PyTorchJob",
    "metadata": {"name": "fuzz-elastic"},
    "spec": {
        "elasticPolicy": {"rdzvBackend": "c10d", "minReplicas": 1, "maxReplicas": 2, "maxRestarts": 3},
        "nprocPerNode": "1",
        "pytorchReplicaSpecs": {
            "Worker": {
                "replicas": 2,
                "restartPolicy": "OnFailure",
                "template": {
                    "spec": {"containers": [_container("pytorch", ["python", "-m", "torch.distributed.run"])]}
                },
            }
        },
    },
}

RUNTIME: dict[str, Any] = {
    "apiVersion": "trainer.kubeflow.org/v1alpha1",
    "kind": "TrainingRuntime",
    "metadata": {"name": "fuzz-runtime", "labels": {"trainer.kubeflow.org/framework": "torch"}},
    "spec": {
        "mlPolicy": {"numNodes": 1, "torch": {}},
        "template": {
            "spec": {
                "replicatedJobs": [
                    {
                        "name": "node",
                        "template": {
                            "metadata": {
                                "labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}
                            },
                            "spec": {
                                "template": {
                                    "spec": {
                                        "volumes": [{"name": "scratch", "emptyDir": {}}],
                                        "containers": [
                                            {
                                                "name": "node",
                                                "image": "torchjob-examples:latest",
                                                "volumeMounts": [
                                                    {"name": "scratch", "mountPath": "/scratch"}
                                                ],
                                                "resources": {"requests": {"cpu": "1"}},
                                            }
                                        ],
                                    }
                                }
                            },
                        },
                    }
                ]
            }
        },
    },
}

TRAINJOB: dict[str, Any] = {
    "apiVersion": "trainer.kubeflow.org/v1alpha1",
    "kind": "TrainJob",
    "metadata": {"name": "fuzz-trainjob"},
    "spec": {
        "runtimeRef": {"kind": "TrainingRuntime", "name": "fuzz-runtime"},
        "trainer": {
            "numNodes": 2,
            "numProcPerNode": 1,
            "image": "torchjob-examples:latest",
            "command": ["torchrun", "train.py"],
            "args": ["--lr", "0.1"],
            "env": [{"name": "OMP_NUM_THREADS", "value": "1"}],
            "resourcesPerNode": {"requests": {"cpu": "1"}},
        },
        "runtimePatches": [
            {
                "manager": "example.com/team",
                "trainingRuntimeSpec": {
                    "template": {
                        "spec": {
                            "replicatedJobs": [
                                {
                                    "name": "node",
                                    "template": {
                                        "spec": {"template": {"metadata": {"labels": {"team": "research"}}}}
                                    },
                                }
                            ]
                        }
                    }
                },
            }
        ],
    },
}

CLUSTER_RUNTIME: dict[str, Any] = {
    **copy.deepcopy(RUNTIME),
    "kind": "ClusterTrainingRuntime",
    "metadata": {"name": "fuzz-cluster-runtime"},
}
CLUSTER_TRAINJOB: dict[str, Any] = {
    **copy.deepcopy(TRAINJOB),
    "metadata": {"name": "fuzz-cluster-trainjob"},
}
CLUSTER_TRAINJOB["spec"]["runtimeRef"] = {"kind": "ClusterTrainingRuntime", "name": "fuzz-cluster-runtime"}
del CLUSTER_TRAINJOB["spec"]["runtimePatches"]

JOBSET: dict[str, Any] = {
    "apiVersion": "jobset.x-k8s.io/v1alpha2",
    "kind": "JobSet",
    "metadata": {"name": "fuzz-jobset"},
    "spec": {
        "network": {"enableDNSHostnames": True},
        "successPolicy": {"operator": "All", "targetReplicatedJobs": ["workers"]},
        "failurePolicy": {"maxRestarts": 2},
        "replicatedJobs": [
            {
                "name": "driver",
                "replicas": 1,
                "template": {
                    "spec": {
                        "parallelism": 1,
                        "completions": 1,
                        "backoffLimit": 0,
                        "template": {
                            "spec": {"restartPolicy": "Never", "containers": [_container("driver", ["true"])]}
                        },
                    }
                },
            },
            {
                "name": "workers",
                "replicas": 1,
                "template": {
                    "spec": {
                        "parallelism": 2,
                        "completions": 2,
                        "completionMode": "Indexed",
                        "backoffLimit": 1,
                        "template": {
                            "spec": {
                                "restartPolicy": "OnFailure",
                                "containers": [_container("pytorch", ["python", "train.py"])],
                            }
                        },
                    }
                },
            },
        ],
    },
}

# JobSet's PyTorch example: one replicated job of two pods, which every target can express.
JOBSET_ONE: dict[str, Any] = copy.deepcopy(JOBSET)
JOBSET_ONE["metadata"]["name"] = "fuzz-jobset-one"
JOBSET_ONE["spec"]["replicatedJobs"][1]["template"]["spec"]["template"]["spec"]["containers"][0]["env"] = [
    {"name": "MASTER_ADDR", "value": "fuzz-jobset-one-workers-0-0.fuzz-jobset-one"},
    {"name": "MASTER_PORT", "value": "23456"},
    {
        "name": "RANK",
        "valueFrom": {
            "fieldRef": {"fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}
        },
    },
]
del JOBSET_ONE["spec"]["replicatedJobs"][0], JOBSET_ONE["spec"]["successPolicy"]

# Each valid file: its documents, in order.
FILES: dict[str, list[dict[str, Any]]] = {
    "pytorchjob": [PYTORCHJOB],
    "elastic": [ELASTIC],
    "trainjob": [RUNTIME, TRAINJOB],
    "cluster-trainjob": [CLUSTER_RUNTIME, CLUSTER_TRAINJOB],
    "jobset": [JOBSET],
    "jobset-one": [JOBSET_ONE],
}

# Words that matter to these kinds: their role names, policies, runtimes, numbers as text.
WORDS = [
    "", " ", "-", "0", "-1", "1e3", "0x10", "true", "null", "~", "Master", "Worker", "master", "worker",
    "node", "workers", "driver", "dataset-initializer", "model-initializer", "torch-distributed",
    "TrainingRuntime", "ClusterTrainingRuntime", "OnFailure", "Never", "Always", "ExitCode", "All",
    "Any", "Indexed", "NonIndexed", "auto", "cpu", "gpu", "c10d", "etcd", "fuzz-runtime", "x" * 70,
    "a b", "a\nb", "$(id)", "é", "{", "'", "kubeflow.org/v1", "JobSet", "PyTorchJob", "TrainJob",
]  # fmt: skip
texts = st.one_of(st.sampled_from(WORDS), st.text(max_size=10))
# Small or edge integers: a merely large count is valid and would make an example render many pods.
integers = st.one_of(
    st.integers(-3, 6),
    st.sampled_from([2**31 - 1, 2**31, 2**63, -(2**31), 8192, 8193, 150_001]),
)
scalars = st.one_of(
    st.none(), st.booleans(), integers, st.floats(allow_nan=False, allow_infinity=False), texts
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(texts, inner, max_size=3)),
    max_leaves=8,
)


def paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path to a value inside ``value`` (dict keys and list indexes)."""
    found = [prefix]
    if isinstance(value, dict):
        for key, item in value.items():
            found += paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += paths(item, (*prefix, index))
    return found


OPS = ["delete", "replace", "replace", "number", "empty", "duplicate", "rename", "add"]


def mutate(docs: list[Any], path: tuple[Any, ...], op: str, new: Any, data: st.DataObject) -> None:
    """Change ``docs`` in place at ``path`` (never the list of documents itself)."""
    parent: Any = docs
    for part in path[:-1]:
        parent = parent[part]
    last = path[-1]
    old = parent[last]
    if op == "delete":
        del parent[last]
    elif op == "replace":
        parent[last] = new
    elif op == "number":  # a number, or a count's text, where a count may be
        parent[last] = data.draw(st.one_of(integers, integers.map(str), st.sampled_from([0.5, -1.0, 1e300])))
    elif op == "empty":
        parent[last] = type(old)() if isinstance(old, list | dict | str) else None
    elif op == "duplicate" and isinstance(old, list) and old:
        old.append(copy.deepcopy(data.draw(st.sampled_from(old), label="repeated")))
    elif op == "rename" and isinstance(parent, dict):
        key = data.draw(texts, label="new key")
        parent[key] = parent.pop(last)
    elif op == "add" and isinstance(old, dict):
        old[data.draw(texts, label="added key")] = new


def file_text(docs: list[Any], style: str) -> str:
    if style == "json":  # one JSON document per file; a runtime goes in a YAML stream
        return json.dumps(docs[0]) if len(docs) == 1 else yaml.safe_dump_all(docs, sort_keys=False)
    return yaml.safe_dump_all(docs, sort_keys=False)


def _runtimes(text: str) -> Runtimes:
    """The runtimes of a file, for reading back what was rendered from its TrainJob (as --runtime)."""
    runtimes = Runtimes()
    for document in parse_documents(text, FILE):
        if is_runtime(document.data):
            runtimes.add(document)
    return runtimes


def exercise(source: str) -> None:
    """Load and check ``source``; what passes expands and renders for every target, or is refused."""
    try:
        loaded = load_jobs_from_text(source, FILE)
    except SpecError as err:
        assert err.problems
        for problem in err.problems:
            line = problem.format()
            assert "\n" not in line and line.startswith(FILE), line
        event("refused")
        return
    event("valid")
    for item in loaded:
        expansion = Expansion(item.job)
        expansion.warnings()
        if item.job.total_replicas <= 64:  # a merely large job is valid; its pods are not the point
            objects = [*expansion.objects(), *(pod.manifest for pod in expansion.pods())]
            dump(list_of(objects), "json")
        for target in target_names():
            try:
                rendered = for_cluster(item.job, target, "default")
            except SpecError as err:
                for problem in err.problems:
                    # as `render` tells it: the document's file and line
                    assert "\n" not in item.document.problem(problem.path, problem.message).format()
                event(f"refused by {target}")
                continue
            event(f"rendered for {target}")
            assert rendered.objects or item.job.total_replicas == 0  # bare pods: none to render
            text = dump(list_of(rendered.objects), "yaml")
            if target != "pods":  # read back as every command reads a List: a job, or SpecError only
                try:
                    load_jobs_from_text(text, "rendered.yaml", _runtimes(source))
                    event(f"read back from {target}")
                except SpecError:
                    # the object as read, labelled, reads as it did
                    assert item.job.kind is None or item.job.kind.target != target
                    event(f"not read back from {target}")
            for obj in rendered.objects:
                schema = crds.shipped(obj["apiVersion"], obj["kind"])
                if schema is not None:  # what the cluster's CRD takes, strictly, as the engine sends it
                    assert crds.unknown_fields(obj, schema) == [], (target, obj)
                    stored = crds.prune(_without_nulls(obj), schema)
                    assert crds.invalid(stored, schema) == [], (target, obj)


def _without_nulls(value: Any) -> Any:
    """A custom resource as the API server validates it: a field set to null is dropped first
    (fields not marked nullable, since Kubernetes 1.20)."""
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value


@pytest.mark.parametrize("name", FILES)
def test_the_valid_files_render_for_every_target(name: str) -> None:
    loaded = load_jobs_from_text(file_text(FILES[name], "yaml"), FILE)
    assert len(loaded) == 1
    refused = []
    for target in target_names():
        try:
            assert for_cluster(loaded[0].job, target, "default").objects
        except SpecError:
            refused.append(target)
    # an elastic range of nodes is what trainjob and jobset cannot express; a driver beside the
    # workers, which of them is the master
    expected = {"elastic": ["trainjob", "jobset"], "jobset": ["kubeflow", "trainjob"]}
    assert refused == expected.get(name, [])


@FUZZ
@given(st.sampled_from(list(FILES)), st.sampled_from(["yaml", "json"]), st.data())
def test_mutated_kinds_load_render_or_are_refused(name: str, style: str, data: st.DataObject) -> None:
    docs = copy.deepcopy(FILES[name])
    for _ in range(data.draw(st.integers(1, 4), label="mutations")):
        path = data.draw(st.sampled_from([p for p in paths(docs) if len(p) > 1]), label="path")
        op = data.draw(st.sampled_from(OPS), label="op")
        mutate(docs, path, op, data.draw(values, label="value"), data)
    exercise(file_text(docs, style))


def leaves(docs: list[Any]) -> list[Any]:
    return [value for path in paths(docs) if not isinstance(value := _at(docs, path), dict | list)]


def _at(docs: Any, path: tuple[Any, ...]) -> Any:
    for part in path:
        docs = docs[part]
    return docs


@FUZZ
@given(st.sampled_from(list(FILES)), st.data())
def test_plausible_changes_of_each_kind(name: str, data: st.DataObject) -> None:
    """Changes a user might make (a value of the file put elsewhere, a small count, a known word,
    a field dropped), so that many results pass the checks and are rendered for every target."""
    docs = copy.deepcopy(FILES[name])
    for _ in range(data.draw(st.integers(1, 3), label="changes")):
        path = data.draw(st.sampled_from([p for p in paths(docs) if len(p) > 1]), label="path")
        parent = _at(docs, path[:-1])
        new = data.draw(
            st.one_of(
                st.sampled_from(leaves(docs)),
                st.integers(0, 4),
                st.sampled_from(WORDS[:40]),
                st.just(copy.deepcopy(parent[path[-1]])),
            ),
            label="value",
        )
        if data.draw(st.booleans(), label="drop"):
            del parent[path[-1]]
        else:
            parent[path[-1]] = new
    exercise(file_text(docs, "yaml"))


@FUZZ
@given(st.sampled_from(list(FILES)), st.data())
def test_random_specs_of_each_kind(name: str, data: st.DataObject) -> None:
    docs = copy.deepcopy(FILES[name])
    where = data.draw(st.sampled_from([p for p in paths(docs[-1]["spec"]) if p]), label="path")
    parent = docs[-1]["spec"]
    for part in where[:-1]:
        parent = parent[part]
    parent[where[-1]] = data.draw(values, label="value")
    exercise(file_text(docs, "yaml"))


# ------------------------------------------------------------------ what the fuzzing found, as examples


def _problems(docs: list[dict[str, Any]]) -> list[str]:
    with pytest.raises(SpecError) as err:
        load_jobs_from_text(file_text(docs, "yaml"), FILE)
    return [f"{p.path}: {p.message}" for p in err.value.problems]


def test_a_trainjob_of_negative_nodes_is_told_once() -> None:
    """Not again as the schema's bound, the Volcano Job's minAvailable, or the runtime's Job."""
    docs = copy.deepcopy(FILES["trainjob"])
    docs[1]["spec"]["trainer"]["numNodes"] = -1
    assert _problems(docs) == ["spec.trainer.numNodes: expected an integer >= 0, got -1 (in document 2)"]
    docs[1]["spec"]["trainer"]["numNodes"] = 0
    assert _problems(docs) == ["spec.trainer.numNodes: expected at least 1 node, got 0 (in document 2)"]


def test_a_jobset_of_negative_replicas_is_told_once() -> None:
    """Not again as a Volcano Job of no task."""
    docs = copy.deepcopy(FILES["jobset-one"])
    docs[0]["spec"]["replicatedJobs"][0]["replicas"] = -1
    assert _problems(docs) == ["spec.replicatedJobs[0].replicas: expected an integer >= 0, got -1"]


def test_a_pytorchjob_of_no_workers_is_told_once() -> None:
    """Not again as the Volcano Job's minSuccess, a field a PyTorchJob does not have."""
    docs = copy.deepcopy(FILES["elastic"])
    docs[0]["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] = 0
    assert _problems(docs) == ["spec.pytorchReplicaSpecs.Worker.replicas: expected at least 1 replica, got 0"]


def test_an_int32_bound_reads_as_english() -> None:
    docs = copy.deepcopy(FILES["jobset-one"])
    docs[0]["spec"]["replicatedJobs"][0]["template"]["spec"]["completions"] = 2**31
    assert _problems(docs) == [
        f"spec.replicatedJobs[0].template.spec.completions: expected an int32 integer, got {2**31}"
    ]


def test_a_replicated_job_name_is_told_as_written() -> None:
    """Not as the name of its first Job ('Workers-0'), once, in a JobSet or a TrainJob's runtime."""
    docs = copy.deepcopy(FILES["jobset-one"])
    docs[0]["spec"]["replicatedJobs"][0]["name"] = "Workers"
    docs[0]["spec"]["successPolicy"] = {"operator": "All", "targetReplicatedJobs": ["Workers"]}
    label = (
        "is not a DNS-1123 label: use lower-case letters, digits and '-', "
        "starting and ending with a letter or digit"
    )
    assert _problems(docs) == [f"spec.replicatedJobs[0].name: 'Workers' {label}"]
    docs = copy.deepcopy(FILES["cluster-trainjob"])
    docs[0]["spec"]["template"]["spec"]["replicatedJobs"][0]["name"] = "Node"
    assert _problems(docs) == [f"spec.template.spec.replicatedJobs[0].name: 'Node' {label} (in document 1)"]


def test_a_jobset_whose_pods_restart_always_is_refused() -> None:
    """Kubernetes refuses such a Job; rendered as read, the JobSet would not be created."""
    docs = copy.deepcopy(FILES["jobset-one"])
    docs[0]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["restartPolicy"] = "Always"
    assert _problems(docs) == [
        "spec.replicatedJobs[0].template.spec.template.spec.restartPolicy: "
        "a Job's pods restart OnFailure or Never, got 'Always'"
    ]


def test_the_pod_template_of_a_replicated_job_of_no_jobs_is_checked() -> None:
    """replicas: 0 makes no task here; the template still goes to the cluster, which checks it."""
    docs = copy.deepcopy(FILES["jobset"])
    driver = docs[0]["spec"]["replicatedJobs"][0]
    driver["replicas"] = 0
    driver["template"]["spec"]["template"]["spec"]["containers"][0]["image"] = 3
    path = "spec.replicatedJobs[0].template.spec.template"
    assert _problems(docs) == [
        f"{path}.spec.containers[0].image: expected a string (quote it), got integer 3"
    ]
    driver["template"]["spec"]["template"] = "JobSet"
    assert _problems(docs) == [f"{path}: expected a mapping (a pod template), got string"]


def test_a_pod_template_that_is_a_list_is_told_once() -> None:
    docs = copy.deepcopy(FILES["jobset"])
    docs[0]["spec"]["replicatedJobs"][1]["template"]["spec"]["template"] = []
    assert _problems(docs) == [
        "spec.replicatedJobs[1].template.spec.template: expected a mapping (a pod template), got list"
    ]


def test_a_runtime_whose_containers_are_not_a_list_is_told_there() -> None:
    """A number there crashed the TrainJob's reader (TypeError: 'int' object is not iterable)."""
    docs = copy.deepcopy(FILES["trainjob"])
    pod = docs[0]["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    pod["containers"] = 0
    assert _problems(docs) == [
        "spec.template.spec.replicatedJobs[0].template.spec.template.spec.containers: "
        "expected a list of containers, got integer (in document 1)"
    ]


def test_a_null_entry_of_a_list_is_refused() -> None:
    """Passed as if absent, and rendered as read, it was refused by the cluster's CRD."""
    docs = copy.deepcopy(FILES["trainjob"])
    docs[1]["spec"]["trainer"]["env"] = [None]
    assert _problems(docs) == ["spec.trainer.env[0]: expected an entry, got null (in document 2)"]
    docs = copy.deepcopy(FILES["jobset-one"])
    docs[0]["spec"]["replicatedJobs"].append(None)
    assert _problems(docs) == ["spec.replicatedJobs[1]: expected an entry, got null"]


def test_a_pytorchjob_nproc_per_node_torchrun_refuses_is_refused() -> None:
    """'lots' passed, and was rendered for Trainer as numProcPerNode: 1."""
    for value in ("lots", "-1", "0"):
        docs = copy.deepcopy(FILES["pytorchjob"])
        docs[0]["spec"]["nprocPerNode"] = value
        assert _problems(docs) == [
            f"spec.nprocPerNode: expected a number of processes (1 or more), auto, cpu or gpu, got {value!r}"
        ]
    for value in ("auto", "cpu", "gpu", "4"):
        docs[0]["spec"]["nprocPerNode"] = value
        load_jobs_from_text(file_text(docs, "yaml"), FILE)


def test_a_replica_type_of_any_text_is_told_on_one_line() -> None:
    """A key with a newline broke the line of its problem (the path was written as given)."""
    docs = copy.deepcopy(FILES["pytorchjob"])
    docs[0]["spec"]["pytorchReplicaSpecs"]["a\nb"] = None
    with pytest.raises(SpecError) as err:
        load_jobs_from_text(file_text(docs, "yaml"), FILE)
    assert [p.format() for p in err.value.problems] == [
        f"{FILE}:60: "  # the key's own line
        + 'spec.pytorchReplicaSpecs["a\\nb"]: '
        + "unknown replica type 'a\\nb'; a PyTorchJob has Master and Worker"
    ]


def test_a_trainjob_on_a_runtime_of_its_own_node_name_reads_back_as_rendered() -> None:
    """torchjob's label patch named the replicated job 'node' whatever the runtime called it, and
    the TrainJob it rendered was refused when read back (and by Trainer)."""
    docs = copy.deepcopy(FILES["trainjob"])
    docs[0]["spec"]["template"]["spec"]["replicatedJobs"][0]["name"] = "trainer"
    del docs[1]["spec"]["runtimePatches"]
    text = file_text(docs, "yaml")
    (loaded,) = load_jobs_from_text(text, FILE)
    objects = for_cluster(loaded.job, "trainjob", "default").objects
    (patch,) = objects[0]["spec"]["runtimePatches"]
    assert [r["name"] for r in patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]] == [
        "trainer"
    ]
    (again,) = load_jobs_from_text(dump(list_of(objects), "yaml"), "rendered.yaml", _runtimes(text))
    assert again.job.total_replicas == 2
