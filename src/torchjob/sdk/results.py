"""How arguments, return values and exceptions cross process boundaries.

A payload is a plain-pickled dict holding the caller's ``sys.path`` and a cloudpickle blob of
``(function, args, kwargs)``: the outer layer can be read before the user's modules are importable,
so the reader extends ``sys.path`` first and only then unpickles the function.

Ranks report through files in a results directory: ``rank-0.value`` (rank 0's return value) and
``rank-<r>.error`` (a record of an exception). Files are written to a temporary name and renamed,
so a reader never sees half a file. An error record names the attempt it belongs to (the job's
restarts, then the elastic launcher's): after a restart, the last attempt's error is the task's,
as torchrun reports its last attempt's failure, and a stale record of a rank is replaced.
"""

from __future__ import annotations

import copyreg
import dataclasses
import io
import os
import pickle
import sys
import time
import traceback
from collections import ChainMap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import CodeType, TracebackType
from typing import Any, ClassVar

import cloudpickle

from torchjob.files import write_atomic


def _by_name(name: str) -> Callable[[object], str]:
    return lambda _: name  # a reducer's string: pickle saves the object as that global


# dataclasses' sentinels by reference, not as new objects: a dataclass pickled by value (defined in
# __main__ or a task's file) is rebuilt with them, and cloudpickle gives the caller's own class the
# rebuilt fields when a rank's value comes back; with copies of MISSING every field seemed to
# have a default (flytekit's type engine then failed on the class).
copyreg.pickle(type(dataclasses.MISSING), _by_name("MISSING"))
copyreg.pickle(type(dataclasses.KW_ONLY), _by_name("KW_ONLY"))

VALUE_FILE = "rank-0.value"
PROGRESS_FILE = "rendezvous.progress"
_DYNAMIC = "<dynamic-code>"


Finish = Callable[[Callable[..., Any], Any], Any]  # (the function rank 0 ran, its value) -> what goes back


@dataclass
class Call:
    function: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    finish: Finish | None = None


def _code_in_file(code: CodeType, filename: str) -> CodeType:
    return code.replace(co_filename=filename)


def _code_reduce(code: CodeType) -> tuple[Any, ...]:
    """Pickle a code object with the name of its file.

    cloudpickle writes every code object it pickles by value (functions and classes of a script's
    ``__main__``, a notebook, a file torchjob imported) under the name ``<dynamic-code>``, so a
    rank's traceback showed no file and no source line for them. The code goes with that name, as
    cloudpickle makes it, and gets its own back when it is loaded; code objects nested in its
    constants (inner functions, comprehensions) are pickled, and named again, the same way.
    """
    if code.co_filename == _DYNAMIC:
        reduced: tuple[Any, ...] = _CLOUDPICKLE_CODE(code)
        return reduced
    return _code_in_file, (code.replace(co_filename=_DYNAMIC), code.co_filename)


_CLOUDPICKLE_CODE = cloudpickle.Pickler.dispatch_table[CodeType]


class _Pickler(cloudpickle.Pickler):  # type: ignore[misc]  # cloudpickle has no type hints
    # Read by pickle when the pickler is made: an instance's own table set later is not used.
    dispatch_table: ClassVar[ChainMap[Any, Any]] = ChainMap(
        {CodeType: _code_reduce}, cloudpickle.Pickler.dispatch_table
    )


def dump_call(
    function: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    import_in_pod: bool = False,
    finish: Finish | None = None,
) -> bytes:
    """The payload of a call; with ``import_in_pod``, the rank imports the function's module (by
    name, or its file where torchjob imported it from one) and calls the function it defines;
    rank 0 hands its value to ``finish`` and returns what that gives (:func:`run_call`)."""
    buffer = io.BytesIO()
    call = (function, tuple(args), dict(kwargs), finish)
    _Pickler(buffer, protocol=cloudpickle.DEFAULT_PROTOCOL).dump(call)
    module = sys.modules.get(getattr(function, "__module__", None) or "")
    home = (module.__name__, getattr(module, "__file__", None)) if import_in_pod and module else None
    return pickle.dumps({"sys_path": list(sys.path), "blob": buffer.getvalue(), "module": home})


def load_call(data: bytes) -> Call:
    outer = pickle.loads(data)
    for entry in outer["sys_path"]:
        if entry not in sys.path:
            sys.path.append(entry)
    function, args, kwargs, finish = cloudpickle.loads(outer["blob"])
    if outer.get("module"):
        function = _as_imported(function, *outer["module"])
    return Call(function, args, kwargs, finish)


