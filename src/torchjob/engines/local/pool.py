"""The warm pool: one fork server per Python process, kept from one job to the next.

The SDK asks for it (``StartOptions.warm``) when a task is called in a notebook or a script: the
first local job starts a fork server (``preload.py``, the machinery of ``run --preload``) that
imports torch and the task's module; later jobs of the same process fork their main containers
from it instead of starting a new one. Each container is still a fresh process, forked under the
same rules as ``--preload`` (its environment apart from per-pod names equal to the server's,
torchjob's python, the same options and directories); a container that does not fit starts cold.

The server carries no job's marker (a job's end does not sweep it) and ends with this process: at
exit (atexit), when the thread that started it ends (``PR_SET_PDEATHSIG``: a killed notebook
kernel), and when its request pipe closes. A module whose source file changed since the server
imported it is not reused: the server is replaced, so an edit takes effect in the next call.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import subprocess
import sys
from pathlib import Path

from torchjob import logs, scratch
from torchjob.engines.local.preload import ENDED, Preloader
from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable
    from concurrent.futures import ThreadPoolExecutor

    from torchjob.engines.local.containers import ContainerRun
    from torchjob.engines.local.netns import Network

Sources = tuple[tuple[str, int, int], ...]

_pools: dict[tuple[str, ...], tuple[Sources, Preloader]] = {}
_spares: dict[tuple[str, ...], Preloader] = {}  # the server a for_job replaced, kept for a return
_home: list[Path] = []  # the pool's private directory (its servers' preload.log), made once
# The network namespace of the pool's jobs (netns.py), made once: its servers run in it, and so do
# all processes of the jobs they serve (forked or not); only this user may enter it. A str: why none.
_network: list[Network | str] = []
_starter: list[ThreadPoolExecutor] = []  # the thread that starts the servers (_launch), made once
LAUNCH_TIMEOUT = 60.0  # seconds for starting a server's process (not its import)


def _source(name: str) -> tuple[str, int, int] | None:
    """(file, mtime, size) of a module's source as this process would import it now."""
    module = sys.modules.get(name)
    path = getattr(module, "__file__", None)
    if path is None:
        import importlib.util

        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            return None
        path = spec.origin if spec is not None else None
    if not path or not os.path.isfile(path):
        return None
    stat = os.stat(path)
    return (path, stat.st_mtime_ns, stat.st_size)


def _sources(modules: tuple[str, ...]) -> Sources:
    """What an edit changes: the source files of the modules besides torch (a library's files are
    not watched, nor the modules they import)."""
    found = (_source(m) for m in modules if m.split(".")[0] not in ("torch", "torchjob"))
    return tuple(s for s in found if s is not None)


def _directory() -> Path:
    if not _home:  # 0700, this user's; a killed process's is removed by the next one's (scratch.py)
        _home.append(scratch.make("torchjob-pool-"))
    return _home[0]


def _new(modules: tuple[str, ...]) -> Preloader:
    server = Preloader(modules, _directory(), pooled=True)
    server.launch = _launch
    return server


