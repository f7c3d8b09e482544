"""``FILE.py:TASK`` and ``package.module:TASK`` references to SDK tasks.

A file is imported under a private module name (so its ``if __name__ == "__main__":`` block does
not run), with its directory on ``sys.path`` for sibling imports. Its functions are pickled by
value, since a pod cannot import a module that exists only under that private name.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.util
import os
import sys
from collections.abc import Iterator
from types import ModuleType
from typing import Any, NoReturn

from torchjob.errors import Problem, SpecError
from torchjob.jobs import LoadedJob
from torchjob.sdk.task import Task

MODULE_PREFIX = "torchjob_sdk_file_"

# The files torchjob is importing now (to find their tasks): a task they call while being imported
# is refused, or rendering a file whose last line is ``train()`` would run a real job (and every
# pod, importing the file in turn, would start one more).
_importing: list[str] = []


class CalledWhileImporting(RuntimeError):
    """A task called by a file's top-level code while torchjob imports the file."""

    def __init__(self, task: str) -> None:
        super().__init__(task)
        self.task = task


def refuse_call_while_importing(task: str) -> None:
    """Called by every task call: raises CalledWhileImporting during :func:`import_file`."""
    if _importing:
        raise CalledWhileImporting(task)


class _ExitCalled(BaseException):
    """``os._exit`` called by a file's top-level code while torchjob imports it."""

    def __init__(self, code: object) -> None:
        super().__init__(code)
        self.code = code


@contextlib.contextmanager
def _exits_refused() -> Iterator[None]:
    """``os._exit`` raises :class:`_ExitCalled` in this process while a file is imported.

    It would end torchjob on the spot, printing nothing, with the file's exit code (0: "valid",
    and nothing ran). A process the file forks meanwhile still exits with it, as it means to.
    """
    real, me = os._exit, os.getpid()

    def refuse(status: int) -> NoReturn:
        if os.getpid() != me:
            real(status)
        raise _ExitCalled(status)

    os._exit = refuse
    try:
        yield
    finally:
        os._exit = real


def _fail(file: str, path: str, message: str) -> SpecError:
    return SpecError([Problem(path, message, file)])


def import_file(path: str) -> ModuleType:
    """Import ``path`` as a module; every failure is a one-line SpecError naming the file."""
    if not os.path.isfile(path):
        raise _fail(path, "", "no such file")
    full = os.path.abspath(path)
    digest = hashlib.sha1(full.encode()).hexdigest()[:10]
    name = f"{MODULE_PREFIX}{digest}"
    if name in sys.modules:
        return sys.modules[name]
    from torchjob.sdk.flyte.support import check_file

    check_file(path)  # an unserved flytekit is refused before the file imports it (and torch)
    spec = importlib.util.spec_from_file_location(name, full)
    if spec is None or spec.loader is None:
        raise _fail(path, "", "cannot be imported as a Python module")
    module = importlib.util.module_from_spec(spec)
    folder = os.path.dirname(full)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    sys.modules[name] = module
    _importing.append(full)
    try:
        with _exits_refused():
            spec.loader.exec_module(module)
    except KeyboardInterrupt:  # Ctrl-C during a slow import still stops torchjob (exit 130)
        sys.modules.pop(name, None)
        raise
    except BaseException as err:  # the file's sys.exit() must not end torchjob
        sys.modules.pop(name, None)
        raise _import_failed(path, err) from None
    finally:
        _importing.pop()
    import cloudpickle

    cloudpickle.register_pickle_by_value(module)
    return module


def _import_failed(file: str, err: BaseException) -> SpecError:
    """What went wrong importing ``file``, as one problem: other files' results are still reported."""
    if isinstance(err, CalledWhileImporting):
        return SpecError(
            [
                Problem(
                    "",
                    f"the file calls task {err.task!r} when it is imported; torchjob imports the file "
                    "to find its tasks and must not start a job then, so call it under "
                    "'if __name__ == \"__main__\":'",
                    file,
                    _line_in(file, err),
                )
            ]
        )
    if isinstance(err, SyntaxError):
        return SpecError([Problem("", f"syntax error: {err.msg}", file, err.lineno)])
    if isinstance(err, SystemExit):
        code = "" if err.code is None else repr(err.code) if isinstance(err.code, str) else _text(err.code)
        return _fail(
            file,
            "",
            f"importing the file called sys.exit({code}); torchjob imports it to find its tasks, "
            "so put what the file does as a script under 'if __name__ == \"__main__\":'",
        )
    if isinstance(err, _ExitCalled):
        return _fail(
            file,
            "",
            f"importing the file called os._exit({_text(err.code)}); torchjob imports it to find its tasks, "
            "so put what the file does as a script under 'if __name__ == \"__main__\":'",
        )
    if isinstance(err, ValueError):  # a bad task config raises at decoration time: say where
        return SpecError([Problem("", f"invalid task: {_text(err)}", file, _line_in(file, err))])
    return _fail(file, "", f"importing the file raised {type(err).__name__}: {_text(err)}")


