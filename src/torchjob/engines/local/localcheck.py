"""What cannot run locally, found before anything starts; what has no effect here, as warnings.

:func:`check_pods` resolves every container of every task once, as a pod would (its ConfigMaps,
its env, its mounts, its working directory and script), collecting each problem with its field
path; :func:`local_warnings` lists what the job asks for that this engine does not do
(``securityContext`` fields, values for the engine's own variables).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Mapping
from pathlib import Path

from torchjob.controller.probes import probe_warnings
from torchjob.engines.local import security
from torchjob.engines.local.containers import PYTHON, ContainerRun, PodSetup, ResolveError, configmaps_of
from torchjob.engines.local.envvars import is_engine_variable
from torchjob.engines.local.mounts import empty_dirs, inside
from torchjob.engines.local.resolve import resolve_container
from torchjob.errors import Issue, warning
from torchjob.expand import DesiredState, PodPlan
from torchjob.spec.model import Job
from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any

Issues = list[Issue]


# The most processes one job may have here: Linux's default pid_max (the kernel's default on a
# machine of up to 32 CPUs), lowered to this machine's pid_max and this user's RLIMIT_NPROC.
# A job of more processes than the machine can hold cannot start; beyond it the job is refused
# before a pod is planned (a plan holds every pod: about 0.2 ms and 30 KB each).
MAX_PROCESSES = 32768
# The plugins whose --nproc-per-node tells how many training processes torchrun starts per pod.
_NPROC_PLUGINS = ("kubeflow", "trainer")


def process_limit() -> int:
    """The most processes a job may have on this machine (``MAX_PROCESSES`` or less)."""
    import resource

    limit = MAX_PROCESSES
    with contextlib.suppress(OSError, ValueError):  # not Linux: the default stands
        limit = min(limit, int(Path("/proc/sys/kernel/pid_max").read_text()))
    soft = resource.getrlimit(resource.RLIMIT_NPROC)[0]
    if soft != resource.RLIM_INFINITY and soft > 0:
        limit = min(limit, soft)
    return limit


def processes_per_pod(job: Job) -> int:
    """The processes a pod of ``job`` may start: for a PyTorchJob's or TrainJob's number of
    processes per node (``--nproc-per-node``), that many training processes and torchrun's agent;
    else one. The flags as the plugins themselves parse them (``--flag=N`` or ``--flag N``)."""
    from torchjob.plugins import build_plugins

    most = 1
    for plugin in build_plugins(job):
        if plugin.name not in _NPROC_PLUGINS:
            continue
        for flag in ("nproc-per-node", "elastic-nproc-per-node"):
            value = str(plugin.values.get(flag) or "")
            if value.isascii() and value.isdigit():
                most = max(most, int(value) + 1)
    return most


def check_size(job: Job) -> Issues:
    """A job with more processes than this machine holds (``process_limit``), told from its
    counts alone: nothing is expanded first."""
    pods = job.total_replicas
    per_pod = processes_per_pod(job)
    limit = process_limit()
    if pods * per_pod <= limit:
        return []
    what = (
        f"{pods} pods"
        if per_pod == 1
        else f"{pods} pods of up to {per_pod} processes (torchrun and its ranks)"
    )
    return [
        Issue(
            "spec.tasks",
            f"the job has {what}; expected at most {limit} processes in all, the most the local engine "
            "starts for one job on this machine (pid_max, RLIMIT_NPROC): run it on a cluster engine",
        )
    ]


def local_warnings(state: DesiredState, extra_env: Mapping[str, str]) -> Issues:
    """What the job asks for that has no effect here, once per field path."""
    found: Issues = []
    for t, task in enumerate(state.job.spec.tasks):
        spec = task.template.spec
        for kind in ("initContainers", "containers"):
            for i, container in enumerate(spec.get(kind) or []):
                if not isinstance(container, dict):
                    continue
                for at_pod, key, message in security.unapplied(spec, container):
                    level = "" if at_pod else f".{kind}[{i}]"
                    found.append(
                        warning(f"spec.tasks[{t}].template.spec{level}.securityContext.{key}", message)
                    )
    found += probe_warnings(state.job)
    found += engine_variable_warnings(state, extra_env)
    return list(dict.fromkeys(found))


def engine_variable_warnings(state: DesiredState, extra_env: Mapping[str, str]) -> Issues:
    """A job's (or ``--env``'s) entries for the engine's own variables, which are ignored."""
    found: Issues = []
    for t, task in enumerate(state.job.spec.tasks):
        for kind in ("initContainers", "containers"):
            for i, container in enumerate(task.template.spec.get(kind) or []):
                if not isinstance(container, dict):
                    continue
                for j, var in enumerate(container.get("env") or []):
                    name = var.get("name") if isinstance(var, dict) else None
                    if isinstance(name, str) and is_engine_variable(name):
                        found.append(
                            warning(
                                f"spec.tasks[{t}].template.spec.{kind}[{i}].env[{j}].name",
                                f"{name} is set by torchjob for its own bookkeeping; this value is ignored",
                            )
                        )
    for name in extra_env:
        if is_engine_variable(name):
            found.append(
                warning("--env", f"{name} is set by torchjob for its own bookkeeping; this value is ignored")
            )
    return found


def _task_path(state: DesiredState, plan: PodPlan) -> str:
    t = next(i for i, task in enumerate(state.job.spec.tasks) if task.name == plan.task.name)
    return f"spec.tasks[{t}].template"


