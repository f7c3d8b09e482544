"""``kubeflow``: a training-operator v1 ``PyTorchJob``, mapped the way Flyte's backend maps it.

- ``Master`` (exactly one replica) from the pytorch master task, ``Worker`` from the worker task
  (left out when there are no workers); the training container is renamed ``pytorch`` and given
  the ``pytorchjob-port`` port, which the operator reads for ``MASTER_PORT``.
- ``nprocPerNode: "1"`` unless elastic: one process per pod, not the operator's ``auto``.
- Each replica's ``restartPolicy`` is its pod template's (Kubernetes' ``Always`` when unset; the
  SDK writes ``Never`` for an unset policy, as Flyte does).
- Elastic SDK tasks: no Master, ``Worker`` x max nodes, ``elasticPolicy`` with min/max replicas,
  ``c10d``, ``nProcPerNode`` and ``maxRestarts`` (Flyte sets the deprecated ``nProcPerNode``
  field, not ``spec.nprocPerNode``, and so does this).
- ``runPolicy``: the SDK's run policy as Flyte parses it (warned where its backoff limit gives
  other than ``backoff_limit`` restarts); for YAML jobs ``cleanPodPolicy: Running``, the TTL, and a
  backoff limit of ``maxRetry`` when a failed pod restarts the job. The operator's own env
  (``MASTER_ADDR=<job>-master-0``, ``RANK``, ``WORLD_SIZE``) and init container replace the
  pytorch plugin's.
"""

from __future__ import annotations

from typing import Any

from torchjob.plugins.pytorch import PORT_NAME
from torchjob.spec.model import Job, Task
from torchjob.target_api.common import (
    SDK_LABEL,
    claim_objects,
    condition_status,
    labelled,
    metadata,
    mount_job_volumes,
    pod_scheduling,
    pytorch_roles,
    restarts_on_failure,
    scheduler_warnings,
    task_path,
    total_pods,
    volcano_warnings,
    wait_master_flags,
)
from torchjob.targets import Status, Target, TargetRender, TopKind

API_VERSION = "kubeflow.org/v1"
KIND = "PyTorchJob"
CONTAINER = "pytorch"


def _template(job: Job, task: Task, port: int, warnings: list[tuple[str, str]]) -> tuple[dict[str, Any], str]:
    """The replica's pod template and the restart policy taken out of it."""
    template = labelled(task.template.raw, job)
    spec = template["spec"]
    for key in ("hostname", "subdomain"):
        if spec.pop(key, None) is not None:
            warnings.append(
                (
                    f"{task_path(job, task)}.template.spec.{key}",
                    f"the operator names pods <job>-master-0/<job>-worker-<i>; {key} is dropped",
                )
            )
    policy = str(spec.pop("restartPolicy", None) or "Always")
    containers: list[dict[str, Any]] = spec["containers"]
    main = next((c for c in containers if c.get("name") == CONTAINER), containers[0])
    main["name"] = CONTAINER
    ports = main.setdefault("ports", [])
    if not any(p.get("name") == PORT_NAME for p in ports):
        same = next((p for p in ports if p.get("containerPort") == port), None)
        if same is not None:
            same["name"] = PORT_NAME
        else:
            ports.append({"name": PORT_NAME, "containerPort": port})
    if job.metadata.labels.get(SDK_LABEL) == "true" and main.get("resources"):
        main["resources"] = flyte_resources(main["resources"])
    mount_job_volumes(job, spec)
    pod_scheduling(job, spec)
    return template, policy


def flyte_resources(resources: dict[str, Any]) -> dict[str, Any]:
    """Requests and limits as Flyte's backend completes them (``container_helper.go``).

    For each resource the task names, a missing (or zero) request is the limit, a missing limit is
    the request, and a request above its limit is lowered to it: a task giving only limits runs
    Guaranteed, as under Flyte, not Burstable. (Flyte's platform defaults for a resource the task
    does not name at all are the cluster's own, and are not guessed here.)
    """
    from torchjob.spec.units import parse_quantity

    requests = dict(resources.get("requests") or {})
    limits = dict(resources.get("limits") or {})

    def zero(value: Any) -> bool:
        return value is None or parse_quantity(value) == 0

    for key in [*requests, *(k for k in limits if k not in requests)]:
        request, limit = requests.get(key), limits.get(key)
        if zero(request):
            request = limit
        if zero(limit):
            limit = request
        if not zero(limit) and parse_quantity(request) > parse_quantity(limit):
            request = limit
        requests[key], limits[key] = request, limit
    out = dict(resources)
    out["requests"], out["limits"] = requests, limits
    return out


