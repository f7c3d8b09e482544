"""No orphans, no hangs: Ctrl-C, SIGTERM, a SIGKILLed supervisor and the job's own end.

Each job has a container that starts a grandchild ``sleep`` in a new session (it leaves the
container's process group) and one that ignores SIGTERM, so the grace period and the SIGKILL
after it are exercised too. Every check looks for processes that carry the job's marker.

The main tests run in the three start modes (issue 13): ``cold``; ``prewarm``, where the spawner's
pod has an init container, so its interpreter is started (and imports torch) before it runs; and
``preload``, where the spawner is forked from the job's fork server (``--preload torch``).
"""

from __future__ import annotations

import io
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest

from support import container, leftovers, log_dir, log_text, make_job, run, sh, task, wait_until
from torchjob.engines.local.cleanup import JobProcesses
from torchjob.spec.manifest import job_manifest

pytestmark = pytest.mark.timeout(60)

SPAWNER = """
import subprocess, sys, time
subprocess.Popen(["sleep", "300"], start_new_session=True)  # leaves the container's group
subprocess.Popen(["sleep", "301"])  # stays in it
print("spawned", "warm" if "torch" in sys.modules else "cold", flush=True)
time.sleep(300)
"""


MODES = ["cold", "prewarm", "preload"]


def _init(mode: str) -> list[dict[str, object]] | None:
    return [container("init", sh("sleep 0.2"))] if mode == "prewarm" else None


def _job(tmp_path: Path, name: str, mode: str) -> Path:
    (tmp_path / "spawner.py").write_text(SPAWNER)
    spawner = container("spawner", ["python", str(tmp_path / "spawner.py")])
    job = make_job(
        name,
        [
            task("master", [spawner], init=_init(mode)),
            task("worker", [container("stubborn", sh("trap '' TERM; echo stubborn; sleep 300"))]),
        ],
    )
    path = tmp_path / "job.json"
    path.write_text(json.dumps(job_manifest(job)))
    return path


def _start(tmp_path: Path, name: str, mode: str) -> tuple[subprocess.Popen[bytes], str]:
    home = tmp_path / "home"
    env = {**os.environ, "TORCHJOB_HOME": str(home)}
    out = open(tmp_path / "out.txt", "wb")  # noqa: SIM115 - closed by the test's end
    flags = {"cold": ["--no-prewarm"], "prewarm": [], "preload": ["--preload", "torch"]}[mode]
    proc = subprocess.Popen(
        [sys.executable, "-m", "torchjob", "run", *flags, str(_job(tmp_path, name, mode))],
        env=env,
        stdout=out,
        stderr=subprocess.STDOUT,
    )
    jobs = home / "jobs"
    assert wait_until(lambda: jobs.is_dir() and any(jobs.iterdir()), 15), "the job never started"
    job_id = next(jobs.iterdir()).name
    logs = jobs / job_id / "logs"

    def ready() -> bool:
        spawned = list(logs.glob("*master-0/attempt-0/spawner.log"))
        stubborn = list(logs.glob("*worker-0/attempt-0/stubborn.log"))
        return bool(
            spawned
            and f"spawned {'cold' if mode == 'cold' else 'warm'}" in spawned[0].read_text()
            and stubborn
            and "stubborn" in stubborn[0].read_text()
        )

    assert wait_until(ready, 20), (tmp_path / "out.txt").read_text()
    assert wait_until(lambda: len(leftovers(job_id)) >= 5, 5)
    sessions = {os.getsid(p.pid) for p in leftovers(job_id) if p.name() == "sleep"}
    assert len(sessions) >= 2, "the test needs a grandchild in a session of its own"
    return proc, job_id


def _exit_code(proc: subprocess.Popen[bytes]) -> int:
    return proc.wait(timeout=20)


@pytest.mark.parametrize("mode", MODES)
def test_ctrl_c_stops_every_process_and_exits_130(tmp_path: Path, mode: str) -> None:
    proc, job_id = _start(tmp_path, "sigint", mode)
    proc.send_signal(signal.SIGINT)
    assert _exit_code(proc) == 130
    assert leftovers(job_id) == []
    status = json.loads(next((tmp_path / "home" / "jobs").glob("*/status.json")).read_text())
    assert status["phase"] == "Terminated" and "SIGINT" in status["reason"]


