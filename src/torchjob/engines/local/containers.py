"""From a pod manifest to the processes that run it: argv, env, working directory, mounts.

What a kubelet and a container runtime would do, done for local processes:

* ``env``/``envFrom`` resolved in order, ``valueFrom.fieldRef`` from the pod's own metadata and
  local addresses, ``configMapKeyRef`` from the ConfigMaps of the expansion (the svc plugin's),
  ``resourceFieldRef`` from the container's resources (else this machine's), and ``$(VAR)``
  expanded in values, ``command`` and ``args`` as Kubernetes does.
* ``volumeMounts``: a ConfigMap volume is a directory of files in the job directory, an
  ``emptyDir`` a directory per pod attempt, a ``hostPath`` the host path itself. Each mount path
  written in ``command``, ``args``, env values or ``workingDir`` is rewritten to its local
  directory (so ``/etc/volcano/worker.host`` works); programs that open such paths themselves
  should read ``$TORCHJOB_VOLCANO_DIR`` instead.
* A ``python``/``python3`` command runs this interpreter (``sys.executable``).

:func:`check_pods` finds what cannot run locally before anything starts.
"""

from __future__ import annotations

import math
import os
import re
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

from torchjob.engines.local import security
from torchjob.errors import Issue, warning
from torchjob.expand import DesiredState, PodPlan
from torchjob.records import field, record
from torchjob.spec.units import parse_quantity
from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any

Issues = list[Issue]

_PYTHON = re.compile(r"python(3(\.\d+)?)?")
_VAR_REF = re.compile(r"\$(\$|\(([A-Za-z_][A-Za-z0-9_.-]*)\))")
_FIELD_INDEX = re.compile(r"^metadata\.(labels|annotations)\['([^']*)'\]$")


class ResolveError(Exception):
    """A container cannot run locally; ``field`` is the path inside the container."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


@record
class PodSetup:
    """What the engine knows of one pod attempt, for resolving its containers."""

    plan: PodPlan
    address: str
    uid: str
    configmaps: dict[str, dict[str, str]]
    configmap_dir: Path  # ConfigMap volumes are <configmap_dir>/<name>/<key>
    pod_dir: Path  # emptyDir volumes are <pod_dir>/volumes/<name>
    base_env: dict[str, str] = field(default_factory=dict)  # the engine's own variables
    extra_env: dict[str, str] = field(default_factory=dict)
    gpu_env: dict[str, dict[str, str]] = field(default_factory=dict)  # per container name: gpus.py


@record
class ContainerRun:
    """One container, ready to start."""

    name: str
    image: str
    init: bool
    argv: list[str]
    env: dict[str, str]
    cwd: str | None
    before_exec: Callable[[], None] | None = None  # run in the child before the program


# What the engine sets in every container for its bookkeeping (markers, directories, ports):
# reserved, so that a job can neither hide its processes nor mislead the engine's records.
ENGINE_VARIABLES = frozenset(
    {
        "TORCHJOB_JOB_ID", "TORCHJOB_POD_UID", "TORCHJOB_JOB_DIR", "TORCHJOB_POD_NAME", "TORCHJOB_POD_IP",
        "TORCHJOB_ATTEMPT", "TORCHJOB_RETRY_COUNT", "TORCHJOB_WAIT_INTERVAL", "TORCHJOB_BIN",
        "TORCHJOB_VOLCANO_DIR", "TORCHJOB_CONFIG_MOUNT", "TORCHJOB_JOB_UIDS", "TORCHJOB_FINISHED",
    }
)  # fmt: skip
ENGINE_PREFIXES = ("TORCHJOB_PORT_",)


# What torch's launcher (torchrun, torch.distributed.launch) sets for each of its workers: the
# worker's own rank. A job started from such a worker (an SDK call in a script torchrun runs)
# must not hand them to its pods: TORCHELASTIC_USE_AGENT_STORE=True alone makes every rank wait for
# a store that nobody serves. Dropped only when the caller is such a worker (TORCHELASTIC_RUN_ID).
_LAUNCHER_VARIABLES = frozenset(
    {
        "RANK", "LOCAL_RANK", "GROUP_RANK", "ROLE_RANK", "ROLE_NAME", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
        "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    }
)  # fmt: skip


def inherited_env() -> dict[str, str]:
    """This process's environment as the containers inherit it (see _LAUNCHER_VARIABLES)."""
    if "TORCHELASTIC_RUN_ID" not in os.environ:
        return dict(os.environ)
    return {
        k: v
        for k, v in os.environ.items()
        if k not in _LAUNCHER_VARIABLES and not k.startswith("TORCHELASTIC_")
    }


