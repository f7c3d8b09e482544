"""A private Slurm cluster on this machine: munged, slurmctld and one slurmd per node.

Used by the tests (tests/conftest.py puts this directory on ``sys.path``), by
benchmarks/bench_slurm.py, and by a person who wants to try ``torchjob run --engine slurm`` on one
machine (``make slurm-try``, docs/slurm.md)::

    python tools/slurm_cluster.py start DIR [--nodes N] [--cpus N] [--gpus N]
    . DIR/env.sh                      # SLURM_CONF, PATH: the Slurm clients now talk to it
    python tools/slurm_cluster.py stop DIR

Everything lives in one private directory: the configuration, a munge key and socket of its own,
state, spool and logs; the ports are free ones picked at start. So two clusters on one machine
(or a real Slurm installed on it) never see each other's jobs. Clients reach the cluster through
``SLURM_CONF`` (:attr:`SlurmCluster.env`, ``DIR/env.sh``).

Daemons run as the user who starts them: as root (the tests) any job user works; as another user
the jobs run as that user (``SlurmUser`` and ``SlurmdUser`` are that user), enough for trying the
engine, since torchjob submits as that user too.

``nodes=N`` (up to 4) declares N nodes on this machine, each its own slurmd (Debian's Slurm is
built with multiple-slurmd support) with its own name, port and spool. Their names resolve to this
machine as a real node's do: the host's own name, ``localhost``, and the same in capitals (host
names are not case-sensitive, Slurm's node names are). A heterogeneous job needs two: Slurm's
backfill scheduler, the only one that starts such a job, places each component on a node of its
own. ``gpus=N`` gives every node N fake GPUs (``gres.conf``; as root, character devices made with
``mknod`` under the cluster's directory): nothing is bound, but Slurm counts and assigns them and
sets ``CUDA_VISIBLE_DEVICES``.

``unshared=DIR`` makes a one-node cluster's node a machine that does not share ``DIR`` with this
one: slurmd (and so every job on it) runs in a mount namespace of its own with an empty tmpfs
over ``DIR``.

:meth:`SlurmCluster.stop_controller` and :meth:`SlurmCluster.start_controller` stop slurmctld by its
pid and start it again with its saved state: an outage, as the tests make one.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import pwd
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "srun", "squeue", "scontrol", "scancel", "sinfo")
PARTITION = "main"
START_TIMEOUT = 60.0  # seconds until the nodes must be idle (a busy shared machine is slow)
MAX_NODES = 4


def why_not(root: bool = True) -> str | None:
    """Why a private cluster cannot run here, or None; ``root``: the tests' daemons run as root."""
    if root and os.geteuid() != 0:
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


def node_names(host: str, count: int) -> list[str]:
    """``count`` distinct node names that resolve to this machine, the host's own name first."""
    names: list[str] = []
    for name in (host, "localhost", host.upper(), "LOCALHOST", host.capitalize(), "Localhost"):
        if name not in names:
            names.append(name)
    if count > len(names) or count > MAX_NODES:
        raise Unsupported(f"{count} nodes on host {host!r}: at most {min(len(names), MAX_NODES)}")
    return names[:count]


