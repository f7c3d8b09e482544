"""A private Slurm cluster on this machine for tests: munged, slurmctld and slurmd as root.

Everything lives in one private directory: the configuration, a munge key and socket of its own,
state, spool and logs; the ports are free ones picked at start. So two test runs on one machine
(or a real Slurm installed on it) never see each other's jobs. Clients reach the cluster through
``SLURM_CONF`` in :attr:`SlurmCluster.env`.

``nodes=2`` declares a second node on this machine (a second slurmd, Debian's Slurm being built
with multiple-slurmd support), named ``localhost`` so that its name resolves as a real node's
does. A heterogeneous job needs it: Slurm's backfill scheduler, the only one that starts such a
job, places each component on a node of its own, so on one node it stays pending (Resources).

``unshared=DIR`` makes the node a machine that does not share ``DIR`` with this one: slurmd (and
so every job on it) runs in a mount namespace of its own with an empty tmpfs over ``DIR``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "srun", "squeue", "scontrol", "scancel", "sinfo")
PARTITION = "main"
START_TIMEOUT = 60.0  # seconds until the node must be idle (a busy shared machine is slow)


def why_not() -> str | None:
    """Why a private cluster cannot run here, or None."""
    if os.geteuid() != 0:
        return "the Slurm daemons of the tests run as root"
    missing = [name for name in (*DAEMONS, *CLIENTS) if shutil.which(name) is None and not _sbin(name)]
    if missing:
        return f"Slurm is not installed (missing {', '.join(missing)}; apt-get install slurm-wlm munge)"
    return None


def _sbin(name: str) -> str | None:
    for directory in ("/usr/sbin", "/sbin", "/usr/local/sbin"):
        path = Path(directory) / name
        if path.is_file() and os.access(path, os.X_OK):
            return str(path)
    return None


def _which(name: str) -> str:
    found = shutil.which(name) or _sbin(name)
    if found is None:
        raise RuntimeError(f"{name} not found")
    return found


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


class Unsupported(RuntimeError):
    """This Slurm cannot make the cluster asked for (a reason to skip, not a failure)."""


def config_text(
    directory: Path,
    host: str,
    ctld_port: int,
    d_port: int,
    cpus: int,
    memory: int,
    more: Sequence[tuple[str, int]] = (),
    scheduler: str | None = "bf_interval=1",
) -> str:
    """The configuration; ``more`` are (name, port) of further nodes on this host. ``scheduler``
    is SchedulerParameters: a backfill pass every second by default (heterogeneous jobs start only
    by backfill, and tests wait less); None leaves Slurm's own defaults (a 30 s backfill interval,
    batch jobs scheduled every 3 s at most: batch_sched_delay)."""
    d = directory
    per_node = "-%n" if more else ""  # slurmd files of one node each, with several slurmds
    lines = [
        f"ClusterName=tj{os.getpid() % 100000}",
        f"SlurmctldHost={host}",
        "AuthType=auth/munge",
        "CredType=cred/munge",
        f"AuthInfo=socket={d}/munge.sock",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "MpiDefault=none",
        "SchedulerType=sched/backfill",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core",
        *([f"SchedulerParameters={scheduler}"] if scheduler is not None else []),
        f"SlurmctldPidFile={d}/ctld.pid",
        f"SlurmdPidFile={d}/d{per_node}.pid",
        f"SlurmdSpoolDir={d}/spool{per_node}",
        f"StateSaveLocation={d}/state",
        f"SlurmctldLogFile={d}/ctld.log",
        f"SlurmdLogFile={d}/d{per_node}.log",
        f"SlurmctldPort={ctld_port}",
        f"SlurmdPort={d_port}",
        "SlurmUser=root",
        "SlurmdUser=root",
        "ReturnToService=2",
        "SlurmdParameters=config_overrides",
        "KillWait=3",  # seconds between SIGTERM and SIGKILL on cancel and time limit
        "InactiveLimit=0",
        "MessageTimeout=20",
        "JobCompType=jobcomp/filetxt",
        f"JobCompLoc={d}/jobcomp.txt",
        f"NodeName={host} CPUs={cpus} RealMemory={memory} State=UNKNOWN",
        *(
            f"NodeName={name} NodeHostname={host} NodeAddr=127.0.0.1 Port={port} "
            f"CPUs={cpus} RealMemory={memory} State=UNKNOWN"
            for name, port in more
        ),
        f"PartitionName={PARTITION} Nodes={','.join([host, *(n for n, _ in more)])} Default=YES "
        "MaxTime=INFINITE State=UP",
    ]
    return "\n".join(lines) + "\n"


class SlurmCluster:
    """One private cluster; :meth:`start` it, :meth:`stop` it (also after a failed start)."""

    def __init__(
        self,
        directory: Path,
        *,
        cpus: int = 8,
        memory: int = 8000,
        nodes: int = 1,
        unshared: Path | None = None,
        scheduler: str | None = "bf_interval=1",
    ) -> None:
        self.dir = directory
        self.scheduler = scheduler  # SchedulerParameters (see config_text)
        self.unshared = unshared
        self.host = socket.gethostname().split(".")[0]
        if nodes not in (1, 2) or (nodes == 2 and self.host == "localhost"):
            raise Unsupported(f"{nodes} nodes on host {self.host!r}")
        self.nodes = [self.host, "localhost"][:nodes]  # each a name that resolves to this machine
        self.cpus = cpus
        self.memory = memory
        self.conf = directory / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self.partition = PARTITION
        self.pids: dict[str, int] = {}

    def start(self, attempts: int = 3) -> SlurmCluster:
        self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.dir, 0o700)
        for sub in ("spool", "state"):
            (self.dir / sub).mkdir(mode=0o700, exist_ok=True)
        self._start_munge()
        for attempt in range(attempts):
            # Free ports are picked, then bound by the daemons: another run may take one between.
            ctld_port, d_port = free_port(), free_port()
            more = [(name, free_port()) for name in self.nodes[1:]]
            text = config_text(
                self.dir, self.host, ctld_port, d_port, self.cpus, self.memory, more, self.scheduler
            )
            self.conf.write_text(text)
            self.conf.chmod(0o644)
            try:
                self._daemon("slurmctld", [_which("slurmctld"), "-f", str(self.conf)], self.dir / "ctld.pid")
                if more:
                    self._check_multiple_slurmd()
                    for name in self.nodes:
                        argv = [_which("slurmd"), "-f", str(self.conf), "-N", name]
                        self._daemon(f"slurmd-{name}", argv, self.dir / f"d-{name}.pid")
                else:
                    argv = [_which("slurmd"), "-f", str(self.conf)]
                    if self.unshared is not None:
                        argv = self._apart(argv, self.unshared)
                    self._daemon("slurmd", argv, self.dir / "d.pid")
                self.wait_idle(START_TIMEOUT)
                return self
            except RuntimeError as err:
                for name in [*self._slurmds(), "slurmctld"]:
                    pid = self.pids.pop(name, None)
                    if pid is not None:
                        _stop_pid(pid)
                if attempt == attempts - 1 or isinstance(err, Unsupported):
                    raise
        return self

    @staticmethod
    def _apart(argv: list[str], directory: Path) -> list[str]:
        """``argv`` in a mount namespace of its own, with an empty tmpfs over ``directory``."""
        mount = 'mount -t tmpfs -o mode=0700 tmpfs "$1" && shift && exec "$@"'
        unshare = [_which("unshare"), "--mount", "--propagation", "private"]
        return [*unshare, "sh", "-c", mount, "sh", str(directory), *argv]

    def _slurmds(self) -> list[str]:
        return [name for name in self.pids if name.startswith("slurmd")]

    def _check_multiple_slurmd(self) -> None:
        """Several slurmds on one host need a Slurm built for it (Debian's is)."""
        config = self.run("scontrol", "show", "config", timeout=20).stdout
        if not any(line.split() == ["MULTIPLE_SLURMD", "=", "Yes"] for line in config.splitlines()):
            raise Unsupported("this Slurm is not built with multiple-slurmd support (two nodes on one host)")

    def _start_munge(self) -> None:
        key = self.dir / "munge.key"
        fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(os.urandom(1024))
        argv = [
            _which("munged"),
            "--force",
            f"--socket={self.dir}/munge.sock",
            f"--key-file={key}",
            f"--pid-file={self.dir}/munged.pid",
            f"--seed-file={self.dir}/munged.seed",
            f"--log-file={self.dir}/munged.log",
        ]
        self._daemon("munged", argv, self.dir / "munged.pid")

    def _daemon(self, name: str, argv: list[str], pid_file: Path) -> None:
        """Start a daemon that forks into the background and wait (bounded) for its pid file."""
        pid_file.unlink(missing_ok=True)  # a pid file left by an earlier attempt is not this one's
        done = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=30, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{name} did not start: {(done.stderr or done.stdout).strip()}")
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                pid = int(pid_file.read_text().split()[0])
            except (OSError, ValueError, IndexError):
                time.sleep(0.05)
                continue
            self.pids[name] = pid
            return
        raise RuntimeError(f"{name} wrote no pid file {pid_file}; its log: {self._log_tail(name)}")

    def _log_tail(self, name: str) -> str:
        log = {"munged": "munged.log", "slurmctld": "ctld.log"}.get(
            name, name.replace("slurmd", "d") + ".log"
        )
        try:
            return " | ".join((self.dir / log).read_text().splitlines()[-5:])
        except OSError:
            return "(none)"

    def run(self, *argv: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        """A Slurm client command against this cluster."""
        return subprocess.run(
            argv, env=self.env, capture_output=True, text=True, timeout=timeout, check=False
        )

    def wait_idle(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        state = ""
        resumed = False
        while time.monotonic() < deadline:
            for name in ("slurmctld", *self._slurmds()):
                if name in self.pids and not alive(self.pids[name]):
                    raise RuntimeError(f"{name} exited; its log: {self._log_tail(name)}")
            states = self.run("sinfo", "-h", "-N", "-o", "%t", timeout=10).stdout.split()
            state = ",".join(states)
            if len(states) == len(self.nodes) and set(states) == {"idle"}:
                return
            if any(s.startswith("down") for s in states) and not resumed:
                self.run("scontrol", "update", f"nodename={','.join(self.nodes)}", "state=resume")
                resumed = True
            time.sleep(0.2)
        raise RuntimeError(
            f"the node is not idle after {timeout:.0f} s (sinfo: {state!r}); "
            f"slurmctld: {self._log_tail('slurmctld')}; "
            + "; ".join(f"{name}: {self._log_tail(name)}" for name in self._slurmds())
        )

    def jobs(self) -> list[str]:
        out = self.run("squeue", "-h", "-o", "%i", timeout=10).stdout
        return out.split()

    def stop(self) -> None:
        """Cancel every job, stop the daemons by pid, and kill any step process of this cluster."""
        if "slurmctld" in self.pids and self._slurmds():
            try:
                self.run("scancel", "--full", "--user=root", timeout=10)
                deadline = time.monotonic() + 15
                while self.jobs() and time.monotonic() < deadline:
                    time.sleep(0.2)
            except (OSError, subprocess.TimeoutExpired):
                pass
        for name in (*self._slurmds(), "slurmctld", "munged"):
            pid = self.pids.pop(name, None)
            if pid is not None:
                _stop_pid(pid)
        for pid in self.step_daemons():
            _stop_pid(pid)

    def step_daemons(self) -> list[int]:
        """slurmstepd processes of this cluster: those holding something in its directory open."""
        found = []
        prefix = str(self.dir) + "/"
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                if not (entry / "cmdline").read_bytes().startswith(b"slurmstepd"):
                    continue
                links = [os.readlink(fd) for fd in (entry / "fd").iterdir()]
            except OSError:
                continue
            if any(link.startswith(prefix) for link in links):
                found.append(int(entry.name))
        return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _stop_pid(pid: int, grace: float = 10.0) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
