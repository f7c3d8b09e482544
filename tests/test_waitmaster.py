"""The wait-for-master script, run for real by busybox ash, bash and dash against real sockets.

Each shell runs with a PATH holding only the tools an image of that kind would have, so the probe
the script picks is the one such an image would use. Durations are bounded by subprocess timeouts,
never asserted tightly.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from torchjob.plugins import waitmaster
from torchjob.plugins.waitmaster import INTERVAL_ENV, UIDS_ENV, wait_for_master_script

pytestmark = pytest.mark.timeout(120)

FAST = "0.05"  # a short poll interval (the local engine uses 0.02)
RUN_LIMIT = 20.0  # no single script run here may take longer than this


# --- validation -----------------------------------------------------------------------------------

HOSTILE_HOSTS = [
    "a; touch {marker}",
    "$(touch {marker})",
    "`touch {marker}`",
    "a' ; touch {marker} ; '",
    'a" ; touch {marker} ; "',
    "a\ntouch {marker}",
    "a&&touch {marker}",
    "a|touch {marker}",
    "a b",
]


@pytest.mark.parametrize(
    "host",
    ["master-0.job", "test-pytorch-master-0.test-pytorch", "127.0.1.1", "::1", "localhost", "Master-0.Job"],
)
def test_accepts_dns_names_and_ip_addresses(host: str) -> None:
    assert waitmaster.valid_host(host)
    assert wait_for_master_script(host, 23456, 300)


@pytest.mark.parametrize(
    "host",
    [h.format(marker="/tmp/x") for h in HOSTILE_HOSTS]
    + ["-e/bin/sh", "", "a..b", "a_b", "-a", "a-", "x" * 64, "a." * 127 + "a"],
)
def test_rejects_hosts_that_are_not_names_or_addresses(host: str) -> None:
    with pytest.raises(ValueError, match="host"):
        wait_for_master_script(host, 23456, 300)


@pytest.mark.parametrize("port", [0, -1, 65536, True, "23456", 1.5])
def test_rejects_bad_ports(port: object) -> None:
    with pytest.raises(ValueError, match="port"):
        wait_for_master_script("master-0.job", port, 300)  # type: ignore[arg-type]


@pytest.mark.parametrize("timeout", [-1, False, "300", 2.5])
def test_rejects_bad_timeouts(timeout: object) -> None:
    with pytest.raises(ValueError, match="timeout"):
        wait_for_master_script("master-0.job", 23456, timeout)  # type: ignore[arg-type]


@pytest.mark.parametrize("interval", [0, -1, 1000, "0.5; reboot", True])
def test_rejects_bad_intervals(interval: object) -> None:
    with pytest.raises(ValueError, match="interval"):
        wait_for_master_script("master-0.job", 23456, 300, interval)  # type: ignore[arg-type]


@pytest.mark.parametrize("limit", [0, -1, "2; reboot", True, 1.5])
def test_rejects_bad_probe_limits(limit: object) -> None:
    with pytest.raises(ValueError, match="probe_limit"):
        wait_for_master_script("master-0.job", 23456, 300, probe_limit=limit)  # type: ignore[arg-type]


def test_values_land_in_the_script_and_the_interval_is_overridable() -> None:
    script = wait_for_master_script("master-0.job", 29500, 42, 0.25)
    assert "host=master-0.job\n" in script
    assert "port=29500\n" in script
    assert "timeout=42\n" in script
    assert f'interval="${{{INTERVAL_ENV}:-0.25}}"' in script


# --- shells and the images they stand for --------------------------------------------------------


@dataclass(frozen=True)
class Shell:
    """A shell and a PATH directory holding only what the image it stands for would have."""

    sh: str
    path: Path
    method: str  # the probe the script should pick there


def _toolbox(directory: Path, tools: dict[str, str]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for name, target in tools.items():
        (directory / name).symlink_to(target)
    return directory


def _system(*names: str) -> dict[str, str]:
    found = {name: shutil.which(name) for name in names}
    missing = [name for name, where in found.items() if where is None]
    if missing:
        pytest.skip(f"needs {', '.join(missing)} on this machine")
    return {name: str(where) for name, where in found.items()}


def _busybox_dir(root: Path, drop: tuple[str, ...] = ()) -> Path:
    busybox = shutil.which("busybox")
    if busybox is None:
        pytest.skip("busybox is not installed (Debian package 'busybox')")
    directory = root / "busybox"
    directory.mkdir()
    subprocess.run([busybox, "--install", "-s", str(directory)], check=True, timeout=30)
    for name in ("nc", "sh", "sleep", "date"):
        if not (directory / name).exists():
            pytest.skip(f"this busybox build has no {name} applet")
    for name in drop:
        (directory / name).unlink(missing_ok=True)
    return directory


def _openbsd_nc() -> str:
    nc = shutil.which("nc")
    if nc is None:
        pytest.skip("no nc on this machine")
    out = subprocess.run([nc, "-h"], capture_output=True, text=True, timeout=10)
    if "OpenBSD" not in out.stdout + out.stderr:
        pytest.skip(f"{nc} is not OpenBSD netcat")
    return nc


def make_shell(kind: str, root: Path) -> Shell:
    if kind == "busybox":  # the busybox image: ash, busybox nc (no -z here), timeout
        box = _busybox_dir(root)
        return Shell(str(box / "sh"), box, "nc")
    if kind == "busybox-no-timeout":  # old or trimmed busybox: the watchdog bounds each probe
        box = _busybox_dir(root, drop=("timeout",))
        return Shell(str(box / "sh"), box, "nc")
    if kind == "bash":  # a bash image without nc: /dev/tcp
        tools = _system("bash", "cat", "sleep", "date", "timeout")
        return Shell(tools["bash"], _toolbox(root / "bash", tools), "bash")
    if kind == "sh-is-bash":  # /bin/sh is bash (posix mode) and no "bash" name on PATH
        tools = _system("bash", "sleep", "date", "timeout")
        box = _toolbox(root / "shbash", {"sh": tools.pop("bash"), **tools})
        return Shell(str(box / "sh"), box, "bash")
    if kind == "bash-no-timeout":
        tools = _system("bash", "sleep", "date")
        return Shell(tools["bash"], _toolbox(root / "bash-nt", tools), "bash")
    if kind == "dash-openbsd-nc":  # Debian-like: dash as sh, OpenBSD nc with -z
        tools = {"nc": _openbsd_nc(), **_system("dash", "cat", "sleep", "date", "timeout")}
        return Shell(tools["dash"], _toolbox(root / "dash-nc", tools), "nc")
    if kind == "dash-no-timeout":
        tools = {"nc": _openbsd_nc(), **_system("dash", "cat", "sleep", "date")}
        return Shell(tools["dash"], _toolbox(root / "dash-nt", tools), "nc")
    if kind == "dash-bash":  # dash runs the script, bash's /dev/tcp probes
        tools = _system("dash", "bash", "cat", "sleep", "date", "timeout")
        return Shell(tools["dash"], _toolbox(root / "dash-bash", tools), "bash")
    if kind == "dash-bash-no-cat":  # no cat: the tables are read by the shell itself
        tools = _system("dash", "bash", "sleep", "date", "timeout")
        return Shell(tools["dash"], _toolbox(root / "dash-bash-nc", tools), "bash")
    if kind == "dash-bare":  # no nc, no bash: nothing can probe
        tools = _system("dash", "sleep", "date", "timeout")
        return Shell(tools["dash"], _toolbox(root / "dash", tools), "none")
    raise AssertionError(kind)


PROBING = ["busybox", "busybox-no-timeout", "bash", "sh-is-bash", "bash-no-timeout", "dash-openbsd-nc"]


@pytest.fixture(params=PROBING)
def shell(request: pytest.FixtureRequest, tmp_path: Path) -> Shell:
    return make_shell(request.param, tmp_path)


# --- running the script ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Run:
    code: int
    stdout: str
    stderr: str
    seconds: float


def _group_members(pgid: int) -> list[psutil.Process]:
    members = []
    for proc in psutil.process_iter(["status"]):
        try:
            if os.getpgid(proc.pid) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                members.append(proc)
        except (ProcessLookupError, psutil.Error):
            continue
    return members


def _napping(proc: subprocess.Popen[str], limit: float = 10.0) -> None:
    """Until the script naps: its ``sleep`` runs and nothing else of it does (no poll, no probe)."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        others = []
        for member in _group_members(proc.pid):
            with contextlib.suppress(psutil.Error):
                if member.pid != proc.pid:
                    others.append(member.name())
        if others == ["sleep"]:
            return
        time.sleep(0.01)
    pytest.fail(f"the script did not nap within {limit}s")