def config_text(
    directory: Path,
    host: str,
    ctld_port: int,
    nodes: Sequence[tuple[str, int]],
    cpus: int,
    memory: int,
    *,
    gpus: int = 0,
    features: str = "",
    user: str = "root",
    scheduler: str | None = "bf_interval=1",
    message_timeout: int = 20,
    extra: Sequence[str] = (),
) -> str:
    """The configuration; ``nodes`` are (name, slurmd port). ``scheduler`` is SchedulerParameters: a
    backfill pass every second by default (heterogeneous jobs start only by backfill, and tests
    wait less); None leaves Slurm's own defaults (a 30 s backfill interval, batch jobs scheduled
    every 3 s at most: batch_sched_delay). ``features``: every node's (``--constraint``).
    ``message_timeout``: about how long a client tries to reach a slurmctld that does not answer.
    ``extra`` lines go at the end (another partition, ...)."""
    d = directory
    node_extra = f" Gres=gpu:{gpus}" if gpus else ""
    node_extra += f" Features={features}" if features else ""
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
        *(["GresTypes=gpu"] if gpus else []),
        f"SlurmctldPidFile={d}/ctld.pid",
        f"SlurmdPidFile={d}/d-%n.pid",
        f"SlurmdSpoolDir={d}/spool-%n",
        f"StateSaveLocation={d}/state",
        f"SlurmctldLogFile={d}/ctld.log",
        f"SlurmdLogFile={d}/d-%n.log",
        f"SlurmctldPort={ctld_port}",
        f"SlurmUser={user}",
        f"SlurmdUser={user}",
        "ReturnToService=2",
        "SlurmdParameters=config_overrides",
        "KillWait=3",  # seconds between SIGTERM and SIGKILL on cancel and time limit
        "InactiveLimit=0",
        f"MessageTimeout={message_timeout}",
        "JobCompType=jobcomp/filetxt",
        f"JobCompLoc={d}/jobcomp.txt",
        *(
            f"NodeName={name} NodeHostname={host} NodeAddr=127.0.0.1 Port={port} "
            f"CPUs={cpus} RealMemory={memory}{node_extra} State=UNKNOWN"
            for name, port in nodes
        ),
        f"PartitionName={PARTITION} Nodes={','.join(n for n, _ in nodes)} Default=YES "
        "MaxTime=INFINITE State=UP",
        *extra,
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
        gpus: int = 0,
        features: str = "",
        unshared: Path | None = None,
        scheduler: str | None = "bf_interval=1",
        message_timeout: int = 20,
        extra: Sequence[str] = (),
        tied: bool = False,
    ) -> None:
        self.dir = directory
        self.tied = tied  # the daemons die with this process (see _tie)
        self._watcher: subprocess.Popen[bytes] | None = None
        self.features = features
        self.message_timeout = message_timeout
        self.scheduler = scheduler  # SchedulerParameters (see config_text)
        self.extra = tuple(extra)
        self.unshared = unshared
        if unshared is not None and nodes != 1:
            raise Unsupported("an unshared directory on a cluster of one node only")
        self.host = socket.gethostname().split(".")[0]
        self.nodes = node_names(self.host, nodes)
        self.cpus = cpus
        self.memory = memory
        self.gpus = gpus
        self.user = pwd.getpwuid(os.geteuid()).pw_name
        self.conf = directory / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self.partition = PARTITION
        self.pids: dict[str, int] = {}

    def start(self, attempts: int = 3) -> SlurmCluster:
        self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.dir, 0o700)
        (self.dir / "state").mkdir(mode=0o700, exist_ok=True)
        if self.gpus:
            self._fake_gpus()
        if self.tied and self._watcher is None:
            self._tie()
        self._start_munge()
        for attempt in range(attempts):
            # Free ports are picked, then bound by the daemons: another run may take one between.
            ctld_port = free_port()
            nodes = [(name, free_port()) for name in self.nodes]
            text = config_text(
                self.dir,
                self.host,
                ctld_port,
                nodes,
                self.cpus,
                self.memory,
                gpus=self.gpus,
                features=self.features,
                user=self.user,
                scheduler=self.scheduler,
                message_timeout=self.message_timeout,
                extra=self.extra,
            )
            self.conf.write_text(text)
            self.conf.chmod(0o644)
            try:
                self.start_controller()
                if len(self.nodes) > 1:
                    self._check_multiple_slurmd()
                for name in self.nodes:
                    self.start_node(name)
                self.wait_idle(START_TIMEOUT)
                self._write_env()
                return self
            except RuntimeError as err:
                for name in [*self._slurmds(), "slurmctld"]:
                    pid = self.pids.pop(name, None)
                    if pid is not None:
                        _stop_pid(pid)
                if attempt == attempts - 1 or isinstance(err, Unsupported):
                    raise
        return self

    def _tie(self) -> None:
        """A watcher that stops this cluster when this process ends without stopping it (a test
        worker killed or crashed): the daemons fork away from their parent, so no signal of the
        parent's death reaches them. Its standard input is a pipe only this process holds; an end
        without a word is that death. In a session of its own, so the group's signal spares it."""
        self._watcher = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "watch", str(self.dir)],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )

    def _untie(self) -> None:
        """Stopped: the watcher is told so, and ends without touching any process."""
        watcher, self._watcher = self._watcher, None
        if watcher is None or watcher.stdin is None:
            return
        with contextlib.suppress(OSError):
            watcher.stdin.write(b"stopped\n")
            watcher.stdin.close()
        try:
            watcher.wait(10)
        except subprocess.TimeoutExpired:
            watcher.kill()
            watcher.wait(10)

    def start_controller(self) -> None:
        """Start slurmctld (again, after :meth:`stop_controller`: with the state it saved)."""
        self._daemon("slurmctld", [_which("slurmctld"), "-f", str(self.conf)], self.dir / "ctld.pid")

    def stop_controller(self) -> None:
        """Stop slurmctld by its pid: the cluster's jobs and steps run on without it."""
        pid = self.pids.pop("slurmctld", None)
        if pid is not None:
            _stop_pid(pid)

    def start_node(self, name: str) -> None:
        argv = [_which("slurmd"), "-f", str(self.conf), "-N", name]
        if self.unshared is not None:
            argv = self._apart(argv, self.unshared)
        self._daemon(f"slurmd-{name}", argv, self.dir / f"d-{name}.pid")

    def stop_node(self, name: str) -> None:
        """Stop one node's slurmd by its pid (its steps' slurmstepd run on)."""
        pid = self.pids.pop(f"slurmd-{name}", None)
        if pid is not None:
            _stop_pid(pid)

    def _fake_gpus(self) -> None:
        """``gres.conf``: each node's GPUs, device files under the cluster's directory (character
        devices as root; Slurm only needs the files, nothing opens them)."""
        lines = []
        for name in self.nodes:
            files = []
            for index in range(self.gpus):
                device = self.dir / f"gpu-{name}-{index}"
                if not device.exists():
                    if os.geteuid() == 0:
                        os.mknod(device, 0o600 | 0o020000, os.makedev(1, 3))  # /dev/null's numbers
                    else:
                        device.touch(0o600)
                files.append(str(device))
            lines.append(f"NodeName={name} Name=gpu File={','.join(files)}")
        (self.dir / "gres.conf").write_text("\n".join(lines) + "\n")
        (self.dir / "gres.conf").chmod(0o644)

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
            rows = self.run("sinfo", "-h", "-N", "-o", "%N|%t", timeout=10).stdout.split()
            by_node = dict(row.split("|", 1) for row in rows if "|" in row)  # once per partition
            states = list(by_node.values())
            state = ",".join(states)
            if len(by_node) == len(self.nodes) and set(states) == {"idle"}:
                return
            if any(s.startswith("down") for s in states) and not resumed:
                self.run("scontrol", "update", f"nodename={','.join(self.nodes)}", "state=resume")
                resumed = True
            time.sleep(0.2)
        raise RuntimeError(
            f"the nodes are not idle after {timeout:.0f} s (sinfo: {state!r}); "
            f"slurmctld: {self._log_tail('slurmctld')}; "
            + "; ".join(f"{name}: {self._log_tail(name)}" for name in self._slurmds())
        )

    def jobs(self) -> list[str]:
        out = self.run("squeue", "-h", "-o", "%i", timeout=10).stdout
        return out.split()

    def _write_env(self) -> None:
        """``env.sh``: what a shell sources to use the cluster."""
        clients = os.path.dirname(_which("sbatch"))
        text = (
            f"# the private Slurm cluster in {self.dir}: stop it with "
            f"python tools/slurm_cluster.py stop {shlex.quote(str(self.dir))}\n"
            f"export SLURM_CONF={shlex.quote(str(self.conf))}\n"
            f'case ":$PATH:" in *:{clients}:*) ;; *) export PATH="$PATH:{clients}" ;; esac\n'
        )
        (self.dir / "env.sh").write_text(text)

    def stop(self) -> None:
        """Cancel every job, stop the daemons by pid, and kill any step process of this cluster."""
        if "slurmctld" in self.pids and self._slurmds():
            try:
                self.run("scancel", "--full", f"--user={self.user}", timeout=10)
                deadline = time.monotonic() + 5  # then their step daemons are stopped by pid
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
        self._untie()

    def adopt(self) -> SlurmCluster:
        """The daemons of a cluster started earlier in ``self.dir`` (by another process), by their
        pid files: so that :meth:`stop` stops them."""
        files = {"munged": "munged.pid", "slurmctld": "ctld.pid"}
        files.update({f"slurmd-{name}": f"d-{name}.pid" for name in self.nodes})
        for name, file in files.items():
            with contextlib.suppress(OSError, ValueError, IndexError):
                pid = int((self.dir / file).read_text().split()[0])
                if alive(pid):
                    self.pids[name] = pid
        return self

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


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="tools/slurm_cluster.py",
        description="A private Slurm cluster on this machine, to try torchjob's Slurm engine.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    start = sub.add_parser("start", help="start one in DIR (a new directory) and say how to use it")
    start.add_argument("dir", type=Path)
    start.add_argument("--nodes", type=int, default=1, help=f"nodes on this machine (1-{MAX_NODES})")
    cpus = "CPUs each node declares (more than the machine has is fine)"
    start.add_argument("--cpus", type=int, default=8, help=cpus)
    start.add_argument("--gpus", type=int, default=0, help="fake GPUs per node")
    stop = sub.add_parser("stop", help="cancel its jobs and stop its daemons")
    stop.add_argument("dir", type=Path)
    watch = sub.add_parser("watch", help="stop it once standard input ends unsaid (its starter died)")
    watch.add_argument("dir", type=Path)
    args = parser.parse_args(argv)
    directory = args.dir.resolve()
    if args.command == "watch" and sys.stdin.buffer.read():
        return 0  # the starter stopped the cluster itself and said so
    if args.command in ("stop", "watch"):
        # A starter may die before writing slurm.conf, with munged already running.
        if args.command == "stop" and not (directory / "slurm.conf").is_file():
            print(f"slurm_cluster: {directory} holds no cluster (no slurm.conf)", file=sys.stderr)
            return 2
        nodes = sum(1 for _ in directory.glob("d-*.pid")) or 1
        cluster = SlurmCluster(directory, nodes=min(nodes, MAX_NODES)).adopt()
        cluster.stop()
        print(f"stopped the cluster in {directory}")
        return 0
    reason = why_not(root=False)
    if reason is not None:
        print(f"slurm_cluster: {reason}", file=sys.stderr)
        return 2
    if directory.exists() and any(directory.iterdir()):
        print(f"slurm_cluster: {directory} is not empty: give a new directory", file=sys.stderr)
        return 2
    try:
        cluster = SlurmCluster(directory, cpus=args.cpus, nodes=args.nodes, gpus=args.gpus)
        cluster.start()
    except (RuntimeError, OSError) as err:
        print(f"slurm_cluster: {err}", file=sys.stderr)
        with contextlib.suppress(NameError):
            cluster.stop()
        return 1
    env = directory / "env.sh"
    print(f"a Slurm cluster of {len(cluster.nodes)} node(s) runs in {directory}:")
    print(f"  . {shlex.quote(str(env))}        # then sinfo, sbatch, torchjob run ... --engine slurm")
    print(f"  python tools/slurm_cluster.py stop {shlex.quote(str(directory))}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
