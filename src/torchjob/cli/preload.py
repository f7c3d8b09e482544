"""``run --preload MODULE[,MODULE]``: a module that cannot be found is refused before the job starts.

The fork server imports the modules in this interpreter (the one a container's ``python`` runs), from
``sys.path`` and the directory of the container's script; a misspelt name would otherwise end only
in the server's log and every container would start cold, unnoticed. The modules are looked up
without importing anything (``importlib``'s path finders read directories only): a parent package's
``__init__`` is not run, and a module's own import errors stay the server's to report.
"""

from __future__ import annotations

import os
import sys

from torchjob.errors import Problem, SpecError
from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from torchjob.spec.model import Job

COMMAND_LINE = "<command line>"


def _places(job: Job, extra_env: dict[str, str]) -> list[str]:
    """Directories the server may import from besides ``sys.path``: each container's working
    directory, its script's directory, and its ``PYTHONPATH``."""
    places = [os.getcwd()]
    for task in job.spec.tasks:
        for container in task.template.containers:
            cwd = container.working_dir or os.getcwd()
            places.append(cwd)
            script = next((a for a in [*container.command, *container.args][1:] if a.endswith(".py")), None)
            if script is not None:
                places.append(os.path.dirname(os.path.join(cwd, script)))
            paths = [str(v.get("value") or "") for v in container.env if v.get("name") == "PYTHONPATH"]
            for path in [*paths, extra_env.get("PYTHONPATH", "")]:
                places += [os.path.join(cwd, p) for p in path.split(os.pathsep) if p]
    return list(dict.fromkeys(places))


def _missing(name: str, places: list[str]) -> tuple[str, list[str] | None] | None:
    """None when ``name`` is found; else the first part that is not, and the directories it was
    looked for in (None: the top-level search, sys.path and the places)."""
    import importlib.machinery
    import importlib.util

    if name in sys.modules:  # this interpreter has it already (os.path, which os sets itself)
        return None
    top, *rest = name.split(".")
    spec = importlib.machinery.PathFinder.find_spec(top, places)
    if spec is None:
        try:
            spec = importlib.util.find_spec(top)  # built-in, frozen, sys.path and any import hook
        except (ImportError, ValueError):
            spec = None
    if spec is None:
        return top, None
    qualified = top
    for part in rest:  # submodules: found in the parent package's directories, never imported
        locations = list(spec.submodule_search_locations or [])
        qualified += f".{part}"
        spec = importlib.machinery.PathFinder.find_spec(qualified, locations) if locations else None
        if spec is None:
            return qualified, locations
    return None


def _close(qualified: str, locations: list[str] | None) -> str:
    """``; did you mean 'torch'?`` for a near miss among the modules where ``qualified`` was looked for."""
    import difflib
    import pkgutil

    parent, _, last = qualified.rpartition(".")
    known = {m.name for m in pkgutil.iter_modules(locations)}
    if locations is None:
        known |= set(sys.builtin_module_names)
    close = difflib.get_close_matches(last, sorted(known), n=1)
    return f"; did you mean {(parent + '.' if parent else '') + close[0]!r}?" if close else ""


def check_preload(modules: tuple[str, ...], job: Job, extra_env: dict[str, str]) -> None:
    """SpecError (exit 2) naming the first module this interpreter cannot find."""
    if not modules:
        return
    places = _places(job, extra_env)
    for name in modules:
        missing = _missing(name, places)
        if missing is not None:
            hint = _close(*missing)
            message = f"no module named {missing[0]!r} for {sys.executable}{hint}"
            raise SpecError([Problem("--preload", message, COMMAND_LINE)])
