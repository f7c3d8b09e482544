"""From a pod manifest to the processes that run it: each container's argv, env and working
directory, as a kubelet and a container runtime would decide them, for local processes.

The environment is :mod:`.envvars`', the mounts :mod:`.mounts`'; ``$(VAR)`` is expanded in
``command`` and ``args``, mount paths in them rewritten to their local directories, and a
``python``/``python3`` command runs this interpreter (``sys.executable``). The engine's own
variables come last: a job cannot set them.
"""

from __future__ import annotations

import os
import sys

from torchjob.engines.local import security
from torchjob.engines.local.containers import PYTHON, ContainerRun, PodSetup, ResolveError
from torchjob.engines.local.envvars import env_from, env_value, expand_refs, inherited_env, is_engine_variable
from torchjob.engines.local.mounts import mount_dirs, rewrite_paths
from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any


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
    env_from(ctx, container, defined, errors)  # with errors: each source's problem, all of them
    for i, var in enumerate(container.get("env") or []):
        try:
            value = env_value(ctx, container, var, defined, f"env[{i}]")
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
    if PYTHON.fullmatch(argv[0]):
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
