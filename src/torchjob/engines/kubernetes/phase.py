"""A target's own status and the job's pods, read as the JobReport every engine returns.

Volcano reports a phase (``status.state.phase``); PyTorchJob, JobSet and TrainJob report
conditions, and the last two have no Running condition at all, so Running/Pending come from the
pods. Pod diagnoses (an image that cannot be pulled, a pod the scheduler cannot place) are read
here too, so ``status`` and a followed job tell the same story.
"""

from __future__ import annotations

import datetime
import functools
import re
from typing import Any

from torchjob.engine_api.base import ContainerReport, JobReport, PodReport
from torchjob.phases import TERMINAL_JOB_PHASES, UNSUCCESSFUL_JOB_PHASES, ContainerState, PodState
from torchjob.records import record

IMAGE_PULL_REASONS = frozenset({"ErrImagePull", "ImagePullBackOff", "InvalidImageName"})
DEFAULT_SCHEDULER = "default-scheduler"  # what the API server puts in an empty schedulerName

_TRAILING_INDEX = re.compile(r"(.+)-(\d+)\Z")
_FIELD_PATH = re.compile(r"metadata\.(labels|annotations)\['([^']+)'\]\Z")


def timestamp(value: Any) -> float | None:
    if not value:
        return None
    try:
        return datetime.datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _meta(obj: dict[str, Any], key: str) -> str | None:
    metadata = obj.get("metadata") or {}
    for where in ("labels", "annotations"):
        value = (metadata.get(where) or {}).get(key)
        if value is not None:
            return str(value)
    return None


@functools.cache  # read for every pod of every poll
def _keys(target: str) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """The labels (then annotations) naming a pod's task, index and attempt: the target's own
    first, then every other target's (a pod of an unknown target is read as any controller
    labels it)."""
    from torchjob.targets import all_targets, target_names

    task: dict[str, None] = {}
    index: dict[str, None] = {}
    attempt: dict[str, None] = {}
    known = all_targets()
    own = [t for t in known if t.name == target] if target in target_names() else []
    for t in own + known:
        task.update(dict.fromkeys(t.task_keys))
        index.update(dict.fromkeys(t.index_keys))
        attempt.update(dict.fromkeys(t.attempt_keys))
    return tuple(task), tuple(index), tuple(attempt)


def pod_attempt(pod: dict[str, Any], target: str = "") -> int:
    """Which run of the whole job a pod belongs to, as its controller counts the job's restarts
    (Volcano's retry count, JobSet's restart attempt); 0 where the controller says none."""
    value = next((v for k in _keys(target)[2] if (v := _meta(pod, k))), "0")
    return int(value) if value.isdigit() else 0


def pod_identity(job_name: str, pod: dict[str, Any], target: str = "") -> tuple[str, int]:
    """(task, index) of a pod: from its controller's labels, else from its name."""
    task_keys, index_keys, _ = _keys(target)
    task = next((v for k in task_keys if (v := _meta(pod, k))), None)
    index = next((v for k in index_keys if (v := _meta(pod, k))), None)
    if task and index is not None and index.isdigit():
        return task.lower(), int(index)
    name = str((pod.get("metadata") or {}).get("name", ""))
    rest = name[len(job_name) + 1 :] if name.startswith(f"{job_name}-") else name
    match = _TRAILING_INDEX.match(rest)
    if task:
        return task.lower(), int(match.group(2)) if match else 0
    return (match.group(1), int(match.group(2))) if match else (rest, 0)