@pytest.mark.parametrize("mode", MODES)
def test_sigterm_stops_every_process_and_exits_1(tmp_path: Path, mode: str) -> None:
    proc, job_id = _start(tmp_path, "sigterm", mode)
    proc.send_signal(signal.SIGTERM)
    assert _exit_code(proc) == 1
    assert leftovers(job_id) == []


@pytest.mark.parametrize("mode", MODES)
def test_a_sigkilled_supervisor_leaves_nothing_after_two_seconds(tmp_path: Path, mode: str) -> None:
    proc, job_id = _start(tmp_path, "sigkill", mode)
    victims = leftovers(job_id)
    proc.kill()
    killed_at = time.monotonic()
    proc.wait(timeout=5)

    def victims_alive() -> bool:
        # A dying process loses its environment (so its marker) before it becomes a zombie.
        try:
            return any(v.is_running() and v.status() != psutil.STATUS_ZOMBIE for v in victims)
        except psutil.NoSuchProcess:
            return victims_alive()  # one just went; look again

    gone = wait_until(lambda: not leftovers(job_id) and not victims_alive(), 2.0)
    took = time.monotonic() - killed_at
    assert gone, f"still alive {took:.2f}s after the SIGKILL: {[p.cmdline() for p in leftovers(job_id)]}"
    assert not victims_alive()


# Waits (at most 20 s, then exit 4) until the master's spawner has said it spawned.
AFTER_THE_SPAWNER = (
    'i=0; until grep -qs spawned "$TORCHJOB_JOB_DIR"/logs/*master-0/attempt-0/spawner.log; do '
    "i=$((i + 1)); [ $i -lt 400 ] || exit 4; sleep 0.05; done; "
)


@pytest.mark.parametrize("mode", MODES)
def test_the_end_of_a_job_stops_grandchildren_that_left_the_group(tmp_path: Path, mode: str) -> None:
    (tmp_path / "spawner.py").write_text(SPAWNER)
    job = make_job(
        "ending",
        [
            task(
                "master",
                [container("spawner", ["python", str(tmp_path / "spawner.py")])],
                init=_init(mode),
            ),
            # Fails (and aborts the job) once the spawner has started its grandchildren: a fixed
            # sleep lost the race to a warm spawner's import of torch on a busy machine.
            task("worker", [container("quick", sh(AFTER_THE_SPAWNER + "exit 3"))]),
        ],
        policies=[{"event": "PodFailed", "action": "AbortJob"}],
    )
    preload = ("torch",) if mode == "preload" else ()
    result = run(job, tmp_path, prewarm=mode == "prewarm", preload=preload)
    assert result.phase == "Aborted"
    worker = next(p for p in result.pods if p.name.endswith("worker-0"))
    assert worker.exit_code == 3, "the spawner never said it spawned"
    assert ("spawned warm" if mode == "preload" else "spawned") in log_text(result, "master-0", "spawner")
    assert leftovers(result.id) == []


@pytest.mark.parametrize("how", ["SIGKILL", "SIGTERM"])
def test_a_warm_process_waiting_for_its_init_containers_dies_with_the_supervisor(
    tmp_path: Path, how: str
) -> None:
    """Stopped while the init container still runs: the warm process is found and killed (or
    ends by itself on its pipe's end of file) and the program never runs."""
    ran = tmp_path / "ran"
    program = ["python", "-c", f"open({str(ran)!r}, 'w').write('ran')"]
    job = make_job(
        "waiting", [task("main", [container("app", program)], init=[container("init", sh("sleep 300"))])]
    )
    (tmp_path / "job.json").write_text(json.dumps(job_manifest(job)))
    env = {**os.environ, "TORCHJOB_HOME": str(tmp_path / "home")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "torchjob", "run", str(tmp_path / "job.json")],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    jobs = tmp_path / "home" / "jobs"
    assert wait_until(lambda: jobs.is_dir() and any(jobs.iterdir()), 15), "the job never started"
    job_id = next(jobs.iterdir()).name

    def warm() -> list[psutil.Process]:
        return [p for p in leftovers(job_id) if "torchjob_prewarm" in " ".join(p.cmdline())]

    assert wait_until(lambda: warm() and len(leftovers(job_id)) >= 2, 15), "no warm process"
    victims = leftovers(job_id)
    proc.send_signal(getattr(signal, how))
    proc.wait(timeout=15)
    assert wait_until(
        lambda: not any(v.is_running() and v.status() != psutil.STATUS_ZOMBIE for v in victims), 3.0
    )
    assert leftovers(job_id) == []
    assert not ran.exists()