def _launch(start: Callable[[], subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
    """Run ``start`` (a server's Popen) in a thread that lives as long as this process: the server
    gets SIGKILL when the thread that started it ends (PR_SET_PDEATHSIG), and the call that needs it
    may come from a thread that ends long before the process (a thread pool's, a notebook's)."""
    if not _starter:
        from concurrent.futures import ThreadPoolExecutor

        _starter.append(ThreadPoolExecutor(1, thread_name_prefix="torchjob-warm-pool"))
    return _starter[0].submit(start).result(timeout=LAUNCH_TIMEOUT)


def preloader(modules: tuple[str, ...]) -> Preloader:
    """This process's fork server for ``modules``: the kept one, or a new one when there is none,
    it is off, or a module's source changed since it imported it."""
    sources = _sources(modules)
    kept = _pools.get(modules)
    if kept is not None:
        then, server = kept
        if server.ended():  # killed, say: a new one, which serves again
            logs.debug("warm pool: the fork server ended (%s): a new one", server.why_off or "killed")
            server.close()
        elif then == sources and (server.state != "off" or server.why_off != ENDED):
            return server  # an unusable one too: its import would fail again (calls start cold)
        else:
            server.close()  # edited: a new server imports the new source
            spare = _spares.pop(modules, None)
            if spare is not None:
                spare.close()
    server = _new(modules)
    _pools[modules] = (sources, server)
    if len(_pools) == 1:
        atexit.register(close_all)
    return server


def network() -> Network | str:
    """The network of the pool's jobs, made by the first; or why there can be none."""
    if not _network:
        from torchjob.engines.local import netns

        _network.append(netns.create())
    return _network[0]


def network_failed(why: str) -> None:
    """The pool's network cannot be entered (a job's probe found): its jobs use the machine's."""
    for made in _network:
        if not isinstance(made, str):
            made.close()
    _network[:] = [why]


def for_job(server: Preloader, run: ContainerRun) -> Preloader:
    """The server for a job whose first main container is ``run``: a running one whose environment
    or directories differ from the job's (the caller set a variable, or changed directory, since
    it started) is replaced, so that this call and the next are warm again. The replaced one is
    kept as a spare, taken back when a later job fits it: calls that alternate between two
    environments (two tasks with different ``env``) do not start a server each time."""
    why = server.why_not(run) if server.state in ("starting", "ready") else ""
    if not why.startswith(("its environment", "its interpreter")):
        return server
    modules = server.modules
    sources = _pools[modules][0]
    spare = _spares.pop(modules, None)
    if spare is not None and spare.ended():
        spare.close()
        spare = None
    if spare is not None and spare.state in ("starting", "ready") and not spare.why_not(run):
        logs.debug("warm pool: back to the spare fork server (%s)", why)
        _spares[modules] = server
        _pools[modules] = (sources, spare)
        return spare
    if spare is not None:
        spare.close()
    logs.debug("warm pool: a new fork server: %s", why)
    _spares[modules] = server
    fresh = _new(modules)
    _pools[modules] = (sources, fresh)
    return fresh


def hosts_view(server: Preloader, text: str | None) -> tuple[bool, Callable[[], None] | None]:
    """The server's /etc/hosts set-up (``before_exec``) for a job whose pods see ``text`` as their
    /etc/hosts (None: the machine's). The pool's own file takes the job's entries, rewritten in
    place so that a running server's bind mount shows them. (False, None) when the server was
    started with the other setting (then the job starts cold)."""
    from torchjob.engines.local import podnames

    if server.state != "none" and (server.before_exec is None) != (text is None):
        return False, None
    if text is None:
        return True, None
    path = _directory() / "hosts"
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(path, flags, 0o600)
    try:
        # Asked again for each pod of a job, while the ranks forked for its earlier pods resolve
        # names through this very file: rewritten only when it changes, never emptied on the way
        # (an empty /etc/hosts sends gloo's lookup of the host's own name to DNS: EAI_AGAIN).
        data = text.encode()
        if os.pread(fd, len(data) + 1, 0) != data:
            os.pwrite(fd, data, 0)
            os.ftruncate(fd, len(data))
    finally:
        os.close(fd)
    if server.state != "none":
        return True, server.before_exec
    return True, podnames.HostsMount.of(str(path), True).enter


def _forget_in_child() -> None:
    """A fork of this process (multiprocessing, a user's os.fork) has no pool: the servers are its
    parent's (their forks would be reparented to the parent), so the child drops them untouched."""
    for server in [s for _, s in _pools.values()] + list(_spares.values()):
        for fd in (server._requests, server._replies):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        server.proc = None  # never killed from here
        server.spares.pids = []  # nor its spares (the parent's children)
        server.state, server.why_off = "off", ENDED
    _pools.clear()
    _spares.clear()
    for path in _home:  # the directory is the parent's too
        scratch.forget(path)
    _home.clear()
    _network.clear()  # not closed: a child about to start a server of ours still enters it
    _starter.clear()  # its thread is the parent's: a child's own is made when needed


os.register_at_fork(after_in_child=_forget_in_child)


def close_all() -> None:
    """End every kept server (at exit, or when asked: ``torchjob.sdk.warm_pool_close``)."""
    for server in [s for _, s in _pools.values()] + list(_spares.values()):
        with contextlib.suppress(Exception):
            server.close()
    _pools.clear()
    _spares.clear()
    for path in _home:
        scratch.remove(path)
    _home.clear()
    for made in _network:
        if not isinstance(made, str):
            made.close()
    _network.clear()
