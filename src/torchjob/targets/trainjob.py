"""``trainjob``: a Kubeflow Trainer v2 ``TrainJob`` (``trainer.kubeflow.org/v1alpha1``).

The ``torch-distributed`` runtime (or ``--runtime NAME``) runs ``numNodes`` pods from one
``node`` container and sets only torchrun's ``PET_*`` env (``PET_NNODES``, ``PET_NPROC_PER_NODE``,
``PET_NODE_RANK``, ``PET_MASTER_ADDR``, ``PET_MASTER_PORT``). The job's command therefore runs
through ``torchrun --no-python``: torchrun reads those ``PET_*`` variables, rendezvouses
statically on node 0 and starts the command with ``MASTER_ADDR``, ``MASTER_PORT``, ``RANK``,
``WORLD_SIZE`` and ``LOCAL_RANK`` set, so a plain ``python train.py`` works unchanged. One process
per node (``numProcPerNode: 1``), as on Volcano, unless an SDK ``Elastic`` task asks for more.

A TrainJob has one image and command for all nodes and no elastic range: a job whose master and
workers differ, or an elastic ``min:max``, is an error naming the targets that can express it.
Pod settings reach the runtime's pods through a ``runtimePatches`` entry (volumes, node
selection, service account, labels); anything else in the pod template is refused.
"""

from __future__ import annotations

from typing import Any

from torchjob.errors import Problem, SpecError
from torchjob.quick import unwrap_launcher
from torchjob.spec.model import Job, Task
from torchjob.target_api import torchrun
from torchjob.target_api.common import (
    PATCH_MANAGER,
    add_env_to_containers,
    cannot,
    claim_objects,
    condition_status,
    copy,
    gang_warnings,
    metadata,
    mount_job_volumes,
    pytorch_roles,
    queue_warnings,
    restart_rule,
    task_path,
    volcano_warnings,
    wait_master_flags,
)
from torchjob.target_api.names import POD_SUFFIX
from torchjob.targets import JOB_LABEL, Status, Target, TargetRender, TopKind

NAME = "trainjob"
API_VERSION = "trainer.kubeflow.org/v1alpha1"
KIND = "TrainJob"
DEFAULT_RUNTIME = "torch-distributed"
NODE = "node"  # the runtime's trainer job and container
MANAGER = PATCH_MANAGER
RESERVED_ENV = ("PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT")
TORCHRUN = ("torchrun", "--no-python")
# Pod spec fields a runtime patch may set; the rest of a pod template has no place in a TrainJob.
PATCHED_POD_FIELDS = (
    "volumes",
    "nodeSelector",
    "affinity",
    "tolerations",
    "serviceAccountName",
    "imagePullSecrets",
    "securityContext",
    "terminationGracePeriodSeconds",
    "schedulingGates",
)
DROPPED_POD_FIELDS = {
    "restartPolicy": "the runtime's Job decides how pods restart",
    "schedulerName": "the runtime decides the scheduler",
    "hostname": "the runtime names the pods",
    "subdomain": "the runtime names the pods",
}
TRAINER_CONTAINER_FIELDS = ("image", "command", "args", "env", "resources")
PATCHED_CONTAINER_FIELDS = ("volumeMounts", "securityContext")
DROPPED_CONTAINER_FIELDS = {
    "name": "the runtime's container is called node",
    "ports": "torchrun listens on the runtime's port 29500",
    "imagePullPolicy": "the runtime's container decides it",
    "terminationMessagePath": "the runtime's container decides it",
    "terminationMessagePolicy": "the runtime's container decides it",
}


def _shape(template: dict[str, Any]) -> dict[str, Any]:
    """A pod template with container names blanked: what must match between master and workers."""
    out: dict[str, Any] = copy(template)
    for container in (out.get("spec") or {}).get("containers") or []:
        container.pop("name", None)
    return out


def _sdk_command(command: list[str]) -> tuple[list[str], bool]:
    """An SDK entrypoint command without its own elastic launcher: torchrun launches instead."""
    if "torchjob.sdk.entrypoint" in command and "--elastic" in command:
        return command[: command.index("--elastic")], True
    return command, False


