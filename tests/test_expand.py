"""Expansion: the pods Volcano's controller would create, before and after the plugins."""

from __future__ import annotations

import copy
import errno
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from support import Ran
from torchjob.expand import DesiredState, expand
from torchjob.jobs import load_jobs_from_text
from torchjob.spec.model import Job

pytestmark = pytest.mark.timeout(120)

# Linux refuses one "NAME=value" environment string longer than this (with its NUL) in execve.
MAX_ARG_STRLEN = 32 * 4096


def job_doc(
    tasks: list[dict[str, Any]], plugins: dict[str, list[str]] | None = None, **spec: Any
) -> dict[str, Any]:
    return {
        "apiVersion": "batch.volcano.sh/v1alpha1",
        "kind": "Job",
        "metadata": {"name": "demo"},
        "spec": {**({"plugins": plugins} if plugins is not None else {}), **spec, "tasks": tasks},
    }


def simple_task(name: str, replicas: int, **template_spec: Any) -> dict[str, Any]:
    spec = {"containers": [{"name": "main", "image": "python:3.11"}], **template_spec}
    return {"name": name, "replicas": replicas, "template": {"spec": spec}}


def load(doc: dict[str, Any]) -> Job:
    [loaded] = load_jobs_from_text(yaml.safe_dump(doc, sort_keys=False), "job.yaml")
    return loaded.job


def test_pod_names_and_order_follow_tasks_then_index() -> None:
    state = expand(load(job_doc([simple_task("b", 2), simple_task("a", 1)])))
    assert [p.name for p in state.pods] == ["demo-b-0", "demo-b-1", "demo-a-0"]
    assert [(p.task.name, p.index) for p in state.pods] == [("b", 0), ("b", 1), ("a", 0)]
    assert state.objects == []  # no plugins: no Service, ConfigMap or NetworkPolicy


def test_default_task_names_are_used_in_pod_names() -> None:
    unnamed = {
        "replicas": 1,
        "template": {"spec": {"containers": [{"name": "main", "image": "python:3.11"}]}},
    }
    state = expand(load(job_doc([unnamed, dict(unnamed)])))
    assert [p.name for p in state.pods] == ["demo-default0-0", "demo-default1-0"]
    assert state.pods[1].manifest["metadata"]["annotations"]["volcano.sh/task-spec"] == "default1"


def test_labels_and_annotations_as_create_job_pod_sets_them() -> None:
    task = simple_task("worker", 3)
    task["template"]["metadata"] = {
        "labels": {"app": "trainer", "volcano.sh/job-name": "overridden"},
        "annotations": {"note": "kept"},
    }
    doc = job_doc([task], queue="research")
    doc["metadata"]["namespace"] = "ml"
    pod = expand(load(doc)).pods[2].manifest
    assert pod["apiVersion"] == "v1" and pod["kind"] == "Pod"
    assert pod["metadata"]["name"] == "demo-worker-2"
    assert pod["metadata"]["namespace"] == "ml"
    assert pod["metadata"]["labels"] == {
        "app": "trainer",
        "volcano.sh/job-name": "demo",
        "volcano.sh/task-index": "2",
        "volcano.sh/task-spec": "worker",
        "volcano.sh/job-namespace": "ml",
        "volcano.sh/queue-name": "research",
    }
    assert pod["metadata"]["annotations"] == {
        "note": "kept",
        "volcano.sh/task-index": "2",
        "volcano.sh/task-spec": "worker",
        "scheduling.k8s.io/group-name": "demo",
        "volcano.sh/job-name": "demo",
        "volcano.sh/queue-name": "research",
        "volcano.sh/job-version": "0",
        "volcano.sh/template-uid": "demo-worker",
        "volcano.sh/job-retry-count": "0",
    }


def test_version_and_retry_count_reach_the_annotations() -> None:
    state = expand(load(job_doc([simple_task("a", 1)])), version=4, retry_count=2)
    annotations = state.pods[0].manifest["metadata"]["annotations"]
    assert annotations["volcano.sh/job-version"] == "4"
    assert annotations["volcano.sh/job-retry-count"] == "2"