def test_a_timeout_kills_a_container_that_ignores_sigterm(tmp_path: Path) -> None:
    job = make_job("stubborn", [task("main", [container("app", sh("trap '' TERM; sleep 300"))])])
    result = run(job, tmp_path, timeout=0.5)
    assert result.phase == "Terminated"
    assert result.pods[0].exit_code == 137  # SIGKILL after the 2 s grace period
    assert leftovers(result.id) == []


def test_a_restart_leaves_nothing_of_the_previous_attempt(tmp_path: Path) -> None:
    pid_file = tmp_path / "daemon.pid"
    first = (
        "import subprocess, sys\n"
        "daemon = subprocess.Popen(['sleep', '300'], start_new_session=True)\n"
        f"open({str(pid_file)!r}, 'w').write(str(daemon.pid))\n"
        "sys.exit(1)\n"  # at once, before any scan of descendants could record the daemon
    )
    second = (
        "import os, sys\n"
        "try:\n"
        f"    os.kill(int(open({str(pid_file)!r}).read()), 0)\n"
        "except OSError:\n"
        "    sys.exit(0)  # the daemon of attempt 0 is gone\n"
        "sys.exit(5)\n"
    )
    (tmp_path / "first.py").write_text(first)
    (tmp_path / "second.py").write_text(second)
    script = (
        f'[ "$TORCHJOB_ATTEMPT" = 0 ] && exec python {tmp_path}/first.py; exec python {tmp_path}/second.py'
    )
    job = make_job(
        "norest",
        [task("main", [container("app", sh(script))])],
        policies=[{"event": "PodFailed", "action": "RestartJob"}],
    )
    result = run(job, tmp_path)
    assert result.ok, result.reason
    assert log_dir(result, result.pods[0]).name == "attempt-1"


# Ways a program leaves its job's process group, session and marker behind. Each writes the
# daemon's pid to the file named by argv[1]; the daemon is a sleep whose environment is empty
# or holds only PATH, so the job's marker cannot find it.
ESCAPES = {
    # the idiom: a child in a session of its own with an environment of its own
    "new-session": """
import os, subprocess, sys
daemon = subprocess.Popen(["sleep", "300"], env={"PATH": os.environ["PATH"]}, start_new_session=True)
open(sys.argv[1], "w").write(str(daemon.pid))
""",
    # a classic daemon: fork, setsid, fork again, the middle process gone, the environment cleared
    "double-fork": """
import os, shutil, sys
sleep = shutil.which("sleep")
read, write = os.pipe()
if os.fork() == 0:
    os.setsid()
    pid = os.fork()
    if pid == 0:
        os.execve(sleep, ["sleep", "300"], {})
    os.write(write, str(pid).encode())
    os._exit(0)
os.close(write)
open(sys.argv[1], "w").write(os.read(read, 64).decode())
""",
}


def _escaper(tmp_path: Path, how: str, then: str) -> list[str]:
    program = tmp_path / "escape.py"
    program.write_text(ESCAPES[how] + then)
    return ["python", str(program), str(tmp_path / "daemon.pid")]


def _daemon(tmp_path: Path) -> int:
    pid_file = tmp_path / "daemon.pid"
    assert wait_until(lambda: pid_file.exists() and pid_file.read_text().strip(), 20), "no daemon started"
    return int(pid_file.read_text())


def _gone(pid: int) -> bool:
    """Not running (a zombie is not running, but the supervisor must not leave one either)."""
    try:
        return not psutil.Process(pid).is_running()
    except psutil.NoSuchProcess:
        return True


def _kill(pid: int) -> None:
    if not _gone(pid):
        os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("how", sorted(ESCAPES))
@pytest.mark.parametrize("end", ["exits at once", "runs until the timeout"])
def test_a_process_that_left_the_session_and_dropped_the_marker_dies_with_the_job(
    tmp_path: Path, how: str, end: str
) -> None:
    then = "" if end == "exits at once" else "import time; time.sleep(300)\n"
    job = make_job("escape", [task("main", [container("app", _escaper(tmp_path, how, then))])])
    result = run(job, tmp_path, timeout=30 if end == "exits at once" else 2)
    daemon = _daemon(tmp_path)
    try:
        assert result.phase == ("Completed" if end == "exits at once" else "Terminated"), result.reason
        assert _gone(daemon), f"the daemon (pid {daemon}) outlived its job"
    finally:
        _kill(daemon)


