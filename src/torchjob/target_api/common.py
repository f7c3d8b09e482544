"""Pieces every target shares: copies, labels, the pytorch roles of a job, and error wording."""

from __future__ import annotations

from typing import Any

from torchjob.errors import Problem, SpecError
from torchjob.records import record
from torchjob.spec.defaults import DEFAULT_MAX_RETRY, DEFAULT_SCHEDULER
from torchjob.spec.model import Job, Task
from torchjob.targets import JOB_LABEL, Status, all_targets

# The manager of torchjob's runtime patch of a TrainJob (its label on the runtime's pods).
PATCH_MANAGER = "torchjob.io/render"

# The features a target may refuse; each target's record lists those it can express (Target.can),
# and every refusal names the targets that can.
FEATURES = (
    "any-tasks",
    "no-pytorch",
    "elastic-range",
    "different-roles",
    "pod-field",
    "job-volumes",
    "no-command",
)


def able(feature: str) -> list[str]:
    """The targets that can express ``feature``, in registry order."""
    return [t.name for t in all_targets() if feature in t.can]


def copy(value: Any) -> Any:
    """A deep copy of plain YAML data (much faster than copy.deepcopy)."""
    if isinstance(value, dict):
        return {k: copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [copy(v) for v in value]
    return value


def unknown_target(message: str) -> SpecError:
    return SpecError([Problem("", message)])


def cannot(target: str, path: str, feature: str, can: str, why: str = "") -> Problem:
    """'<feature> cannot be expressed by target X (why); targets that can: ...'."""
    others = [t for t in able(can) if t != target]
    reason = f" ({why})" if why else ""
    return Problem(
        path,
        f"{feature} cannot be expressed by target {target!r}{reason}; use --target {' or '.join(others)}",
    )


def metadata(job: Job, name: str | None = None) -> dict[str, Any]:
    """Object metadata: the job's labels and annotations plus :data:`JOB_LABEL`."""
    meta: dict[str, Any] = {"name": name or job.name, "namespace": job.metadata.namespace}
    meta["labels"] = {**job.metadata.labels, JOB_LABEL: job.name}
    if job.metadata.annotations:
        meta["annotations"] = dict(job.metadata.annotations)
    return meta


def labelled(template: dict[str, Any], job: Job) -> dict[str, Any]:
    """A copy of a pod template whose metadata carries :data:`JOB_LABEL`."""
    given = copy(template)
    meta = given.pop("metadata", None)
    meta = meta if isinstance(meta, dict) else {}
    labels = meta.get("labels")
    meta["labels"] = {**(labels if isinstance(labels, dict) else {}), JOB_LABEL: job.name}
    out: dict[str, Any] = {"metadata": meta, **given}  # metadata first, as kubectl prints it
    if not isinstance(out.get("spec"), dict):
        out["spec"] = {}
    return out


def task_path(job: Job, task: Task) -> str:
    return f"spec.tasks[{job.spec.tasks.index(task)}]"


@record
class Roles:
    """The pytorch plugin's view of a job: its master task, worker task and port."""

    master: Task
    worker: Task | None
    port: int
    wait_master: bool


def pytorch_roles(job: Job, target: str) -> Roles:
    """The master and worker tasks; a job without them cannot become ``target``'s object."""
    from torchjob.plugins.pytorch import PyTorchPlugin

    if "pytorch" not in job.spec.plugins:
        raise SpecError(
            [
                cannot(
                    target,
                    "spec.plugins",
                    "a job without the pytorch plugin",
                    "no-pytorch",
                    "it needs to know which task is the master",
                )
            ]
        )
    plugin = PyTorchPlugin(job.spec.plugins["pytorch"])
    master = job.task(plugin.master)
    assert master is not None, "validation guarantees the master task"
    worker = job.task(plugin.worker)
    problems = [
        cannot(
            target,
            f"spec.tasks[{i}]",
            f"task {t.name!r} (neither the pytorch master nor worker)",
            "any-tasks",
            "it has only a master and workers",
        )
        for i, t in enumerate(job.spec.tasks)
        if t is not master and t is not worker
    ]
    if problems:
        raise SpecError(problems)
    return Roles(master, worker, plugin.port, bool(plugin.values["wait-master-enabled"]))


SDK_LABEL = "torchjob.dev/sdk"
FAILURE_EVENTS = ("PodFailed", "PodEvicted", "*")


def restarts_on_failure(job: Job) -> bool:
    """Whether a failed pod restarts the whole job (a job-level ``PodFailed -> RestartJob``)."""
    return any(
        p.action == "RestartJob" and any(e in FAILURE_EVENTS for e in p.events) for p in job.spec.policies
    )


INT32_MAX = 2**31 - 1


def job_restarts(job: Job) -> int:
    """How often a failed pod restarts the whole job under Volcano (and the local engine).

    Volcano counts runs, not restarts: it fails the job on the restart that reaches ``maxRetry``,
    so ``maxRetry: M`` allows ``M - 1`` restarts. The SDK writes ``maxRetry = backoff_limit + 1``.
    """
    return max(job.spec.max_retry - 1, 0) if restarts_on_failure(job) else 0


def restart_rule(job: Job) -> str:
    """What the job asks for on a failure, in words, for a warning where a target differs."""
    if restarts_on_failure(job):
        n, m = job_restarts(job), job.spec.max_retry
        return f"{n} restart{'s' if n != 1 else ''} of the whole job after a failed pod (maxRetry {m})"
    if any(t.template.restart_policy != "Never" for t in job.spec.tasks if t.replicas):
        return "containers restarted in place without limit (restartPolicy OnFailure/Always)"
    return "no restart"


def uncontrolled_warnings(job: Job) -> list[tuple[str, str]]:
    """What bare pods (``--target pods``) cannot give, no controller acting on them: restarts after
    a failed pod, the run policy's deadline and clean-up of finished pods."""
    bare = "target 'pods' creates the pods without a controller"
    warnings = []
    if restarts_on_failure(job):
        warnings.append(
            (
                "spec.maxRetry",
                f"{bare}: a failed pod fails the job, where the job asks for {restart_rule(job)}; "
                "use --target volcano or jobset to keep it",
            )
        )
    policy = job.run_policy
    if policy is not None and policy.active_deadline_seconds:
        warnings.append(
            (
                "run_policy.active_deadline_seconds",
                f"{bare}: nothing ends them at the deadline of {policy.active_deadline_seconds} s; "
                "use --target jobset, kubeflow or trainjob to keep it",
            )
        )
    if policy is not None and policy.clean_pod_policy not in (None, "None"):
        warnings.append(
            (
                "run_policy.clean_pod_policy",
                f"{bare}: finished pods stay until they are deleted; {policy.clean_pod_policy!r} is dropped",
            )
        )
    return warnings


def policy_warnings(job: Job, target: str, master: Task | None) -> list[tuple[str, str]]:
    """Lifecycle policies ``target`` has no place for, each named with what becomes of it.

    Understood everywhere: a job-level restart, terminate or abort on a failed pod (the failure
    policy), and ``TaskCompleted -> CompleteJob`` on the master (the job ends with its master).
    """
    warnings: list[tuple[str, str]] = []
    for i, p in enumerate(job.spec.policies):
        if (
            p.action in ("RestartJob", "TerminateJob", "AbortJob")
            and p.events
            and all(e in FAILURE_EVENTS for e in p.events)
        ):
            continue
        warnings.append(
            (
                f"spec.policies[{i}]",
                f"target {target!r} has no lifecycle policies; "
                f"{p.action} on {', '.join(p.events) or f'exit code {p.exit_code}'} is dropped",
            )
        )
    for t, task in enumerate(job.spec.tasks):
        for i, p in enumerate(task.policies):
            if task is master and p.action == "CompleteJob" and p.events == ["TaskCompleted"]:
                continue
            warnings.append(
                (
                    f"spec.tasks[{t}].policies[{i}]",
                    f"target {target!r} has no task policies; "
                    f"{p.action} on {', '.join(p.events) or f'exit code {p.exit_code}'} is dropped",
                )
            )
        if task.depends_on is not None and task.depends_on.names:
            # a kind's user wrote no Volcano dependsOn: the wait is said in words any reader knows
            warnings.append(
                (
                    f"spec.tasks[{t}].dependsOn",
                    f"target {target!r} does not keep the wait for {', '.join(task.depends_on.names)} to "
                    "run (dependsOn): these pods start without waiting; it is dropped",
                )
            )
    return warnings


def plugin_warnings(job: Job, target: str) -> list[tuple[str, str]]:
    """Volcano plugins other than pytorch that ``target`` does not run."""
    warnings: list[tuple[str, str]] = []
    for name, args in job.spec.plugins.items():
        if name == "pytorch" or (name == "svc" and not args):
            continue  # svc without flags is what Volcano adds for pytorch: the target's own DNS replaces it
        if name == "env" and job.metadata.labels.get(SDK_LABEL) == "true":
            continue  # the SDK's entrypoint never reads the task index
        what = {
            "svc": "its host files (/etc/volcano/*.host) and VC_<TASK>_HOSTS/VC_<TASK>_NUM env",
            "env": "its VK_TASK_INDEX/VC_TASK_INDEX env",
        }.get(name, "it")
        warnings.append(
            (
                f"spec.plugins.{name}",
                f"target {target!r} does not run Volcano's {name} plugin; {what} is not created",
            )
        )
    return warnings


def mount_job_volumes(job: Job, spec: dict[str, Any]) -> None:
    """Mount the job's ``spec.volumes`` claims into a pod spec, as Volcano's controller does."""
    from torchjob.expand import job_volumes

    for volume in job_volumes(job):
        spec.setdefault("volumes", []).append(
            {"name": volume.volume_name, "persistentVolumeClaim": {"claimName": volume.claim_name}}
        )
        for container in spec.get("containers", []):
            container.setdefault("volumeMounts", []).append(
                {"name": volume.volume_name, "mountPath": volume.mount_path}
            )


def claim_objects(job: Job) -> list[dict[str, Any]]:
    """PersistentVolumeClaims to create for volumes given as a claim spec, labelled."""
    from torchjob.expand import claim_objects as claims

    out = claims(job)
    for claim in out:
        claim["metadata"]["labels"] = {JOB_LABEL: job.name}
    return out


def volcano_warnings(job: Job, target: str, master: Task | None) -> list[tuple[str, str]]:
    """Everything Volcano-only in a job that ``target`` drops: policies, plugins, scheduling hints."""
    warnings = policy_warnings(job, target, master) + plugin_warnings(job, target)
    for key in ("networkTopology", "runningEstimate"):
        if key in job.spec.extra:
            warnings.append((f"spec.{key}", f"target {target!r} has no {key}; it is dropped"))
    if job.spec.min_success is not None:
        warnings.append(("spec.minSuccess", f"target {target!r} has no minSuccess; it is dropped"))
    for t, task in enumerate(job.spec.tasks):
        for key in task.extra:
            warnings.append((f"spec.tasks[{t}].{key}", f"target {target!r} has no {key}; it is dropped"))
        if task.max_retry != DEFAULT_MAX_RETRY:
            warnings.append(
                (
                    f"spec.tasks[{t}].maxRetry",
                    f"target {target!r} has no task maxRetry (Volcano's container-restart threshold "
                    f"for TaskFailed); maxRetry {task.max_retry} is dropped",
                )
            )
    return warnings


def pod_scheduling(job: Job, spec: dict[str, Any]) -> None:
    """The job-level scheduler and priority class on a pod spec that names none, as Volcano does.

    ``volcano`` is not copied, whether the job names it or Volcano's webhook filled it in: Volcano's
    scheduler places pods by the PodGroups Volcano's controller makes, which these targets do not,
    so the cluster's default scheduler places them (``scheduler_warnings`` says so).
    """
    if job.spec.priority_class_name and not spec.get("priorityClassName"):
        spec["priorityClassName"] = job.spec.priority_class_name
    if job.spec.scheduler_name not in ("", DEFAULT_SCHEDULER) and not spec.get("schedulerName"):
        spec["schedulerName"] = job.spec.scheduler_name


def scheduler_warnings(job: Job, target: str) -> list[tuple[str, str]]:
    """A job that names Volcano's scheduler itself: ``target`` drops it, and says so."""
    if job.spec.scheduler_defaulted or job.spec.scheduler_name != DEFAULT_SCHEDULER:
        return []
    return [
        (
            "spec.schedulerName",
            f"Volcano's scheduler places pods by the PodGroups Volcano's controller makes, and target "
            f"{target!r} makes none: the cluster's default scheduler places the pods ('volcano' is dropped)",
        )
    ]


def total_pods(job: Job) -> int:
    return sum(t.replicas for t in job.spec.tasks)


def gang_warnings(job: Job, target: str) -> list[tuple[str, str]]:
    """Volcano's gang size where ``target`` starts pods one by one (no PodGroup)."""
    total = total_pods(job)
    if job.elastic is not None or job.spec.min_available >= total:
        return []
    return [
        (
            "spec.minAvailable",
            f"target {target!r} has no gang scheduling: every pod is started, none waits for "
            f"minAvailable {job.spec.min_available} of {total}; it is dropped",
        )
    ]


def wait_master_flags(job: Job) -> list[str]:
    """The pytorch plugin's wait-for-master timeout and image flags the job writes itself."""
    given = []
    for arg in job.spec.plugins.get("pytorch", []):
        name = arg.lstrip("-").split("=", 1)[0]
        if name in ("wait-master-timeout", "wait-master-image") and f"--{name}" not in given:
            given.append(f"--{name}")
    return given


def queue_warnings(job: Job, target: str) -> list[tuple[str, str]]:
    """Volcano's queue and gang size, which ``target`` has no field for."""
    if job.spec.queue == "default":
        return []
    return [("spec.queue", f"target {target!r} has no Volcano queue; queue {job.spec.queue!r} is dropped")]


# ------------------------------------------------------------------ reading back


def add_env_to_containers(obj: dict[str, Any], env: dict[str, str]) -> None:
    """--env on a cluster: set in every main container of every pod template in ``obj``."""
    entries = [{"name": k, "value": v} for k, v in env.items()]

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            containers = node.get("containers")
            if isinstance(containers, list) and all(isinstance(c, dict) and "image" in c for c in containers):
                for c in containers:
                    c["env"] = [e for e in c.get("env") or [] if e.get("name") not in env] + entries
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(obj)


def true_conditions(obj: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The object's conditions whose status is True, by type."""
    return {
        str(c.get("type")): c
        for c in (obj.get("status") or {}).get("conditions") or []
        if str(c.get("status")) == "True"
    }


def condition_reason(condition: dict[str, Any]) -> str:
    return ": ".join(str(p) for p in (condition.get("reason"), condition.get("message")) if p)


def _said(phase: str, condition: dict[str, Any], default: str = "") -> Status:
    since = condition.get("lastTransitionTime")
    return Status(phase, condition_reason(condition) or default, None if since is None else str(since))


def condition_status(
    top: dict[str, Any], success: str, failure: str = "Failed", also: tuple[str, ...] = ()
) -> Status:
    """A job whose controller reports conditions: failure, then success, then Suspended (Pending),
    then each of ``also`` (a condition named as the phase it means); else the pods say."""
    conditions = true_conditions(top)
    if failure in conditions:
        return _said("Failed", conditions[failure])
    if success in conditions:
        return _said("Completed", conditions[success])
    if "Suspended" in conditions:
        return Status("Pending", condition_reason(conditions["Suspended"]) or "suspended")
    for name in also:
        if name in conditions:
            return Status(name, condition_reason(conditions[name]))
    return Status(None)