def _as_imported(function: Callable[..., Any], name: str, file: str | None) -> Callable[..., Any]:
    """``function`` as this process's own import of its module defines it. A function pickled by
    value (a flytekit task's: its module's attribute is the task) carries the globals the caller's
    import computed, so a module-level ``WORLD_SIZE = int(os.environ.get("WORLD_SIZE", 1))``
    read 1 in every rank; Flyte's pods import the module with their own environment."""
    import importlib

    from torchjob.sdk.loader import MODULE_PREFIX, import_file

    if name == "__main__":
        return function  # a script's own functions: by value, as for any local call (docs/sdk.md)
    # A file torchjob imported has a name made from its path: the same in every process.
    module = import_file(file) if name.startswith(MODULE_PREFIX) and file else importlib.import_module(name)
    found = getattr(module, getattr(function, "__name__", ""), None)
    found = getattr(found, "task_function", found)  # a flytekit task: its function
    if callable(found) and getattr(found, "__qualname__", None) == getattr(function, "__qualname__", 0):
        return found  # type: ignore[no-any-return]
    return function


def shown(value: Any, limit: int = 1000) -> str:
    """A returned value for the console: its repr, cut after ``limit`` characters; described
    instead when it cannot be printed (an int of more digits than Python turns into text)."""
    try:
        text = repr(value)
    except Exception as err:
        if isinstance(value, int):  # ValueError: sys.get_int_max_str_digits()
            digits = int((abs(value).bit_length() - 1) * 0.30102999) + 1  # at most the true count
            while 10**digits <= abs(value):
                digits += 1
            return (
                f"an integer of {digits} digits, too many to print "
                "(PYTHONINTMAXSTRDIGITS=0 lifts Python's limit)"
            )
        reason = " ".join(f"{type(err).__name__}: {err}".split())
        return f"a {type(value).__name__} that cannot be printed ({reason[:200]})"
    return text[:limit] + ("..." if len(text) > limit else "")


def write_value(results: str | os.PathLike[str], value: Any) -> None:
    write_atomic(Path(results) / VALUE_FILE, cloudpickle.dumps(value))


def read_value(results: str | os.PathLike[str]) -> tuple[bool, Any]:
    """(True, value) if rank 0 wrote a value, else (False, None)."""
    path = Path(results) / VALUE_FILE
    if not path.exists():
        return False, None
    return True, cloudpickle.loads(path.read_bytes())


class RemoteError(RuntimeError):
    """An exception raised by one rank of a distributed task, re-raised in the caller.

    ``rank``, ``exc_type``, ``message`` and ``remote_traceback`` describe it; ``original`` is the
    exception object itself when it could be unpickled (it is also the ``__cause__``).
    """

    def __init__(
        self,
        rank: int,
        exc_type: str,
        message: str,
        remote_traceback: str,
        original: BaseException | None = None,
        earlier: tuple[str, ...] = (),
    ) -> None:
        self.rank = rank
        self.exc_type = exc_type
        self.message = message
        self.remote_traceback = remote_traceback
        self.original = original
        self.earlier = earlier  # how each earlier attempt failed (``rank 1 raised ValueError: x``)
        super().__init__(rank, exc_type, message)

    def __str__(self) -> str:
        tb = self.remote_traceback.rstrip()
        head = f"rank {self.rank} raised {self.exc_type}: {self.message}"
        if self.earlier:
            count = len(self.earlier)
            head += f"\n(in the last attempt; {count} earlier one{'s' * (count > 1)} failed too: "
            head += "; ".join(self.earlier) + ")"
        return f"{head}\n\nRemote traceback (rank {self.rank}):\n{tb}" if tb else head

    def __reduce__(self) -> tuple[Any, ...]:
        fields = (self.rank, self.exc_type, self.message, self.remote_traceback, None, self.earlier)
        return (RemoteError, fields)


_SDK_DIR = os.path.dirname(os.path.abspath(__file__))


def _user_frames(tb: TracebackType | None) -> TracebackType | None:
    """Drop torchjob's own leading frames (the runner that called the function)."""
    while tb is not None and tb.tb_next is not None and tb.tb_frame.f_code.co_filename.startswith(_SDK_DIR):
        tb = tb.tb_next
    return tb


class TaskFailed(RuntimeError):
    """The task's job failed without any rank reporting an exception (e.g. a pod was killed)."""


def is_clean_exit(error: BaseException) -> bool:
    """``sys.exit()``, ``sys.exit(0)`` or ``sys.exit(None)``: the rank ended well, without a value.

    A task that exits with code 0 has succeeded, as it would under torchrun or in a pod; any other
    code (or a message) is a failure and is reported like an exception.
    """
    return isinstance(error, SystemExit) and error.code in (None, 0)


def run_call(payload: bytes) -> Any:
    """Load a rank's call and run it: its value (in rank 0, what the call's ``finish`` makes of
    it), ``None`` after a clean ``sys.exit`` (see :func:`is_clean_exit`); any other exception, or
    a failing exit, propagates."""
    call = load_call(payload)
    try:
        value = call.function(*call.args, **call.kwargs)
    except SystemExit as err:
        if not is_clean_exit(err):
            raise
        return None  # sys.exit(0): the rank succeeded without a value, as in a pod
    if call.finish is not None and os.environ.get("RANK", "0") == "0":  # only rank 0's goes back
        value = call.finish(call.function, value)
    return value