def start_script(shell: Shell, script: str, interval: str = FAST, **extra: str) -> subprocess.Popen[str]:
    """Start ``sh -c SCRIPT`` as an init container would, in a process group of its own."""
    env = {"PATH": str(shell.path), INTERVAL_ENV: interval, **extra}
    return subprocess.Popen(
        [shell.sh, "-c", script],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def finish_script(proc: subprocess.Popen[str], start: float, limit: float = RUN_LIMIT) -> Run:
    """Its outcome; fail if it outlives ``limit`` or leaves processes behind (the local engine runs
    these scripts too)."""
    try:
        stdout, stderr = proc.communicate(timeout=max(0.0, start + limit - time.monotonic()))
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=10)
        pytest.fail(f"the script ran longer than {limit}s")
    seconds = time.monotonic() - start
    deadline = time.monotonic() + 5
    while (left := _group_members(proc.pid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    if left:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail(f"the script left processes behind: {[p.cmdline() for p in left]}")
    return Run(proc.returncode, stdout, stderr, seconds)


def run_script(
    shell: Shell, script: str, interval: str = FAST, limit: float = RUN_LIMIT, **extra: str
) -> Run:
    start = time.monotonic()
    return finish_script(start_script(shell, script, interval, **extra), start, limit)


@pytest.fixture
def open_port() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        yield sock.getsockname()[1]


@pytest.fixture
def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def later_port() -> Iterator[int]:
    """A port that refuses connections for half a second, then accepts them."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))  # bound but not listening: connections are refused
    timer = threading.Timer(0.5, sock.listen, (16,))
    timer.start()
    try:
        yield sock.getsockname()[1]
    finally:
        timer.cancel()
        timer.join(timeout=5)
        sock.close()


@pytest.fixture
def hung_port() -> Iterator[int]:
    """A port whose accept queue is full, so a new connect hangs instead of being refused."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(0)
    port = server.getsockname()[1]
    held: list[socket.socket] = []
    try:
        for _ in range(64):
            client = socket.socket()
            client.setblocking(False)
            client.connect_ex(("127.0.0.1", port))
            held.append(client)
            with socket.socket() as check:
                check.settimeout(0.2)
                try:
                    check.connect(("127.0.0.1", port))
                except TimeoutError:
                    break
        else:
            pytest.skip("could not make a connect hang on this kernel")
        yield port
    finally:
        for client in held:
            client.close()
        server.close()


# --- the script against real sockets --------------------------------------------------------------


def test_open_port_succeeds(shell: Shell, open_port: int) -> None:
    run = run_script(shell, wait_for_master_script("127.0.0.1", open_port, 10))
    assert run.code == 0, run.stderr
    assert f"(probe: {shell.method})" in run.stdout
    assert f"127.0.0.1:{open_port} is ready" in run.stdout


# Each shell parses /proc/net/tcp, read whole by cat or (no cat) by the shell itself.
OWNERSHIP = ["busybox", "bash", "dash-bash", "dash-openbsd-nc", "dash-bash-no-cat"]


@pytest.mark.parametrize("kind", OWNERSHIP)
def test_a_listener_of_the_jobs_own_uid_is_the_master(kind: str, tmp_path: Path, open_port: int) -> None:
    shell = make_shell(kind, tmp_path)
    env = {UIDS_ENV: f"4242 {os.getuid()}"}
    run = run_script(shell, wait_for_master_script("127.0.0.1", open_port, 10), **env)
    assert run.code == 0, run.stderr
    assert f"127.0.0.1:{open_port} is ready" in run.stdout


@pytest.mark.parametrize("kind", OWNERSHIP)
def test_a_listener_of_another_uid_is_not_the_master(kind: str, tmp_path: Path, open_port: int) -> None:
    """The engine names the job's uids; this test's own listener is then "someone else's"."""
    shell = make_shell(kind, tmp_path)
    env = {UIDS_ENV: "4242"}
    run = run_script(shell, wait_for_master_script("127.0.0.1", open_port, 1), **env)
    assert run.code == 1, run.stdout
    assert f"port {open_port} is held by a process of uid {os.getuid()}, not by this job" in run.stderr
    assert "is ready" not in run.stdout


@pytest.mark.parametrize("kind", ["dash-bash", "dash-bash-no-cat"])
@pytest.mark.parametrize("family", [socket.AF_INET, socket.AF_INET6])
def test_another_uid_listening_beside_the_master_is_refused(
    family: socket.AddressFamily, kind: str, tmp_path: Path, open_port: int
) -> None:
    """Were the job's master listening too (uid 4242 here), another uid's socket on the port
    still means the connection may reach it: not the master's alone."""
    shell = make_shell(kind, tmp_path)
    with socket.socket(family) as other:
        other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            other.bind(("::1" if family == socket.AF_INET6 else "127.0.0.2", open_port))
        except OSError as err:
            pytest.skip(f"cannot listen beside the first socket here: {err}")
        other.listen(1)
        run = run_script(shell, wait_for_master_script("127.0.0.1", open_port, 1), **{UIDS_ENV: "4242"})
    assert run.code == 1 and "not by this job" in run.stderr, run


@pytest.mark.parametrize("kind", ["busybox", "bash", "dash-openbsd-nc"])
def test_a_poll_reads_the_socket_tables_whole_and_runs_no_clock(
    kind: str, tmp_path: Path, closed_port: int
) -> None:
    """The local engine polls every 0.02 s while the master imports torch on the same CPUs, so a
    poll must be cheap: the shell's own `read` would take /proc/net/tcp a byte (a system call) at a
    time, and `date` would be one more process per poll."""
    strace = shutil.which("strace")
    if strace is None:
        pytest.skip("needs strace")
    shell = make_shell(kind, tmp_path)
    trace = tmp_path / "trace"
    env = {"PATH": str(shell.path), INTERVAL_ENV: FAST, UIDS_ENV: str(os.getuid())}
    # strace stops the shell at each traced call until it is scheduled itself, so on a loaded
    # machine a poll takes many times its quiet 20-50 ms: 2 s to wait (3 polls need 0.15 s quiet),
    # and a run limit of its own, as the script's clock only ends the wait between probes.
    script = wait_for_master_script("127.0.0.1", closed_port, 2)
    argv = [strace, "-f", "-qq", "-y", "-e", "trace=execve,read", "-o", str(trace), shell.sh, "-c", script]
    subprocess.run(
        argv, env=env, stdin=subprocess.DEVNULL, capture_output=True, timeout=3 * RUN_LIMIT, check=False
    )
    lines = trace.read_text().splitlines()
    polls = sum('["sleep", ' in line for line in lines if "execve(" in line)
    clocks = sum('["date", ' in line for line in lines if "execve(" in line)
    byte_reads = [line for line in lines if re.search(r"read\(\d+</proc/\S*net/tcp6?>, .*, 1\) = 1", line)]
    assert polls >= 3, lines[-20:]
    assert byte_reads == [], byte_reads[:5]
    assert clocks <= 1, f"date ran {clocks} times in {polls} polls"


def test_closed_port_times_out_with_a_clear_message(shell: Shell, closed_port: int) -> None:
    run = run_script(shell, wait_for_master_script("127.0.0.1", closed_port, 1))
    assert run.code == 1
    assert f"timed out: nothing accepted a TCP connection on 127.0.0.1:{closed_port} within 1s" in run.stderr
    assert run.seconds >= 1  # it waits at least the timeout; the run limit bounds it from above


def test_port_that_opens_later_is_found(shell: Shell, later_port: int) -> None:
    run = run_script(shell, wait_for_master_script("127.0.0.1", later_port, 15))
    assert run.code == 0, run.stderr
    assert "not ready yet" in run.stdout  # the first probes really were refused
    assert "is ready" in run.stdout


def test_timeout_zero_probes_once(shell: Shell, open_port: int, closed_port: int) -> None:
    assert run_script(shell, wait_for_master_script("127.0.0.1", open_port, 0)).code == 0
    assert run_script(shell, wait_for_master_script("127.0.0.1", closed_port, 0)).code == 1


@pytest.mark.parametrize("kind", ["bash", "bash-no-timeout", "busybox-no-timeout", "dash-openbsd-nc"])
def test_a_hung_connect_does_not_stall_the_timeout(kind: str, tmp_path: Path, hung_port: int) -> None:
    # Without a bound, bash's connect here waits for the kernel's SYN retries (about two minutes).
    shell = make_shell(kind, tmp_path)
    run = run_script(shell, wait_for_master_script("127.0.0.1", hung_port, 1), limit=10)
    assert run.code == 1
    assert "timed out" in run.stderr


def test_a_bad_interval_in_the_environment_still_polls(tmp_path: Path, later_port: int) -> None:
    shell = make_shell("busybox", tmp_path)
    run = run_script(shell, wait_for_master_script("127.0.0.1", later_port, 15), interval="soon")
    assert run.code == 0, run.stderr


def test_no_nc_and_no_bash_fails_at_once(tmp_path: Path, open_port: int) -> None:
    shell = make_shell("dash-bare", tmp_path)
    # A 60-second timeout and a 5-second run limit: waiting at all would fail the test.
    run = run_script(shell, wait_for_master_script("127.0.0.1", open_port, 60), limit=5)
    assert run.code == 1
    assert "has neither nc nor bash" in run.stderr
    assert run.stdout == ""


@pytest.mark.parametrize("tool", ["sleep", "date"])
def test_a_missing_tool_fails_at_once(tool: str, tmp_path: Path, open_port: int) -> None:
    tools = {"nc": _openbsd_nc(), **_system("dash", "sleep", "date", "timeout")}
    del tools[tool]
    shell = Shell(tools["dash"], _toolbox(tmp_path / "box", tools), "nc")
    run = run_script(shell, wait_for_master_script("127.0.0.1", open_port, 60), limit=5)
    assert run.code == 1
    assert f"has no '{tool}' command" in run.stderr


@pytest.mark.parametrize("kind", ["busybox", "bash", "dash-bare"])
def test_default_script_parses_in_every_shell(kind: str, tmp_path: Path) -> None:
    shell = make_shell(kind, tmp_path)
    script = wait_for_master_script("test-pytorch-master-0.test-pytorch", 23456, 300)
    out = subprocess.run([shell.sh, "-n", "-c", script], capture_output=True, text=True, timeout=10)
    assert out.returncode == 0, out.stderr


@pytest.mark.parametrize("template", HOSTILE_HOSTS)
@pytest.mark.parametrize("kind", ["bash", "dash-openbsd-nc"])
def test_a_hostile_host_cannot_inject_commands(
    template: str, kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = tmp_path / "injected"
    host = template.format(marker=marker)
    with pytest.raises(ValueError):
        wait_for_master_script(host, 23456, 0)
    # Validation is the first wall; quoting is the second. Knock down the first and the host is
    # still only ever data to the shell.
    monkeypatch.setattr(waitmaster, "valid_host", lambda _host: True)
    script = wait_for_master_script(host, 23456, 0)
    shell = make_shell(kind, tmp_path)
    run = run_script(shell, script, limit=10)
    assert run.code == 1
    assert not marker.exists(), f"{host!r} ran a command"


# --- nudges: SIGWINCH ends the nap between polls -----------------------------------------------------

# Each shell with and without `timeout`: without it, a nudge also interrupts the watchdog's `wait`.
NUDGED = ["busybox", "busybox-no-timeout", "bash", "bash-no-timeout", "dash-openbsd-nc", "dash-no-timeout"]
SLOW = "30"  # a poll interval no run here may wait out


class Nudger:
    """Sends SIGWINCH to the script's shell (that pid only, as the engine does) every ``every``
    seconds from a thread, until stopped or the shell is gone."""

    def __init__(self, proc: subprocess.Popen[str], every: float) -> None:
        self.proc, self.every, self.sent = proc, every, 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.wait(self.every) and self.proc.poll() is None:
            try:
                os.kill(self.proc.pid, signal.SIGWINCH)
            except ProcessLookupError:
                return
            self.sent += 1

    def __enter__(self) -> Nudger:
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.thread.join(timeout=10)


def _kill(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=10)


NAP = "30"  # seconds: the nap a nudge must end
NUDGED_WITHIN = 8.0  # seconds from the nudge to the script's end, far below a nap


@pytest.mark.parametrize("kind", NUDGED)
def test_a_nudge_once_the_master_listens_ends_the_nap(kind: str, tmp_path: Path) -> None:
    shell = make_shell(kind, tmp_path)
    with socket.socket() as master:
        master.bind(("127.0.0.1", 0))  # refuses connections until it listens
        port = master.getsockname()[1]
        start = time.monotonic()
        proc = start_script(
            shell, wait_for_master_script("127.0.0.1", port, 90), NAP, **{UIDS_ENV: str(os.getuid())}
        )
        try:
            for _ in range(6):  # fast nudges before the master listens: a poll each, then a nap again
                time.sleep(0.04)
                proc.send_signal(signal.SIGWINCH)
            time.sleep(max(0.0, start + 0.3 - time.monotonic()))
            _napping(proc)  # their polls are over (on a loaded machine one may come late)
            master.listen(16)
            time.sleep(0.1)
            assert proc.poll() is None, "the script ended before it was told the port opened"
            nudged = time.monotonic()
            proc.send_signal(signal.SIGWINCH)
            # (also: no sleep, nor anything else, left behind; a lost nudge shows as a whole nap)
            run = finish_script(proc, start, limit=float(NAP) + 15)
        finally:
            _kill(proc)
    after = run.seconds - (nudged - start)
    assert run.code == 0, run
    # A probe and a line take milliseconds; the margin is for a machine loaded by the whole suite
    # (2 s seen at a load of 9 on 2 cores). Missed, the nudge would cost the rest of the nap.
    assert after < NUDGED_WITHIN, f"ready {after:.2f}s after the nudge (a nap is {NAP}s)"
    assert run.stderr == ""
    assert run.stdout.count("not ready yet") == 1, run.stdout  # the first failed poll's line only
    assert f"127.0.0.1:{port} is ready" in run.stdout


def _slow_nc(shell: Shell, kind: str, tmp_path: Path, delay: float) -> Path:
    """Replace the toolbox's nc with one that waits ``delay`` seconds before the real nc runs and
    logs each run's start and end: a probe long enough to be nudged in the middle of."""
    if kind.startswith("busybox"):
        real = f"{shlex.quote(str(shutil.which('busybox')))} nc"
    else:
        real = shlex.quote(_openbsd_nc())
    log = tmp_path / "nc.log"
    nc = shell.path / "nc"
    nc.unlink(missing_ok=True)
    q = shlex.quote
    nc.write_text(
        f"#!{shell.sh}\necho start >>{q(str(log))}\n{q(str(shell.path / 'sleep'))} {delay}\n"
        f'{real} "$@"\nrc=$?\necho end >>{q(str(log))}\nexit $rc\n'
    )
    nc.chmod(0o700)
    return log


def _wait_for(check: Callable[[], bool], what: str, limit: float = 10.0) -> None:
    deadline = time.monotonic() + limit
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"no {what} within {limit}s")
        time.sleep(0.01)


def _lines(log: Path, word: str) -> int:
    return log.read_text().split().count(word) if log.exists() else 0


@pytest.mark.parametrize("kind", NUDGED)
def test_a_nudge_during_a_probe_ends_the_next_nap(kind: str, tmp_path: Path) -> None:
    """The engine's nudge may come while the script probes rather than naps: it is not lost."""
    shell = make_shell(kind, tmp_path)
    log = _slow_nc(shell, kind, tmp_path, delay=0.4)
    with socket.socket() as master:
        master.bind(("127.0.0.1", 0))
        port = master.getsockname()[1]
        start = time.monotonic()
        # A probe limit far above the probe's 0.4 s: killed for its time on a loaded machine, the
        # probe would not log its end.
        script = wait_for_master_script("127.0.0.1", port, 60, probe_limit=30)
        proc = start_script(shell, script, SLOW)
        try:
            _wait_for(lambda: _lines(log, "start") >= 1, "probe")
            proc.send_signal(signal.SIGWINCH)  # in the middle of the first probe
            # The failed probe tries nc twice (-z, then -e); then the master listens.
            _wait_for(lambda: _lines(log, "end") >= 2, "end of the first probe")
            master.listen(16)
            run = finish_script(proc, start)
        finally:
            _kill(proc)
    assert run.code == 0, run
    assert run.seconds < 10, f"{run.seconds:.1f}s: the nudge was lost and the script napped"
    assert run.stdout.count("not ready yet") == 1 and run.stderr == "", run


@pytest.mark.parametrize("kind", ["busybox-no-timeout", "bash-no-timeout", "dash-no-timeout"])
def test_nudges_during_a_watchdog_probe_let_it_finish(kind: str, tmp_path: Path, open_port: int) -> None:
    """Without `timeout` the script waits for its probe with `wait`, which a nudge interrupts; it
    waits on rather than take the interruption for a failed probe."""
    shell = make_shell(kind, tmp_path)
    log = _slow_nc(shell, kind, tmp_path, delay=0.5)
    start = time.monotonic()
    # The probe's own limit well above its 0.5 s: on a loaded machine, a probe that the watchdog
    # kills for its time would look like one a nudge broke.
    script = wait_for_master_script("127.0.0.1", open_port, 60, probe_limit=30)
    proc = start_script(shell, script, SLOW)
    try:
        with Nudger(proc, every=0.05) as nudger:
            run = finish_script(proc, start)
    finally:
        _kill(proc)
    assert nudger.sent >= 5, nudger.sent
    assert run.code == 0, run
    assert "not ready yet" not in run.stdout, run.stdout  # the first probe succeeded
    assert run.stderr == ""
    assert _lines(log, "start") == _lines(log, "end")  # no probe left running


@pytest.mark.parametrize("kind", ["busybox", "bash", "dash-openbsd-nc"])
def test_a_flood_of_nudges_neither_breaks_nor_silences_the_timeout(
    kind: str, tmp_path: Path, closed_port: int
) -> None:
    """Nudges every few ms while the script reads the socket tables (a command substitution each
    poll) and naps: it still gives up on time, with its one message and nothing else."""
    shell = make_shell(kind, tmp_path)
    start = time.monotonic()
    script = wait_for_master_script("127.0.0.1", closed_port, 1)
    proc = start_script(shell, script, SLOW, **{UIDS_ENV: str(os.getuid())})
    try:
        with Nudger(proc, every=0.003):
            run = finish_script(proc, start)
    finally:
        _kill(proc)
    assert run.code == 1, run
    assert run.seconds >= 1
    timed_out = f"wait-for-master: timed out: nothing accepted a TCP connection on 127.0.0.1:{closed_port}"
    assert run.stderr.startswith(timed_out) and run.stderr.count("\n") == 1, run.stderr
    assert run.stdout.count("not ready yet") == 1, run.stdout


# --- a nudge just after a `wait`: bash ends the next `wait` with it ---------------------------------


def _strace() -> str:
    strace = shutil.which("strace")
    if strace is None:
        pytest.skip("strace is not installed (Debian package 'strace')")
    tried = subprocess.run([strace, "-o", os.devnull, "true"], capture_output=True, timeout=30)
    if tried.returncode != 0:
        pytest.skip(f"strace cannot trace here: {tried.stderr.decode(errors='replace').strip()}")
    return strace


def _nudged_at(strace: str, shell: Shell, script: Path, call: int, trace: Path) -> tuple[str, str]:
    """Run ``shell script`` with SIGWINCH put at its ``call``-th rt_sigprocmask (0: none): its
    output and strace's record of its rt_sigprocmask, wait4, clone and openat calls and SIGWINCH."""
    argv = [strace, "-o", str(trace), "-e", "trace=rt_sigprocmask,wait4,clone,openat", "-e", "signal=WINCH"]
    if call:
        argv += ["-e", f"inject=rt_sigprocmask:signal=WINCH:when={call}"]
    done = subprocess.run(
        [*argv, shell.sh, str(script)],
        env={"PATH": str(shell.path)},
        capture_output=True,
        text=True,
        timeout=RUN_LIMIT,
        start_new_session=True,
    )
    return done.stdout, trace.read_text()


@pytest.mark.parametrize(
    "then",
    [
        'nap 0.01\nnap 0.2 2>/dev/null\necho "rc=$?"',  # heard by the first nap; the second sleeps
        'bounded sleep 0.2\necho "rc=$?"',  # a probe (no `timeout`: the watchdog's way) waited for
    ],
    ids=["nap", "watchdog-probe"],
)
def test_a_nudge_just_after_a_wait_does_not_cut_the_next_wait_short(then: str, tmp_path: Path) -> None:
    """bash 5 keeps a SIGWINCH that lands just after a `wait` returned, before the next command,
    and ends the next `wait` with it at once (128 + SIGWINCH), though the nudge's trap has run and
    the nudge was heard. Before, a nap took that for its sleep's failure (and slept 1 s, the
    fallback) and a probe for a failed one (left running without its watchdog).

    The script's own functions, then a `wait` for a child; strace puts the nudge at each of the
    next rt_sigprocmask calls in turn. The script is a file here: bash reads it between commands,
    which puts system calls into that window (under ``sh -c`` the window is as real, but has none
    to put a signal at). Each time, the nap sleeps its time and the probe is waited for (status 0).
    """
    strace = _strace()
    shell = make_shell("bash-no-timeout", tmp_path)
    script = wait_for_master_script("127.0.0.1", 9, 60)
    functions = script[: script.index('say "waiting up to')]
    marker = ": </proc/self/status\n"  # the wait below is the first one after this file is opened
    path = tmp_path / "script.sh"
    path.write_text(f'{functions}{marker}sleep 0.05 & child=$!\nwait "$child"\nstatus=$?\n{then}\n')
    out, trace = _nudged_at(strace, shell, path, 0, tmp_path / "plain.trace")
    assert out == "rc=0\n", out
    calls, marked, reaped = 0, False, None
    for line in trace.splitlines():
        calls += line.startswith("rt_sigprocmask")
        marked = marked or "/proc/self/status" in line
        if marked and re.match(r"wait4\(-1, \[.*\], 0, NULL\)", line):  # the wait that reaped the child
            reaped = calls
            break
    assert reaped is not None, trace
    for call in range(reaped + 1, reaped + 9):  # past the wait: in bash 5.2.15, the 4th to 7th
        out, nudged = _nudged_at(strace, shell, path, call, tmp_path / f"{call}.trace")
        assert "--- SIGWINCH" in nudged, f"no nudge at call {call}"
        assert out == "rc=0\n", f"nudged at rt_sigprocmask {call} ({call - reaped} after the wait): {out}"
