"""Property tests: whatever a user feeds in, the loader, validator and renderer never crash.

The only allowed failure is :class:`SpecError`, which the CLI turns into one-line messages. Inputs
are random documents (YAML-ish nested data and raw text), mutations of a valid pytorch job
(fields deleted or replaced by values of random types) and random plugin flag lists.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from torchjob.errors import SpecError
from torchjob.expand import expand
from torchjob.jobs import load_jobs_from_text
from torchjob.render import as_list, dump

pytestmark = pytest.mark.timeout(300)

FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

VALID: dict[str, Any] = {
    "apiVersion": "batch.volcano.sh/v1alpha1",
    "kind": "Job",
    "metadata": {"name": "fuzz", "labels": {"team": "ml"}},
    "spec": {
        "minAvailable": 3,
        "policies": [{"event": "PodEvicted", "action": "RestartJob"}],
        "plugins": {
            "pytorch": ["--master=master", "--worker=worker", "--port=23456", "--wait-master-enabled"],
            "env": [],
            "svc": ["--publish-not-ready-addresses"],
        },
        "tasks": [
            {
                "name": "master",
                "replicas": 1,
                "template": {
                    "metadata": {"labels": {"role": "master"}},
                    "spec": {
                        "restartPolicy": "OnFailure",
                        "containers": [
                            {
                                "name": "main",
                                "image": "python:3.11-slim",
                                "command": ["python", "-c", "print(1)"],
                                "env": [{"name": "EPOCHS", "value": "3"}],
                                "ports": [{"containerPort": 8080, "name": "http"}],
                            }
                        ],
                    },
                },
            },
            {
                "name": "worker",
                "replicas": 2,
                "policies": [{"exitCode": 3, "action": "RestartTask"}],
                "template": {
                    "spec": {
                        "initContainers": [{"name": "prep", "image": "busybox:1.36.1"}],
                        "containers": [{"name": "main", "image": "python:3.11-slim", "volumeMounts": []}],
                        "volumes": [],
                    }
                },
            },
        ],
    },
}

# Text that tends to matter here: shell metacharacters, names, flags, YAML specials.
WORDS = [
    "", " ", "-", "--", "=", "*", "0", "-1", "true", "True", "yes", "null", "~", "master", "worker",
    "default", "PodFailed", "OutOfSync", "RestartJob", "$(id)", "`id`", ";rm -rf /", "a b", "a\nb",
    "busybox:1.36.1", "busybox:1.36.1\n", "worker\n", "Worker", "x" * 70, "é", "{", "[", "'", '"',
    "--port", "--port=", "10", "0x10", "010", "1e3", "2024-01-31", "12:30:00",
]  # fmt: skip
texts = st.one_of(st.sampled_from(WORDS), st.text(max_size=12))
# Small or edge-case integers only: a huge replica count is refused, but a merely large one is valid
# and would make each example render thousands of pods.
integers = st.one_of(
    st.integers(-3, 6), st.sampled_from([2**31 - 1, 2**31, 2**63, -(2**31), 65535, 65536, 150_001])
)
scalars = st.one_of(
    st.none(), st.booleans(), integers, st.floats(allow_nan=False, allow_infinity=False), texts
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(texts, inner, max_size=4)),
    max_leaves=12,
)


def exercise(text: str) -> None:
    """Load, validate, expand and render ``text``; a SpecError is the only acceptable failure."""
    try:
        loaded = load_jobs_from_text(text, "fuzz.yaml")
    except SpecError as err:
        assert err.problems
        for problem in err.problems:
            line = problem.format()
            assert "\n" not in line and line.startswith("fuzz.yaml")
        return
    event("rendered")
    states = [expand(item.job) for item in loaded]
    for state in states:
        for pod in state.pods:
            check_pod(pod.manifest)
    # Both formats carry exactly the same objects.
    from_json = json.loads(dump(as_list(states), "json"))
    assert yaml.safe_load(dump(as_list(states), "yaml")) == from_json


_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_SHELL_SPECIAL = set(" \t\n;&|<>()$`\\'\"*?!{}")


def check_pod(pod: dict[str, Any]) -> None:
    """What validation promises about every pod it lets through (checked here independently)."""
    name = pod["metadata"]["name"]
    assert len(name) <= 63 and _LABEL.fullmatch(name), name
    spec = pod["spec"]
    for key in ("hostname", "subdomain"):
        if key in spec:
            assert _LABEL.fullmatch(spec[key]), spec[key]
    for container in [*spec.get("initContainers", []), *spec["containers"]]:
        assert not _SHELL_SPECIAL & set(container["image"]), container["image"]
        assert _LABEL.fullmatch(container["name"]), container["name"]
        for var in container.get("env", []):
            assert "value" not in var or isinstance(var["value"], str)


def as_text(doc: Any, style: str) -> str:
    if style == "json":
        return json.dumps(doc)
    return yaml.safe_dump(doc, sort_keys=False)


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


def mutate(doc: Any, path: tuple[Any, ...], op: str, new: Any) -> Any:
    """``doc`` with the value at ``path`` deleted, replaced, or given an extra key."""
    if not path:
        return new if op == "replace" else doc
    parent = doc
    for part in path[:-1]:
        parent = parent[part]
    last = path[-1]
    if op == "delete":
        del parent[last]
    elif op == "replace":
        parent[last] = new
    elif isinstance(parent[last], dict):
        parent[last]["x-extra" if not isinstance(new, str) else new] = new
    return doc


def test_the_valid_job_is_valid() -> None:
    loaded = load_jobs_from_text(as_text(VALID, "yaml"))
    assert [item.job.name for item in loaded] == ["fuzz"]
    assert len(expand(loaded[0].job).pods) == 3


@FUZZ
@given(st.text(max_size=200))
def test_random_text(text: str) -> None:
    exercise(text)


@FUZZ
@given(values, st.sampled_from(["yaml", "json"]))
def test_random_documents(doc: Any, style: str) -> None:
    exercise(as_text(doc, style))


@FUZZ
@given(values)
def test_random_specs_under_a_job_header(spec: Any) -> None:
    doc = {"apiVersion": VALID["apiVersion"], "kind": "Job", "metadata": {"name": "fuzz"}, "spec": spec}
    exercise(as_text(doc, "yaml"))


@FUZZ
@given(st.data())
def test_mutations_of_a_valid_job(data: st.DataObject) -> None:
    doc = json.loads(json.dumps(VALID))
    for _ in range(data.draw(st.integers(1, 4), label="mutations")):
        path = data.draw(st.sampled_from(paths(doc)), label="path")
        op = data.draw(st.sampled_from(["delete", "replace", "add"]), label="op")
        doc = mutate(doc, path, op, data.draw(values, label="value"))
    exercise(as_text(doc, data.draw(st.sampled_from(["yaml", "json"]), label="style")))


TASK_NAMES = ["a", "b", "c", "worker-1", "9", "", "Worker", "$(id)", "a b", "x" * 70, "default0"]
flag_names = st.sampled_from([
    "master", "worker", "port", "wait-master-enabled", "wait-master-timeout", "wait-master-image",
    "publish-not-ready-addresses", "disable-network-policy", "inject-hosts-env", "help", "x",
])  # fmt: skip
flag_values = st.one_of(
    texts,
    st.integers(-2, 70000).map(str),
    st.sampled_from(["1", "t", "FALSE", "0x1F90", "1_000", "010", "busybox"]),
)
flag_args = st.one_of(
    st.builds(lambda d, n, v: f"{d}{n}={v}", st.sampled_from(["-", "--", "---"]), flag_names, flag_values),
    st.builds(lambda d, n: f"{d}{n}", st.sampled_from(["-", "--"]), flag_names),
    flag_values,
)


bools = st.sampled_from(["1", "t", "T", "TRUE", "true", "True", "0", "f", "F", "FALSE", "false", "False"])
GOOD_FLAGS = {
    "pytorch": st.one_of(
        st.builds("--port={}".format, st.integers(1, 65535)),
        st.builds("-port={}".format, st.integers(1, 65535)),
        st.builds("--wait-master-timeout={}".format, st.integers(0, 1000)),
        st.builds("--wait-master-enabled={}".format, bools),
        st.just("--wait-master-enabled"),
        st.just("--wait-master-image=busybox:1.36.1"),
    ),
    "svc": st.builds(
        "--{}={}".format,
        st.sampled_from(["publish-not-ready-addresses", "disable-network-policy", "inject-hosts-env"]),
        bools,
    ),
    "env": flag_args,
}


@FUZZ
@given(st.data())
def test_random_flag_lists(data: st.DataObject) -> None:
    plugin = data.draw(st.sampled_from(["pytorch", "svc", "env"]), label="plugin")
    good = GOOD_FLAGS[plugin]
    # Mostly well-formed flags, each at most once, so that many lists are valid and get rendered.
    flag_list = st.lists(
        st.one_of(good, good, good, flag_args), max_size=4, unique_by=lambda a: a.split("=")[0]
    )
    args = data.draw(flag_list, label="args")
    doc = json.loads(json.dumps(VALID))
    doc["spec"]["plugins"][plugin] = args
    exercise(as_text(doc, "yaml"))


@FUZZ
@given(st.lists(st.sampled_from(TASK_NAMES), min_size=1, max_size=4, unique=True), st.data())
def test_random_task_names_and_dependencies(names: list[str], data: st.DataObject) -> None:
    doc = json.loads(json.dumps(VALID))
    del doc["spec"]["plugins"]["pytorch"], doc["spec"]["minAvailable"]
    task = doc["spec"]["tasks"][1]
    doc["spec"]["tasks"] = [
        {
            **json.loads(json.dumps(task)),
            "name": name,
            "dependsOn": {"name": data.draw(st.lists(st.sampled_from(names)))},
        }
        for name in names
    ]
    exercise(as_text(doc, "yaml"))


# Every pod-template field the local engine reads (engines/local/: containers, pod, creation, cleanup).
ENGINE_VALID: dict[str, Any] = {
    "apiVersion": "batch.volcano.sh/v1alpha1",
    "kind": "Job",
    "metadata": {"name": "engine", "annotations": {"note": "x"}},
    "spec": {
        "tasks": [
            {
                "name": "main",
                "replicas": 1,
                "template": {
                    "metadata": {"labels": {"app": "x"}, "annotations": {"a": "b"}},
                    "spec": {
                        "restartPolicy": "Never",
                        "terminationGracePeriodSeconds": 5,
                        "serviceAccountName": "default",
                        "volumes": [
                            {"name": "scratch", "emptyDir": {}},
                            {"name": "host", "hostPath": {"path": "/tmp", "type": "Directory"}},
                            {"name": "config", "configMap": {"name": "settings", "optional": True}},
                        ],
                        "containers": [
                            {
                                "name": "main",
                                "image": "busybox:1.36.1",
                                "command": ["sh", "-c", "echo $(A)"],
                                "args": ["x"],
                                "workingDir": "/scratch/sub",
                                "resources": {
                                    "limits": {"cpu": "2", "memory": "1Gi"},
                                    "requests": {"cpu": 1},
                                },
                                "volumeMounts": [
                                    {"name": "scratch", "mountPath": "/scratch"},
                                    {"name": "host", "mountPath": "/host", "subPath": "x", "readOnly": True},
                                    {"name": "config", "mountPath": "/config"},
                                ],
                                "envFrom": [
                                    {"prefix": "P_", "configMapRef": {"name": "settings", "optional": True}},
                                    {"secretRef": {"name": "s", "optional": True}},
                                ],
                                "env": [
                                    {"name": "A", "value": "1"},
                                    {"name": "B", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                                    {
                                        "name": "C",
                                        "valueFrom": {
                                            "resourceFieldRef": {"resource": "limits.cpu", "divisor": "1m"}
                                        },
                                    },
                                    {
                                        "name": "D",
                                        "valueFrom": {
                                            "configMapKeyRef": {
                                                "name": "settings",
                                                "key": "k",
                                                "optional": True,
                                            }
                                        },
                                    },
                                    {
                                        "name": "E",
                                        "valueFrom": {
                                            "secretKeyRef": {"name": "s", "key": "k", "optional": True}
                                        },
                                    },
                                    {"name": "F", "value": "nul\x00"},
                                ],
                            }
                        ],
                    },
                },
            }
        ]
    },
}


@FUZZ
@given(st.data())
def test_what_validation_accepts_the_local_engine_can_start_or_refuse(data: st.DataObject) -> None:
    """Values the engine reads never crash it once validation has passed them (issue 8)."""
    import tempfile

    from torchjob.engines.local import check_job
    from torchjob.engines.local.containers import PodSetup
    from torchjob.engines.local.mounts import make_empty_dirs
    from torchjob.engines.local.resolve import resolve_pod

    doc = json.loads(json.dumps(ENGINE_VALID))
    if data.draw(st.booleans(), label="without the NUL"):
        del doc["spec"]["tasks"][0]["template"]["spec"]["containers"][0]["env"][-1]
    for _ in range(data.draw(st.integers(0, 4), label="mutations")):
        path = data.draw(st.sampled_from(paths(doc["spec"])), label="path")
        op = data.draw(st.sampled_from(["delete", "replace", "add"]), label="op")
        mutate(doc["spec"], path, op, data.draw(values, label="value"))
    try:
        [loaded] = load_jobs_from_text(json.dumps(doc), "engine.json")
    except SpecError:
        return
    event("valid")
    issues = check_job(loaded.job)  # resolves every container as the engine will
    if issues:
        return
    event("runnable")
    state = expand(loaded.job)
    for plan in state.pods:
        grace = plan.task.template.spec.get("terminationGracePeriodSeconds")
        assert grace is None or 0 <= float(grace) < float("inf")
        with tempfile.TemporaryDirectory() as scratch:
            ctx = PodSetup(plan, "127.0.0.1", "uid", {}, Path(scratch) / "cm", Path(scratch) / "pod")
            make_empty_dirs(ctx)
            for run in [c for runs in resolve_pod(ctx) for c in runs]:
                assert not any("\0" in text for text in [*run.argv, *run.env, *run.env.values()])