def test_job_annotations_labels_and_task_policies_copied_to_pods() -> None:
    task = simple_task("a", 4)
    task["topologyPolicy"] = "best-effort"
    task["partitionPolicy"] = {"totalPartitions": 2, "partitionSize": 2, "minPartitions": 1}
    doc = job_doc([task])
    doc["metadata"]["annotations"] = {
        "volcano.sh/preemptable": "true",
        "volcano.sh/revocable-zone": "*",
        "volcano.sh/cooldown-time": "60s",
        "volcano.sh/jdb-min-available": "2",
        "volcano.sh/jdb-max-unavailable": "1",
        "unrelated": "not copied",
    }
    doc["metadata"]["labels"] = {
        "volcano.sh/preemptable": "false",
        "volcano.sh/cooldown-time": "30s",
        "x": "y",
    }
    pods = expand(load(doc)).pods
    annotations = pods[3].manifest["metadata"]["annotations"]
    labels = pods[3].manifest["metadata"]["labels"]
    assert annotations["volcano.sh/numa-topology-policy"] == "best-effort"
    assert annotations["volcano.sh/preemptable"] == "true"
    assert annotations["volcano.sh/revocable-zone"] == "*"
    assert annotations["volcano.sh/cooldown-time"] == "60s"
    # Only one disruption budget is copied: min-available wins.
    assert annotations["volcano.sh/jdb-min-available"] == "2"
    assert "volcano.sh/jdb-max-unavailable" not in annotations
    assert "unrelated" not in annotations
    assert labels["volcano.sh/preemptable"] == "false"
    assert labels["volcano.sh/cooldown-time"] == "30s"
    assert "x" not in labels
    assert [p.manifest["metadata"]["labels"]["volcano.sh/partition-id"] for p in pods] == ["0", "0", "1", "1"]


def test_max_unavailable_copied_when_no_min_available() -> None:
    doc = job_doc([simple_task("a", 1)])
    doc["metadata"]["annotations"] = {"volcano.sh/jdb-max-unavailable": "25%"}
    annotations = expand(load(doc)).pods[0].manifest["metadata"]["annotations"]
    assert annotations["volcano.sh/jdb-max-unavailable"] == "25%"
    assert "volcano.sh/numa-topology-policy" not in annotations


def test_scheduler_name_and_priority_class_propagation() -> None:
    tasks = [
        simple_task("plain", 1),
        simple_task("own", 1, schedulerName="default-scheduler", priorityClassName="low"),
    ]
    defaulted = expand(load(job_doc(copy.deepcopy(tasks))))
    plain, own = (p.manifest["spec"] for p in defaulted.pods)
    assert plain["schedulerName"] == "volcano"  # the webhook's default
    assert "priorityClassName" not in plain
    assert own["schedulerName"] == "default-scheduler"
    assert own["priorityClassName"] == "low"

    explicit = expand(
        load(job_doc(copy.deepcopy(tasks), schedulerName="kube-batch", priorityClassName="high"))
    )
    plain, own = (p.manifest["spec"] for p in explicit.pods)
    assert plain["schedulerName"] == "kube-batch"
    assert plain["priorityClassName"] == "high"
    assert own["schedulerName"] == "default-scheduler"
    assert own["priorityClassName"] == "low"


