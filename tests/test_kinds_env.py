"""The env each pod of a PyTorchJob, TrainJob or JobSet gets from torchjob is the env its own
controller gives it: checked against the project's simulations of the training operator, Trainer,
JobSet and the Job controller (tests/controllers/), pod by pod and container by container, and
against what each training process then uses (its rank, world size and master).

The kind's object (as ``render`` prints it) is created on a simulated cluster and its pods are read
as the kubelet starts them; the job torchjob reads from the same file is expanded as a cluster
would address it (``ClusterAddressing``) and as this machine does (a loopback address per pod, its
ports mapped). Addresses are compared by the pod they reach.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from controllers import all_of
from controllers.cluster import simulated
from controllers.dns import resolve
from controllers.envs import pod_env, processes
from torchjob.addressing import ClusterAddressing
from torchjob.engines.local.addressing import LocalAddressing
from torchjob.engines.local.ports import declared_ports
from torchjob.expand import expand
from torchjob.jobs import load_jobs, load_jobs_from_text
from torchjob.spec.model import Job
from torchjob.targets import for_cluster

REPO = Path(__file__).resolve().parent.parent
KINDS = REPO / "examples" / "kinds"
pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(
        not (REPO.parent / "shared" / "crds").is_dir() and not os.environ.get("TORCHJOB_SHARED"),
        reason="the CRD schemas (../shared/crds) are not beside the checkout",
    ),
]

ADDRESSES = ("MASTER_ADDR", "PET_MASTER_ADDR")
# The training operator's elastic env (elastic.go), which its simulation does not give: checked on
# its own below.
ELASTIC = ("PET_RDZV_ENDPOINT", "PET_RDZV_BACKEND", "PET_NNODES", "PET_MAX_RESTARTS")
INDEX = "batch.kubernetes.io/job-completion-index"


def _variants() -> list[tuple[str, str]]:
    ptj = yaml.safe_load((KINDS / "pytorchjob.yaml").read_text())
    numbered = {**ptj, "spec": {**ptj["spec"], "nprocPerNode": "2"}}
    numbered["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] = 3
    numbered["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]["ports"] = [
        {"name": "pytorchjob-port", "containerPort": 29400}
    ]
    workers_only = {
        **ptj,
        "spec": {"pytorchReplicaSpecs": {"Worker": ptj["spec"]["pytorchReplicaSpecs"]["Worker"]}},
    }
    tj = yaml.safe_load((KINDS / "trainjob.yaml").read_text())
    tj["spec"]["trainer"]["numNodes"] = 3
    tj["spec"]["trainer"]["numProcPerNode"] = 4
    two = yaml.safe_load((KINDS / "jobset.yaml").read_text())
    leader = {"name": "leader", "template": two["spec"]["replicatedJobs"][0]["template"]}
    leader = yaml.safe_load(yaml.safe_dump(leader))
    leader["template"]["spec"].update(parallelism=1, completions=1)
    two["spec"]["replicatedJobs"].insert(0, leader)
    two["spec"]["replicatedJobs"][1]["replicas"] = 2
    two["metadata"]["name"] = "two"
    for rjob in two["spec"]["replicatedJobs"]:  # the leader's pod is the rendezvous
        container = rjob["template"]["spec"]["template"]["spec"]["containers"][0]
        container["env"][0]["value"] = "two-leader-0-0.two"
    return [
        ("numbered", yaml.safe_dump(numbered)),
        ("workers-only", yaml.safe_dump(workers_only)),
        ("four-per-node", yaml.safe_dump(tj)),
        ("leader-and-workers", yaml.safe_dump(two)),
    ]


CASES = [(p.name, p.read_text()) for p in sorted(KINDS.glob("*.yaml"))] + _variants()


def _job(text: str) -> Job:
    (loaded,) = load_jobs_from_text(text)
    return loaded.job


def _key(pod: dict[str, Any]) -> str:
    """A pod's name without the Job controller's random suffix: torchjob's name of it."""
    name = str(pod["metadata"]["name"])
    return name.rsplit("-", 1)[0] if INDEX in (pod["metadata"].get("labels") or {}) else name