@pytest.mark.parametrize("how", sorted(ESCAPES))
@pytest.mark.parametrize("seen", [False, True], ids=["at-once", "after-a-scan"])
def test_the_watchdog_stops_an_escaped_daemon_when_the_supervisor_is_killed(
    tmp_path: Path, how: str, seen: bool
) -> None:
    job = make_job(
        "watched",
        [task("main", [container("app", _escaper(tmp_path, how, "import time; time.sleep(300)\n"))])],
    )
    (tmp_path / "job.json").write_text(json.dumps(job_manifest(job)))
    env = {**os.environ, "TORCHJOB_HOME": str(tmp_path / "home")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "torchjob", "run", str(tmp_path / "job.json")],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    daemon = _daemon(tmp_path)
    try:
        if seen:
            time.sleep(1.0)  # the supervisor's scans have recorded the daemon and told the watchdog
        proc.kill()
        proc.wait(timeout=5)
        # Not a zombie either: the watchdog's kill makes init its parent, which reaps it.
        assert wait_until(lambda: _gone(daemon), 3.0), f"the daemon (pid {daemon}) outlived its supervisor"
    finally:
        _kill(daemon)


HOLDER = """
import socket, sys, time
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(("127.0.0.1", int(sys.argv[1])))
server.listen()
print("bound", flush=True)
time.sleep(300)
"""

RESTARTED = """
import os, socket, subprocess, sys
port, first = sys.argv[1], sys.argv[2]
if not os.path.exists(first):  # the first run: a detached child takes the port, the run fails
    open(first, "w").close()
    holder = subprocess.Popen(
        [sys.executable, "-c", sys.argv[3], port],
        env={"PATH": os.environ["PATH"]},
        start_new_session=True,
        stdout=subprocess.PIPE,
    )
    assert holder.stdout.readline() == b"bound\\n"
    open(first, "w").write(str(holder.pid))
    sys.exit(1)
server = socket.socket()  # the restart: the port must be free again
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(("127.0.0.1", int(port)))
print("bound again")
"""


@pytest.mark.parametrize("policy", ["OnFailure", "Always"])
def test_a_container_restart_stops_the_detached_processes_of_its_previous_run(
    tmp_path: Path, policy: str
) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    (tmp_path / "restarted.py").write_text(RESTARTED)
    first = tmp_path / "first-run"
    command = ["python", str(tmp_path / "restarted.py"), str(port), str(first), HOLDER]
    # Under Always the second run succeeds and is restarted again: the job ends by its timeout.
    job = make_job("restart", [task("main", [container("app", command)], restart=policy)])
    result = run(job, tmp_path, timeout=30 if policy == "OnFailure" else 4)
    holder = int(first.read_text())
    try:
        log = log_text(result, "main-0", "app")
        assert "bound again" in log, log
        assert "Address already in use" not in log, log
        if policy == "OnFailure":
            assert result.ok, result.reason
            assert result.pods[0].restarts == 1
        assert _gone(holder)
    finally:
        _kill(holder)


def test_a_library_callers_own_children_are_not_taken_for_the_jobs(tmp_path: Path) -> None:
    """In-process, the supervisor is the caller's process: its own children (also in sessions of
    their own, as the job's orphans are) are not adopted orphans and outlive the job."""
    own = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        job = make_job("caller", [task("main", [container("app", _escaper(tmp_path, "new-session", ""))])])
        result = run(job, tmp_path)
        assert result.ok, result.reason
        assert _gone(_daemon(tmp_path))  # the job's own escaped child is stopped
        assert own.poll() is None, "the caller's own child was stopped with the job"
    finally:
        own.kill()
        own.wait(timeout=5)


# Each replica leaves a classic daemon (double fork, setsid, empty environment), waits for the
# keeper's signal and exits: the replicas' main processes end together, which is when one scan
# for orphans may serve them all (cleanup.JobProcesses.adopt).
TOGETHER = """
import os, shutil, sys, time
where, me = sys.argv[1], os.environ["TORCHJOB_POD_NAME"]
read, write = os.pipe()
if os.fork() == 0:
    os.setsid()
    pid = os.fork()
    if pid == 0:
        os.execve(shutil.which("sleep"), ["sleep", "300"], {})
    os.write(write, str(pid).encode())
    os._exit(0)
os.close(write)
with open(f"{where}/.{me}", "w") as out:
    out.write(os.read(read, 64).decode())
os.rename(f"{where}/.{me}", f"{where}/daemon-{me}")
while not os.path.exists(f"{where}/go"):
    time.sleep(0.002)
"""