def render(job: Job, *, runtime: str | None = None) -> TargetRender:
    roles = pytorch_roles(job, NAME)
    master, worker = roles.master, roles.worker
    template = copy(master.template.raw)
    spec: dict[str, Any] = template.get("spec") or {}
    mount_job_volumes(job, spec)
    path = f"{task_path(job, master)}.template.spec"
    containers: list[dict[str, Any]] = spec.get("containers") or []
    main = containers[0] if containers else {}
    cpath = f"{path}.containers[0]"
    env = [copy(e) for e in main.get("env") or []]
    problems = _shape_problems(job, master, worker)
    warnings = _job_warnings(job, master)
    problems += _pod_rules(spec, path, warnings)
    problems += _container_rules(main, cpath, warnings)
    problems += _command_problems(main, cpath) + _env_problems(env, cpath)
    if problems:
        raise SpecError(problems)
    out: dict[str, Any] = {
        "runtimeRef": {
            "name": runtime or DEFAULT_RUNTIME,
            "apiGroup": "trainer.kubeflow.org",
            "kind": "ClusterTrainingRuntime",
        },
        "trainer": _trainer(
            job,
            main,
            env,
            master.replicas + (worker.replicas if worker is not None else 0),
            (cpath, warnings),
        ),
        "runtimePatches": [_patch(job, template, spec, main)],
    }
    sdk = job.run_policy
    if sdk is not None and sdk.active_deadline_seconds:
        out["activeDeadlineSeconds"] = sdk.active_deadline_seconds
    warnings += _lifecycle_warnings(job, runtime)
    job_object = {"apiVersion": API_VERSION, "kind": KIND, "metadata": metadata(job), "spec": out}
    return TargetRender(KIND, API_VERSION, [*claim_objects(job), job_object], warnings)


def _shape_problems(job: Job, master: Task, worker: Task | None) -> list[Problem]:
    """Every node of a TrainJob is alike, and there is no elastic range."""
    problems: list[Problem] = []
    elastic = job.elastic
    if elastic is not None and elastic.min_nodes != elastic.max_nodes:
        problems.append(
            cannot(
                NAME,
                "spec.minAvailable",
                f"an elastic range of {elastic.min_nodes}:{elastic.max_nodes} nodes",
                "elastic-range",
                "Trainer v2 has no elastic training",
            )
        )
    if worker is not None and worker.replicas and _shape(worker.template.raw) != _shape(master.template.raw):
        problems.append(
            cannot(
                NAME,
                task_path(job, worker),
                f"a worker task whose pod template differs from the master's ({master.name!r})",
                "different-roles",
                "every node of a TrainJob runs one image and command",
            )
        )
    return problems


def _job_warnings(job: Job, master: Task) -> list[tuple[str, str]]:
    """Job fields the runtime decides instead (Volcano's, the queue, gang, wait-for-master, ...)."""
    warnings = volcano_warnings(job, NAME, master)
    warnings += queue_warnings(job, NAME) + gang_warnings(job, NAME)
    for flag in wait_master_flags(job):
        warnings.append(
            (
                "spec.plugins.pytorch",
                f"torchrun waits for node 0 itself, up to its rendezvous timeout; {flag} is dropped",
            )
        )
    if job.spec.priority_class_name:
        warnings.append(
            (
                "spec.priorityClassName",
                f"a TrainJob's runtime patches cannot set a priority class; "
                f"{job.spec.priority_class_name!r} is dropped",
            )
        )
    if not job.spec.scheduler_defaulted:  # volcano too: the runtime's JobSet has no PodGroup
        warnings.append(
            (
                "spec.schedulerName",
                f"the runtime decides the scheduler; {job.spec.scheduler_name!r} is dropped",
            )
        )
    return warnings


def _pod_rules(spec: dict[str, Any], path: str, warnings: list[tuple[str, str]]) -> list[Problem]:
    """Pod fields: dropped (warned about), patched, or refused; one container, no init containers."""
    problems: list[Problem] = []
    for key in spec:
        if key in DROPPED_POD_FIELDS:
            warnings.append((f"{path}.{key}", f"{key} is dropped: {DROPPED_POD_FIELDS[key]}"))
        elif key not in PATCHED_POD_FIELDS and key != "containers":
            problems.append(
                cannot(
                    NAME,
                    f"{path}.{key}",
                    f"pod field {key}",
                    "pod-field",
                    "a TrainJob's runtime patches cannot set it",
                )
            )
    if len(spec.get("containers") or []) > 1:
        problems.append(
            cannot(
                NAME,
                f"{path}.containers[1]",
                "a second container",
                "pod-field",
                "the runtime's node pods have one container",
            )
        )
    if spec.get("initContainers"):
        problems.append(
            cannot(
                NAME,
                f"{path}.initContainers",
                "init containers",
                "pod-field",
                "a runtime patch can only change the runtime's own containers",
            )
        )
    return problems


