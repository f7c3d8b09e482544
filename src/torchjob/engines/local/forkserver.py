"""The preloading fork server: import torch once, then fork each container's program from it.

This file is not imported by torchjob. With ``torchjob run --preload torch`` the engine starts
``python [options] -c BOOT <this file> <warmstart.py> <requests fd> <replies fd> <modules> <path0>
<watched env prefixes>``
(see ``preload.py``). ``BOOT`` loads this file into a private namespace and calls :func:`main`,
which loads ``warmstart.py`` the same way (its runner is reused: the program runs as a cold start
would run it), and then

1. imports the modules with stdout and stderr set aside; replies ``ready`` when that was silent
   and left the process with one thread (no thread pool, no CUDA, no process group), else
   ``cold <why>`` and ends: the engine then starts every container cold;
2. for each request (a container's argv, env, working directory and log file) makes the
   container's process a child of the engine, so that the engine waits for it as if it had
   spawned it: one fork whose parent is the server's own (``clone`` with ``CLONE_PARENT``, see
   :func:`_fork_to_engine`), or where that cannot be done two forks, the middle process ending
   so that the grandchild is reparented to the engine (a child subreaper). The process starts a
   session of its own, adopts its orphans, takes the log as stdout and stderr, /dev/null as
   stdin, the container's environment and working directory, then tells the server its pid
   (which the server replies to the engine) and runs the program;
   a ``spare`` request (the warm pool's, once a job's containers have ended) forks such a process
   ahead of time: it waits, in the server's session, for a container's request of its own, and
   the next container is handed to it, so that the fork is off the container's start (``spare
   <pid>`` is replied, or ``nospare`` where it needs two forks); a spare ends when the server
   does (end of file on its pipe);
3. ends at end of file on the requests pipe (the engine is gone).

Only what the interpreter loaded anyway (os, sys) and what the preloaded modules imported
(ctypes, threading and, when there, gc: torch imports them) is used, so that ``sys.modules`` is
what a cold start with the modules imported has.
"""

from __future__ import annotations

import os
import sys
from typing import Any

PR_SET_CHILD_SUBREAPER = 36
CLONE_PARENT = 0x8000  # the new process's parent is the caller's parent: the engine
SIGCHLD = 17
# clone's system call number; with no stack, thread ids or TLS given, its argument order (which
# differs between these two) does not matter.
SYS_CLONE = {"x86_64": 56, "aarch64": 220}
SPARE = b"spare..."  # a request's 8-byte head that asks for a spare process instead
Spare = tuple[int, int, int]  # a spare's pid, the pipe its request goes to, the pipe it reports on
_clone: list[Any] = []  # (syscall, its arguments, the C API) once looked up; [None]: two forks
WARNING = (
    "torchjob: warning: the program sets {name} after torch was imported (torchjob run --preload); "
    "it may have no effect\n"
)


def main() -> None:
    boot = sys._getframe(1).f_code
    here, runner_path, requests_text, replies_text, modules_text, path0, prefixes = sys.argv[1:8]
    requests, replies = int(requests_text), int(replies_text)
    prefix = sys.orig_argv[: len(sys.orig_argv) - len(sys.argv) - 1]  # python and its options
    runner = _load(runner_path)
    sys.path[0] = path0  # where the containers' programs import from (the same for all of them)
    why = _preload(runner, [m for m in modules_text.split(",") if m])
    _write(1, f"imported {modules_text}: {why or 'ready'}\n".encode())  # preload.log (fd 1)
    _write(replies, b"ready\n" if not why else f"cold {why}\n".encode())
    if why:
        os._exit(0)
    # Every object the import made goes to the collector's permanent generation: a forked
    # program's collections never walk them, so their pages are not copied into each program
    # (a full collection of torch's objects is about 0.1 s of CPU, and every page it touches).
    # (gc is imported by torch; a module that does not import it leaves it out of sys.modules.)
    if "gc" in sys.modules:
        sys.modules["gc"].freeze()
    files = {here, runner_path}
    spares: list[Spare] = []
    while True:
        request = _read_request(requests)
        if request is None:
            os._exit(0)  # the engine is gone or done
        if request == SPARE:
            child = _fork_spare(spares, requests, replies)
        elif _hand_to_spare(spares, request, replies):
            child = None
        else:
            child = _fork(request, requests, replies, spares)
        if child is not None:  # in the container's process: the server's loop is left behind
            _run(runner, prefix, child, files, boot, tuple(prefixes.split(",")))
            raise SystemExit(0)


def _load(path: str) -> dict[str, Any]:
    with open(path, "rb") as handle:
        source = handle.read()
    namespace: dict[str, Any] = {"__name__": "torchjob_preload_runner", "__builtins__": __builtins__}
    exec(compile(source, path, "exec"), namespace)
    return namespace