def _containers(pod: dict[str, Any]) -> list[str]:
    spec = pod["spec"]
    return [c["name"] for c in [*(spec.get("initContainers") or []), *spec["containers"]]]


def _controllers(job: Job) -> tuple[dict[str, dict[str, dict[str, str]]], dict[str, Any]]:
    """What the kind's controllers give each pod: env by pod and container, and each process."""
    assert job.kind is not None
    objects = for_cluster(job, job.kind.target, "default").objects
    with simulated(objects, job.kind.target) as api:
        pods = all_of(api, "v1", "Pod")
        envs = {_key(p): {c: pod_env(p, c, api) for c in _containers(p)} for p in pods}
        procs = {}
        for pod in pods:
            for proc in processes(pod, api):
                reached = (
                    [_key(p) for p in resolve(api, "default", proc.master_addr)] if proc.master_addr else []
                )
                procs[(_key(pod), proc.local_rank)] = (proc.rank, proc.world_size, reached, proc.master_port)
    return envs, procs


def _named(value: str) -> str:
    """The pod a cluster address of torchjob's names (``<pod>.<subdomain>``)."""
    return value.split(".")[0]


@pytest.mark.parametrize(("name", "text"), CASES, ids=[c[0] for c in CASES])
def test_each_pods_env_is_its_controllers(name: str, text: str) -> None:
    job = _job(text)
    want, want_procs = _controllers(job)
    state = expand(job, ClusterAddressing())
    got = {p.name: {c: pod_env(p.manifest, c) for c in _containers(p.manifest)} for p in state.pods}
    assert sorted(got) == sorted(want), name
    for pod, containers in want.items():
        for container, env in containers.items():
            mine = dict(got[pod][container])
            # Kubernetes' Job controller gives an Indexed Job's pods their index; the simulation does not.
            if "JOB_COMPLETION_INDEX" in mine and "JOB_COMPLETION_INDEX" not in env:
                assert mine.pop("JOB_COMPLETION_INDEX") == pod.rsplit("-", 1)[1]
            if "--elastic" in job.spec.plugins.get("kubeflow", []):
                assert all(mine.pop(k) for k in ELASTIC if k not in env)
            for key in ADDRESSES:
                if key in env and key in mine and env[key] != mine[key]:
                    # the operator's Service name (<job>-master-0) or torchjob's pod name for it
                    assert _named(mine.pop(key)) == _named(env.pop(key)), (pod, key)
            assert mine == env, f"{name}: {pod}/{container}"
    got_procs = {}
    for plan in state.pods:
        for proc in processes(plan.manifest):
            named = _named(proc.master_addr) if proc.master_addr else None
            reached = [named] if named in got else []
            got_procs[(plan.name, proc.local_rank)] = (proc.rank, proc.world_size, reached, proc.master_port)
    if "--elastic" not in job.spec.plugins.get("kubeflow", []):  # the simulation has no elastic env
        assert got_procs == want_procs, name


