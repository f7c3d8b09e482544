"""The job file of ``torchjob run FILE``, read by a second process while the command imports the rest.

Before its first pod can start, ``torchjob run job.yaml`` spends about 13 ms on PyYAML (importing
it, most of it one regular expression PyYAML compiles, then the parse) on one core, while the
machine's other cores wait. Started first thing, a forked child reads and parses the file there
as this process imports the command line and the engine; the documents come back over a pipe,
marshalled (they are plain values: the parser keeps nothing else). Whatever goes wrong on that
way (no fork, the child failing, the command loading another file, the file changed) leaves the
file to be read here, as it is without this; the outcome is the same either way, problems too.

The child dies with this process (``PR_SET_PDEATHSIG``), and is reaped or killed before a job's
processes start (``keep_only`` after the command line is parsed, ``take`` when the file is loaded).
"""

from __future__ import annotations

import marshal
import os
import stat
import sys
import time

from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

    from torchjob.errors import Problem
    from torchjob.spec.source import Document

COMMANDS = ("run",)  # whose start-up is worth a second process
SUFFIXES = (".yaml", ".yml", ".json")
# A parse takes as long in either process: past this the child is taken for stuck and killed.
WAIT_LIMIT = 120.0
_PR_SET_PDEATHSIG = 1


class _Pending:
    def __init__(self, file: str, pid: int, fd: int, identity: tuple[int, int, int, int]) -> None:
        self.file, self.pid, self.fd, self.identity = file, pid, fd, identity


_pending: list[_Pending] = []


def job_file(argv: Sequence[str]) -> str | None:
    """The job file ``argv`` most likely names: the first argument after one of COMMANDS that is
    not an option and names a regular YAML or JSON file. A wrong guess (an option's value) costs
    a parse nobody uses; ``keep_only`` then drops it."""
    args = list(argv)
    at = next((i for i, arg in enumerate(args) if not arg.startswith("-")), None)
    if at is None or args[at] not in COMMANDS:
        return None
    for arg in args[at + 1 :]:
        if arg == "--":
            return None
        if not arg.startswith("-") and arg.lower().endswith(SUFFIXES):
            return arg
    return None


def start(argv: Sequence[str]) -> None:
    """Read the job file ``argv`` names in a child process, if it names one; never fails."""
    file = job_file(argv)
    threading = sys.modules.get("threading")
    if file is None or (threading is not None and threading.active_count() > 1):
        return  # (a fork copies no other thread: one holding a lock would leave it held in the child)
    if not idle_core():
        return
    try:
        info = os.stat(file)
        if not stat.S_ISREG(info.st_mode):  # a pipe or a device: read once, by whoever needs it
            return
        read_fd, write_fd = os.pipe()
    except OSError:
        return
    import signal  # (imported by the command anyway: not before it is known to be needed)

    parent = os.getpid()
    try:
        pid = os.fork()
    except OSError:
        os.close(read_fd)
        os.close(write_fd)
        return
    if pid == 0:  # pragma: no cover - the child (its result is what the tests check)
        try:
            os.close(read_fd)
            _serve(file, write_fd, parent, signal)
        finally:
            os._exit(0)
    os.close(write_fd)
    os.set_blocking(read_fd, False)
    _pending.append(_Pending(file, pid, read_fd, _identity(info)))


def idle_core(loadavg: str = "/proc/loadavg") -> bool:
    """Whether another core is free for the child now: with none, its CPU would come out of this
    process's (measured: the start was ~7 ms slower at a load of 3 on 2 cores). The processes
    running at this instant (``/proc/loadavg``, this one among them), not the load average, which
    still counts the jobs that ended in the last minute."""
    try:
        cores = len(os.sched_getaffinity(0))
        with open(loadavg, "rb") as numbers:
            running = int(numbers.read().split()[3].split(b"/")[0])
    except (AttributeError, OSError, ValueError, IndexError):
        return False
    return running < cores


def _serve(file: str, out: int, parent: int, signal: Any) -> None:  # pragma: no cover - runs in the child
    """Parse ``file`` as ``load_documents`` would and write the outcome to ``out``."""
    try:
        signal.signal(signal.SIGINT, signal.SIG_DFL)  # a Ctrl-C ends this process, quietly
        import ctypes

        ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the line above
            return
        from torchjob.errors import SpecError
        from torchjob.spec import source

        try:
            documents = source.parse_documents(source.read_text(file), file)
            outcome: tuple[Any, ...] = ("documents", [_packed(d) for d in documents])
        except SpecError as err:
            outcome = ("problems", _rows(err.problems))
        data = memoryview(marshal.dumps(outcome))
        while data:
            data = data[os.write(out, data) :]
    except BaseException:  # nothing (or half) written: the parent reads the file itself
        return


def _packed(document: Document) -> tuple[object, ...]:  # pragma: no cover - runs in the child
    rows = _rows(document.problems)
    return (document.data, document.lines, document.index, document.total, rows, document.prefix)


def _rows(problems: list[Problem]) -> list[tuple[object, ...]]:  # pragma: no cover - runs in the child
    """Problems as marshal carries them: ``Problem(*row)`` makes each again."""
    return [(p.path, p.message, p.file, p.line) for p in problems]


def _identity(info: os.stat_result) -> tuple[int, int, int, int]:
    return (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)


def reading(file: str) -> bool:
    """Whether a child is reading ``file``: the caller has time to import what it needs next."""
    return any(p.file == file for p in _pending)


def take(file: str) -> list[Document] | None:
    """The documents of ``file`` as the child read them (a SpecError as the child found it), or
    None when no child read this file or its answer cannot be used: then the caller reads it."""
    found = next((p for p in _pending if p.file == file), None)
    if found is None:
        return None
    _pending.remove(found)
    data = _collect(found)
    try:
        unchanged = _identity(os.stat(file)) == found.identity  # (and the same working directory)
    except OSError:
        unchanged = False
    if not data or not unchanged:
        return None
    try:
        kind, items = marshal.loads(data)
    except (EOFError, ValueError, TypeError):
        return None
    from torchjob.errors import Problem, SpecError
    from torchjob.spec.source import Document

    if kind == "problems":
        raise SpecError([Problem(*item) for item in items])
    documents = []
    for data_, lines, index, total, problems, prefix in items:
        document = Document(data=data_, file=file, lines=lines, index=index, total=total, prefix=prefix)
        document.problems = [Problem(*p) for p in problems]
        documents.append(document)
    return documents


def _collect(pending: _Pending) -> bytes:
    """Everything the child wrote, once it closed its end (it ended); b"" if it was too slow."""
    import select

    chunks: list[bytes] = []
    poller = select.poll()
    poller.register(pending.fd, select.POLLIN)
    deadline = time.monotonic() + WAIT_LIMIT
    complete = False
    try:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            if not poller.poll(int(left * 1000) + 1):
                continue
            try:
                chunk = os.read(pending.fd, 1 << 20)
            except BlockingIOError:
                continue
            if not chunk:
                complete = True
                break
            chunks.append(chunk)
    finally:
        os.close(pending.fd)
        _end(pending.pid, kill=not complete)
    return b"".join(chunks) if complete else b""


def _end(pid: int, kill: bool) -> None:
    import contextlib
    import signal

    if kill:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)  # it closed the pipe as it exited, or it was killed: no wait to speak of


def keep_only(file: str | None) -> None:
    """Drop (kill and reap) the children reading anything but ``file``, the file the command loads."""
    for pending in [p for p in _pending if p.file != file]:
        _pending.remove(pending)
        os.close(pending.fd)
        _end(pending.pid, kill=True)