USER_SPEC: dict[str, Any] = {
    "containers": [
        {
            "name": "main",
            "image": "python:3.11",
            "command": ["python", "-m", "train"],
            "args": ["--epochs", "3"],
            "workingDir": "/work",
            "resources": {"limits": {"cpu": "2", "memory": "4Gi"}, "requests": {"cpu": "1"}},
            "securityContext": {"runAsNonRoot": True, "capabilities": {"drop": ["ALL"]}},
            "env": [{"name": "FROM_SECRET", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}],
            "volumeMounts": [{"name": "data", "mountPath": "/data", "readOnly": True}],
            "readinessProbe": {"exec": {"command": ["true"]}, "periodSeconds": 5},
            # Fields torchjob never reads, nested deep: they pass through as written.
            "lifecycle": {"preStop": {"exec": {"command": ["sleep", "1"]}}},
        }
    ],
    "nodeSelector": {"gpu": "a100"},
    "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}],
    "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "datasets"}}],
    "securityContext": {"fsGroup": 1000},
    "affinity": {"nodeAffinity": {}},
    "terminationGracePeriodSeconds": 5,
    "restartPolicy": "OnFailure",
    "dnsConfig": {"options": [{"name": "ndots", "value": "2"}], "searches": ["svc.local"]},
}


@pytest.mark.parametrize("plugins", [None, {"pytorch": [], "env": []}])
def test_user_template_fields_survive_untouched(plugins: dict[str, list[str]] | None) -> None:
    tasks = [
        {"name": "master", "replicas": 1, "template": {"spec": copy.deepcopy(USER_SPEC)}},
        {"name": "worker", "replicas": 2, "template": {"spec": copy.deepcopy(USER_SPEC)}},
    ]
    job = load(job_doc(tasks, plugins))
    before = copy.deepcopy([t.template.raw for t in job.spec.tasks])
    state = expand(job)
    for pod in state.pods:
        spec = pod.manifest["spec"]
        for key, value in USER_SPEC.items():
            if key == "containers":
                continue
            if key == "volumes":
                assert spec[key][: len(value)] == value  # svc appends its volume after the user's
            else:
                assert spec[key] == value, key
        main = spec["containers"][0]
        for key, value in USER_SPEC["containers"][0].items():
            if key in ("env", "volumeMounts"):
                assert main[key][: len(value)] == value  # plugins append after the user's entries
            else:
                assert main[key] == value, key
    # Expansion never changes the job's templates, so it can run again (restarts, re-renders).
    assert [t.template.raw for t in job.spec.tasks] == before
    assert [p.manifest for p in expand(job).pods] == [p.manifest for p in state.pods]


def test_pods_share_no_mutable_data() -> None:
    """The local engine edits pods one at a time; an edit must not leak into a sibling pod."""
    first, second = (p.manifest for p in expand(load(job_doc([simple_task("a", 2)]))).pods)
    first["spec"]["containers"][0]["image"] = "changed"
    first["metadata"]["labels"]["x"] = "y"
    assert second["spec"]["containers"][0]["image"] == "python:3.11"
    assert "x" not in second["metadata"]["labels"]


def test_pods_share_no_mutable_data_with_plugins() -> None:
    state = expand(
        load(job_doc([simple_task("master", 1), simple_task("worker", 2)], {"pytorch": [], "env": []}))
    )
    a, b = (p.manifest for p in state.pods[1:])
    for key in ("containers",):
        for ca, cb in zip(a["spec"][key], b["spec"][key], strict=True):
            assert ca is not cb
            for ea, eb in zip(ca["env"], cb["env"], strict=True):
                assert ea is not eb
            assert ca["ports"] is not cb["ports"]
            assert ca["volumeMounts"] is not cb["volumeMounts"]
    assert a["spec"]["volumes"] is not b["spec"]["volumes"]
    assert a["metadata"]["labels"] is not b["metadata"]["labels"]


# ------------------------------------------------------------------------------ the execve limit


def hosts(job: str, task: str, replicas: int) -> str:
    return ",".join(f"{job}-{task}-{i}.{job}" for i in range(replicas))


def hosts_env_size(job: str, task: str, replicas: int) -> int:
    """Bytes execve needs for VC_<TASK>_HOSTS=<hosts> with its terminating NUL."""
    return len(f"VC_{task.upper()}_HOSTS=") + len(hosts(job, task, replicas).encode()) + 1


def largest_fitting_replicas(job: str, task: str) -> int:
    n = 1
    while hosts_env_size(job, task, n + 1) <= MAX_ARG_STRLEN:
        n += 1
    return n


