"""Preloading fork server (opt-in, ``torchjob run --preload torch``): one import, forked per container.

Every rank of a local job importing torch is most of its start: on a small machine N ranks spend
N times a second of CPU on the same import. With ``--preload MODULE[,MODULE]`` the engine starts
one server process per job (``forkserver.py`` runs in it) that imports the modules once; each main
container whose command is torchjob's ``python`` (the same rules as pre-warming, see
``prewarm.warm_argv``) is then forked from it, copy-on-write, and runs its program through the
pre-warmed runner (``warmstart.py``), so that it sees the argv, ``__main__``, ``sys.path``, env,
working directory, stdio, session and exit status of a cold start.

The forked process is reparented to the supervisor (a child subreaper: the server forks twice and
the middle process ends), which waits for it as for a process it spawned: exit codes, pidfds,
signals to its group and restarts work unchanged (:class:`Forked`). The server itself lives in a
session of its own (as a container does: one CPU share under autogroup scheduling), is known to the
supervisor's orphan scans as its own helper, carries the job's marker (not a pod's), and ends when
its request pipe closes; the end-of-job sweep kills it with the rest.

The server starts with no pod's own variables (``POD_NAMES`` and the engine's ``TORCHJOB_*``): what
its imports read is the same for every pod, and a preloaded module sees no pod's name. A container
is forked only when its whole environment, apart from those variables, is the one the server
started with; any other difference (a ``TORCHDYNAMO_*`` setting on one task, a locale) could have
changed what the imports did, so that container starts cold. It starts cold as well when it is not
torchjob's python, has other interpreter options, another working directory or script directory,
a ``runAsUser``/``runAsGroup`` (the identity is set by the engine's own hook), changed resource
limits, or when the server could not be used (said once on the console).

The server's import is not waited for: a container to be forked while it imports is retried on
the supervisor's next turns (``FORK_LATER``), so that deadlines, policies and status go on;
the loop wakes for the server's answer (:meth:`Preloader.importing`), so the first such turn comes
the moment the import is done.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from torchjob.engines.local import prewarm, process, proctree
from torchjob.engines.local.containers import ContainerRun
from torchjob.engines.local.envvars import is_engine_variable
from torchjob.engines.local.forked import Forked as Forked  # (imported from here by the runner)
from torchjob.engines.local.forked import Spares, reap
from torchjob.engines.local.state import open_private
from torchjob.host import procfs
from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from torchjob.engines.local.netns import Network

SERVER = str(Path(__file__).with_name("forkserver.py"))
FORK_LATER = "later"  # the answer to a fork while the server still imports: ask again (runner.py)
READY_TIMEOUT = 300.0  # seconds for the server's import (torch on a loaded 2-core machine takes a few)
REPLY_TIMEOUT = 10.0  # seconds for one fork; the server is then given up on
# Environment that torch and the native libraries it loads (OpenMP, MKL, OpenBLAS, CUDA) read when
# imported: a program that sets one of these itself is warned that the server's value was used.
IMPORT_TIME_PREFIXES = ("OMP_", "KMP_", "GOMP_", "MKL_", "OPENBLAS_", "TORCH_", "PYTORCH_", "CUDA_")
# What the engine (besides its TORCHJOB_* variables) and the plugins set per pod, for programs to
# read when they run (rendezvous, rank, the pod's TMPDIR): not the server's, and free to differ
# between forked pods. (TORCHJOB_FINISHED, set per container after the server was chosen, is an
# engine variable.)
POD_NAMES = frozenset(
    {"HOSTNAME", "RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "VC_TASK_INDEX", "VK_TASK_INDEX"}
    | {"TMPDIR", "NCCL_HOSTID"}  # (NCCL reads it when a group starts, not at torch's import)
)

# Set per job for programs to read (Volcano's hosts lists, torchrun's rank interpreter in the job's
# bin): like POD_NAMES, free to differ between forked containers.
JOB_PREFIXES = ("VC_", "VK_", "PYTHON_EXEC")

Key = tuple[object, ...]
ENDED = "the job ended"


def _now(start: Callable[[], subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
    return start()


def _options_and_tail(run: ContainerRun) -> tuple[list[str], list[str]] | None:
    """The interpreter's options and what follows them, when a warm start could run the container."""
    cwd = run.cwd or os.getcwd()
    warm = prewarm.warm_argv(run, 0, (), cwd)
    if warm is None:
        return None
    options = warm[1 : warm.index(prewarm.BOOT) - 1]
    return options, run.argv[1 + len(options) :]


