"""``FILE.py:TASK`` and ``package.module:TASK`` references to SDK tasks.

A file is imported under a private module name (so its ``if __name__ == "__main__":`` block does
not run), with its directory on ``sys.path`` for sibling imports. Its functions are pickled by
value, since a pod cannot import a module that exists only under that private name.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
from types import ModuleType
from typing import Any

from torchjob.errors import Problem, SpecError
from torchjob.jobs import LoadedJob
from torchjob.sdk.task import Task

MODULE_PREFIX = "torchjob_sdk_file_"


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
    spec = importlib.util.spec_from_file_location(name, full)
    if spec is None or spec.loader is None:
        raise _fail(path, "", "cannot be imported as a Python module")
    module = importlib.util.module_from_spec(spec)
    folder = os.path.dirname(full)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except SyntaxError as err:
        del sys.modules[name]
        raise SpecError([Problem("", f"syntax error: {err.msg}", path, err.lineno)]) from None
    except ValueError as err:  # a bad task config raises at decoration time
        del sys.modules[name]
        raise _fail(path, "", f"invalid task: {err}") from None
    except Exception as err:
        del sys.modules[name]
        raise _fail(path, "", f"importing the file raised {type(err).__name__}: {err}") from None
    import cloudpickle

    cloudpickle.register_pickle_by_value(module)
    return module


def _task_from(module: Any, name: str, file: str) -> Task[Any, Any]:
    found = getattr(module, name, None)
    if found is None:
        tasks = sorted(k for k, v in vars(module).items() if isinstance(v, Task))
        hint = f"; tasks in this file: {', '.join(tasks)}" if tasks else "; the file defines no @task"
        raise _fail(file, name, f"no task named {name!r}{hint}")
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
        module = importlib.import_module(where)
    except Exception as err:
        raise _fail(where, "", f"cannot import module: {type(err).__name__}: {err}") from None
    return _task_from(module, name, where)


def load_task_job(path: str, name: str) -> LoadedJob:
    """The checked Job of task ``name`` in ``path``; the jobs layer calls this for ``FILE.py:TASK``."""
    from torchjob.sdk.tojob import build_job

    task = _task_from(import_file(path), name, path)
    ref = f"{path}:{name}"
    job, document = build_job(task.job_request(target=["--task", ref]), file=ref)
    return LoadedJob(job, document)