# With this job name a host is ~25 bytes, so the limit falls at about 5000 workers.
BIG = "resnet"
FITS = largest_fitting_replicas(BIG, "worker")


def big_job(workers: int) -> dict[str, Any]:
    doc = job_doc([simple_task("master", 1), simple_task("worker", workers)], {"pytorch": []})
    doc["metadata"]["name"] = BIG
    return doc


def test_the_boundary_is_where_the_kernel_puts_it() -> None:
    assert 4000 < FITS < 6000  # "about 5000 replicas"
    assert hosts_env_size(BIG, "worker", FITS) <= MAX_ARG_STRLEN < hosts_env_size(BIG, "worker", FITS + 1)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="MAX_ARG_STRLEN is a Linux limit")
def test_the_kernel_really_refuses_one_host_more() -> None:
    true = "/bin/true" if Path("/bin/true").exists() else "/usr/bin/true"
    fits = subprocess.run([true], env={"VC_WORKER_HOSTS": hosts(BIG, "worker", FITS)}, timeout=10)
    assert fits.returncode == 0
    with pytest.raises(OSError) as err:
        subprocess.run([true], env={"VC_WORKER_HOSTS": hosts(BIG, "worker", FITS + 1)}, timeout=10)
    assert err.value.errno == errno.E2BIG


def test_host_list_just_under_the_limit_is_injected() -> None:
    state = expand(load(big_job(FITS)))
    assert state.warnings == []
    for pod in (state.pods[0], state.pods[-1]):
        names = [e["name"] for e in pod.manifest["spec"]["containers"][0]["env"]]
        assert "VC_WORKER_HOSTS" in names and "VC_WORKER_NUM" in names


@pytest.mark.parametrize("workers", [FITS + 1, 5100])
def test_host_list_over_the_limit_is_left_out_with_a_warning(workers: int) -> None:
    state = expand(load(big_job(workers)))
    [(path, message)] = [(w.path, w.message) for w in state.warnings]
    assert path == "spec.tasks[1].replicas"
    assert "VC_WORKER_HOSTS" in message and "128 KiB" in message and "/etc/volcano/worker.host" in message
    for pod in state.pods:
        spec = pod.manifest["spec"]
        for c in [*spec.get("initContainers", []), *spec["containers"]]:
            names = [e["name"] for e in c["env"]]
            assert "VC_WORKER_HOSTS" not in names
            assert "VC_WORKER_NUM" in names and "VC_MASTER_HOSTS" in names
    data = next(o for o in state.objects if o["kind"] == "ConfigMap")["data"]
    assert data["VC_WORKER_NUM"] == str(workers)
    assert len(data["worker.host"].split("\n")) == workers
    assert data["VC_WORKER_HOSTS"].count(",") == workers - 1


def test_no_warning_when_hosts_env_is_not_injected() -> None:
    doc = big_job(FITS + 1)
    doc["spec"]["plugins"]["svc"] = ["--inject-hosts-env=false"]
    assert expand(load(doc)).warnings == []


@pytest.mark.parametrize("command", ["validate", "render"])
def test_cli_warns_with_file_line_and_field_path(
    command: str, tmp_path: Path, run_main: Callable[..., Ran]
) -> None:
    path = tmp_path / "big.yaml"
    path.write_text(yaml.safe_dump(big_job(FITS + 1), sort_keys=False))
    line = next(
        i for i, text in enumerate(path.read_text().splitlines(), 1) if f"replicas: {FITS + 1}" in text
    )
    result = run_main(command, str(path))
    assert result.returncode == 0, result.stderr
    [warning] = result.stderr.splitlines()
    assert warning.startswith(f"{path}:{line}: spec.tasks[1].replicas: warning: VC_WORKER_HOSTS would be ")
    assert "Traceback" not in result.stderr
    if command == "render":
        assert "name: VC_WORKER_HOSTS" not in result.stdout
        assert "VC_WORKER_HOSTS: " in result.stdout  # still in the ConfigMap

    path.write_text(yaml.safe_dump(big_job(FITS), sort_keys=False))
    quiet = run_main(command, str(path))
    assert quiet.returncode == 0 and quiet.stderr == ""