def _template_path(state: DesiredState, plan: PodPlan, kind: str, name: str) -> str:
    """The field path of a container in the user's job (plugin-added ones point at the plugins)."""
    t = next(i for i, task in enumerate(state.job.spec.tasks) if task.name == plan.task.name)
    for i, container in enumerate(plan.task.template.spec.get(kind) or []):
        if isinstance(container, dict) and container.get("name") == name:
            return f"spec.tasks[{t}].template.spec.{kind}[{i}]"
    return "spec.plugins"


# Options of python that take a value; -c and -m end the options without a script file.
_PYTHON_VALUE_OPTIONS = frozenset({"-W", "-X", "-Q"})


def script_of(argv: list[str]) -> tuple[int, str] | None:
    """The index and path of the script ``python [options] SCRIPT ...`` runs; None for -c/-m/stdin."""
    if not argv or not (PYTHON.fullmatch(argv[0]) or argv[0] == sys.executable):
        return None
    i = 1
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            i += 1
            break
        if not arg.startswith("-") or arg == "-":
            break
        if arg.startswith(("-c", "-m")):
            return None
        i += 2 if arg in _PYTHON_VALUE_OPTIONS else 1
    if i >= len(argv) or argv[i] == "-":
        return None
    return i, argv[i]


def _check_script(container: dict[str, Any], run: ContainerRun, where: str) -> Issues:
    """The script of a python command that does not exist here: a relative path not in the
    container's working directory, or an absolute one (a file of the image's, such as
    ``/opt/app/train.py``) that is on no volume the engine makes."""
    script = script_of(run.argv)
    if script is None:
        return []
    base = run.cwd or os.getcwd()
    if os.path.exists(os.path.join(base, script[1])) or Path(script[1]).is_relative_to(CHECK_ROOT):
        return []
    commands = len(container.get("command") or [])
    field = f"command[{script[0]}]" if script[0] < commands else f"args[{script[0] - commands}]"
    if os.path.isabs(script[1]):
        # Else every start fails with python's "can't open file", restarted without end under
        # OnFailure; --workdir maps the image's folder to a local one (as for a workingDir).
        folder = os.path.dirname(script[1])
        message = (
            f"python script {script[1]!r} does not exist here (a file of the container's image?); "
            f"--workdir {folder}=DIR reads it from a local DIR instead"
        )
        return [Issue(f"{where}.{field}", message)]
    in_dir = f"working directory {run.cwd!r}" if run.cwd else f"the current directory ({base})"
    return [Issue(f"{where}.{field}", f"python script {script[1]!r} does not exist in {in_dir}")]


# Where the check pretends the engine's own directories (ConfigMap volumes, emptyDirs) are: they
# are made when a pod starts, so a working directory inside them is not looked for on disk.
CHECK_ROOT = Path("/nonexistent/torchjob-check")


def check_pods(state: DesiredState) -> Issues:
    """Everything that would stop a pod of ``state`` from running locally, as (path, message)."""
    issues: Issues = []
    scratch = CHECK_ROOT
    configmaps = configmaps_of(state)
    seen: set[tuple[str, str, str]] = set()
    for name, data in configmaps.items():  # made by plugins from validated names; checked all the same
        for part in (name, *data):
            if not inside(scratch, scratch / part) or (scratch / part).parent != scratch:
                issues.append(Issue("spec.plugins", f"ConfigMap {name!r}: {part!r} is not a plain file name"))
    checked_pods: set[str] = set()
    for plan in state.pods:
        ctx = PodSetup(
            plan=plan,
            address="127.0.0.1",
            uid="check",
            configmaps=configmaps,
            configmap_dir=scratch,
            pod_dir=scratch / "check" / plan.name,
        )
        if not inside(scratch / "check", ctx.pod_dir) or ctx.pod_dir.parent != scratch / "check":
            issues.append(Issue(_task_path(state, plan), f"pod name {plan.name!r} is not a plain name"))
        if plan.task.name not in checked_pods:
            checked_pods.add(plan.task.name)
            try:
                empty_dirs(ctx)
            except ResolveError as err:
                issues.append(Issue(f"{_task_path(state, plan)}.spec.{err.field}", err.message))
        for kind in ("initContainers", "containers"):
            for container in plan.manifest["spec"].get(kind) or []:
                key = (plan.task.name, kind, str(container.get("name")))
                if key in seen:  # replicas of a task share a template
                    continue
                seen.add(key)
                where = _template_path(state, plan, kind, key[2])
                for at_pod, name, message in security.problems(plan.manifest["spec"], container):
                    level = f"{_task_path(state, plan)}.spec" if at_pod else where
                    issues.append(Issue(f"{level}.securityContext.{name}", message))
                errors: list[ResolveError] = []
                try:
                    run = resolve_container(ctx, container, init=kind == "initContainers", errors=errors)
                except ResolveError as err:
                    errors.append(err)
                    run = None
                issues += [Issue(f"{where}.{err.field}", err.message) for err in errors]
                if run is None:
                    continue
                managed = run.cwd is not None and Path(run.cwd).is_relative_to(scratch)
                if run.cwd and not managed and not os.path.isdir(run.cwd):
                    issues.append(
                        Issue(
                            f"{where}.workingDir",
                            f"container {key[2]!r}: working directory {run.cwd!r} does not exist here; "
                            f"--workdir {container.get('workingDir')}=DIR runs it in a local DIR instead",
                        )
                    )
                elif container.get("command") and not managed:
                    issues += _check_script(container, run, where)
    return list(dict.fromkeys(issues))  # a pod-level problem is found once per container