def _path0(tail: list[str], cwd: str) -> str:
    if tail[0] == "-c":
        return ""
    if tail[0] == "-m":
        return cwd
    return os.path.dirname(os.path.realpath(os.path.join(cwd, tail[0])))


def shared_env(env: dict[str, str]) -> dict[str, str]:
    """A container's environment without what is set per pod or per job: what the server may
    import with. The job's own bin directory, first on PATH, is left out of it too: a server kept
    for later jobs (pool.py) serves jobs whose directories differ."""
    shared = {
        k: v
        for k, v in env.items()
        if k not in POD_NAMES and not k.startswith(JOB_PREFIXES) and not is_engine_variable(k)
    }
    job_bin = env.get("TORCHJOB_BIN")
    path = shared.get("PATH")
    if job_bin and path is not None and path.split(os.pathsep)[0] == job_bin:
        shared["PATH"] = path[len(job_bin) + 1 :]
    return shared


def _key(run: ContainerRun) -> Key | None:
    """What must be the same for a container to be forked from a server: None when it cannot be."""
    found = _options_and_tail(run)
    if found is None:
        return None
    options, tail = found
    cwd = run.cwd or os.getcwd()
    env = sorted(shared_env(run.env).items())  # all of it: any variable may be read at import
    # Where the imports resolve: sys.path[0], whose '' (for -c) is the working directory.
    return (tuple(options), cwd, _path0(tail, cwd) or cwd, tuple(env))


def _rlimits() -> list[tuple[int, int]]:
    import resource

    names = sorted(n for n in dir(resource) if n.startswith("RLIMIT_"))
    return [resource.getrlimit(getattr(resource, n)) for n in names]


def encode(cwd: str, log: Path, tail: list[str], env: dict[str, str]) -> bytes:
    fields = [os.fsencode(cwd), os.fsencode(log), str(len(tail)).encode()]
    fields += [os.fsencode(a) for a in tail]
    fields += [os.fsencode(k) + b"=" + os.fsencode(v) for k, v in env.items()]
    body = b"\0".join(fields)
    if any(b"\0" in f for f in fields[3:]) or len(body) > 99_999_999:
        raise ValueError("not representable")
    return b"%08d" % len(body) + body