# ------------------------------------------------------------------------------- job volumes


def test_job_volumes_become_claims_mounted_in_every_container() -> None:
    init = {"name": "setup", "image": "busybox:1.36.1"}
    tasks = [simple_task("a", 2, initContainers=[init])]
    tasks[0]["template"]["spec"]["containers"].append({"name": "side", "image": "busybox:1.36.1"})
    volumes: list[dict[str, Any]] = [
        {"mountPath": "/data", "volumeClaimName": "datasets"},
        {
            "mountPath": "/ckpt",
            "volumeClaim": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
        },
        {"mountPath": "/again", "volumeClaimName": "datasets"},  # a repeated claim is skipped, as in Volcano
    ]
    state = expand(load(job_doc(tasks, {"svc": []}, volumes=volumes)))
    again = expand(load(job_doc(copy.deepcopy(tasks), {"svc": []}, volumes=copy.deepcopy(volumes))))
    assert [p.manifest for p in state.pods] == [p.manifest for p in again.pods]  # names are stable

    [claim] = [o for o in state.objects if o["kind"] == "PersistentVolumeClaim"]
    generated = claim["metadata"]["name"]
    assert generated.startswith("demo-volume-") and len(generated) == len("demo-volume-") + 12
    assert claim["spec"] == volumes[1]["volumeClaim"]
    assert state.objects[0] is claim  # before the pods and the svc objects

    for pod in state.pods:
        spec = pod.manifest["spec"]
        pvcs = [v for v in spec["volumes"] if "persistentVolumeClaim" in v]
        assert [v["persistentVolumeClaim"]["claimName"] for v in pvcs] == ["datasets", generated]
        names = [v["name"] for v in pvcs]
        assert all(n.startswith("demo-") and len(n) == len("demo-") + 12 for n in names)
        assert spec["volumes"][-1]["name"] == "demo-svc"  # plugins come after the controller
        for c in spec["containers"]:
            assert c["volumeMounts"][:2] == [
                {"name": names[0], "mountPath": "/data"},
                {"name": names[1], "mountPath": "/ckpt"},
            ]
        assert [m["mountPath"] for m in spec["initContainers"][0]["volumeMounts"]] == ["/etc/volcano"]


def test_configmap_over_one_mebibyte_is_reported() -> None:
    name = "a" * 40  # long host names reach the ConfigMap limit with fewer pods
    doc = job_doc([simple_task("w", 6000)], {"svc": ["--inject-hosts-env=false"]})
    doc["metadata"]["name"] = name
    state = expand(load(doc))
    data = next(o for o in state.objects if o["kind"] == "ConfigMap")["data"]
    assert sum(len(k) + len(v) for k, v in data.items()) > 1024 * 1024
    [(path, message)] = [(w.path, w.message) for w in state.warnings]
    assert path == "spec.tasks"
    assert "1 MiB" in message and f"{name}-svc" in message