def _preload(runner: dict[str, Any], modules: list[str]) -> str:
    """Import the modules; why the server cannot be used, or '' when it can."""
    if not runner["_warm"](modules):
        return "the import failed or printed something"
    # numpy's OpenBLAS starts a thread pool when imported (a cold start has it too); it stops it
    # before every fork and starts it anew when next needed. Any thread still there after a fork
    # would be missing in the forked programs, with its locks possibly held: refuse.
    threads = len(os.listdir("/proc/self/task"))
    if threads != 1:  # (with one thread, as with OMP_NUM_THREADS=1, nothing is there to stop)
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
        threads = len(os.listdir("/proc/self/task"))
    if threads != 1:
        return f"the import started {threads - 1} thread(s) that a fork does not stop"
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return "the import initialised CUDA"
    if "ctypes" not in sys.modules:  # needed for the subreaper flag; not imported for the program
        return "ctypes was not imported"
    return ""


def _write(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data) :]


def _read_exactly(fd: int, size: int) -> bytes | None:
    data = b""
    while len(data) < size:
        chunk = os.read(fd, size - len(data))
        if not chunk:
            return None
        data += chunk
    return data


def _read_request(fd: int) -> bytes | None:
    """A request as sent by ``preload.encode`` (the body, without its length), or ``SPARE``."""
    head = _read_exactly(fd, 8)
    if head is None:
        return None
    if head == SPARE:
        return SPARE
    return _read_exactly(fd, int(head))


def _fields(request: bytes) -> list[bytes]:
    """[cwd, log, argc, *tail, *env entries] (tail: the container's argv after python and its
    options, which are the server's)."""
    return request.split(b"\0")


def _fork_spare(spares: list[Spare], requests: int, replies: int) -> list[bytes] | None:
    """In the server: fork a spare process, the engine's child like a container's, that waits for a
    request of its own (``_hand_to_spare``), and reply ``spare <pid>`` (``nospare`` where a process
    cannot be made the engine's child at once). In the spare, once it is handed a request and set
    up as that container: the request's argv (None never: a spare with no request ends)."""
    task_r, task_w = os.pipe()
    report_r, report_w = os.pipe()
    pid = _fork_to_engine()
    if pid == 0:
        for fd in (requests, replies, task_w, report_r, *[f for s in spares for f in s[1:]]):
            os.close(fd)
        _subreaper()  # what needs no request is done while it waits, off the container's start
        os.environb.clear()  # (the request's environment replaces the server's anyway)
        request = _read_request(task_r)  # until a container is asked of it
        if request is None or request == SPARE:
            os._exit(0)  # the server ended (or was killed) first: nothing of the spare remains
        os.close(task_r)
        return _become_container(_fields(request), report_w, subreaper=False)
    os.close(task_r)
    os.close(report_w)
    if pid is None:  # two forks would leave it nobody's child between jobs: no spares here
        os.close(task_w)
        os.close(report_r)
        _write(replies, b"nospare\n")
        return None
    spares.append((pid, task_w, report_r))
    _write(replies, b"spare %d\n" % pid)
    return None


def _hand_to_spare(spares: list[Spare], request: bytes, replies: int) -> bool:
    """Give the request to the oldest spare and reply as ``_fork`` does; False when no spare took it
    (none left; one that died meanwhile is replied as ``gone <pid>``, for the engine to reap)."""
    while spares:
        pid, task_w, report_r = spares.pop(0)
        try:
            _write(task_w, b"%08d" % len(request) + request)
        except OSError:  # it died (killed): the next one
            os.close(task_w)
            os.close(report_r)
            _write(replies, b"gone %d\n" % pid)
            continue
        os.close(task_w)
        answer = _read_exactly(report_r, 8)  # its pid, once it is set up; nothing when that failed
        os.close(report_r)
        _reply(request, answer, replies, pid)
        return True
    return False


def _reply(request: bytes, answer: bytes | None, replies: int, pid: int | None) -> None:
    """``pid <pid>``, or ``fail <pid>`` (the engine's child that ended, to reap; ``fail`` where
    the process is not known here: the two forks)."""
    line = b"pid " + answer + b"\n" if answer else b"fail %d\n" % pid if pid else b"fail\n"
    what = b"forked " + answer if answer else b"could not set up the container"
    _write(1, what + b" for " + _fields(request)[1] + b"\n")  # preload.log
    _write(replies, line)


def _fork(
    request_bytes: bytes, requests: int, replies: int, spares: list[Spare] | tuple[()] = ()
) -> list[bytes] | None:
    """In the server: fork the container's process and reply its pid (or ``fail``); returns None.
    In the container's process, set up: returns the request."""
    request = _fields(request_bytes)
    report_r, report_w = os.pipe()
    pid = _fork_to_engine()
    if pid == 0:
        for fd in (report_r, requests, replies, *[f for s in spares for f in s[1:]]):
            os.close(fd)
        return _become_container(request, report_w)
    if pid is None:
        middle = os.fork()
        if middle == 0:  # the intermediate: its child goes to the engine when it ends
            os.close(report_r)
            if os.fork() == 0:
                os.close(requests)
                os.close(replies)
                return _become_container(request, report_w)
            os._exit(0)
        os.close(report_w)
        os.waitpid(middle, 0)  # reparenting is done once the intermediate has ended
    else:
        os.close(report_w)
    answer = _read_exactly(report_r, 8)  # its pid, once it is set up; nothing when it failed
    os.close(report_r)
    _reply(request_bytes, answer, replies, pid)
    return None