def _run_policy(job: Job, restart: bool) -> dict[str, Any]:
    sdk = job.run_policy
    if sdk is not None:  # Flyte's ParseRunPolicy: zero values are left unset, cleanPodPolicy always set
        out: dict[str, Any] = {"cleanPodPolicy": sdk.clean_pod_policy or "None"}
        if sdk.backoff_limit:
            out["backoffLimit"] = sdk.backoff_limit
        if sdk.active_deadline_seconds:
            out["activeDeadlineSeconds"] = sdk.active_deadline_seconds
        if sdk.ttl_seconds_after_finished:
            out["ttlSecondsAfterFinished"] = sdk.ttl_seconds_after_finished
        return out
    # Volcano kills the pods still running or pending when a job ends and keeps the finished ones;
    # an SDK task without a run policy keeps Flyte's mapping (none: the operator's "None").
    out = {} if job.metadata.labels.get(SDK_LABEL) == "true" else {"cleanPodPolicy": "Running"}
    if job.spec.ttl_seconds_after_finished is not None:
        out["ttlSecondsAfterFinished"] = job.spec.ttl_seconds_after_finished
    if restart:
        # The operator fails the job once its pods' container restarts, summed, reach backoffLimit,
        # that is on the M-th failure: as Volcano does with maxRetry M (M - 1 restarts).
        out["backoffLimit"] = job.spec.max_retry
    # Read by the operator's gang scheduling (Volcano or scheduler-plugins) for its PodGroup.
    gang = job.elastic is None and job.spec.min_available < total_pods(job)
    if job.spec.queue != "default" or job.spec.priority_class_name or gang:
        scheduling: dict[str, Any] = {"minAvailable": job.spec.min_available}
        if job.spec.queue != "default":
            scheduling["queue"] = job.spec.queue
        if job.spec.priority_class_name:
            scheduling["priorityClass"] = job.spec.priority_class_name
        out["schedulingPolicy"] = scheduling
    return out


def _backoff_warnings(job: Job, replicas: dict[str, Any]) -> list[tuple[str, str]]:
    """Where Flyte's ``backoffLimit: B`` (kept for SDK tasks) gives other than B restarts."""
    limit = job.run_policy.backoff_limit if job.run_policy is not None else None
    if not limit:
        return []
    policies = {kind: r["restartPolicy"] for kind, r in replicas.items()}
    elsewhere = f"the local engine, volcano and jobset restart the whole job {limit} times"
    out = []
    never = [kind for kind, p in policies.items() if p == "Never"]
    if never:
        out.append(
            (
                "run_policy.backoff_limit",
                f"the operator fails the job at the first failed pod of a Never replica ({', '.join(never)}) "
                f"whatever backoffLimit says: no restart here, where {elsewhere} (Flyte's mapping is kept; "
                "RestartPolicy.FAILURE restarts pods in place)",
            )
        )
    others = [kind for kind in policies if kind not in never]
    if others:
        out.append(
            (
                "run_policy.backoff_limit",
                f"the operator fails the job when the in-place container restarts of {', '.join(others)}, "
                f"summed over its pods, reach backoffLimit {limit} ({limit - 1} restarts), where the "
                "local engine, volcano and jobset restart such pods in place without limit "
                "(Flyte's mapping is kept)",
            )
        )
    return out


