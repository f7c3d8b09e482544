"""A task's configuration becomes a torchjob Job, checked exactly like a YAML job.

The Job is built as the document a user would write (a ``master`` task of one replica and, for
more than one node, a ``worker`` task, with the ``pytorch`` plugin), then goes through
:func:`torchjob.jobs.check_document` so that defaults, validation and plugin checks are the
same ones YAML gets. The elastic settings and run policy, which Volcano's schema has no place for,
are then set on the Job's own ``elastic`` and ``run_policy`` fields for the cluster targets.

Mapping choices (Kubeflow/Flyte semantics on a Volcano job):
- ``PyTorch``: master x1 + worker xN; restart policies default to ``Never`` as in Flyte's backend.
- ``Elastic``: ``max_nodes`` pods in total (master x1 + worker x(max-1)); the rendezvous endpoint
  is the master pod's address and port; the job may start once ``min_nodes`` pods are scheduled.
- The job completes when the master task completes (Kubeflow ends a job on the master's success);
  a failed pod terminates the job, or restarts it up to ``backoff_limit`` times (``maxRetry`` is
  ``backoff_limit + 1``: Volcano's maxRetry counts the runs, the first one included). A task called
  from Python locally waits for every pod instead, so that no rank's exception is lost.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from torchjob.errors import SpecError
from torchjob.logs import get_logger
from torchjob.sdk.config import Elastic, PyTorch, Resources, RestartPolicy
from torchjob.spec import model

INT32_MAX = 2**31 - 1  # maxRetry is an int32

logger = get_logger()

DEFAULT_IMAGE = "pytorch/pytorch:latest"
CONTAINER = "pytorch"
MASTER = "master"
WORKER = "worker"
PORT = 23456
ENTRYPOINT_MODULE = "torchjob.sdk.entrypoint"
# Pod names are <job>-<task>-<index> and must fit a 63-character DNS label.
MAX_JOB_NAME = 40


@dataclass
class ReplicaSettings:
    """What one task of the job gets: image, resources and restart policy."""

    image: str
    requests: Resources | None
    limits: Resources | None
    restart_policy: RestartPolicy | None


@dataclass
class JobRequest:
    """Everything :func:`build_job` needs; the Task fills it in."""

    name: str
    config: PyTorch | Elastic | None
    image: str | None
    requests: Resources | None
    limits: Resources | None
    env: dict[str, str]
    # How the pod finds the function: ["--task", "file.py:fn"] or ["--payload", FILE, "--results", DIR].
    target: list[str]
    python: str = "python"
    run_id: str | None = None
    # Kubeflow's rule: the job completes when the master does. A local caller sets it False: its
    # call must wait for every rank, or a worker's exception is lost when the master ends first.
    complete_with_master: bool = True


def job_name(function_name: str) -> str:
    """A DNS-1123 label from a Python name: ``train_MNIST`` -> ``train-mnist``."""
    name = re.sub(r"[^a-z0-9-]+", "-", function_name.lower()).strip("-")
    return name[:MAX_JOB_NAME].rstrip("-") or "task"


def elastic_args(config: Elastic, run_id: str) -> list[str]:
    """The entrypoint flags that describe an elastic launch (the torchrun equivalent)."""
    return [
        "--elastic",
        "--nnodes", config.nnodes_text,
        "--nproc-per-node", str(config.nproc_per_node),
        "--max-restarts", str(config.max_restarts),
        "--start-method", config.start_method,
        "--monitor-interval", str(config.monitor_interval),
        "--rdzv-backend", "c10d",
        "--rdzv-configs", json.dumps(config.rdzv_configs, sort_keys=True, separators=(",", ":")),
        "--run-id", run_id,
    ]  # fmt: skip


def _container(request: JobRequest, replica: ReplicaSettings, command: list[str]) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": replica.image,
        "command": command,
        "env": [{"name": "PYTHONUNBUFFERED", "value": "1"}]
        + [{"name": k, "value": str(v)} for k, v in request.env.items()],
    }
    resources: dict[str, Any] = {}
    if replica.requests is not None and replica.requests.to_k8s():
        resources["requests"] = replica.requests.to_k8s()
    if replica.limits is not None and replica.limits.to_k8s():
        resources["limits"] = replica.limits.to_k8s()
    if resources:
        container["resources"] = resources
    return container


def _template(request: JobRequest, replica: ReplicaSettings, command: list[str], shm: bool) -> dict[str, Any]:
    container = _container(request, replica, command)
    restart = (replica.restart_policy or RestartPolicy.NEVER).value
    spec: dict[str, Any] = {"restartPolicy": restart, "containers": [container]}
    if shm:  # torch's DataLoader workers need more than the container runtime's default 64 MiB
        container["volumeMounts"] = [{"name": "shm", "mountPath": "/dev/shm"}]
        spec["volumes"] = [{"name": "shm", "emptyDir": {"medium": "Memory"}}]
    return {"spec": spec}


def _replicas(request: JobRequest) -> tuple[ReplicaSettings, ReplicaSettings, int]:
    """Master settings, worker settings and the number of worker pods."""
    config = request.config
    image = request.image or DEFAULT_IMAGE

    def settings(part: Any) -> ReplicaSettings:
        return ReplicaSettings(
            image=getattr(part, "image", None) or image,
            requests=getattr(part, "requests", None) or request.requests,
            limits=getattr(part, "limits", None) or request.limits,
            restart_policy=getattr(part, "restart_policy", None),
        )

    if isinstance(config, PyTorch):
        return settings(config.master), settings(config.worker), config.workers
    base = settings(None)
    workers = config.max_nodes - 1 if isinstance(config, Elastic) else 0
    return base, base, workers


def job_document(request: JobRequest) -> dict[str, Any]:
    """The Volcano Job document for a task, as a user would write it in YAML."""
    config = request.config
    run_id = request.run_id or request.name
    command = [request.python, "-m", ENTRYPOINT_MODULE, *request.target]
    if isinstance(config, Elastic):
        command += elastic_args(config, run_id)
    shm = bool(config.increase_shared_mem) if config is not None else False
    master, worker, workers = _replicas(request)
    master_task: dict[str, Any] = {
        "name": MASTER,
        "replicas": 1,
        "template": _template(request, master, command, shm),
    }
    if request.complete_with_master:
        master_task["policies"] = [{"event": "TaskCompleted", "action": "CompleteJob"}]
    tasks: list[dict[str, Any]] = [master_task]
    if workers > 0:
        worker_task: dict[str, Any] = {
            "name": WORKER,
            "replicas": workers,
            "template": _template(request, worker, command, shm),
        }
        if isinstance(config, Elastic):
            worker_task["minAvailable"] = config.min_nodes - 1
        tasks.append(worker_task)
    spec: dict[str, Any] = {
        "plugins": {
            "pytorch": [f"--master={MASTER}", f"--worker={WORKER}", f"--port={PORT}"],
            "svc": [],
            "env": [],
        },
        "tasks": tasks,
    }
    if isinstance(config, Elastic):
        spec["minAvailable"] = config.min_nodes
    run_policy = config.run_policy if config is not None else None
    backoff = run_policy.backoff_limit if run_policy is not None else None
    if backoff:
        # backoff_limit counts restarts (as a Kubernetes Job's does); Volcano's maxRetry counts runs:
        # it fails the job on the restart that reaches it, so B restarts need maxRetry B + 1.
        spec["policies"] = [{"event": "PodFailed", "action": "RestartJob"}]
        spec["maxRetry"] = min(backoff + 1, INT32_MAX)
    else:
        spec["policies"] = [{"event": "PodFailed", "action": "TerminateJob"}]
    if run_policy is not None and run_policy.ttl_seconds_after_finished is not None:
        spec["ttlSecondsAfterFinished"] = run_policy.ttl_seconds_after_finished
    return {
        "apiVersion": model.API_VERSION,
        "kind": model.KIND,
        "metadata": {
            "name": request.name,
            "labels": {"torchjob.dev/sdk": "true"},
            "annotations": {model.ORIGIN: "task"},  # its failures are told in the user's terms
        },
        "spec": spec,
    }


def model_policies(
    config: PyTorch | Elastic | None,
) -> tuple[model.ElasticPolicy | None, model.JobRunPolicy | None]:
    """The Job's elastic and run-policy fields for a config."""
    elastic = None
    if isinstance(config, Elastic):
        rdzv = dict(config.rdzv_configs)
        elastic = model.ElasticPolicy(
            min_nodes=config.min_nodes,
            max_nodes=config.max_nodes,
            nproc_per_node=config.nproc_per_node,
            rdzv_backend="c10d",
            rdzv_timeout=int(rdzv.get("timeout", 900)),
            rdzv_join_timeout=int(rdzv.get("join_timeout", 900)),
            max_restarts=config.max_restarts,
            start_method=config.start_method,
            monitor_interval=float(config.monitor_interval),
            rdzv_configs=rdzv,
        )
    policy = config.run_policy if config is not None else None
    run_policy = None
    if policy is not None:
        run_policy = model.JobRunPolicy(
            clean_pod_policy=policy.clean_pod_policy.value if policy.clean_pod_policy else None,
            ttl_seconds_after_finished=policy.ttl_seconds_after_finished,
            active_deadline_seconds=policy.active_deadline_seconds,
            backoff_limit=policy.backoff_limit,
        )
    return elastic, run_policy


def build_job(request: JobRequest, file: str = "<sdk>") -> tuple[model.Job, Any]:
    """The checked Job and the Document it was built from; a SpecError lists every problem."""
    from torchjob.jobs import check_document  # lazy: keeps `import torchjob.sdk` light
    from torchjob.spec.source import Document

    document = Document(data=job_document(request), file=file)
    job, problems = check_document(document)
    if job is None:
        raise SpecError(problems)
    job.elastic, job.run_policy = model_policies(request.config)
    shape = ", ".join(f"{t.name} x{t.replicas}" for t in job.spec.tasks)
    if job.elastic is not None:
        e = job.elastic
        shape += (
            f"; elastic {e.min_nodes}:{e.max_nodes} nodes x {e.nproc_per_node} processes, "
            f"c10d rendezvous at the master pod's port {PORT}"
        )
    logger.debug("job %s: %s", job.name, shape)
    return job, document