def _fork_to_engine() -> int | None:
    """``os.fork``, except that the child's parent is the engine (the server's parent) from its
    start: 0 in the child, its pid in the server, None when this cannot be done here.

    One fork instead of two: each fork of a process that has imported torch copies the page
    tables of its 150-300 MB (torch's CPU or CUDA build), and the middle process of two forks
    tears its copy down again before the server may reply: about 10-40 ms per container on this
    2-core machine, in series, against 5-15 ms. Python has no ``clone``; the system call is made
    as ``os.fork`` makes its ``fork``, between the interpreter's own before- and after-fork steps
    (locks, the threading module, ``os.register_at_fork`` hooks). What libc's ``fork`` adds is not
    needed in this process: it has one thread (checked at import), so no lock of libc's can be
    held, and the ``pthread_atfork`` handlers of the libraries torch loads act on threads there
    are none of here.
    """
    if not _clone:
        _clone.append(_clone_call())
    call = _clone[0]
    if call is None:
        return None
    syscall, args, api = call
    api.PyOS_BeforeFork()
    pid = int(syscall(*args))
    if pid == 0:
        api.PyOS_AfterFork_Child()
        return 0
    api.PyOS_AfterFork_Parent()
    if pid < 0:  # not allowed here (a seccomp filter, an init process): two forks from now on
        _clone[0] = None
        return None
    return pid


def _clone_call() -> tuple[Any, tuple[Any, ...], Any] | None:
    number = SYS_CLONE.get(os.uname().machine)
    ctypes: Any = sys.modules["ctypes"]
    if number is None:
        return None
    try:
        syscall = ctypes.PyDLL(None).syscall  # PyDLL: the GIL is held through the call, as os.fork does
        syscall.restype = ctypes.c_long
        zero = ctypes.c_long(0)  # (a plain int would leave a long's upper half undefined)
        args = (ctypes.c_long(number), ctypes.c_long(CLONE_PARENT | SIGCHLD), zero, zero, zero, zero)
        return syscall, args, ctypes.pythonapi
    except (AttributeError, OSError):
        return None


def _subreaper() -> None:
    """The process adopts its orphans, as a container started cold does."""
    import ctypes  # imported by torch already (checked): nothing new in sys.modules

    ctypes.CDLL(None).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def _become_container(request: list[bytes], report: int, subreaper: bool = True) -> list[bytes]:
    try:
        os.setsid()
        if subreaper:  # (a spare is one already)
            _subreaper()
        cwd, log, argc = request[0], request[1], int(request[2])
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW
        out = os.open(log, flags, 0o600)
        null = os.open(os.devnull, os.O_RDONLY)
        os.chdir(cwd)
    except BaseException:
        os._exit(127)  # no pid reported: the engine starts the container cold and says why
    os.dup2(null, 0)
    os.dup2(out, 1)
    os.dup2(out, 2)
    os.close(null)
    os.close(out)
    environ = dict(entry.split(b"=", 1) for entry in request[3 + argc :] if entry)
    os.environb.clear()
    os.environb.update(environ)
    if "tempfile" in sys.modules:  # what a preloaded module asked (torch._inductor does) is the
        import tempfile  # server's TMPDIR: the pod's own comes from its environment at the next ask

        tempfile.tempdir = None
    _write(report, b"%08d" % os.getpid())
    os.close(report)
    return request[3 : 3 + argc]


def _run(
    runner: dict[str, Any],
    prefix: list[str],
    tail_bytes: list[bytes],
    files: set[str],
    boot: Any,
    watched: tuple[str, ...],
) -> None:
    """Run the program as ``python [options] <tail>`` started now would (warmstart's runner)."""
    tail = [os.fsdecode(a) for a in tail_bytes]  # the container's argv after python and its options
    cold = [*prefix, *tail]
    mode, target, args = runner["_parse"](tail)
    sys.argv[:] = [target if mode == "script" else f"-{mode}", *args]
    sys.path[0] = runner["_path0"](mode, target)
    sys.orig_argv[:] = cold
    numpy_random = sys.modules.get("numpy.random")  # (random reseeds itself in a forked child)
    if numpy_random is not None:
        numpy_random.seed()  # from the OS's entropy, as at a cold import: not the server's state
    _watch_environ(watched)
    runner["_run"](mode, target, cold, files, boot)


def _watch_environ(watched: tuple[str, ...]) -> None:
    """Say once when the program sets, in os.environ, what torch and the native libraries it loads
    (OpenMP, MKL, OpenBLAS) read when the server imported them (preload.IMPORT_TIME_PREFIXES)."""
    base = type(os.environ)
    said: list[str] = []

    class _Environ(base):  # type: ignore[valid-type,misc]
        def __setitem__(self, key: str, value: str) -> None:
            if not said and key.startswith(watched) and self.get(key) != value:
                said.append(key)
                sys.stderr.write(WARNING.format(name=key))
                sys.stderr.flush()
            base.__setitem__(self, key, value)

    _Environ.__module__, _Environ.__qualname__ = base.__module__, base.__qualname__
    os.environ.__class__ = _Environ
