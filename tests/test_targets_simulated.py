"""Each target's objects as its controllers run them: what every pod and training process gets.

The objects ``submit`` sends (``targets.for_cluster``) are created on a simulated cluster
(tests/controllers/cluster.py: every admission step with ``fieldValidation=Strict``, then the
target's controllers, scheduler and kubelet) and the pods they make are read as the kubelet starts
them: each container's environment resolved, each training process's rank, world size and master
as torch.distributed (or torchrun) will take them, and the master's address looked up in the
cluster's DNS. The Volcano target, run by the simulation of Volcano's own controller and plugins,
is the reference every other target must agree with.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from controllers.cluster import simulated
from controllers.dns import resolve
from controllers.envs import Process, pod_env, processes
from torchjob import Master, PyTorch, Resources, Worker, task
from torchjob.errors import SpecError
from torchjob.jobs import load_jobs, load_jobs_from_text
from torchjob.quick import quick_job
from torchjob.spec.model import Job
from torchjob.targets import for_cluster, target_names

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.skipif(
    not (REPO.parent / "shared" / "crds").is_dir() and not os.environ.get("TORCHJOB_SHARED"),
    reason="the CRD schemas (../shared/crds) are not beside the checkout",
)

TORCHRUN = (
    '[torchrun, --nnodes=3, "--node-rank=$(RANK)", "--master-addr=$(MASTER_ADDR)", '
    '"--master-port=$(MASTER_PORT)", train.py]'
)
INIT = '          initContainers:\n            - {name: prepare, image: "busybox:1.36", command: ["true"]}\n'


def _volcano_job(name: str, tasks: list[tuple[str, int, str]], init: bool, env_plugin: bool) -> str:
    text = f"""\
apiVersion: batch.volcano.sh/v1alpha1
kind: Job
metadata: {{name: {name}}}
spec:
  minAvailable: {sum(t[1] for t in tasks)}
  plugins:
    pytorch: ["--master=master", "--worker=worker", "--port=29400"]
"""
    text += "    env: []\n" if env_plugin else ""
    text += "  tasks:\n"
    for task_name, replicas, command in tasks:
        text += f"""\
    - name: {task_name}
      replicas: {replicas}
      template:
        spec:
          restartPolicy: Never
{INIT if init else ""}\
          containers:
            - {{name: main, image: "registry.example/train:1", command: {command}}}
"""
    return text


# A job of every kind Volcano's plugins wire: a task that is neither master nor worker (pytorch
# gives it the master's address and the world size, no rank), the env plugin's task index in
# every container and init container, and a command that runs torchrun without saying how many
# processes (torchrun then reads PET_NPROC_PER_NODE: "auto" would start one per CPU or GPU).
WIRED = _volcano_job(
    "wired",
    [("master", 1, TORCHRUN), ("worker", 2, TORCHRUN), ("evaluator", 1, "[python, evaluate.py]")],
    init=True,
    env_plugin=True,
)
# Its torchrun pods alone, for the targets that take only a master and workers alike.
TWO_TASKS = _volcano_job("two-tasks", [("master", 1, TORCHRUN), ("worker", 2, TORCHRUN)], False, False)


def _job(which: str) -> Job:
    if which in ("wired", "two-tasks"):
        return load_jobs_from_text(WIRED if which == "wired" else TWO_TASKS, f"{which}.yaml")[0].job
    if which == "quick":
        script = REPO / "examples" / "programs" / "ddp_train.py"
        return quick_job("3x2", str(script), ["--steps", "5"], local=False, image="registry.example/t:1").job
    return load_jobs(str(REPO / "examples" / f"{which}.yaml"))[0].job


JOBS = ("pytorch-job", "ddp-train", "quick", "wired", "two-tasks")


def _pods(api: Any) -> list[dict[str, Any]]:
    return sorted(api.objects_of("v1", "Pod"), key=lambda p: str(p["metadata"]["name"]))


def _short(job: Job, pod: dict[str, Any], target: str) -> str:
    from torchjob.engines.kubernetes.phase import pod_identity

    task_name, index = pod_identity(job.name, pod, target)
    return f"{task_name}-{index}"


@pytest.mark.parametrize("target", target_names())
@pytest.mark.parametrize("which", JOBS)
def test_every_process_sees_one_world_and_reaches_its_master(which: str, target: str) -> None:
    """The ranks are 0..N-1 once each, every process agrees on the world size and the master, the
    master's address resolves to the pod of rank 0, and N is what Volcano's controller gives."""
    job = _job(which)
    try:
        objects = for_cluster(job, target, "default").objects
    except SpecError:
        assert target in ("kubeflow", "trainjob") and which == "wired"  # an evaluator task
        return
    with simulated(objects, target) as api:
        pods = _pods(api)
        ranked: list[Process] = [
            p for pod in pods for p in processes(pod, api) if p.rank is not None or p.world_size is not None
        ]
        ranks = sorted(p.rank for p in ranked if p.rank is not None)
        worlds = {p.world_size for p in ranked}
        masters = {(p.master_addr, p.master_port) for p in ranked}
        assert len(worlds) == 1 and len(masters) == 1, (worlds, masters)
        assert ranks == list(range(len(ranks))) and ranks, ranks
        (world,) = worlds
        assert world == len(ranks), f"WORLD_SIZE {world} for {len(ranks)} ranks"
        ((address, _),) = masters
        rank0 = next(p.pod for p in ranked if p.rank == 0)
        assert address and [q["metadata"]["name"] for q in resolve(api, "default", address)] == [rank0]
    assert len(ranks) == _reference_world(job)


def _reference_world(job: Job) -> int:
    """The world size Volcano's controller gives the same job (the reference)."""
    objects = for_cluster(job, "volcano", "default").objects
    with simulated(objects, "volcano") as api:
        return sum(1 for pod in _pods(api) for p in processes(pod, api) if p.rank is not None)


