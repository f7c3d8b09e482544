"""Following a cluster job through what a server, a proxy or a user may do (issue 33, item 8 and 5).

The real CLI and client over real HTTP against the fake API server, its controllers simulated
(tests/controllers/): a watch that stalls while the job runs to its end, a log stream resumed on a
server that ignores ``timestamps=true``, a watch event cut short by a proxy, Ctrl-C while a create
is under way, and ``logs`` of a log without a newline.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("kubernetes")

from controllers import ControlPlane
from controllers.cluster import for_target
from controllers.kubelet import Kubelet
from kubeapi import FakeKubeAPI
from test_kubernetes_controllers import job_file, run

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def quick_watches(monkeypatch: pytest.MonkeyPatch) -> None:
    """Watches the server ends after 1 s, a stall noticed 1 s later, back-off from 50 ms."""
    from torchjob.engines.kubernetes import watch

    monkeypatch.setattr(watch, "WATCH_SECONDS", 1)
    monkeypatch.setattr(watch, "STALL_SLACK", 1.0)
    monkeypatch.setattr(watch, "BACKOFF_FIRST", 0.05)
    monkeypatch.setattr(watch, "BACKOFF_MAX", 0.2)


class GatedKubelet(Kubelet):
    """A kubelet that starts no pod before ``gate`` is set."""

    def __init__(self, api: FakeKubeAPI, gate: threading.Event, **kwargs: Any) -> None:
        super().__init__(api, **kwargs)
        self.gate = gate

    def reconcile(self) -> None:
        if self.gate.is_set():
            super().reconcile()


class HeldExitKubelet(Kubelet):
    """A kubelet whose pods named in ``held`` do not exit before ``release`` is set."""

    def __init__(self, api: FakeKubeAPI, held: set[str], release: threading.Event, **kwargs: Any) -> None:
        super().__init__(api, **kwargs)
        self.held, self.release = held, release

    def _exit(self, pod: dict[str, Any]) -> None:
        if pod["metadata"]["name"] in self.held and not self.release.is_set():
            return  # asked again a period later
        super()._exit(pod)


def test_a_job_that_ended_during_a_stalled_watch_still_prints_its_logs(
    api: FakeKubeAPI, kubeconfig: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], quick_watches: None
) -> None:
    """The watches stall once the job's pods were listed, not yet started: the job runs and
    completes unseen. After the stall the job's list (one object, quick) says it ended before
    the pods' list (slower) says how its pods did; every line the pods wrote is printed."""
    api.stall_watches = True
    gate = threading.Event()

    def after_the_first_list() -> None:
        deadline = time.monotonic() + 20
        while not [q for m, p, q in api.requests if p.endswith("/pods") and not {"watch", "limit"} & set(q)]:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        api.list_lag["pods"] = 1.0
        gate.set()

    threading.Thread(target=after_the_first_list, daemon=True).start()
    with ControlPlane(api, *for_target(api, "volcano"), GatedKubelet(api, gate, seconds=0.3, lines=6)):
        code = run(kubeconfig, job_file(tmp_path), "volcano")
    out, err = capsys.readouterr()
    assert code == 0, err
    for pod in ("demo-master-0", "demo-worker-0", "demo-worker-1"):
        for k in range(1, 6):
            assert f"{pod} attempt 0: training {k}" in out, out
        assert f"{pod} attempt 0: exit 0" in out


def test_a_log_stream_resumed_where_timestamps_are_ignored_prints_each_line_once(
    api: FakeKubeAPI, kubeconfig: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], quick_watches: None
) -> None:
    """A server that ignores timestamps=true (and sinceTime): after the stream is cut, the log is
    read again from its start; the lines already printed are not printed again, none is lost."""
    api.log_timestamps = False
    lines = [f"step {i}" for i in range(40)]
    written = threading.Event()  # the container exits only then, however slow the writing

    def write() -> None:
        deadline = time.monotonic() + 20
        while api.get("v1", "Pod", "demo-worker-0") is None or not api.logs.get(("demo-worker-0", "worker")):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        for i, line in enumerate(lines):
            api.log("demo-worker-0", "worker", line)
            if i == 15:
                time.sleep(0.3)
                api.break_for("drop", seconds=0.5)  # open streams cut, requests dropped
            time.sleep(0.03)
        written.set()

    code, out, err = _run_writing(api, kubeconfig, tmp_path, capsys, write, written)
    assert code == 0, err
    printed = [line.split(" | ", 1)[1] for line in out.splitlines() if line.startswith("worker-0 r1 | step ")]
    assert printed == lines, out