@pytest.mark.parametrize(("name", "text"), CASES, ids=[c[0] for c in CASES])
def test_here_each_pod_reaches_the_same_pods_at_their_addresses(name: str, text: str) -> None:
    """On this machine (pods without names: loopback addresses, ports mapped) the env names the
    same pods and ports, as the local engine reaches them."""
    job = _job(text)
    ports = {port: 40000 + i for i, port in enumerate(declared_ports(job))}
    local = LocalAddressing(job, ports)
    cluster = {p.name: p.manifest for p in expand(job, ClusterAddressing()).pods}
    addresses = {
        f"{job.name}-{t.name}-{i}": local.address_of(t.name, i)
        for t in job.spec.tasks
        for i in range(t.replicas)
    }
    for plan in expand(job, local).pods:
        for container in _containers(plan.manifest):
            here, there = pod_env(plan.manifest, container), pod_env(cluster[plan.name], container)
            assert here.keys() - {"PET_RDZV_CONF"} == there.keys()
            for key, value in there.items():
                host, colon, port = value.rpartition(":")
                if colon and _named(host) in addresses and port.isdigit():
                    assert here[key] == f"{addresses[_named(host)]}:{ports[int(port)]}", (plan.name, key)
                elif _named(value) in addresses:
                    assert here[key] == addresses[_named(value)], (plan.name, key)
                elif key.endswith("PORT") and value.isdigit() and int(value) in ports:
                    assert here[key] == str(ports[int(value)]), (plan.name, key)
                elif key != "PET_RDZV_CONF":
                    assert here[key] == value, (plan.name, key)


def test_an_elastic_pytorchjobs_rendezvous_is_worker_zeros() -> None:
    """The operator's elastic env (the simulation has none of it): worker 0's Service and port,
    the node range, the restarts, the backend; here worker 0 is told it hosts the store."""
    (loaded,) = load_jobs(str(KINDS / "pytorchjob-elastic.yaml"))
    job = loaded.job
    envs = {p.name: pod_env(p.manifest) for p in expand(job, ClusterAddressing()).pods}
    for env in envs.values():
        assert env["PET_RDZV_ENDPOINT"] == "pytorchjob-elastic-worker-0.pytorchjob-elastic:23456"
        assert (env["PET_NNODES"], env["PET_MAX_RESTARTS"], env["PET_RDZV_BACKEND"]) == ("1:2", "3", "c10d")
        assert "RANK" not in env and "MASTER_ADDR" not in env and "PET_RDZV_CONF" not in env
    local = LocalAddressing(job, {23456: 41000})
    here = {p.name: pod_env(p.manifest) for p in expand(job, local).pods}
    assert here["pytorchjob-elastic-worker-0"]["PET_RDZV_CONF"] == "is_host=1"
    assert here["pytorchjob-elastic-worker-1"]["PET_RDZV_CONF"] == "is_host=0"
    assert here["pytorchjob-elastic-worker-1"]["PET_RDZV_ENDPOINT"] == "127.0.1.1:41000"


def test_where_pod_names_resolve_a_pytorchjob_names_the_operators_services() -> None:
    """The operator gives MASTER_ADDR (and PET_MASTER_ADDR) as the master's own Service,
    ``<job>-master-0``, and an elastic job's rendezvous as ``<job>-worker-0:port``: so do the local
    engine's pods where pod names resolve (its job network lists each pod's name). Without names
    they get the pod's loopback address; the objects rendered for a cluster keep the pod's DNS name."""
    (loaded,) = load_jobs(str(KINDS / "pytorchjob.yaml"))
    job = loaded.job
    named = LocalAddressing(job, {23456: 41000}, names=True)
    for plan in expand(job, named).pods:
        env = pod_env(plan.manifest)
        assert env["MASTER_ADDR"] == env["PET_MASTER_ADDR"] == "pytorchjob-sendrecv-master-0", plan.name
        assert env["MASTER_PORT"] == "41000"
    for plan in expand(job, LocalAddressing(job, {23456: 41000})).pods:
        assert pod_env(plan.manifest)["MASTER_ADDR"] == "127.0.1.1", plan.name
    for plan in expand(job, ClusterAddressing()).pods:
        assert pod_env(plan.manifest)["MASTER_ADDR"] == "pytorchjob-sendrecv-master-0.pytorchjob-sendrecv"
    (loaded,) = load_jobs(str(KINDS / "pytorchjob-elastic.yaml"))
    job = loaded.job
    for plan in expand(job, LocalAddressing(job, {23456: 41000}, names=True)).pods:
        assert pod_env(plan.manifest)["PET_RDZV_ENDPOINT"] == "pytorchjob-elastic-worker-0:41000", plan.name
