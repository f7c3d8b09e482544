"""Hand-built target objects and a pretend controller for the kubernetes engine tests.

The engine renders with ``torchjob.targets.render_target``. These tests check the client side,
not the rendering, so ``hand_render`` stands in for it with small objects of each target that
carry the job label, and ``Controller`` plays the cluster's controller: it makes the pods of a
created job and moves them and the job through their states as a test says.
"""

from __future__ import annotations

import sys
import types
from typing import Any

from torchjob.records import field, record

JOB_LABEL = "torchjob.io/job-name"

API = {
    "volcano": ("batch.volcano.sh/v1alpha1", "Job"),
    "kubeflow": ("kubeflow.org/v1", "PyTorchJob"),
    "jobset": ("jobset.x-k8s.io/v1alpha2", "JobSet"),
    "trainjob": ("trainer.kubeflow.org/v1alpha1", "TrainJob"),
}


@record
class TargetRender:
    objects: list[dict[str, Any]]
    warnings: list[tuple[str, str]] = field(default_factory=list)
    kind: str = ""
    api_version: str = ""


def _meta(name: str, namespace: str, job: str | None = None) -> dict[str, Any]:
    return {"name": name, "namespace": namespace, "labels": {JOB_LABEL: job or name}}


def _container(name: str, image: str = "busybox:1.36") -> dict[str, Any]:
    return {"name": name, "image": image, "command": ["sh", "-c", "echo hi"]}


def hand_render(job: Any, target: str, *, runtime: str | None = None) -> TargetRender:
    """Small objects of each target for ``job`` (its name, namespace and tasks), with the label."""
    name, namespace = job.metadata.name, job.metadata.namespace
    tasks = [(t.name, t.replicas) for t in job.spec.tasks]
    template = {"metadata": {"labels": {JOB_LABEL: name}}}
    if target == "pods":
        objects: list[dict[str, Any]] = [
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": _meta(f"{name}-svc", namespace, name),
                "data": {},
            }
        ]
        for task, replicas in tasks:
            for i in range(replicas):
                pod = {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": _meta(f"{name}-{task}-{i}", namespace, name),
                    "spec": {"containers": [_container(task)], "restartPolicy": "Never"},
                }
                pod["metadata"]["labels"].update(
                    {"volcano.sh/task-spec": task, "volcano.sh/task-index": str(i)}
                )
                objects.append(pod)
        return TargetRender(objects, [], "Pod", "v1")
    api_version, kind = API[target]
    if target == "volcano":
        spec: dict[str, Any] = {
            "tasks": [
                {"name": t, "replicas": r, "template": {**template, "spec": {"containers": [_container(t)]}}}
                for t, r in tasks
            ]
        }
    elif target == "kubeflow":
        spec = {
            "pytorchReplicaSpecs": {
                t.capitalize(): {
                    "replicas": r,
                    "template": {**template, "spec": {"containers": [_container("pytorch")]}},
                }
                for t, r in tasks
            }
        }
    elif target == "jobset":
        spec = {
            "replicatedJobs": [
                {
                    "name": t,
                    "replicas": 1,
                    "template": {"spec": {"parallelism": r, "completions": r, "template": template}},
                }
                for t, r in tasks
            ]
        }
    else:
        spec = {
            "runtimeRef": {"name": runtime or "torch-distributed"},
            "trainer": {"numNodes": sum(r for _, r in tasks)},
        }
    obj = {"apiVersion": api_version, "kind": kind, "metadata": _meta(name, namespace), "spec": spec}
    return TargetRender(
        [obj], [("spec.x", "dropped for this test")] if target == "trainjob" else [], kind, api_version
    )


def hand_for_cluster(
    job: Any, target: str, namespace: str, env: dict[str, str] | None = None, *, runtime: str | None = None
) -> TargetRender:
    """``hand_render``'s objects placed as the real ``for_cluster`` places them (namespace, --env)."""
    from torchjob.records import replace
    from torchjob.target_api.common import add_env_to_containers

    job = replace(job, metadata=replace(job.metadata, namespace=namespace))
    rendered = hand_render(job, target, runtime=runtime)
    add_env = _real_targets().get_target(target).add_env or add_env_to_containers
    for obj in rendered.objects:
        obj.setdefault("metadata", {})["namespace"] = namespace
        if env:
            add_env(obj, env)
    return rendered