def render(job: Job) -> TargetRender:
    roles = pytorch_roles(job, "kubeflow")
    warnings = volcano_warnings(job, "kubeflow", roles.master) + scheduler_warnings(job, "kubeflow")
    # A YAML job that restarts on a failed pod: the operator restarts pods, so Never must become OnFailure.
    restart = job.run_policy is None and restarts_on_failure(job)
    replicas: dict[str, Any] = {}
    elastic = job.elastic
    if elastic is not None:  # Flyte drops the Master: every pod is a worker of the rendezvous
        template, policy = _template(job, roles.master, roles.port, warnings)
        replicas["Worker"] = {"replicas": elastic.max_nodes, "restartPolicy": policy, "template": template}
    else:
        tasks = [("Master", roles.master, 1)]
        if roles.worker is not None and roles.worker.replicas > 0:
            tasks.append(("Worker", roles.worker, roles.worker.replicas))
        for kind, task, count in tasks:
            template, policy = _template(job, task, roles.port, warnings)
            if restart and policy == "Never":
                policy = "OnFailure"
                warnings.append(
                    (
                        f"{task_path(job, task)}.template.spec.restartPolicy",
                        "the PyTorchJob operator restarts failed pods rather than the whole job: "
                        "restartPolicy Never becomes OnFailure so a failed pod is retried",
                    )
                )
            replicas[kind] = {"replicas": count, "restartPolicy": policy, "template": template}
    # backoffLimit only counts the failures Volcano would restart the job for: those of Never pods.
    # Pods already OnFailure/Always restart in place without limit, under Volcano as here.
    restart = restart and any(
        t.template.restart_policy == "Never" for t in (roles.master, roles.worker) if t is not None
    )
    warnings += _backoff_warnings(job, replicas)
    for flag in wait_master_flags(job):
        warnings.append(
            (
                "spec.plugins.pytorch",
                f"the operator adds its own wait-for-master init container to workers (it resolves "
                f"the master's name, 100 tries 2 s apart unless the operator is configured otherwise); "
                f"{flag} is dropped",
            )
        )
    spec: dict[str, Any] = {"pytorchReplicaSpecs": replicas, "runPolicy": _run_policy(job, restart)}
    if elastic is None:
        # Unset, the operator defaults it to "auto": a command running torchrun would then start one
        # process per GPU (or per host CPU), not the one rank per pod every other target gives.
        spec["nprocPerNode"] = "1"
    else:
        spec["elasticPolicy"] = {
            "minReplicas": elastic.min_nodes,
            "maxReplicas": elastic.max_nodes,
            "rdzvBackend": elastic.rdzv_backend,
            "nProcPerNode": elastic.nproc_per_node,
            "maxRestarts": elastic.max_restarts,
        }
    job_object = {"apiVersion": API_VERSION, "kind": KIND, "metadata": metadata(job), "spec": spec}
    return TargetRender(KIND, API_VERSION, [*claim_objects(job), job_object], warnings)


def status(top: dict[str, Any]) -> Status:
    """The training operator's conditions; it says Restarting and Running itself."""
    return condition_status(top, "Succeeded", also=("Restarting", "Running"))


def generated(job: Job) -> list[tuple[str, str, str]]:
    """The operator names each pod and its Service <job>-<replica type>-<index> (GenGeneralName)."""
    from torchjob.plugins.pytorch import PyTorchPlugin

    if "pytorch" not in job.spec.plugins:
        return []  # refused elsewhere
    plugin = PyTorchPlugin(job.spec.plugins["pytorch"])
    worker = job.task(plugin.worker)
    workers = job.elastic.max_nodes if job.elastic is not None else (worker.replicas if worker else 0)
    what = "pod and Service"
    out = [] if job.elastic is not None else [("metadata.name", what, f"{job.name}-master-0")]
    if workers:
        out.append(("metadata.name", what, f"{job.name}-worker-{workers - 1}"))
    return out


TARGET = Target(
    name="kubeflow",
    generated=generated,
    dns1035=True,  # the PyTorchJob webhook's rule
    render=lambda job, runtime: render(job),
    top=TopKind(
        "kubeflow.org/v1",
        "PyTorchJob",
        "pytorchjobs",
        "install the Kubeflow training operator",
        versions=(("spec.nprocPerNode", "the Kubeflow training operator v1.7"),),
    ),
    preference=20,  # a PyTorchJob keeps master and workers apart
    can=frozenset({"elastic-range", "different-roles", "pod-field", "no-command"}),
    status=status,
    task_keys=("training.kubeflow.org/replica-type",),
    index_keys=("training.kubeflow.org/replica-index",),
)