def _run_writing(
    api: FakeKubeAPI,
    kubeconfig: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    write: Callable[[], None],
    release: threading.Event,
) -> tuple[int, str, str]:
    """The demo job run on volcano while ``write`` writes demo-worker-0's log in a thread; that
    container ends only once ``release`` is set. The exit code, stdout and stderr."""
    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    kubelet = HeldExitKubelet(api, {"demo-worker-0"}, release, seconds=0.3)
    with ControlPlane(api, *for_target(api, "volcano"), kubelet):
        code = run(kubeconfig, job_file(tmp_path), "volcano")
    writer.join(timeout=10)
    out, err = capsys.readouterr()
    return code, out, err


def _log_followed(api: FakeKubeAPI, pod: str, timeout: float = 60.0, times: int = 1) -> None:
    """Wait until the command has asked to follow ``pod``'s log (its stream is open), ``times``
    times in all (a stream ended, then opened again)."""
    deadline = time.monotonic() + timeout
    while len([q for m, p, q in api.requests if p.endswith(f"/{pod}/log") and q.get("follow")]) < times:
        assert time.monotonic() < deadline, f"no one follows the log of {pod} ({times} times)"
        time.sleep(0.02)


@pytest.mark.parametrize("stamped", [True, False], ids=["timestamps", "no-timestamps"])
def test_a_log_stream_ended_cleanly_mid_line_prints_that_line_once_whole_and_follows_on(
    api: FakeKubeAPI,
    kubeconfig: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    quick_watches: None,
    stamped: bool,
) -> None:
    """The server ends a running container's log stream cleanly after the first half of a line
    (its last chunk sent: an API server whose connection to the kubelet ended). That half is not
    printed: the container still running, its log is followed on, and the line is printed once,
    whole; nothing written after the cut is lost."""
    api.log_timestamps = stamped
    release = threading.Event()

    def write() -> None:
        _log_followed(api, "demo-worker-0")
        api.log("demo-worker-0", "worker", "step 1")
        api.cut_log("demo-worker-0", "worker", partial="step 2 hal")
        _log_followed(api, "demo-worker-0", times=2)  # the container ends only after that
        api.log("demo-worker-0", "worker", "step 2 half", "step 3")
        release.set()

    code, out, err = _run_writing(api, kubeconfig, tmp_path, capsys, write, release)
    assert code == 0, err
    printed = [line.split(" | ", 1)[1] for line in out.splitlines() if line.startswith("worker-0 r1 | step ")]
    assert printed == ["step 1", "step 2 half", "step 3"], out  # whole, once, and followed on


@pytest.mark.parametrize("stamped", [True, False], ids=["timestamps", "no-timestamps"])
def test_a_line_over_64_kib_cut_in_its_middle_is_printed_once_and_whole(
    api: FakeKubeAPI,
    kubeconfig: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    quick_watches: None,
    stamped: bool,
) -> None:
    """A line of some 260 KiB, three-byte characters where 64 KiB pieces end, and the stream
    ended cleanly after its first 100,000 characters. Opened again, the log is read from its
    start (or from that line's second): the line is passed on in pieces of at most 64 KiB,
    each once, which together are the line (no character broken in two), and the log goes on."""
    from torchjob.engines.kubernetes.client import MAX_LINE

    api.log_timestamps = stamped
    long = "a" * 65_501 + "\u20ac" * 100 + "b" * 100_000 + "\u20ac" * 30_000 + "c" * 10_000
    release = threading.Event()

    def write() -> None:
        _log_followed(api, "demo-worker-0")
        api.log("demo-worker-0", "worker", "step 1")
        api.cut_log("demo-worker-0", "worker", partial=long[:100_000])
        _log_followed(api, "demo-worker-0", times=2)  # the container ends only after that
        api.log("demo-worker-0", "worker", long, "step 3")
        release.set()

    code, out, err = _run_writing(api, kubeconfig, tmp_path, capsys, write, release)
    assert code == 0, err
    printed = [line.split(" | ", 1)[1] for line in out.splitlines() if line.startswith("worker-0 r1 | ")]
    assert "step 1" in printed and "step 3" in printed, out[-2000:]
    pieces = printed[printed.index("step 1") + 1 : printed.index("step 3")]
    assert all(len(piece.encode()) <= MAX_LINE for piece in pieces), [len(p) for p in pieces]
    assert "".join(pieces) == long, [(len(p), p[:5], p[-5:]) for p in pieces]