def _container_rules(main: dict[str, Any], cpath: str, warnings: list[tuple[str, str]]) -> list[Problem]:
    """Container fields: the trainer's own, patched, dropped (warned about), or refused."""
    problems: list[Problem] = []
    for key in main:
        if key in DROPPED_CONTAINER_FIELDS:
            if key != "name":
                warnings.append((f"{cpath}.{key}", f"{key} is dropped: {DROPPED_CONTAINER_FIELDS[key]}"))
        elif key not in TRAINER_CONTAINER_FIELDS and key not in PATCHED_CONTAINER_FIELDS:
            problems.append(
                cannot(
                    NAME,
                    f"{cpath}.{key}",
                    f"container field {key}",
                    "pod-field",
                    "a TrainJob sets only the image, command, env and resources of its node",
                )
            )
    return problems


def _command_problems(main: dict[str, Any], cpath: str) -> list[Problem]:
    if main.get("command"):
        return []
    return [
        cannot(
            NAME,
            f"{cpath}.command",
            "a container without a command",
            "no-command",
            "the command must be known to run it through torchrun",
        )
    ]


def _env_problems(env: list[dict[str, Any]], cpath: str) -> list[Problem]:
    return [
        Problem(
            f"{cpath}.env[{i}].name", f"{var['name']} is set by the TrainJob runtime and cannot be overridden"
        )
        for i, var in enumerate(env)
        if var.get("name") in RESERVED_ENV
    ]


def _trainer(
    job: Job,
    main: dict[str, Any],
    env: list[dict[str, Any]],
    nodes: int,
    told: tuple[str, list[tuple[str, str]]],
) -> dict[str, Any]:
    """``spec.trainer``: the command run through the runtime's torchrun on ``nodes`` nodes."""
    command, stripped = _sdk_command([str(c) for c in main.get("command") or []])
    args = [str(a) for a in main.get("args") or []]
    nproc = 1
    quick = unwrap_launcher(command, args)
    own = torchrun.find(main) if quick is None and not stripped else None
    if quick is not None:  # quick mode's torchrun: the runtime's torchrun takes its place
        command, nproc = quick
        args = []
    elif own is not None:  # the job's own torchrun: the runtime's, told the same, takes its place
        (command, nproc), args = _own_torchrun(own, *told), []
    elastic = job.elastic
    if elastic is not None:
        nproc = elastic.nproc_per_node
        if stripped and elastic.max_restarts:
            env.append({"name": "PET_MAX_RESTARTS", "value": str(elastic.max_restarts)})
    trainer: dict[str, Any] = {
        "image": main["image"],
        "command": [*TORCHRUN, *command, *args],
        "numNodes": nodes,
        "numProcPerNode": nproc,
    }
    if env:
        trainer["env"] = env
    if main.get("resources"):
        trainer["resourcesPerNode"] = copy(main["resources"])
    return trainer


def _own_torchrun(
    run: torchrun.Torchrun, cpath: str, warnings: list[tuple[str, str]]
) -> tuple[list[str], int]:
    """A container's own torchrun: the program the runtime's torchrun starts, and the processes per
    node it asks for as ``numProcPerNode``; the flags that are dropped are said."""
    program, given, dropped = torchrun.under_runtime(run)
    if dropped:
        warnings.append((f"{cpath}.command", dropped))
    if given is None:
        return program, 1
    if not given.isdigit() or int(given) < 1:
        warnings.append(
            (
                f"{cpath}.command",
                f"--nproc-per-node={given} becomes 1: a TrainJob's numProcPerNode is a number",
            )
        )
        return program, 1
    return program, int(given)