def _real_targets() -> types.ModuleType:
    """The real targets package, every target module loaded (before a stand-in takes its place)."""
    import torchjob.targets as real

    real.all_targets()
    import torchjob.target_api.common  # noqa: F401

    return real


def stand_in_targets_module() -> types.ModuleType:
    """Renders by hand; how each target is read back (kinds, status, pod labels) is the real one."""
    real = _real_targets()
    module = types.ModuleType("torchjob.targets")
    module.render_target = hand_render  # type: ignore[attr-defined]
    module.for_cluster = hand_for_cluster  # type: ignore[attr-defined]
    module.JOB_LABEL = JOB_LABEL  # type: ignore[attr-defined]
    for name in ("get_target", "all_targets", "target_names", "MODULES"):
        setattr(module, name, getattr(real, name))
    return module


def install_stand_in(monkeypatch: Any, *, only_if_missing: bool = False) -> None:
    """Put ``hand_render`` where the engine imports the renderer from (undone after the test)."""
    if only_if_missing:
        try:
            __import__("torchjob.targets")
            return
        except ImportError:
            pass
    monkeypatch.setitem(sys.modules, "torchjob.targets", stand_in_targets_module())


# ---------------------------------------------------------------------- the demo job's file

PYTORCH_PLUGIN = '  plugins:\n    pytorch: ["--master=master", "--worker=worker", "--port=23456"]\n'
CLAIM_VOLUME = (
    "  volumes:\n"
    "    - mountPath: /ckpt\n"
    "      volumeClaim: {accessModes: [ReadWriteOnce], resources: {requests: {storage: 1Gi}}}\n"
)


def demo_job(
    name: str = "demo",
    *,
    workers: int = 1,
    min_available: int | None = None,
    pytorch: bool = True,
    pytorch_defaults: bool = False,
    volume: bool = False,
    extra: str = "",
) -> str:
    """The Volcano Job file the kubernetes tests send: one master and ``workers`` workers, each a
    busybox container that echoes once and is never restarted. ``min_available`` defaults to every
    pod; ``pytorch`` adds the pytorch plugin (``pytorch_defaults``: without flags, Volcano's
    defaults, ``{pytorch: []}``), ``volume`` a claim the job's pods mount at /ckpt, ``extra`` more
    lines of ``spec`` (unindented: ``ttlSecondsAfterFinished: 0``)."""
    spec = f"  minAvailable: {workers + 1 if min_available is None else min_available}\n"
    spec += CLAIM_VOLUME if volume else ""
    spec += "".join(f"  {line}\n" for line in extra.splitlines())
    if pytorch:
        spec += "  plugins: {pytorch: []}\n" if pytorch_defaults else PYTORCH_PLUGIN
    tasks = "".join(
        f"""\
    - replicas: {replicas}
      name: {task}
      template:
        spec:
          containers:
            - {{name: {task}, image: busybox:1.36, command: [sh, -c, "echo hi"]}}
          restartPolicy: Never
"""
        for task, replicas in (("master", 1), ("worker", workers))
    )
    head = f"apiVersion: batch.volcano.sh/v1alpha1\nkind: Job\nmetadata:\n  name: {name}\nspec:\n"
    return f"{head}{spec}  tasks:\n{tasks}"


# ---------------------------------------------------------------------- pods as a controller makes them

POD_TASK_LABELS = {
    "volcano": ("volcano.sh/task-spec", "volcano.sh/task-index"),
    "kubeflow": ("training.kubeflow.org/replica-type", "training.kubeflow.org/replica-index"),
    # The jobset target: one one-pod Job per replica, so the pod's index is its Job's index.
    "jobset": ("jobset.sigs.k8s.io/replicatedjob-name", "jobset.sigs.k8s.io/job-index"),
    # A TrainJob's runtime: one Indexed Job of numNodes pods.
    "trainjob": ("jobset.sigs.k8s.io/replicatedjob-name", "batch.kubernetes.io/job-completion-index"),
}


