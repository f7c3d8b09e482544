"""The local engine's small parts: addresses, ports, env expansion, checks, log following."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from support import Ran, container, job_dir, make_job, run, sh, task, unremovable, wait_until
from torchjob.display import prefix_for
from torchjob.engines.local import check_job
from torchjob.engines.local.addressing import LocalAddressing, pod_address
from torchjob.engines.local.containers import PodSetup
from torchjob.engines.local.envvars import expand_refs
from torchjob.engines.local.mounts import rewrite_paths
from torchjob.engines.local.ports import declared_ports, release, reserve
from torchjob.engines.local.resolve import resolve_container
from torchjob.errors import Issue
from torchjob.expand import expand
from torchjob.files import LogFollower
from torchjob.spec.units import parse_quantity

pytestmark = pytest.mark.timeout(30)


def test_pod_addresses_are_distinct_loopback_addresses_avoiding_network_and_broadcast() -> None:
    assert pod_address(0, per_pod=True) == "127.0.1.1"
    assert pod_address(253, per_pod=True) == "127.0.1.254"
    assert pod_address(254, per_pod=True) == "127.0.2.1"
    addresses = [pod_address(n, per_pod=True) for n in range(5000)]
    assert len(set(addresses)) == 5000
    assert not any(a.endswith((".0", ".255")) for a in addresses)
    assert pod_address(7, per_pod=False) == "127.0.0.1"


def test_local_addressing_maps_ports_and_gives_pod_zero_for_a_shared_hostname() -> None:
    job = make_job(
        "addr",
        [
            task("a", [container("c", ["true"])], replicas=2),
            task("b", [container("c", ["true"])], replicas=3),
        ],
    )
    addressing = LocalAddressing(job, {23456: 31000})
    b = job.spec.tasks[1]
    assert addressing.host(job, b, 2) == "127.0.1.5"
    assert addressing.port(job, 23456) == 31000 and addressing.port(job, 80) == 80
    b.template.spec["hostname"] = "shared"
    assert addressing.host(job, b, 2) == "127.0.1.3"


def test_kubernetes_variable_expansion() -> None:
    env = {"A": "a", "EMPTY": ""}
    assert expand_refs("$(A)-$(B)-$(EMPTY)", env) == "a-$(B)-"
    assert expand_refs("$$(A) costs $$5", env) == "$(A) costs $5"
    assert expand_refs("$A ${A}", env) == "$A ${A}"


def test_quantities() -> None:
    assert parse_quantity("500m") == 0.5
    assert parse_quantity("2") == 2
    assert parse_quantity("1Gi") == 2**30
    assert parse_quantity("1.5k") == 1500
    assert parse_quantity("1e3") == 1000 and parse_quantity("2E-3") == 0.002
    with pytest.raises(ValueError):
        parse_quantity("lots")


def test_mount_paths_are_rewritten_only_as_whole_path_components() -> None:
    mounts = {"/etc/volcano": "/jobs/x/volumes/x-svc"}
    assert rewrite_paths("cat /etc/volcano/worker.host", mounts) == "cat /jobs/x/volumes/x-svc/worker.host"
    assert rewrite_paths("/etc/volcano", mounts) == "/jobs/x/volumes/x-svc"
    assert rewrite_paths("/etc/volcanoes/x", mounts) == "/etc/volcanoes/x"


def test_declared_ports_are_the_pytorch_port_then_container_ports() -> None:
    job = make_job(
        "ports",
        [
            task(
                "master",
                [container("m", ["true"], ports=[{"containerPort": 29400}, {"containerPort": 23456}])],
            ),
            task("worker", [container("w", ["true"])]),
        ],
        plugins={"pytorch": ["--master=master", "--worker=worker"]},
    )
    assert declared_ports(job) == [23456, 29400]


@pytest.fixture
def registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TORCHJOB_RUNTIME_DIR", str(tmp_path / "runtime"))
    return tmp_path / "runtime"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_free_port_is_kept_and_a_reserved_one_is_not_given_twice(registry: Path) -> None:
    port = _free_port()
    first = reserve("job-a", [port])
    second = reserve("job-b", [port])
    assert first == {port: port}
    assert second[port] != port
    release("job-a")
    assert reserve("job-c", [port]) == {port: port}
    data = json.loads((registry / "ports.json").read_text())
    assert {v["job"] for v in data.values()} == {"job-b", "job-c"}


def test_a_listening_port_is_mapped_away(registry: Path) -> None:
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        s.listen()
        taken = s.getsockname()[1]
        mapping = reserve("job", [taken])
    assert mapping[taken] != taken


def test_reservations_of_a_dead_supervisor_are_ignored(registry: Path) -> None:
    port = _free_port()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    registry.mkdir(mode=0o700, parents=True, exist_ok=True)  # as torchjob makes it: private
    (registry / "ports.json").write_text(
        json.dumps({str(port): {"pid": dead.pid, "created": 0, "job": "gone"}})
    )
    assert reserve("job", [port]) == {port: port}


def test_check_job_finds_what_cannot_run_locally(tmp_path: Path) -> None:
    job = make_job(
        "checks",
        [
            task(
                "main",
                [
                    container("wd", ["true"], workingDir=str(tmp_path / "missing")),
                    container(
                        "secret",
                        ["true"],
                        env=[{"name": "S", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}],
                    ),
                    container(
                        "optional",
                        ["true"],
                        env=[
                            {
                                "name": "S",
                                "valueFrom": {"secretKeyRef": {"name": "s", "key": "k", "optional": True}},
                            }
                        ],
                    ),
                    container(
                        "cm",
                        ["true"],
                        env=[{"name": "C", "valueFrom": {"configMapKeyRef": {"name": "mine", "key": "k"}}}],
                    ),
                    # A fieldRef the engine cannot resolve is one Kubernetes refuses too: validation
                    # refuses it (tests/bad_inputs/field_ref_unknown_path.yaml).
                ],
            )
        ],
    )
    issues = {i.path: i.message for i in check_job(job)}
    base = "spec.tasks[0].template.spec.containers"
    assert set(issues) == {
        f"{base}[0].workingDir",
        f"{base}[1].env[0].valueFrom.secretKeyRef",
        f"{base}[3].env[0].valueFrom.configMapKeyRef",
    }
    assert "does not exist" in issues[f"{base}[0].workingDir"]


def test_a_working_directory_in_an_empty_dir_is_made_by_the_engine_so_the_check_accepts_it(
    tmp_path: Path,
) -> None:
    main = task(
        "main",
        [
            container(
                "app",
                sh("pwd > out.txt"),
                workingDir="/scratch",
                volumeMounts=[{"name": "scratch", "mountPath": "/scratch"}],
            )
        ],
    )
    main["template"]["spec"]["volumes"] = [{"name": "scratch", "emptyDir": {}}]
    job = make_job("wd-volume", [main])
    assert check_job(job) == []
    result = run(job, tmp_path)
    assert result.ok, result.reason
    written = next(job_dir(result).rglob("out.txt"))
    assert written.parent.name == "scratch"
    assert written.read_text().strip() == str(written.parent)


def test_a_job_without_pods_cannot_run_locally() -> None:
    job = make_job("empty", [task("main", [container("app", ["true"])], replicas=0)])
    assert check_job(job) == [Issue("spec.tasks", "every task has 0 replicas: there is no pod to run")]


def test_log_follower_yields_whole_lines_and_the_last_partial_one_on_close(tmp_path: Path) -> None:
    log = tmp_path / "c.log"
    follower = LogFollower()
    follower.follow(log, "worker-0 r1")
    assert follower.read() == []
    log.write_bytes(b"one\ntw")
    assert [text for _, text in follower.read()] == ["one"]
    with open(log, "ab") as handle:
        handle.write(b"o\nthree")
    assert [text for _, text in follower.read()] == ["two"]
    follower.close(log)
    assert [text for _, text in follower.read()] == ["three"]
    assert follower.files == {}


def test_log_follower_keeps_the_last_state_of_a_progress_bar_and_splits_endless_lines(tmp_path: Path) -> None:
    log = tmp_path / "bar.log"
    log.write_bytes(b"10%\r50%\r100%\r\n" + b"x" * 70000)
    follower = LogFollower()
    follower.follow(log, "master-0")
    texts = [text for _, text in follower.read()]
    assert texts == ["100%", "x" * 70000]


def test_prefixes() -> None:
    assert prefix_for("worker-1", "2", None) == "worker-1 r2"
    assert prefix_for("worker-1", None, "wait-for-master") == "worker-1/wait-for-master"


def test_importing_the_engine_is_cheap() -> None:
    code = "import sys, torchjob.engines.local; print('torch' in sys.modules, 'kubernetes' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=30, env={**os.environ}
    ).stdout.split()
    assert out == ["False", "False"]


def test_process_alive_tells_live_zombie_gone_and_reused_pids_apart() -> None:
    from torchjob.engines.local.state import process_alive, start_time

    me = os.getpid()
    assert abs(start_time(me) - psutil.Process(me).create_time()) < 0.05
    assert process_alive(me, start_time(me)) and process_alive(me, None)
    assert not process_alive(me, start_time(me) - 3600)  # same pid, another process: reused
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    assert wait_until(lambda: psutil.Process(child.pid).status() == psutil.STATUS_ZOMBIE, 10)
    assert not process_alive(child.pid, None)  # exited, not yet reaped
    child.wait()
    assert not process_alive(child.pid, None)


# The forked watchdog is the one of a supervisor without threads: these run in a new interpreter,
# since this one may hold threads of earlier tests (its jobs would share one watchdog instead).
WATCHDOG_TOLD_DONE = """\
import os, subprocess
from torchjob.engines.local.watchdog import Watchdog