PLUGIN_ENV = ("MASTER_PORT", "WORLD_SIZE", "RANK", "VK_TASK_INDEX", "VC_TASK_INDEX")


def _plugin_env(job: Job, target: str) -> dict[tuple[str, str], dict[str, str]]:
    """(pod short name, container) -> the variables Volcano's pytorch and env plugins set, and
    MASTER_ADDR as the short name of the pod it reaches."""
    objects = for_cluster(job, target, "default").objects
    out: dict[tuple[str, str], dict[str, str]] = {}
    with simulated(objects, target) as api:
        for pod in _pods(api):
            short = _short(job, pod, target)
            spec = pod["spec"]
            for container in [*spec["containers"], *(spec.get("initContainers") or [])]:
                env = pod_env(pod, container["name"], api)
                seen = {k: env[k] for k in PLUGIN_ENV if k in env}
                if "MASTER_ADDR" in env:
                    reached = resolve(api, "default", env["MASTER_ADDR"])
                    seen["MASTER_ADDR"] = ",".join(_short(job, q, target) for q in reached) or "(none)"
                out[(short, container["name"])] = seen
    return out


@pytest.mark.parametrize("target", ["jobset", "pods"])
def test_every_task_and_container_is_wired_as_volcanos_plugins_wire_it(target: str) -> None:
    """jobset and pods carry every task: each container and init container gets what Volcano's
    pytorch and env plugins give it (the evaluator the master's address and world size, no
    rank; every container its task index)."""
    job = _job("wired")
    reference = _plugin_env(job, "volcano")
    assert reference[("evaluator-0", "main")]["MASTER_ADDR"] == "master-0"
    assert reference[("worker-1", "prepare")]["VC_TASK_INDEX"] == "1"
    assert _plugin_env(job, target) == reference


def test_the_training_operator_gives_one_process_per_pod() -> None:
    """A command running torchrun without --nproc-per-node reads PET_NPROC_PER_NODE, which the
    operator sets from nprocPerNode: left at its default "auto", each CPU pod would start one
    process per CPU of its node."""
    job = _job("two-tasks")
    objects = for_cluster(job, "kubeflow", "default").objects
    with simulated(objects, "kubeflow") as api:
        per_pod = {pod["metadata"]["name"]: len(processes(pod, api)) for pod in _pods(api)}
    assert set(per_pod.values()) == {1}, per_pod


def train() -> None:
    pass


def _requests_only() -> Job:
    asked = Resources(cpu="1", mem="1Gi")
    config = PyTorch(master=Master(requests=asked), worker=Worker(replicas=1, requests=asked))
    return task(task_config=config)(train).to_job()


def test_an_sdk_task_gets_the_qos_class_flyte_gives_it() -> None:
    """Flyte completes a task's limits from its requests, so a task that asks only for requests
    runs Guaranteed under Flyte; on kubeflow too (the API server alone would make it Burstable)."""
    objects = for_cluster(_requests_only(), "kubeflow", "default").objects
    with simulated(objects, "kubeflow") as api:
        classes = {pod["status"]["qosClass"] for pod in _pods(api)}
    assert classes == {"Guaranteed"}


def _named(name: str, extra: str = "") -> Job:
    command = "[python, t.py]"
    text = _volcano_job(name, [("m", 1, command), ("w", 2, command)], False, False)
    text = text.replace("--master=master", "--master=m").replace("--worker=worker", "--worker=w")
    return load_jobs_from_text(text.replace("  minAvailable:", extra + "  minAvailable:"), "named.yaml")[
        0
    ].job


@pytest.mark.parametrize("target", ["kubeflow", "jobset", "trainjob"])
def test_a_job_name_is_refused_or_its_controller_makes_every_name(target: str) -> None:
    """Around the longest name that fits, a job is either refused before it is sent, or its
    controller makes every pod and Service and its master resolves: never a job that cannot start."""
    outcomes = []
    for length in range(45, 60):
        name = ("n" * length)[:length]
        job = _named(name)
        try:
            objects = for_cluster(job, target, "default").objects
        except SpecError as err:
            assert "the longest job name that fits is" in str(err), err
            outcomes.append("refused")
            continue
        with simulated(objects, target) as api:
            assert not api.refused, api.refused
            pods = _pods(api)
            assert len(pods) == 3
            for pod in pods:
                for process in processes(pod, api):
                    assert process.master_addr and resolve(api, "default", process.master_addr)
        outcomes.append("runs")
    assert "refused" in outcomes and "runs" in outcomes  # the limit lies in the range tried


@pytest.mark.parametrize("target", ["kubeflow", "jobset", "trainjob"])
def test_a_job_that_names_volcano_runs_on_the_default_scheduler_and_is_told(target: str) -> None:
    """A job that names Volcano's scheduler itself (examples/pytorch-job.yaml does): without the
    PodGroups Volcano's controller makes, Volcano would not gang-schedule these pods. The target
    drops it, with a warning, and the cluster's default scheduler places every pod."""
    job = _named("demo", "  schedulerName: volcano\n")
    rendered = for_cluster(job, target, "default")
    assert [p for p, _ in rendered.warnings if p == "spec.schedulerName"], rendered.warnings
    with simulated(rendered.objects, target) as api:
        pods = _pods(api)
        assert pods and all(p["spec"].get("nodeName") for p in pods)