def test_a_malformed_watch_event_does_not_end_following(
    api: FakeKubeAPI, kubeconfig: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], quick_watches: None
) -> None:
    """One event a proxy cut short: the watch lists again (which shows what the event would
    have), and the job is followed to its end."""

    def garble() -> None:
        deadline = time.monotonic() + 20
        while not any(p["status"].get("phase") == "Running" for p in api.objects_of("v1", "Pod")):
            assert time.monotonic() < deadline
            time.sleep(0.02)
        api.garble_events = 1

    threading.Thread(target=garble, daemon=True).start()
    with ControlPlane(api, *for_target(api, "volcano"), Kubelet(api, seconds=1.0)):
        code = run(kubeconfig, job_file(tmp_path), "volcano")
    _, err = capsys.readouterr()
    assert api.garble_events == 0  # it was sent
    assert code == 0, err
    assert err.splitlines()[-1].startswith("torchjob: job demo Completed")


def test_a_job_is_followed_to_its_end_when_every_watch_event_is_malformed(
    api: FakeKubeAPI, kubeconfig: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], quick_watches: None
) -> None:
    """A proxy that mangles every watch event: the lists still answer, and show the job as it
    goes, to its end."""
    api.garble_events = 10**9
    with ControlPlane(api, *for_target(api, "volcano"), Kubelet(api, seconds=1.0)):
        code = run(kubeconfig, job_file(tmp_path), "volcano")
    _, err = capsys.readouterr()
    assert code == 0, err
    assert err.splitlines()[-1].startswith("torchjob: job demo Completed")


def test_ctrl_c_while_a_create_is_under_way_leaves_nothing_and_says_so(
    api: FakeKubeAPI, kubeconfig: str, tmp_path: Path
) -> None:
    """The pods target creates a ConfigMap, a Service, ... : Ctrl-C comes while the server has
    received the Service but not yet made it. What that request makes is deleted too, and the
    message says what is left: nothing."""
    api.create_lag = 1.5
    argv = [sys.executable, "-m", "torchjob", "run", job_file(tmp_path), "--engine", "kubernetes"]
    argv += ["--kubeconfig", kubeconfig, "--target", "pods"]
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while api.count("POST", "/services") == 0:  # the ConfigMap made, the Service asked for
            assert time.monotonic() < deadline and process.poll() is None
            time.sleep(0.02)
        time.sleep(0.3)
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 130, err
    assert "Traceback" not in err
    time.sleep(api.create_lag)  # anything still under way on the server has landed by now
    left = [f"{o['kind']} {o['metadata']['name']}" for o in api.objects.values()]
    assert left == [], (left, err)
    assert "those already created were deleted" in err, err


def test_logs_of_a_log_without_a_newline_stay_in_bounded_memory(api: FakeKubeAPI, kubeconfig: str) -> None:
    """`torchjob logs JOB` (no -f) of a container that writes without a newline: it is printed in
    pieces as it is read, and the command's memory stays bounded however much it reads."""
    from kube_fixtures import make_pod, running

    top = api.put(
        {
            "apiVersion": "batch.volcano.sh/v1alpha1",
            "kind": "Job",
            "metadata": {"name": "demo", "labels": {"torchjob.io/job-name": "demo"}},
            "spec": {"tasks": []},
            "status": {"state": {"phase": "Running"}},
        }
    )
    api.put(running(make_pod("demo", "master", 0, owner=top, rank=0)))
    api.endless_log("demo-master-0", "master", b"x" * 4096)
    argv = [
        sys.executable,
        "-m",
        "torchjob",
        "logs",
        "demo",
        "--engine",
        "kubernetes",
        "--kubeconfig",
        kubeconfig,
    ]
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        peak = 0
        deadline = time.monotonic() + 60
        while api.log_bytes_sent < 400 * 1024 * 1024:  # 400 MiB read by the command
            assert process.poll() is None, process.stderr.read() if process.stderr else ""
            assert time.monotonic() < deadline, f"only {api.log_bytes_sent >> 20} MiB read in 60 s"
            peak = max(peak, _resident_kib(process.pid))
            time.sleep(0.1)
    finally:
        process.kill()
        process.wait()
    assert peak < 150 * 1024, f"logs held {peak >> 10} MiB after reading 400 MiB"


def _resident_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0