sleeper = subprocess.Popen(["sleep", "30"], start_new_session=True)
try:
    dog = Watchdog("unit-done")
    assert dog._pipe is not None  # forked
    dog.watch(sleeper.pid)
    dog.close()  # "done", then reaped: no zombie is left
    try:
        os.waitpid(dog.pid, os.WNOHANG)
        raise SystemExit("the watchdog was not reaped")
    except ChildProcessError:
        pass
    assert sleeper.poll() is None  # a supervisor that cleaned up itself keeps control
finally:
    sleeper.kill()
    sleeper.wait()
"""

WATCHDOG_SUPERVISOR_VANISHES = """\
import signal, subprocess
from torchjob.engines.local.watchdog import Watchdog

sleeper = subprocess.Popen(["sleep", "30"], start_new_session=True)
try:
    dog = Watchdog("unit-vanish")
    dog.watch(sleeper.pid)
    assert dog._pipe is not None  # forked
    dog._pipe.close()  # what the kernel does when the supervisor is killed: end-of-file
    dog._pipe = None
    assert sleeper.wait(timeout=10) == -signal.SIGTERM
    dog.reap()
finally:
    if sleeper.poll() is None:
        sleeper.kill()
        sleeper.wait()
"""


@pytest.mark.parametrize(
    "script", [WATCHDOG_TOLD_DONE, WATCHDOG_SUPERVISOR_VANISHES], ids=["done", "vanishes"]
)
def test_a_forked_watchdog_leaves_a_finished_job_alone_and_stops_one_whose_supervisor_vanished(
    script: str,
) -> None:
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_threaded_supervisors_jobs_share_one_watchdog_that_stops_only_the_unfinished_ones() -> None:
    """A supervisor with threads (an SDK caller) keeps one watchdog for all its jobs: a job told
    done is left alone when the process dies, one still running is stopped."""
    from torchjob.engines.local import watchdog

    done_job = subprocess.Popen(["sleep", "30"], start_new_session=True)
    running = subprocess.Popen(["sleep", "30"], start_new_session=True)
    stop = threading.Event()
    other = threading.Thread(target=stop.wait, args=(30,))  # the caller's own thread: no fork
    other.start()
    try:
        first, second = watchdog.Watchdog("unit-shared-a"), watchdog.Watchdog("unit-shared-b")
        assert first.pid == second.pid and first._shared is not None  # one process for both
        first.watch(done_job.pid)
        second.watch(running.pid)
        first.close()  # "done unit-shared-a": the shared watchdog goes on
        assert watchdog.Watchdog("unit-shared-c").pid == first.pid
        shared = watchdog._SHARED[0]
        assert shared.proc.stdin is not None
        shared.proc.stdin.close()  # what the kernel does when the supervisor is killed
        assert running.wait(timeout=10) == -signal.SIGTERM
        assert shared.proc.wait(timeout=10) == 0
        assert done_job.poll() is None  # its supervisor had cleaned up itself
    finally:
        stop.set()
        other.join()
        watchdog._SHARED.clear()
        for proc in (done_job, running):
            if proc.poll() is None:
                proc.kill()
                proc.wait()


@pytest.mark.parametrize(
    ("command", "replaced"),
    [("python", True), ("python3", True), ("python3.11", True), ("python\n", False), ("python3.", False)],
)
def test_only_a_whole_python_command_name_becomes_this_interpreter(command: str, replaced: bool) -> None:
    job = make_job("py", [task("main", [container("app", [command, "x.py"])])])
    plan = expand(job, LocalAddressing(job)).pods[0]
    ctx = PodSetup(
        plan=plan, address="127.0.0.1", uid="u", configmaps={}, configmap_dir=Path("/c"), pod_dir=Path("/p")
    )
    resolved = resolve_container(ctx, plan.manifest["spec"]["containers"][0], init=False)
    assert (resolved.argv[0] == sys.executable) is replaced
    assert resolved.argv[1:] == ["x.py"]


@pytest.mark.parametrize(
    ("failures", "delay"), [(0, 0.1), (1, 0.1), (2, 0.2), (10, 51.2), (1024, 300.0), (10**6, 300.0)]
)
def test_the_restart_back_off_doubles_up_to_five_minutes_and_never_overflows(
    failures: int, delay: float
) -> None:
    from torchjob.controller.driver import backoff

    assert backoff(failures) == pytest.approx(delay)


def _finished_job(root: Path, name: str, expires: float | None = None) -> Path:
    """A local job directory as a supervisor (this process) leaves it once its job completed."""
    from torchjob.engine_api.base import JobReport
    from torchjob.engines.local.roots import new_job_dir

    made = new_job_dir(root, name)
    os.close(made.write_pid())
    made.write_status(JobReport(engine="local", id=made.id, name=name, phase="Completed"))
    if expires is not None:
        made.write_expiry(expires)
    return made.path


def test_delete_and_a_ttl_name_what_they_could_not_remove(
    tmp_path: Path, run_main: Callable[..., Ran]
) -> None:
    """The local engine's removals are the shared checked one (engine_api/jobdirs.py): delete
    names what stays of a job (exit 2); a TTL's collection renames it aside, so that no half-removed
    job is listed, and -v says where it is."""
    from torchjob.engine_api.jobdirs import ROOT_MARKER
    from torchjob.engines.local.state import JobDir

    root = tmp_path / "jobs"
    stuck, other = _finished_job(root, "stuck"), _finished_job(root, "other")
    expired = _finished_job(root, "expired", expires=1.0)
    with unremovable(stuck), unremovable(expired):
        listed = run_main("-v", "status", "--state-dir", str(root))
        assert listed.returncode == 0 and "expired" not in listed.stdout, listed
        (aside,) = root.glob(f".{expired.name}.removed-*")
        assert f"{expired.name}: {aside} could not be removed" in listed.stderr, listed.stderr
        deleted = run_main("delete", stuck.name, other.name, "--state-dir", str(root))
        (left,) = root.glob(f".{stuck.name}.removed-*")
        assert deleted == (2, "", f"torchjob: {stuck.name}: {left} could not be removed\n")
        assert not stuck.exists() and not other.exists()
    assert JobDir(left).remove() is None and JobDir(aside).remove() is None
    assert [p.name for p in root.iterdir()] == [ROOT_MARKER]


def test_a_job_directory_is_removed_while_a_process_still_writes_into_it(tmp_path: Path) -> None:
    """A job directory whose status could not be kept is removed, also while a straggler writes
    new files into it by its path, and checked gone. (A single ``rmtree(ignore_errors=True)``
    stops at "Directory not empty" when a file comes between its listing and its last rmdir, and
    leaves a directory no command can see or delete: here about one time in five, so that it
    fails nine runs in ten without the rename and the checked retries.)"""
    from torchjob.engines.local.state import JobDir

    root = tmp_path / "jobs"
    for attempt in range(10):  # each removal races the writer anew
        where = JobDir(root / f"busy-abc12{attempt}")
        where.path.mkdir(parents=True)
        started = tmp_path / f"started-{attempt}"
        script = f': > {started}; i=0; while :; do i=$((i+1)); true > "$1/f$i" 2>/dev/null; done'
        writer = subprocess.Popen(["sh", "-c", script, "sh", str(where.path)])
        try:
            assert wait_until(lambda: started.exists() and any(where.path.iterdir()), 10)  # noqa: B023
            assert where.remove() is None
            assert writer.poll() is None  # it wrote on all along; its files went nowhere
        finally:
            writer.kill()
            writer.wait(timeout=5)
        assert list(root.iterdir()) == []  # gone, nothing kept aside either