def _line_in(file: str, err: BaseException) -> int | None:
    """The line of ``file`` that the exception passed through last (the call in its top level)."""
    import traceback

    full = os.path.abspath(file)
    lines = [f.lineno for f in traceback.extract_tb(err.__traceback__) if f.filename == full]
    return lines[-1] if lines else None


def _text(value: object) -> str:
    """``value`` for a message; an object whose ``str()`` or ``repr()`` fails must not end torchjob."""
    try:
        text = str(value) if isinstance(value, BaseException | str) else repr(value)
    except Exception:
        return f"<{type(value).__name__} that cannot be shown>"
    return " ".join(text.split())


def _task_from(module: Any, name: str, file: str) -> Task[Any, Any]:
    from torchjob.sdk.flyte import is_flyte

    found = getattr(module, name, None)
    if found is None:
        tasks = sorted(k for k, v in vars(module).items() if isinstance(v, Task))
        if "flytekit" in sys.modules:
            from torchjob.sdk.flyte.commands import entity_names

            tasks = sorted([*tasks, *entity_names(module)])
        hint = f"; tasks in this file: {', '.join(tasks)}" if tasks else "; the file defines no @task"
        raise _fail(file, name, f"no task named {name!r}{hint}")
    if is_flyte(found):  # a flytekit task, as a cluster would run it (sdk/flyte)
        from torchjob.sdk.flyte.commands import task_of

        return task_of(found, f"{file}:{name}", file)
    if not isinstance(found, Task):
        raise _fail(
            file, name, f"{name!r} is a {type(found).__name__}, not a function decorated with @torchjob.task"
        )
    return found


def load_task(ref: str) -> Task[Any, Any]:
    """The task a reference names: ``path/to/file.py:name`` or ``package.module:name``."""
    where, _, name = ref.rpartition(":")
    if not where or not name:
        raise _fail(ref, "", "expected a task reference such as file.py:my_task or package.module:my_task")
    if where.endswith(".py"):
        return _task_from(import_file(where), name, where)
    try:
        with _exits_refused():
            module = importlib.import_module(where)
    except KeyboardInterrupt:
        raise
    except BaseException as err:  # as for a file, above
        raise _import_failed(where, err) from None
    return _task_from(module, name, where)


def load_task_job(
    path: str, name: str, argv: list[str] | None = None, *, every_rank: bool = False
) -> LoadedJob:
    """The checked Job of task ``name`` in ``path``; the jobs layer calls this for ``FILE.py:TASK``.

    With ``argv`` (``--NAME VALUE`` tokens: ``run FILE.py:TASK -- ARGS``), the task's arguments:
    checked here against its signature, so a missing or mistyped one is refused before anything
    starts, and read again the same way in each pod.
    """
    import json

    from torchjob.sdk.tojob import build_job

    module = import_file(path)
    task = _task_from(module, name, path)
    ref = f"{path}:{name}"
    target = ["--task", ref]
    if argv is not None:
        from torchjob.sdk.workflow_cli import parse_arguments

        parse_arguments(task, argv, ref)
        if argv:  # Kubernetes expands $(VAR) in a command: the user's text is meant literally
            target += ["--task-args", json.dumps(argv).replace("$", "$$")]
    # every_rank: the job waits for every rank, as a task call does, instead of ending with the master
    request = task.job_request(target=target, complete_with_master=not every_rank)
    job, document = build_job(request, file=ref)
    for note in getattr(task, "flyte_notes", ()):  # what differs from the flytekit task's own view
        print(f"{ref}: warning: {note}", file=sys.stderr)
    return LoadedJob(job, document)