class Preloader:
    """The job's fork server, started for the first container it can serve."""

    def __init__(self, modules: tuple[str, ...], job_dir: Path, pooled: bool = False) -> None:
        self.modules = modules
        self.job_dir = job_dir  # where preload.log is: the job's directory, or the pool's own
        # pooled: kept for the next jobs of this process (pool.py): no job's marker, ends with us
        self.pooled = pooled
        self.before_exec: Callable[[], None] | None = None  # the job's /etc/hosts, for every container
        self.network: Network | None = None  # the network namespace the server (and its forks) run in
        self.note: Callable[[str], None] = lambda _text: None  # the console, when the server is given up
        self.proc: subprocess.Popen[bytes] | None = None
        self.key: Key | None = None
        self.state = "none"  # none | starting | ready | off
        self.why_off = ""
        self.served = False  # it was ready once: should it end, a new server would be too
        self.died = False  # its process had ended by itself when it was given up on
        # How its process is started: here, or (the warm pool) by a thread that lives as long as
        # this process, since PR_SET_PDEATHSIG kills it when the thread that started it ends.
        self.launch: Callable[[Callable[[], subprocess.Popen[bytes]]], subprocess.Popen[bytes]] = _now
        self.since = 0.0  # when the server started importing (monotonic)
        self._eof = False  # the server closed its replies
        self.rlimits: list[tuple[int, int]] = []
        self._requests = -1
        self._replies = -1
        self._buffer = b""
        self.spares = Spares()  # the warm pool's processes forked ahead of its next job (forked.py)

    def accepts(self, run: ContainerRun) -> bool:
        """Whether ``run`` will be forked from the server (started now for the first one)."""
        if self.state == "off" or run.before_exec is not None:  # runAsUser: the engine's hook, not ours
            return False
        key = _key(run)
        if key is None:
            return False
        if self.state == "none":
            self._start(run, key)
        return self.state != "off" and key == self.key

    def fork(self, run: ContainerRun, log: Path) -> Forked | str | None:
        """Fork ``run``'s process from the server; None: start it cold (the server cannot now);
        ``FORK_LATER``: the server is still importing, ask again (nothing waits for it here)."""
        if self.state == "starting":
            self._poll_ready()
            if self.state == "starting":
                return FORK_LATER
        if self.state != "ready" or _key(run) != self.key or _rlimits() != self.rlimits:
            return None
        found = _options_and_tail(run)
        assert found is not None
        try:
            os.write(self._requests, encode(run.cwd or os.getcwd(), log, found[1], run.env))
            line = self._answer(REPLY_TIMEOUT)
        except (OSError, ValueError):
            line = None
        if line is None:
            self._off("it did not answer")
            return None
        if not line.startswith(b"pid "):  # it could not set the container up (a log not openable)
            if line.startswith(b"fail "):
                reap([int(line[5:])])  # (our child, ended at once)
            return None  # cold: its start says why
        pid = int(line[4:])
        self.spares.took(pid)
        try:
            ours = procfs.ppid(pid) == os.getpid()
        except (OSError, ValueError, IndexError):
            ours = False
        if not ours:  # not reparented to us (no subreaper): it could not be waited for
            process.signal_group(pid, signal.SIGKILL)
            self._off("its processes are not reparented to the supervisor")
            return None
        return Forked(pid, self._forked_ended)

    def close(self) -> None:
        self._off(ENDED)

    def _forked_ended(self, pid: int) -> None:
        """A container forked from a kept server ended: spares for the next job (forked.py)."""
        if self.pooled and self.state == "ready":
            self.spares.finished(pid, self._requests)

    def ended(self) -> bool:
        """Whether a server that was ready has ended by itself since (killed, say): a new one
        would serve again (one that could not import, or serve, would not)."""
        return self.served and (self.died or (self.proc is not None and self.proc.poll() is not None))

    def importing(self) -> int | None:
        """While the server imports: the pipe that becomes readable when it is done (or ended)."""
        return self._replies if self.state == "starting" and self._replies >= 0 else None

    def imported(self) -> bool:
        """Whether the server's import is over (ready, or given up), taking its answer if it came."""
        if self.state == "starting":
            self._poll_ready()
        return self.state != "starting"

    def why_not(self, run: ContainerRun) -> str:
        """Why ``run`` is not forked from this server (for the log under -v)."""
        if self.state == "off":
            return f"the fork server cannot be used ({self.why_off})"
        if run.before_exec is not None:
            return "the container sets its user or group"
        key = _key(run)
        if key is None:
            return "the container does not run torchjob's python in a form the server can run"
        if self.key is not None and key[:3] != self.key[:3]:
            return "its interpreter options or directories differ from the server's"
        if self.key is not None and key != self.key:
            ours, theirs = dict(self.key[3]), dict(key[3])  # type: ignore[call-overload]
            names = sorted(k for k in ours.keys() | theirs.keys() if ours.get(k) != theirs.get(k))
            return f"its environment differs from the server's ({', '.join(names[:5])})"
        return ""

    # ---------------------------------------------------------------- private

    def _start(self, run: ContainerRun, key: Key) -> None:
        found = _options_and_tail(run)
        assert found is not None
        options, tail = found
        cwd = run.cwd or os.getcwd()
        requests_r, self._requests = os.pipe()
        self._replies, replies_w = os.pipe()
        os.set_inheritable(requests_r, True)
        os.set_inheritable(replies_w, True)
        # No pod's variables (its marker, which a pod's end sweeps, among them); the job's marker.
        env = shared_env(run.env)
        if process.MARKER in run.env and not self.pooled:
            env[process.MARKER] = run.env[process.MARKER]
        argv = [run.argv[0], *options, "-c", prewarm.BOOT, SERVER, prewarm.RUNNER]
        argv += [str(requests_r), str(replies_w), ",".join(self.modules), _path0(tail, cwd)]
        argv.append(",".join(IMPORT_TIME_PREFIXES))
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            with open(os.open(self.job_dir / "preload.log", flags, 0o600), "ab", buffering=0) as log:
                self.proc = self.launch(
                    lambda: subprocess.Popen(
                        argv,
                        env=env,
                        cwd=cwd,
                        stdin=subprocess.DEVNULL,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        close_fds=True,
                        pass_fds=(requests_r, replies_w),
                        preexec_fn=self._before_exec,
                    )
                )
        except (OSError, subprocess.SubprocessError) as err:
            self._off(f"it could not start: {err}")
        else:
            self.key, self.state, self.rlimits = key, "starting", _rlimits()
            self.since = time.monotonic()
            proctree.HELPERS.add(self.proc.pid)  # its session, where its spares wait: not orphans
        finally:
            os.close(requests_r)
            os.close(replies_w)

    def server_pids(self) -> list[int]:
        """The server's process while it runs, and its spares: the engine's own, never an orphan
        of the job's (a spare it has not told of yet lives in its session: proctree.HELPERS)."""
        if self.proc is None or self.proc.returncode is not None:
            return []
        return [self.proc.pid, *self.spares.pids]

    def _before_exec(self) -> None:  # pragma: no cover - runs in the forked child
        # A session of its own, as every container has: with autogroup scheduling (most Linux
        # desktops and servers) CPU is shared per session, so an import in the caller's session
        # would share one share with whatever else runs there (a terminal's other work, the
        # benchmark's busy loops), while each rank of a bare launch has one to itself. Its own
        # group too: a terminal's Ctrl-C is the supervisor's to handle.
        os.setsid()
        if self.pooled:  # a killed caller (a notebook's kernel) leaves no server behind
            process.die_with_parent()
        if self.network is not None:  # before the /etc/hosts mount, made in its user namespace
            self.network.enter()
        if self.before_exec is not None:
            self.before_exec()

    def _poll_ready(self) -> None:
        """Take the server's answer to its import if it has come, without waiting for it."""
        line = self._readline(0.0)
        if line == b"ready":
            self.state, self.served = "ready", True
        elif line is not None:
            self._off(line.decode(errors="replace").removeprefix("cold "))
        elif self._eof or self._replies < 0:
            self._off("it ended before it had imported the modules (see preload.log)")
        elif time.monotonic() - self.since > READY_TIMEOUT:
            self._off(f"its import took more than {READY_TIMEOUT:g} s")

    def _answer(self, timeout: float) -> bytes | None:
        """The server's answer to a container's request (what it says of spares is taken note of)."""
        while True:
            line = self._readline(timeout)
            if line is None or not self.spares.told(line):
                return line

    def _readline(self, timeout: float) -> bytes | None:
        """A line of the server's replies, or None after ``timeout`` (at once for 0) or at its end."""
        import select

        deadline = time.monotonic() + timeout
        while b"\n" not in self._buffer:
            if self._replies < 0 or self._eof:
                return None
            try:
                ready, _, _ = select.select([self._replies], [], [], max(0.0, deadline - time.monotonic()))
                if not ready:
                    if time.monotonic() >= deadline:
                        return None
                    continue
                chunk = os.read(self._replies, 4096)
            except InterruptedError:
                continue
            if not chunk:
                self._eof = True
                return None
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line

    def _off(self, why: str) -> None:
        if self.state != "off":
            if why != ENDED:  # said once, on the console whatever -v says
                self.note(f"--preload {','.join(self.modules)}: the fork server cannot be used ({why}); "
                          "containers start cold")  # fmt: skip
            self.state, self.why_off = "off", why
            self.died = self.proc is not None and self.proc.poll() is not None
            with (
                contextlib.suppress(OSError),
                os.fdopen(open_private(self.job_dir / "preload.log"), "a") as log,
            ):
                log.write(f"server off: {why}\n")
        if self._requests >= 0:
            with contextlib.suppress(OSError):
                os.close(self._requests)
        server = self.proc.pid if self.proc is not None else 0
        if self.proc is not None:
            with contextlib.suppress(OSError):
                self.proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(1.0)
            self.proc = None
        if self._replies >= 0 and self.spares.asked:  # the spares it made before it ended: reaped
            with contextlib.suppress(OSError, ValueError):
                self._answer(0.0)
        if self._replies >= 0:
            with contextlib.suppress(OSError):
                os.close(self._replies)
        self._requests = self._replies = -1
        self.spares.end()
        proctree.HELPERS.discard(server)  # (its spares reaped: its session is empty)