def _patch(job: Job, template: dict[str, Any], spec: dict[str, Any], main: dict[str, Any]) -> dict[str, Any]:
    """The runtime patch that puts the job's label, pod fields and patched container fields on the nodes."""
    pod_meta = copy(template.get("metadata") or {})
    pod_meta = {k: v for k, v in pod_meta.items() if k in ("labels", "annotations")}
    pod_meta["labels"] = {**(pod_meta.get("labels") or {}), JOB_LABEL: job.name}
    pod_spec: dict[str, Any] = {k: copy(spec[k]) for k in PATCHED_POD_FIELDS if k in spec}
    patched = {k: copy(main[k]) for k in PATCHED_CONTAINER_FIELDS if k in main}
    if patched:
        pod_spec["containers"] = [{"name": NODE, **patched}]
    node_template: dict[str, Any] = {"metadata": pod_meta}
    if pod_spec:
        node_template["spec"] = pod_spec
    return {
        "manager": MANAGER,
        "trainingRuntimeSpec": {
            "template": {
                "metadata": {"labels": {JOB_LABEL: job.name}},
                "spec": {
                    "replicatedJobs": [
                        {
                            "name": NODE,
                            "template": {
                                "metadata": {"labels": {JOB_LABEL: job.name}},
                                "spec": {"template": node_template},
                            },
                        }
                    ]
                },
            }
        },
    }


def _lifecycle_warnings(job: Job, runtime: str | None) -> list[tuple[str, str]]:
    """Restarts, TTL and clean-up: a TrainJob has none of them; its runtime decides."""
    # A TrainJob has no restart setting at all; what the runtime does always differs from the job.
    default = (
        f"{DEFAULT_RUNTIME}: a failed node's container restarts in place until 6 failures summed over "
        "the nodes (batch/v1's default backoffLimit) fail the job"
        if runtime in (None, DEFAULT_RUNTIME)
        else f"see runtime {runtime!r}"
    )
    warnings = [
        (
            "spec.maxRetry",
            f"a TrainJob has no restart settings; its runtime's JobSet decides ({default}), "
            f"where this job asks for {restart_rule(job)}",
        )
    ]
    if job.spec.ttl_seconds_after_finished is not None:
        warnings.append(
            (
                "spec.ttlSecondsAfterFinished",
                "a TrainJob has no TTL; finished TrainJobs stay until "
                "deleted (the runtime's JobSet may set one)",
            )
        )
    sdk = job.run_policy
    if sdk is not None and sdk.clean_pod_policy not in (None, "None"):
        warnings.append(
            (
                "run_policy.clean_pod_policy",
                f"a TrainJob has no clean-pod policy; {sdk.clean_pod_policy!r} is dropped",
            )
        )
    return warnings


def status(top: dict[str, Any]) -> Status:
    """Trainer's conditions; no Running one, so a running job is told by its pods."""
    return condition_status(top, "Complete")


def add_env(obj: dict[str, Any], env: dict[str, str]) -> None:
    """--env: a TrainJob's pods come from its runtime, so the variables go in ``spec.trainer.env``."""
    if obj.get("kind") != "TrainJob":
        add_env_to_containers(obj, env)
        return
    trainer = obj.setdefault("spec", {}).setdefault("trainer", {})
    trainer["env"] = [e for e in trainer.get("env") or [] if e["name"] not in env] + [
        {"name": k, "value": v} for k, v in env.items()
    ]


def generated(job: Job) -> list[tuple[str, str, str]]:
    """The runtime's one replicated job "node" holds one Job of numNodes pods."""
    nodes = sum(t.replicas for t in job.spec.tasks)
    return [("metadata.name", "pod", f"{job.name}-node-0-{max(nodes - 1, 0)}{POD_SUFFIX}")]


TARGET = Target(
    name="trainjob",
    generated=generated,
    dns1035=True,  # Trainer's rule for a TrainJob's name
    render=lambda job, runtime: render(job, runtime=runtime),
    top=TopKind(
        API_VERSION,
        "TrainJob",
        "trainjobs",
        "install Kubeflow Trainer",
        versions=(
            ("spec.runtimePatches", "Kubeflow Trainer v2.2"),  # v2.0/v2.1: podSpec/TemplateOverrides
            ("spec.activeDeadlineSeconds", "Kubeflow Trainer v2.2"),
            (
                "spec.runtimePatches.trainingRuntimeSpec.template.spec.replicatedJobs.template.spec.template"
                ".spec.terminationGracePeriodSeconds",
                "Kubeflow Trainer v2.3",
            ),
        ),
    ),
    preference=40,  # expresses the fewest jobs: one image and command for every node
    status=status,
    # The runtime's one replicated job "node" is one Indexed Job of numNodes pods.
    task_keys=("jobset.sigs.k8s.io/replicatedjob-name",),
    index_keys=("batch.kubernetes.io/job-completion-index",),
    attempt_keys=("jobset.sigs.k8s.io/restart-attempt",),  # the runtime's JobSet restarts
    add_env=add_env,
    runtime=True,
)
