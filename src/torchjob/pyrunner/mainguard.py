"""A rank that starts a process by spawn or forkserver from its script's unguarded top level fails
at once, with the reason, instead of leaving that process to join its process group.

This file is not imported by torchjob: ``warmstart.py`` loads it into the process of every program
it runs, and :func:`watch` is called before the program starts. Standard library only; ``ast`` is
imported only when a process is started by spawn or forkserver while torch.distributed is
initialized.

Python starts such a process by running the main script again, as ``__mp_main__``, and stops it
with "An attempt has been made to start a new process before the current process has finished its
bootstrapping phase" once that run, in a script without ``if __name__ == "__main__":``, reaches the
line that starts processes. A distributed script calls ``init_process_group`` on its way there: the
new process joins the job's store with the rank's own ``RANK``, ``MASTER_ADDR`` and
``MASTER_PORT`` (under torchrun every rank, 0 too, is a client of the agent's store) and usually
waits in gloo's rendezvous or the first collective for peers that never come, while the rank waits
for it (a DataLoader's workers have no timeout). torchrun and torchjob alike hung there in many
runs (a small DDP script: 2 of 3 under bare torchrun) and failed fast only when two such processes
happened to pair up. The rank can tell before starting it that the process cannot end well: the
start happens while ``__main__``'s top level runs (the new process's run of it gets there too), in
a script that names nothing a guard would (``__name__``, ``parent_process``, ...), under no ``if``
that reads the environment. Then the rank raises that (``RuntimeError``) instead, and the job
fails at once with the reason.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from importlib.machinery import ModuleSpec
    from types import FrameType, ModuleType
    from typing import Any

SPAWN = "multiprocessing.spawn"  # its get_preparation_data is called for every spawn/forkserver start
# Names a script uses to tell its own run from a child's: such a script may well be guarded.
GUARDS = frozenset(("__name__", "parent_process", "current_process", "_inheriting", "freeze_support"))
ENVIRONMENT = frozenset(("environ", "getenv"))


def watch() -> None:
    """Check every spawn or forkserver start of this process (:func:`_checked`), from now on."""
    spawn = sys.modules.get(SPAWN)
    if spawn is not None:  # a preloaded torch imported it already
        _wrap(spawn)
    else:
        sys.meta_path.insert(0, _WhenImported())


class _WhenImported:
    """A finder that only waits for ``multiprocessing.spawn`` to be imported, wraps it, and leaves."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> ModuleSpec | None:
        if name != SPAWN:
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec: ModuleSpec | None = find(name, path, target) if find is not None else None
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader.exec_module = _then_wrap(spec.loader.exec_module)  # type: ignore[method-assign,assignment]
                return spec
        return None


def _then_wrap(exec_module: Callable[[ModuleType], None]) -> Callable[[ModuleType], None]:
    def run(module: ModuleType) -> None:
        exec_module(module)
        _wrap(module)

    return run


def _wrap(spawn: Any) -> None:
    original: Callable[[str], dict[str, Any]] = spawn.get_preparation_data

    def get_preparation_data(name: str) -> dict[str, Any]:
        data = original(name)  # Python's own check first: in a bootstrapping child it raises
        problem = _checked(sys._getframe(1))
        if problem:
            raise RuntimeError(problem)
        return data

    spawn.get_preparation_data = get_preparation_data


_SEEN: dict[tuple[str, int], bool] = {}  # (script, line): a start from there cannot end well


def _checked(caller: FrameType) -> str | None:
    """Why a process started now, from ``caller``, would join this rank's process group, or None."""
    try:
        dist = sys.modules.get("torch.distributed")
        if dist is None or not dist.is_available() or not dist.is_initialized():
            return None
        main = sys.modules["__main__"]
        script = getattr(main, "__file__", None)
        frame: FrameType | None = caller
        while frame is not None and (frame.f_code.co_name != "<module>" or frame.f_globals is not vars(main)):
            frame = frame.f_back
        if not script or frame is None:
            return None  # -c, or started from code the new process will not run on its way
        line = frame.f_lineno or 0
        if (script, line) not in _SEEN:
            _SEEN[script, line] = unguarded(script, line)
        if not _SEEN[script, line]:
            return None
        method = "forkserver" if "forkserver" in caller.f_code.co_filename else "spawn"
    except Exception:  # not the Python or torch this was written for: Python's own way
        return None
    return (
        f'{os.path.basename(script)} (line {line}) starts a process by "{method}" at its top level, '
        'which has no `if __name__ == "__main__":` guard: that process would run the script again '
        f"from the start, join the job's process group as a second rank {os.environ.get('RANK', '?')} "
        "and wait there for peers that never come, before Python's own check could stop it (\"An "
        "attempt has been made to start a new process before the current process has finished its "
        'bootstrapping phase"). Put the script\'s work under `if __name__ == "__main__":` '
        '("Safe importing of main module", https://docs.python.org/3/library/multiprocessing.html), '
        'or use the "fork" start method.'
    )


def unguarded(script: str, line: int) -> bool:
    """Whether another run of ``script``'s top level would reach ``line`` as this one did: the
    script names nothing a guard would, and no ``if`` or ``while`` around the line reads the
    environment (a flag a parent may set before it starts processes)."""
    import ast

    with open(script, "rb") as handle:
        tree = ast.parse(handle.read(), script)
    if _names(tree) & GUARDS:
        return False
    node: ast.AST = tree
    while True:
        stmt = next((s for s in _inner(node) if s.lineno <= line <= (s.end_lineno or s.lineno)), None)
        if stmt is None:
            return node is not tree  # a compound statement's header (a for's, a with's)
        if isinstance(stmt, (ast.If, ast.While)) and _names(stmt.test) & ENVIRONMENT:
            return False
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            return line < stmt.body[0].lineno  # its body runs in a frame of its own, not the top level's
        node = stmt


def _inner(node: Any) -> Any:
    """The statements directly inside ``node``, those of its except clauses and match cases too."""
    import ast

    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.stmt):
            yield child
        elif isinstance(child, (ast.excepthandler, ast.match_case)):
            yield from _inner(child)


def _names(node: Any) -> set[str]:
    import ast

    return {
        n.id if isinstance(n, ast.Name) else n.attr
        for n in ast.walk(node)
        if isinstance(n, (ast.Name, ast.Attribute))
    }