# Lets the replicas go once both daemons run, then waits (bounded) until both are gone: the job
# succeeds only if the daemons died with their containers, while the job still ran.
KEEPER = """
import glob, os, sys, time
where = sys.argv[1]
deadline = time.monotonic() + 20
while len(glob.glob(f"{where}/daemon-*")) < 2 and time.monotonic() < deadline:
    time.sleep(0.01)
pids = [int(open(path).read()) for path in glob.glob(f"{where}/daemon-*")]
open(f"{where}/go", "w").close()

def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False

while any(alive(p) for p in pids) and time.monotonic() < deadline:
    time.sleep(0.02)
left = [p for p in pids if alive(p)]
print("daemons", pids, "left", left, flush=True)
sys.exit(1 if left or len(pids) < 2 else 0)
"""


def test_daemons_of_containers_that_end_together_die_with_them(tmp_path: Path) -> None:
    (tmp_path / "together.py").write_text(TOGETHER)
    (tmp_path / "keeper.py").write_text(KEEPER)
    job = make_job(
        "together",
        [
            task(
                "app",
                [container("app", ["python", str(tmp_path / "together.py"), str(tmp_path)])],
                replicas=2,
            ),
            task("keeper", [container("keeper", ["python", str(tmp_path / "keeper.py"), str(tmp_path)])]),
        ],
    )
    result = run(job, tmp_path)
    daemons = [int(p.read_text()) for p in tmp_path.glob("daemon-*")]
    try:
        assert len(daemons) == 2, log_text(result, "keeper-0", "keeper")
        assert result.ok, f"{result.reason}: {log_text(result, 'keeper-0', 'keeper')}"
    finally:
        for pid in daemons:
            _kill(pid)


CHILDREN = """
import subprocess, sys, time
from torchjob.engines.local import proctree
assert not proctree.has_children() and proctree.children_of_self() == []
child = subprocess.Popen(["sh", "-c", "exit 7"])
assert proctree.has_children()
while not proctree.exited(child.pid):
    time.sleep(0.01)
assert proctree.children_of_self() == [child.pid]  # ended, not reaped: still a child
assert child.wait(timeout=5) == 7  # asking did not reap it: its exit code is still there
assert not proctree.has_children() and not proctree.exited(child.pid)
print("ok")
"""


def test_the_checks_for_children_ask_without_reaping() -> None:
    """has_children (no scan for a caller's children when there are none) and exited (which main
    processes had ended before an orphan scan) must leave the exit status to its owner."""
    out = subprocess.run([sys.executable, "-c", CHILDREN], capture_output=True, text=True, timeout=30)
    assert out.stdout.strip() == "ok", out.stderr


class _CountingProcesses(JobProcesses):
    """JobProcesses whose fresh scans are counted, not made."""

    def __init__(self) -> None:
        super().__init__("job", {}, {})
        self.watchdog = SimpleNamespace(pid=99, watch=lambda pgid: None)  # type: ignore[assignment]
        self.scans = 0

    def adopt(self, fresh: bool = False) -> list[int]:
        self.scans += fresh
        return []


@pytest.mark.parametrize(
    ("known", "ended", "found", "scans"),
    [
        ({10, 11, 99}, {10, 11}, False, 0),  # every container had ended, nothing found: no scan
        ({10, 11, 99}, {10}, False, 1),  # container 11 still ran then: it may have forked since
        ({10, 11, 99}, {10, 11}, True, 1),  # orphans were found: they may have forked since
    ],
)
def test_the_final_sweep_scans_again_unless_the_last_scan_rules_orphans_out(
    known: set[int], ended: set[int], found: bool, scans: int
) -> None:
    processes = _CountingProcesses()
    assert processes.last_orphans() == [] and processes.scans == 1  # no scan yet: one is made
    processes.scans = 0
    processes._scan = (0.0, known, ended, {})
    processes._scan_found = found
    assert processes.last_orphans() == []
    assert processes.scans == scans
    processes.on_group(12, started=True)  # a container started since: the old scan says nothing
    processes.scans = 0
    processes.last_orphans()
    assert processes.scans == 1