def test_host_network_pods_keep_cluster_dns() -> None:
    tasks = [
        simple_task("host", 1, hostNetwork=True),
        simple_task("chosen", 1, hostNetwork=True, dnsPolicy="Default"),
        simple_task("plain", 1),
    ]
    host, chosen, plain = (p.manifest["spec"] for p in expand(load(job_doc(tasks))).pods)
    assert host["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert chosen["dnsPolicy"] == "Default"
    assert "dnsPolicy" not in plain


# ------------------------------------------------------------------------------ readdressing


EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def readdress_jobs() -> list[tuple[str, Job]]:
    from torchjob.jobs import load_jobs

    jobs = [(p.name, item.job) for p in sorted(EXAMPLES.glob("*.yaml")) for item in load_jobs(str(p))]
    waits = ["--master=m", "--worker=w", "--port=29400", "--wait-master-enabled=true"]
    jobs.append(
        ("wait-master", load(job_doc([simple_task("m", 1), simple_task("w", 3)], {"pytorch": waits})))
    )
    aliased = job_doc(
        [simple_task("m", 1, hostname="head", subdomain="net"), simple_task("w", 2)],
        {"pytorch": ["--master=m", "--worker=w", "--wait-master-enabled=true"], "svc": [], "env": []},
    )
    aliased["spec"]["tasks"][1]["template"]["spec"]["containers"][0]["env"] = [
        {"name": "MASTER_PORT", "value": "1"},  # the user's own, before the plugin's (a warning)
        {"name": "VC_M_NUM", "valueFrom": {"configMapKeyRef": {"name": "demo-svc", "key": "VC_M_NUM"}}},
    ]
    jobs.append(("aliased", load(aliased)))
    # Loopback host lists fit in the env, cluster names do not: the svc plugin's env block changes.
    loopback_fits = (MAX_ARG_STRLEN - 64) // len("127.0.31.254,")
    jobs.append(("big", load(big_job(loopback_fits))))
    return jobs


def addressings(job: Job) -> dict[str, Any]:
    from torchjob.addressing import ClusterAddressing
    from torchjob.engines.local.addressing import LocalAddressing
    from torchjob.engines.local.ports import declared_ports

    mapped = {port: 40000 + i for i, port in enumerate(declared_ports(job))}
    return {
        "cluster": ClusterAddressing(),
        "planned": LocalAddressing(job),
        "ports": LocalAddressing(job, mapped),
        "names": LocalAddressing(job, mapped, names=True),
    }


@pytest.mark.parametrize(("name", "job"), readdress_jobs(), ids=lambda v: v if isinstance(v, str) else "")
def test_readdressing_gives_what_expanding_again_gives(name: str, job: Job) -> None:
    """The local engine expands once (the plan) and readdresses for the job's turn: each plugin's
    rewrite must leave exactly the pods, objects and warnings a second expansion would build."""
    from torchjob.expand import readdress

    ways = addressings(job)
    # Each addressing's own expansion, built once and never readdressed: what a state was before
    # its readdress (expansion is deterministic; a deep copy of 10,000 pods took longer) and what
    # it must become.
    fresh: dict[str, DesiredState] = {}

    def expanded(way: str) -> DesiredState:
        if way not in fresh:
            fresh[way] = expand(job, ways[way])
        return fresh[way]

    pairs = [(a, b) for a in ways for b in ways]
    if name == "big":  # 10,000 pods: the pairs whose host lists fit in one env and not in the other
        pairs = [("planned", "names"), ("names", "ports")]
        hosts_in = {n: "VC_WORKER_HOSTS" in str(expanded(n).pods[-1].manifest) for n in ("ports", "names")}
        assert hosts_in == {"ports": True, "names": False}
    changed = 0
    for was_name, now_name in pairs:
        state = expand(job, ways[was_name])
        assert readdress(state, ways[now_name]), (was_name, now_name)
        now = expanded(now_name)
        where = f"{name}: {was_name} -> {now_name}"
        assert [p.manifest for p in state.pods] == [p.manifest for p in now.pods], where
        assert state.objects == now.objects and state.warnings == now.warnings, where
        changed += [p.manifest for p in state.pods] != [p.manifest for p in expanded(was_name).pods]
    if name != "restart-on-failure.yaml":  # a job without the pytorch plugin has nothing to change
        assert changed


def test_restamping_gives_a_restarts_expansion() -> None:
    from torchjob.expand import restamp

    job = load(job_doc([simple_task("master", 1), simple_task("worker", 2)], {"pytorch": [], "svc": []}))
    first = expand(job)
    again = restamp(first, 2, 1)
    assert [p.manifest for p in again.pods] == [
        p.manifest for p in expand(job, version=2, retry_count=1).pods
    ]
    assert [p.manifest for p in first.pods] == [p.manifest for p in expand(job).pods]  # untouched