def env_value(pod: dict[str, Any], name: str) -> str | None:
    """What variable ``name`` of the pod's first container is: a literal value, or the pod label or
    annotation its ``fieldRef`` reads (as the kubelet resolves it); None when neither."""
    containers = (pod.get("spec") or {}).get("containers") or []
    for env in (containers[0].get("env") or []) if containers else []:
        if env.get("name") != name:
            continue
        if "value" in env:
            return str(env["value"])
        path = str(((env.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath", ""))
        found = _FIELD_PATH.match(path)
        if found:
            value = ((pod.get("metadata") or {}).get(found.group(1)) or {}).get(found.group(2))
            return None if value is None else str(value)
    return None


def pod_rank(pod: dict[str, Any], task: str, index: int, has_master: bool) -> int | None:
    """The pod's RANK as its process sees it, else what the target's layout gives it.

    Volcano's pytorch plugin, the training operator and the pods target write a literal ``RANK``
    into each pod; the jobset target's workers read theirs from JobSet's global job index (a
    ``fieldRef``, resolved here from the pod's own annotations). A TrainJob's pods have no
    ``RANK`` (torchrun sets it): node ``i`` of one process per node is rank ``i``, and a node
    running several processes has no single rank.
    """
    rank = env_value(pod, "RANK")
    if rank is not None and rank.isdigit():
        return int(rank)
    if task == "master":
        return index
    if task == "worker":
        return index + 1 if has_master else index
    if task == "node":
        nproc = env_value(pod, "PET_NPROC_PER_NODE") or "1"
        return index if nproc == "1" else None
    return None


def prefix_for(short: str, rank: int | None, container: str | None = None) -> str:
    """The log prefix the local engine prints too: ``worker-1 r2``, ``master-0/sidecar r0``."""
    head = short if container is None else f"{short}/{container}"
    return f"{head} r{rank}" if rank is not None else head


def _container(status: dict[str, Any], init: bool) -> ContainerReport:
    state = status.get("state") or {}
    report = ContainerReport(
        name=str(status.get("name", "")), init=init, restarts=status.get("restartCount", 0)
    )
    if "terminated" in state:
        term = state["terminated"]
        report.state, report.exit_code, report.reason = (
            ContainerState.TERMINATED,
            term.get("exitCode"),
            term.get("reason", ""),
        )
    elif "running" in state:
        report.state = ContainerState.RUNNING
    else:
        report.reason = str((state.get("waiting") or {}).get("reason", ""))
    return report


def pod_report(job_name: str, pod: dict[str, Any], has_master: bool, target: str = "") -> PodReport:
    metadata, status = pod.get("metadata") or {}, pod.get("status") or {}
    task, index = pod_identity(job_name, pod, target)
    rank = pod_rank(pod, task, index, has_master)
    containers = [_container(s, True) for s in status.get("initContainerStatuses") or []]
    containers += [_container(s, False) for s in status.get("containerStatuses") or []]
    main = [c for c in containers if not c.init]
    exit_code = next((c.exit_code for c in main if c.exit_code), None)
    if exit_code is None and main and all(c.state == "terminated" for c in main):
        exit_code = 0
    finished = [
        timestamp(((s.get("state") or {}).get("terminated") or {}).get("finishedAt"))
        for s in status.get("containerStatuses") or []
    ]
    return PodReport(
        name=str(metadata.get("name", "")),
        short=f"{task}-{index}",
        task=task,
        index=index,
        phase=PodState.of(str(status.get("phase") or "Pending")),
        rank=rank,
        reason=pod_problem(pod) or str(status.get("reason") or ""),
        attempt=pod_attempt(pod, target),
        restarts=sum(c.restarts for c in main),
        exit_code=exit_code,
        started_at=timestamp(status.get("startTime")),
        finished_at=max((f for f in finished if f), default=None),
        address=str(status.get("podIP") or ""),
        containers=containers,
    )


def pod_problem(pod: dict[str, Any]) -> str:
    """What keeps a pod from running, in a few words: an image pull error, or unschedulable."""
    pulled = image_pull_error(pod)
    if pulled:
        return f"{pulled[1]}: cannot pull image {pulled[0]}"
    unschedulable = unschedulable_message(pod)
    return f"Unschedulable: {unschedulable}" if unschedulable is not None else ""


def image_pull_error(pod: dict[str, Any]) -> tuple[str, str, str] | None:
    """(image, reason, message) of the first container whose image cannot be pulled."""
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    images = {
        c.get("name"): c.get("image", "")
        for c in (spec.get("initContainers") or []) + (spec.get("containers") or [])
    }
    for s in (status.get("initContainerStatuses") or []) + (status.get("containerStatuses") or []):
        waiting = (s.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in IMAGE_PULL_REASONS:
            image = images.get(s.get("name")) or s.get("image", "")
            return str(image), str(waiting["reason"]), str(waiting.get("message") or "")
    return None


def unschedulable_message(pod: dict[str, Any]) -> str | None:
    """The scheduler's message when it cannot place a Pending pod; None when it is not stuck."""
    status = pod.get("status") or {}
    if status.get("phase", "Pending") != "Pending":
        return None
    for condition in status.get("conditions") or []:
        if (
            condition.get("type") == "PodScheduled"
            and condition.get("status") == "False"
            and condition.get("reason") == "Unschedulable"
        ):
            return " ".join(str(condition.get("message") or "no message").split())
    return None


def waiting_for_scheduler(pod: dict[str, Any]) -> str | None:
    """The scheduler a Pending pod waits for while no node is bound to it; None once bound.

    No scheduler writes anything on a pod whose ``schedulerName`` it does not serve, so a pod
    that asks for a scheduler the cluster lacks stays like this, without any condition.
    """
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    if spec.get("nodeName") or status.get("phase", "Pending") != "Pending":
        return None
    return str(spec.get("schedulerName") or DEFAULT_SCHEDULER)


# ------------------------------------------------------------------ Volcano's PodGroup

# Volcano's controller creates no pod while the job's PodGroup is Pending (job_controller_actions.go,
# syncJob); its scheduler says why on the PodGroup, as an Unschedulable condition.
PODGROUP_API = "scheduling.volcano.sh/v1beta1"
PODGROUP_WAITING = frozenset({"", "Pending"})


def podgroup_phase(group: dict[str, Any]) -> str:
    return str((group.get("status") or {}).get("phase") or "Pending")


def podgroup_problem(group: dict[str, Any]) -> str:
    """The scheduler's latest reason a PodGroup cannot be placed ("" when it says none)."""
    latest: dict[str, Any] | None = None
    for condition in (group.get("status") or {}).get("conditions") or []:
        if str(condition.get("status")) != "True":
            continue
        if latest is None or str(condition.get("lastTransitionTime") or "") >= str(
            latest.get("lastTransitionTime") or ""
        ):
            latest = condition
    if latest is None or latest.get("type") != "Unschedulable":
        return ""
    parts = (latest.get("reason"), " ".join(str(latest.get("message") or "").split()))
    return ": ".join(str(p) for p in parts if p)


def job_podgroup(groups: list[dict[str, Any]], top: dict[str, Any] | None) -> dict[str, Any] | None:
    """The job's PodGroup among those carrying its label: the one its object owns, else the newest."""
    uid = ((top or {}).get("metadata") or {}).get("uid")
    for group in groups:
        owners = (group.get("metadata") or {}).get("ownerReferences") or []
        if uid and any(o.get("uid") == uid for o in owners):
            return group
    newest = sorted(groups, key=lambda g: str((g.get("metadata") or {}).get("creationTimestamp") or ""))
    return newest[-1] if newest else None


def add_podgroup(report: JobReport, group: dict[str, Any] | None) -> JobReport:
    """A job not yet running says where its PodGroup stands: ``PodGroup Pending: NotEnoughResources: ...``."""
    if group is None or report.terminal or report.phase not in ("Pending", "Restarting"):
        return report
    phase = podgroup_phase(group)
    if phase not in PODGROUP_WAITING and phase != "Inqueue":
        return report
    problem = podgroup_problem(group)
    note = f"PodGroup {phase}" + (f": {problem}" if problem else "")
    report.reason = f"{report.reason}; {note}" if report.reason else note
    return report


# ------------------------------------------------------------------ job phases


def _from_pods(pods: list[PodReport]) -> str:
    if any(p.phase == "Running" for p in pods):
        return "Running"
    return "Pending"


@record
class Phase:
    phase: str
    reason: str = ""
    finished_at: float | None = None


def job_phase(target: str, top: dict[str, Any] | None, pods: list[PodReport]) -> Phase:
    """The job's phase in Volcano's words, from the target's own status (and pods where it has none)."""
    from torchjob.targets import get_target

    declared = get_target(target)
    if declared.top is None:  # no controller (the pods target): the pods say it all
        if any(p.phase == "Failed" for p in pods):
            return Phase("Failed", "a pod failed")
        if pods and all(p.phase == "Succeeded" for p in pods):
            return Phase("Completed")
        return Phase(_from_pods(pods))
    if top is None:
        return Phase("Unknown", "the job's object is gone")
    read = declared.status
    said = read(top) if read is not None else None
    if said is None or said.phase is None:
        return Phase(_from_pods(pods))
    return Phase(said.phase, said.reason, timestamp(said.since))


def build_report(
    *,
    name: str,
    namespace: str,
    target: str,
    context: str,
    top: dict[str, Any] | None,
    pods: dict[str, dict[str, Any]],
    podgroup: dict[str, Any] | None = None,
) -> JobReport:
    has_master = any(pod_identity(name, p, target)[0] == "master" for p in pods.values())
    reports = sorted(
        (pod_report(name, p, has_master, target) for p in pods.values()),
        key=lambda p: (p.rank if p.rank is not None else 1 << 30, p.task, p.index),
    )
    phase = job_phase(target, top, reports)
    top_meta = (top or {}).get("metadata") or {}
    spec, status = (top or {}).get("spec") or {}, (top or {}).get("status") or {}
    created = timestamp(top_meta.get("creationTimestamp"))
    started = min((p.started_at for p in reports if p.started_at), default=created)
    report = JobReport(
        engine="kubernetes",
        id=f"{namespace}/{name}",
        name=name,
        phase=phase.phase,
        reason=phase.reason,
        namespace=namespace,
        target=target,
        location=context,
        # Volcano's retry count, a JobSet's restarts; else the latest attempt its pods belong to
        # (a TrainJob's runtime JobSet restarts the job without telling the TrainJob).
        retry_count=max(
            int(status.get("retryCount") or status.get("restarts") or 0),
            max((p.attempt for p in reports), default=0),
        ),
        max_retry=int(spec.get("maxRetry") or 0),
        started_at=started,
        finished_at=phase.finished_at if phase.phase in TERMINAL_JOB_PHASES else None,
        pods=reports,
    )
    if phase.phase in UNSUCCESSFUL_JOB_PHASES:
        from torchjob.engines.kubernetes.rootcause import first_failure  # (it reads this module)

        report.first_failure = first_failure(reports, pods)
    return add_podgroup(report, podgroup)