def make_pod(
    job: str,
    task: str,
    index: int,
    *,
    target: str = "volcano",
    owner: dict[str, Any] | None = None,
    namespace: str = "default",
    rank: int | None = None,
    image: str = "busybox:1.36",
) -> dict[str, Any]:
    task_key, index_key = POD_TASK_LABELS[target]
    labels = {JOB_LABEL: job, task_key: task, index_key: str(index)}
    if target == "jobset":
        labels["batch.kubernetes.io/job-completion-index"] = "0"
    container = _container(task, image)
    if rank is not None:
        container["env"] = [{"name": "RANK", "value": str(rank)}]
    pod: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"{job}-{task}-{index}", "namespace": namespace, "labels": labels},
        "spec": {"containers": [container]},
        "status": {"phase": "Pending"},
    }
    if owner is not None:
        pod["metadata"]["ownerReferences"] = [
            {
                "apiVersion": owner["apiVersion"],
                "kind": owner["kind"],
                "name": owner["metadata"]["name"],
                "uid": owner["metadata"]["uid"],
                "controller": True,
            }
        ]
    return pod


def running(pod: dict[str, Any], started: str = "2026-01-01T00:00:00Z") -> dict[str, Any]:
    name = pod["spec"]["containers"][0]["name"]
    pod["status"] = {
        "phase": "Running",
        "startTime": started,
        "podIP": "10.0.0.1",
        "containerStatuses": [
            {"name": name, "restartCount": 0, "state": {"running": {"startedAt": started}}}
        ],
    }
    return pod


def terminated(pod: dict[str, Any], code: int, finished: str = "2026-01-01T00:01:00Z") -> dict[str, Any]:
    name = pod["spec"]["containers"][0]["name"]
    pod["status"] = {
        "phase": "Succeeded" if code == 0 else "Failed",
        "startTime": "2026-01-01T00:00:00Z",
        "containerStatuses": [
            {
                "name": name,
                "restartCount": 0,
                "state": {
                    "terminated": {
                        "exitCode": code,
                        "reason": "Completed" if code == 0 else "Error",
                        "finishedAt": finished,
                    }
                },
            }
        ],
    }
    return pod


def waiting(pod: dict[str, Any], reason: str, message: str = "") -> dict[str, Any]:
    name = pod["spec"]["containers"][0]["name"]
    pod["status"] = {
        "phase": "Pending",
        "containerStatuses": [
            {"name": name, "restartCount": 0, "state": {"waiting": {"reason": reason, "message": message}}}
        ],
    }
    return pod


def unschedulable(pod: dict[str, Any], message: str) -> dict[str, Any]:
    pod["status"] = {
        "phase": "Pending",
        "conditions": [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": message,
                "lastTransitionTime": "2026-01-01T00:00:00Z",
            }
        ],
    }
    return pod


# What each target's controller writes when the job ends.
TERMINAL_STATUS: dict[str, dict[str, dict[str, Any]]] = {
    "volcano": {
        phase: {"state": {"phase": phase, "reason": f"test {phase}"}}
        for phase in ("Completed", "Failed", "Aborted", "Terminated")
    },
    "kubeflow": {
        "Completed": {
            "conditions": [{"type": "Succeeded", "status": "True", "reason": "PyTorchJobSucceeded"}]
        },
        "Failed": {"conditions": [{"type": "Failed", "status": "True", "reason": "PyTorchJobFailed"}]},
    },
    "jobset": {
        "Completed": {"conditions": [{"type": "Completed", "status": "True", "reason": "AllJobsCompleted"}]},
        "Failed": {"conditions": [{"type": "Failed", "status": "True", "reason": "FailedJobs"}]},
    },
    "trainjob": {
        "Completed": {"conditions": [{"type": "Complete", "status": "True", "reason": "JobsCompleted"}]},
        "Failed": {"conditions": [{"type": "Failed", "status": "True", "reason": "DeadlineExceeded"}]},
    },
}