def is_engine_variable(name: str) -> bool:
    return name in ENGINE_VARIABLES or name.startswith(ENGINE_PREFIXES)


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


def expand_refs(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion: defined names are replaced, ``$$`` is a literal ``$``."""

    def sub(match: re.Match[str]) -> str:
        if match.group(1) == "$":
            return "$"
        name = match.group(2)
        return env[name] if name in env else match.group(0)

    return _VAR_REF.sub(sub, text)


def _machine_resource(resource: str) -> float:
    if resource.endswith("cpu"):
        return float(os.cpu_count() or 1)
    if resource.endswith("memory"):
        import psutil

        return float(psutil.virtual_memory().total)
    if resource.endswith("ephemeral-storage"):
        import shutil

        return float(shutil.disk_usage("/").total)
    return 0.0


def _resource_value(container: dict[str, Any], ref: dict[str, Any], path: str) -> str:
    resource = str(ref.get("resource", ""))
    kind, _, name = resource.partition(".")
    if kind not in ("limits", "requests") or not name:
        raise ResolveError(path, f"resourceFieldRef resource {resource!r} is not limits.X or requests.X")
    values = (container.get("resources") or {}).get(kind) or {}
    if name in values:
        amount = parse_quantity(values[name])
    elif kind == "requests" and name in ((container.get("resources") or {}).get("limits") or {}):
        amount = parse_quantity(container["resources"]["limits"][name])
    else:
        amount = _machine_resource(name)
    divisor = parse_quantity(ref.get("divisor") or "1") or 1.0
    return str(math.ceil(amount / divisor - 1e-9))


def _field_value(ctx: PodSetup, field_path: str, path: str) -> str:
    meta = ctx.plan.manifest["metadata"]
    spec = ctx.plan.manifest["spec"]
    simple = {
        "metadata.name": meta["name"],
        "metadata.namespace": meta["namespace"],
        "metadata.uid": ctx.uid,
        "spec.nodeName": os.uname().nodename,  # gethostname(), without importing socket
        "spec.serviceAccountName": spec.get("serviceAccountName") or "default",
        "status.podIP": ctx.address,
        "status.podIPs": ctx.address,
        "status.hostIP": "127.0.0.1",
        "status.hostIPs": "127.0.0.1",
    }
    if field_path in simple:
        return str(simple[field_path])
    match = _FIELD_INDEX.match(field_path)
    if match:
        return str((meta.get(match.group(1)) or {}).get(match.group(2), ""))
    raise ResolveError(
        path,
        f"fieldRef {field_path!r} cannot be resolved (supported: {', '.join(simple)}, "
        "metadata.labels['KEY'], metadata.annotations['KEY'])",
    )


def _configmap_value(ctx: PodSetup, ref: dict[str, Any], path: str) -> str | None:
    name, key = str(ref.get("name", "")), str(ref.get("key", ""))
    data = ctx.configmaps.get(name)
    if data is None or key not in data:
        if ref.get("optional"):
            return None
        what = f"ConfigMap {name!r}" if data is None else f"key {key!r} of ConfigMap {name!r}"
        raise ResolveError(
            path,
            f"{what} does not exist locally (only the job's own ConfigMaps do: "
            f"{', '.join(ctx.configmaps) or 'none'}); mark it optional or set the value directly",
        )
    return data[key]


def _env_from(ctx: PodSetup, container: dict[str, Any], env: dict[str, str]) -> None:
    for i, source in enumerate(container.get("envFrom") or []):
        path = f"envFrom[{i}]"
        prefix = str(source.get("prefix") or "")
        if "configMapRef" in source:
            ref = source["configMapRef"] or {}
            data = ctx.configmaps.get(str(ref.get("name", "")))
            if data is None:
                if ref.get("optional"):
                    continue
                raise ResolveError(path, f"ConfigMap {ref.get('name')!r} does not exist locally")
            env.update({prefix + k: v for k, v in data.items()})
        elif "secretRef" in source:
            if (source["secretRef"] or {}).get("optional"):
                continue
            raise ResolveError(
                path,
                "Secrets are not available to local jobs; mark the secretRef optional "
                "and give its variables with run -e NAME=VALUE",
            )


def _env_value(
    ctx: PodSetup, container: dict[str, Any], var: dict[str, Any], env: Mapping[str, str], path: str
) -> str | None:
    if "valueFrom" not in var:
        return expand_refs(str(var.get("value", "")), env)
    source = var["valueFrom"] or {}
    if "fieldRef" in source:
        return _field_value(
            ctx, str((source["fieldRef"] or {}).get("fieldPath", "")), f"{path}.valueFrom.fieldRef"
        )
    if "configMapKeyRef" in source:
        return _configmap_value(ctx, source["configMapKeyRef"] or {}, f"{path}.valueFrom.configMapKeyRef")
    if "resourceFieldRef" in source:
        try:
            return _resource_value(container, source["resourceFieldRef"] or {}, f"{path}.valueFrom")
        except ValueError as err:
            raise ResolveError(f"{path}.valueFrom.resourceFieldRef", str(err)) from None
    if "secretKeyRef" in source:
        if (source["secretKeyRef"] or {}).get("optional"):
            return None
        raise ResolveError(
            f"{path}.valueFrom.secretKeyRef",
            f"Secrets are not available to local jobs; run -e {var.get('name')}=VALUE stands in for it "
            "(or mark it optional)",
        )
    raise ResolveError(f"{path}.valueFrom", "unsupported valueFrom source")


def mount_dirs(ctx: PodSetup, container: dict[str, Any]) -> dict[str, str]:
    """mountPath -> local directory for each volume of the container that has one here.

    A ConfigMap or emptyDir volume, with its ``subPath``, must stay inside the engine's directory
    for it: a name such as ``../x`` is refused (ResolveError), never followed.
    """
    volumes = {str(v.get("name")): v for v in ctx.plan.manifest["spec"].get("volumes") or []}
    mounts: dict[str, str] = {}
    for i, mount in enumerate(container.get("volumeMounts") or []):
        volume = volumes.get(str(mount.get("name")))
        target = str(mount.get("mountPath", "")).rstrip("/")
        if volume is None or not target:
            continue
        local: Path | None = None
        base: Path | None = None
        if "configMap" in volume:
            base = ctx.configmap_dir
            local = base / str((volume["configMap"] or {}).get("name", ""))
        elif "emptyDir" in volume:
            base = ctx.pod_dir / "volumes"
            local = base / str(volume["name"])  # created when the pod starts
        elif "hostPath" in volume:
            local = Path(str((volume["hostPath"] or {}).get("path", "")))
        if local is None:
            continue
        sub_path = str(mount.get("subPath") or "")
        if sub_path:
            if sub_path.startswith("/") or ".." in Path(sub_path).parts:
                raise ResolveError(
                    f"volumeMounts[{i}].subPath",
                    f"{sub_path!r} must be a relative path without '..' (as Kubernetes requires)",
                )
            local = local / sub_path
        if base is not None and not inside(base, local):
            raise ResolveError(
                f"volumeMounts[{i}]",
                f"volume {mount.get('name')!r} would be at {local}, outside the job's directory {base}",
            )
        if str(local) != target:
            mounts[target] = str(local)
    return mounts


def inside(base: Path, path: Path) -> bool:
    """``path`` lies below ``base`` once both are resolved (``..`` and symlinks followed)."""
    root, resolved = base.resolve(), path.resolve()
    return resolved != root and resolved.is_relative_to(root)


def empty_dirs(ctx: PodSetup) -> list[Path]:
    """The pod attempt's emptyDir directories; ResolveError for a name that would lead outside."""
    base = ctx.pod_dir / "volumes"
    found = []
    for volume in ctx.plan.manifest["spec"].get("volumes") or []:
        if "emptyDir" in volume:
            path = base / str(volume["name"])
            if not inside(base, path) or path.parent != base:
                raise ResolveError(
                    "volumes", f"emptyDir {volume['name']!r} would be at {path}, outside the pod's directory"
                )
            found.append(path)
    return found


def make_empty_dirs(ctx: PodSetup) -> None:
    """The pod's emptyDir volumes, and each working directory inside one (a runtime makes a missing
    working directory; only one in the pod's own volumes is made here, never a host path)."""
    from torchjob.engines.local.state import make_private_dirs

    spec = ctx.plan.manifest["spec"]
    owner = security.volume_owner(spec)
    made = empty_dirs(ctx)
    for path in made:
        make_private_dirs(path)
    root = ctx.pod_dir / "volumes"
    for container in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        if container.get("workingDir"):
            cwd = rewrite_paths(str(container["workingDir"]), mount_dirs(ctx, container))
            local = Path(os.path.normpath(cwd))
            # Made before any container of this attempt runs, so no symlink of theirs is followed.
            if local.is_relative_to(os.path.normpath(root)) and not local.exists():
                make_private_dirs(local)
                made.append(local)
    if owner is not None:  # the pod runs as another user: its volumes are its own
        for path in made:
            os.chown(path, owner[0], owner[1])
            os.chmod(path, owner[2])


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
    found += engine_variable_warnings(state, extra_env)
    return list(dict.fromkeys(found))


def rewrite_paths(text: str, mounts: Mapping[str, str]) -> str:
    for target, local in mounts.items():
        # A plain replacement string would interpret backslashes in the local path.
        text = re.sub(re.escape(target) + r"(?=/|$|[^\w.-])", _constant(local), text)
    return text


def _constant(value: str) -> Callable[[re.Match[str]], str]:
    return lambda _match: value


def resolve_container(
    ctx: PodSetup, container: dict[str, Any], *, init: bool, errors: list[ResolveError] | None = None
) -> ContainerRun:
    """The argv, env and cwd of one container of a pod; raises ResolveError.

    With ``errors``, the problems of the command and of each env entry are collected there and
    resolution goes on past them (the check reports every one at once).
    """

    def found(err: ResolveError) -> None:
        if errors is None:
            raise err
        errors.append(err)

    name, image = str(container.get("name", "")), str(container.get("image", ""))
    command = [str(c) for c in container.get("command") or []]
    args = [str(a) for a in container.get("args") or []]
    if not command:
        message = (
            f"container {name!r} (image {image!r}) has no command; torchjob does not "
            "run images locally, so add a 'command' (for example [python, train.py])"
        )
        found(ResolveError("command", message))
        command = ["true"]  # only when collecting: what follows is still checked
    mounts = mount_dirs(ctx, container)
    defined: dict[str, str] = {**ctx.base_env, **ctx.gpu_env.get(name, {})}
    try:
        _env_from(ctx, container, defined)
    except ResolveError as err:
        found(err)
    for i, var in enumerate(container.get("env") or []):
        try:
            value = _env_value(ctx, container, var, defined, f"env[{i}]")
        except ResolveError as err:
            found(err)
            continue
        if value is not None:
            defined[str(var.get("name"))] = rewrite_paths(value, mounts)
    defined.update(ctx.extra_env)
    # The engine's own variables come last: a job's value for one of them (TORCHJOB_JOB_ID would
    # hide its processes from the engine) is ignored; engine_variable_warnings says so.
    for variable in [k for k in defined if is_engine_variable(k)]:
        del defined[variable]
    defined.update({k: v for k, v in ctx.base_env.items() if is_engine_variable(k)})
    argv = [rewrite_paths(expand_refs(a, defined), mounts) for a in [*command, *args]]
    if _PYTHON.fullmatch(argv[0]):
        argv[0] = sys.executable
    env = {**inherited_env(), **defined}
    env["PATH"] = os.pathsep.join(
        [
            str(ctx.base_env.get("TORCHJOB_BIN", "")),
            os.path.dirname(sys.executable),
            defined.get("PATH", os.environ.get("PATH", os.defpath)),
        ]
    ).lstrip(os.pathsep)
    cwd = None
    if container.get("workingDir"):
        cwd = rewrite_paths(str(container["workingDir"]), mounts)
    who = security.identity(ctx.plan.manifest["spec"], container)
    return ContainerRun(
        name=name,
        image=image,
        init=init,
        argv=argv,
        env=env,
        cwd=cwd,
        before_exec=who.enter if who.changes else None,
    )


def resolve_pod(ctx: PodSetup) -> tuple[list[ContainerRun], list[ContainerRun]]:
    spec = ctx.plan.manifest["spec"]
    inits = [resolve_container(ctx, c, init=True) for c in spec.get("initContainers") or []]
    mains = [resolve_container(ctx, c, init=False) for c in spec.get("containers") or []]
    return inits, mains


def configmaps_of(state: DesiredState) -> dict[str, dict[str, str]]:
    return {
        str(obj["metadata"]["name"]): {str(k): str(v) for k, v in (obj.get("data") or {}).items()}
        for obj in state.objects
        if obj.get("kind") == "ConfigMap"
    }


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
    if not argv or not (_PYTHON.fullmatch(argv[0]) or argv[0] == sys.executable):
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
    """A relative script path of a python command that is not in the container's working directory."""
    script = script_of(run.argv)
    if script is None or os.path.isabs(script[1]):
        return []
    base = run.cwd or os.getcwd()
    if os.path.exists(os.path.join(base, script[1])):
        return []
    commands = len(container.get("command") or [])
    field = f"command[{script[0]}]" if script[0] < commands else f"args[{script[0] - commands}]"
    in_dir = f"working directory {run.cwd!r}" if run.cwd else f"the current directory ({base})"
    return [Issue(f"{where}.{field}", f"python script {script[1]!r} does not exist in {in_dir}")]


# Where the check pretends the engine's own directories (ConfigMap volumes, emptyDirs) are: they
# are made when a pod starts, so a working directory inside them is not looked for on disk.
_CHECK_ROOT = Path("/nonexistent/torchjob-check")


def check_pods(state: DesiredState) -> Issues:
    """Everything that would stop a pod of ``state`` from running locally, as (path, message)."""
    issues: Issues = []
    scratch = _CHECK_ROOT
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