def test_a_job_whose_directory_was_removed_stops_with_every_process(tmp_path: Path) -> None:
    """A job's directory removed under it (``rm -rf``, a test's temporary directory cleaned up):
    no command could see or stop the job any more, so its supervisor stops it, and its pods,
    grandchildren in sessions of their own included, go with it; nothing is written again at
    that path."""
    import shutil

    proc, job_id = _start(tmp_path, "vanished", "cold")
    job_dir = tmp_path / "home" / "jobs" / job_id
    # The running job may add a file while the tree is walked ("Directory not empty"): removed
    # again, as a user runs ``rm -rf`` again, until it is gone.
    assert wait_until(lambda: shutil.rmtree(job_dir, ignore_errors=True) or not job_dir.exists(), 10)
    assert _exit_code(proc) == 1
    assert wait_until(lambda: not leftovers(job_id), 5), [p.cmdline() for p in leftovers(job_id)]
    assert not job_dir.exists()
    out = (tmp_path / "out.txt").read_text()
    assert "the job directory was removed" in out, out
    assert "Traceback" not in out, out


def test_a_warm_interpreter_of_a_pod_still_being_created_is_not_taken_for_an_orphan() -> None:
    """An init container can end within its pod's first step, before the controller lists the
    pod: the orphans looked for then must not include the main container's warm interpreter, a
    child of the supervisor in a session of its own with the job's marker (it was SIGKILLed, and
    the program failed with 137, on a busy machine)."""
    job_id = f"creating-{os.getpid()}"
    warm = subprocess.Popen(
        ["sleep", "30"], start_new_session=True, env={**os.environ, "TORCHJOB_JOB_ID": job_id}
    )
    try:
        spec = SimpleNamespace(proc=None, alive=False, warm=SimpleNamespace(proc=warm))
        main = SimpleNamespace(spec=spec)
        pod = SimpleNamespace(containers=[main], mains=[main])
        processes = JobProcesses(job_id, {}, {})
        assert wait_until(lambda: os.getsid(warm.pid) == warm.pid, 5)
        assert warm.pid in processes.adopt(fresh=True)  # unlisted, it would look like an orphan
        processes.created(pod)  # type: ignore[arg-type]
        assert warm.pid not in processes.adopt(fresh=True)
        assert warm.poll() is None
    finally:
        warm.kill()
        warm.wait(timeout=5)


OTHER_UID = 65534  # nobody: any uid but this one's will do; no account is needed for a process


@pytest.mark.skipif(os.geteuid() != 0, reason="starting a process of another uid needs root")
def test_a_process_of_another_user_that_carries_the_marker_is_never_the_jobs() -> None:
    """Anyone can put a job's marker in a process's environment: as root, the sweeps and the
    watchdog would otherwise kill another user's process. Only this user's are the job's (and,
    when named, the uids the job's containers were switched to)."""
    from torchjob.engines.local import process, watchdog

    job_id = f"marked-{os.getpid()}-{time.monotonic_ns() % 100000}"
    env = {**os.environ, "TORCHJOB_JOB_ID": job_id}
    mine = subprocess.Popen(["sleep", "30"], env=env, start_new_session=True)
    theirs = subprocess.Popen(["sleep", "30"], env=env, start_new_session=True, user=OTHER_UID)
    try:
        assert wait_until(lambda: psutil.Process(theirs.pid).uids().real == OTHER_UID, 5)
        assert {p.pid for p in process.marked_processes(job_id)} == {mine.pid}
        both = {p.pid for p in process.marked_processes(job_id, uids={os.getuid(), OTHER_UID})}
        assert both == {mine.pid, theirs.pid}
        assert process.job_owners(f"0 {OTHER_UID}") == {0, OTHER_UID}  # root ran the job as another uid
        # The watchdog, at its supervisor's death (end of file), stops the job's and only those.
        assert watchdog.watch(job_id, io.BytesIO(b"")) == 0
        assert mine.wait(timeout=5) is not None
        assert theirs.poll() is None
        assert process.sweep("TORCHJOB_JOB_ID", [job_id]) == []
        assert theirs.poll() is None
    finally:
        for proc in (mine, theirs):
            proc.kill()
            proc.wait(timeout=5)


def test_a_user_who_is_not_root_owns_no_uid_a_job_names_but_their_own() -> None:
    from torchjob.engines.local import process

    expected = {os.getuid(), 1234} if os.geteuid() == 0 else {os.getuid()}
    assert process.job_owners(f"{os.geteuid()} 1234") == expected