def _message(error: BaseException) -> str:
    """The exception's text; never raises, since losing the record would lose the whole error."""
    if isinstance(error, SystemExit):
        return f"the rank called sys.exit({error.code!r})"
    try:
        return str(error)
    except Exception as err:  # a broken __str__ must not hide the exception it belongs to
        try:
            detail = f"{type(err).__name__}: {err}"
        except Exception:
            detail = type(err).__name__
        return f"<str() of the {type(error).__name__} failed with {detail}>"


def user_traceback(error: BaseException) -> str:
    """The exception's traceback from the user's code on (torchjob's runner frames left out)."""
    try:
        return "".join(traceback.format_exception(type(error), error, _user_frames(error.__traceback__)))
    except Exception:  # the traceback module copes with most broken exceptions, but not all
        return "".join(traceback.format_tb(_user_frames(error.__traceback__)))


def _count(name: str) -> int:
    value = os.environ.get(name, "")
    return int(value) if value.isdigit() else 0


def attempt(launcher_restarts: int | None = None) -> list[int]:
    """Which attempt of the task this process runs in: the job's restarts (a local pod's
    TORCHJOB_RETRY_COUNT), then the elastic launcher's (its workers' TORCHELASTIC_RESTART_COUNT,
    or ``launcher_restarts`` in the launcher itself)."""
    restarts = _count("TORCHELASTIC_RESTART_COUNT") if launcher_restarts is None else launcher_restarts
    return [_count("TORCHJOB_RETRY_COUNT"), restarts]


def error_record(rank: int, error: BaseException) -> dict[str, Any]:
    kind = type(error)
    name = (
        kind.__qualname__
        if kind.__module__ in ("builtins", "__main__")
        else f"{kind.__module__}.{kind.__qualname__}"
    )
    try:
        original: bytes | None = cloudpickle.dumps(error)
    except Exception:  # some exceptions hold unpicklable state; the text is enough then
        original = None
    return {
        "rank": rank,
        "type": name,
        "message": _message(error),
        "traceback": user_traceback(error),
        "time": time.time(),
        "original": original,
        "attempt": attempt(),
    }


def write_error(results: str | os.PathLike[str], rank: int, error: BaseException) -> None:
    write_atomic(Path(results) / f"rank-{rank}.error", pickle.dumps(error_record(rank, error)))


def write_failure(
    results: str | os.PathLike[str], rank: int, exc_type: str, message: str, when: float, restarts: int
) -> None:
    """Record a rank that died without raising (killed by a signal, ``os._exit``) in the launcher's
    last attempt, after ``restarts`` restarts of its workers."""
    path = Path(results) / f"rank-{rank}.error"
    now = attempt(restarts)
    if _attempt_of(_read_record(path)) >= now:  # the rank's own record of this attempt is better
        return
    record = {
        "rank": rank,
        "type": exc_type,
        "message": message,
        "traceback": "",
        "time": when,
        "original": None,
        "attempt": now,
    }
    write_atomic(path, pickle.dumps(record))


def _read_record(path: Path) -> dict[str, Any] | None:
    try:
        record = pickle.loads(path.read_bytes())
    except (OSError, pickle.UnpicklingError, EOFError):
        return None
    return record if isinstance(record, dict) else None


def _attempt_of(record: dict[str, Any] | None) -> list[int]:
    return [-1] if record is None else list(record.get("attempt") or [0, 0])


def first_error(results: str | os.PathLike[str]) -> RemoteError | None:
    """The earliest rank error of the last attempt that failed (later ones are usually its
    consequences; earlier attempts' were retried), or None."""
    records = [r for r in map(_read_record, Path(results).glob("rank-*.error")) if r is not None]
    if not records:
        return None
    by_attempt: dict[tuple[int, ...], list[dict[str, Any]]] = {}
    for record in records:
        by_attempt.setdefault(tuple(_attempt_of(record)), []).append(record)
    firsts = [min(by_attempt[key], key=lambda r: (r["time"], r["rank"])) for key in sorted(by_attempt)]
    first = firsts[-1]
    original = None
    if first["original"] is not None:
        try:
            original = cloudpickle.loads(first["original"])
        except Exception:  # the exception's class may not import here
            original = None
    earlier = tuple(f"rank {r['rank']} raised {r['type']}: {_one_line(r['message'])}" for r in firsts[:-1])
    error = RemoteError(first["rank"], first["type"], first["message"], first["traceback"], original, earlier)
    error.__cause__ = original
    return error


def _one_line(message: str, limit: int = 200) -> str:
    text = " ".join(message.split())
    return text[:limit] + ("..." if len(text) > limit else "")
