"""The local queue under faults (issue 33, items 4 and 6; issue 34, item 7): a lock held by a stopped
process, a damaged or vanished state file, a full filesystem, two names of one GPU, absurd GPU
counts, and the capacity every command sees alike.

Bookkeeping never ends a job: a waiting job waits and says why, a running one runs on.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from queue_support import gpu_job, intervals, release, status, submit, wait_all
from support import cli, container, make_job, task, wait_until
from torchjob.engines.local.admission import Ticket, locked_state, parse_capacity, plan_for
from torchjob.engines.local.admission import store as state_store
from torchjob.engines.local.state import start_time
from torchjob.errors import SpecError
from torchjob.spec.model import Job

pytestmark = pytest.mark.timeout(120)

HOLD = """
import fcntl, os, signal, sys
fd = os.open(sys.argv[1], os.O_RDWR)
fcntl.flock(fd, fcntl.LOCK_EX)
print("locked", flush=True)
os.kill(os.getpid(), signal.SIGSTOP)  # as Ctrl-Z stops a torchjob in the middle of a look
"""


def gpu_demand(name: str, gpus: int) -> Job:
    """A job of one pod asking ``gpus`` GPUs, for tickets taken in this process."""
    limits = {"resources": {"limits": {"nvidia.com/gpu": gpus}}}
    return make_job(name, [task("main", [container("main", ["true"], **limits)])])


def ticket(name: str, gpus: int) -> Ticket:
    plan = plan_for(gpu_demand(name, gpus))
    assert plan is not None
    return Ticket(plan, name, name)


def supervisor_logs(tmp_path: Path) -> str:
    return "".join(p.read_text() for p in (tmp_path / "home" / "jobs").glob("*/supervisor.log"))


# ------------------------------------------------------------------ the lock


def test_a_stopped_process_holding_the_queues_lock_stops_no_job(queue_env: Path) -> None:
    tmp_path = queue_env
    first = submit(tmp_path, gpu_job(tmp_path, "first", gpus=2, gate=True))
    assert status(tmp_path, first)["phase"] == "Running"
    lock = tmp_path / "runtime" / "admission.lock"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(lock)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "locked\n"
        taken = time.monotonic()
        second = submit(tmp_path, gpu_job(tmp_path, "second", sleep=0))  # queued, though the lock is held
        assert time.monotonic() - taken < 8
        held = f"is held by pid {holder.pid} ({sys.executable} -c"
        assert wait_until(lambda: held in status(tmp_path, second)["reason"], 20), status(tmp_path, second)
        assert "stopped (resume it with fg" in status(tmp_path, second)["reason"]
        listing = cli(tmp_path, "queue")
        assert listing.returncode == 0, listing.stderr
        assert held in listing.stdout and "shown as last written" in listing.stdout, listing.stdout
        assert first in listing.stdout  # (the second has not been able to register yet)
        time.sleep(max(0.0, taken + 12 - time.monotonic()))  # beyond the 10 s a look once waited
        assert status(tmp_path, first)["phase"] == "Running"
        assert status(tmp_path, second)["phase"] == "Pending"
        events = " ".join(e["message"] for e in status(tmp_path, first)["events"])
        assert f"the local queue's state cannot be used: the queue's lock ({lock}) {held}" in events, events
    finally:
        holder.kill()
        holder.wait(timeout=10)
    release(tmp_path)
    wait_all(tmp_path, [first, second])
    spans = intervals(tmp_path)
    assert spans["second-main-0"][0] >= spans["first-main-0"][1]
    assert "Traceback" not in supervisor_logs(tmp_path)


# ------------------------------------------------------------------ a damaged state


def test_a_damaged_or_vanished_state_is_never_read_as_empty(
    queue_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(state_store, "REBUILD", 0.5)
    state = queue_env / "runtime" / "admission.json"
    holder = ticket("holder", 2)  # the machine's 2 GPUs
    assert holder.poll()
    pid = os.getpid()
    bad_entry = {"pid": pid, "created": start_time(pid), "seq": 9, "priority": 0, "queue": "default"}
    damages = [
        (b'{"jobs": {"holder": {', "not valid JSON"),
        (b"[1, 2]", "not a JSON object"),
        (json.dumps({"jobs": {"x": {**bad_entry, "pods": "2 GPUs", "gang": []}}}).encode(), "pods is not"),
        (b"", "removed or emptied"),
    ]
    for n, (damage, why) in enumerate(damages):
        if damage:
            state.write_bytes(damage)
        else:
            state.unlink()
        if n:  # as another process sees it, which never read the last good state: only the running
            monkeypatch.setattr(state_store, "_last_good", b"")  # job's registering again protects it
        late = ticket(f"late{n}", 1)
        assert not late.poll()
        assert why in late.reason and "no job is admitted" in late.reason, late.reason
        if damage:
            assert (state.parent / "admission.json.damaged").read_bytes() == damage
        if n:
            holder.next_check = 0.0
            assert holder.grow() == {}  # registers again; it never raises, never stops the job
        time.sleep(0.6)
        assert not late.poll()
        assert late.reason.startswith("waiting for 1 nvidia.com/gpu, 0 free"), late.reason
        late.release()
    holder.release()
    assert ticket("last", 2).poll()


# ------------------------------------------------------------------ a full filesystem


@pytest.fixture
def tiny_fs(tmp_path: Path) -> Iterator[Path]:
    """A 64 KiB tmpfs of this test's own."""
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a small tmpfs")
    mount = tmp_path / "fs"
    mount.mkdir()
    made = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k,mode=0700", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
    )
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(path: Path) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError:
        pass
    finally:
        os.close(fd)


def test_a_full_filesystem_keeps_the_last_good_state_and_stops_no_job(
    queue_env: Path, tiny_fs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tmp_path = queue_env
    queue = tiny_fs / "queue"
    monkeypatch.setenv("TORCHJOB_QUEUE_DIR", str(queue))
    first = submit(tmp_path, gpu_job(tmp_path, "first", gpus=2, gate=True))
    assert status(tmp_path, first)["phase"] == "Running"
    with locked_state() as data:  # the state fills its page to the last 8 bytes: any job more needs a new one
        data["pad"] = ""
        data["pad"] = "x" * (4096 - 8 - len(json.dumps(data, separators=(",", ":"))))
    assert (queue / "admission.json").stat().st_size == 4088
    fill(tiny_fs / "filler")
    second = submit(tmp_path, gpu_job(tmp_path, "second", sleep=0))
    reason = status(tmp_path, second)["reason"]
    assert "cannot write the queue's state: No space left on device" in reason, reason
    assert str(queue / "admission.json") in reason and str(tmp_path / "home") not in reason
    time.sleep(state_store.CHECK_EVERY + 1)  # the running job's looks meanwhile
    assert status(tmp_path, first)["phase"] == "Running"
    assert status(tmp_path, second)["phase"] == "Pending"
    assert json.loads((queue / "admission.json").read_text())["pad"]  # the last good state, whole
    (tiny_fs / "filler").unlink()
    assert wait_until(
        lambda: "waiting for 1 nvidia.com/gpu, 0 free" in status(tmp_path, second)["reason"], 20
    )
    release(tmp_path)
    wait_all(tmp_path, [first, second])
    spans = intervals(tmp_path)
    assert spans["second-main-0"][0] >= spans["first-main-0"][1]
    assert "Traceback" not in supervisor_logs(tmp_path)


def test_a_running_job_whose_grant_cannot_be_written_runs_on(
    queue_env: Path, tiny_fs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TORCHJOB_QUEUE_DIR", str(tiny_fs / "queue"))
    holder = ticket("holder", 1)
    assert holder.poll()
    limits = {"resources": {"limits": {"nvidia.com/gpu": 1}}}
    elastic = make_job(
        "elastic", [task("main", [container("main", ["true"], **limits)], replicas=2, minAvailable=1)]
    )
    plan = plan_for(elastic)
    assert plan is not None
    running = Ticket(plan, "elastic", "elastic")
    assert running.poll() and list(running.granted) == ["main/0"]  # its gang; main/1 waits for a GPU
    with locked_state() as data:  # the state fills its page exactly
        data["pad"] = ""
        data["pad"] = "x" * (4096 - len(json.dumps(data, separators=(",", ":"))))
    fill(tiny_fs / "filler")
    assert holder.grow(finished={"main/0"}) == {}  # its pod ended: the state shrinks, in place
    assert running.grow() == {}  # main/1's grant would need a new page: nothing is written, no raise
    assert "cannot write the queue's state: No space left on device" in running.trouble
    running.trouble_since -= 60
    said = running.notice()
    assert said.startswith("the local queue's state cannot be used: ") and said.endswith(
        "the job runs on with what it holds, its other pods wait"
    ), said
    (tiny_fs / "filler").unlink()
    assert running.grow() == {"main/1": ["0"]}
    assert running.notice() == "the local queue's state can be used again"
    running.release()
    holder.release()


# ------------------------------------------------------------------ GPUs


def test_one_gpu_under_two_names_goes_to_one_job(queue_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from torchjob.engines.local import gpus

    bin_dir = queue_env / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    lines = "".join(f"GPU {i}: NVIDIA A100 (UUID: GPU-{c * 4})\\n" for i, c in enumerate("abcd"))
    smi.write_text(f'#!/bin/sh\n[ "$1" = -L ] || exit 9\nprintf "{lines}"\n')
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(gpus, "PROC_GPUS", queue_env / "no-driver")
    monkeypatch.delenv("TORCHJOB_CAPACITY")
    assert gpus.identities(("1", "GPU-cc", "GPU-zz", "7")) == ("GPU-bbbb", "GPU-cccc", "GPU-zz", "7")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")  # one shell: GPUs by index
    by_index = ticket("by-index", 1)
    assert by_index.poll()
    spec = {"containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": 1}}}]}
    assert by_index.gpu_env({("main", 0): spec})[("main", 0)]["main"]["CUDA_VISIBLE_DEVICES"] == "0"
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")  # another: the machine's GPUs, by UUID
    whole = ticket("whole", 4)
    assert not whole.poll() and whole.reason.startswith("waiting for 4 nvidia.com/gpu, 3 free"), whole.reason
    whole.release()
    by_uuid = ticket("by-uuid", 1)
    assert by_uuid.poll()
    assert by_uuid.gpu_env({("main", 0): spec})[("main", 0)]["main"]["CUDA_VISIBLE_DEVICES"] == "GPU-bbbb"
    by_uuid.release()
    by_index.release()


def test_a_gpu_count_with_a_memory_unit_is_refused_in_one_line(queue_env: Path) -> None:
    tmp_path = queue_env
    for bad in ("nvidia.com/gpu=80Gi", "nvidia.com/gpu=100000", "nvidia.com/gpu=1e12"):
        with pytest.raises(ValueError, match="whole number of GPUs"):
            parse_capacity(bad)

    def small_memory() -> None:  # what 85 billion GPU names would take is far beyond it
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))

    env = {**os.environ, "TORCHJOB_HOME": str(tmp_path / "home"), "TORCHJOB_CAPACITY": "nvidia.com/gpu=80Gi"}
    for args in (["queue"], ["run", gpu_job(tmp_path, "big")]):
        result = subprocess.run(
            [sys.executable, "-m", "torchjob", *args],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
            preexec_fn=small_memory,
        )
        assert result.returncode == 2, result.stderr
        assert result.stderr.splitlines() == [
            "<environment>: TORCHJOB_CAPACITY: nvidia.com/gpu: expected a whole number of GPUs "
            "(at most 1024), got '80Gi': a GPU is counted as a device, not by its memory"
        ]
    assert not (tmp_path / "trace").exists()
    (tmp_path / "queues.yaml").write_text(
        "capacity: {nvidia.com/gpu: 80Gi}\nreserve: {nvidia.com/gpu: 2.5}\n"
    )
    from torchjob.engines.local.admission import load_settings

    with pytest.raises(SpecError) as err:
        load_settings()
    assert [p.path for p in err.value.problems] == ["reserve.nvidia.com/gpu", "capacity.nvidia.com/gpu"]


# ------------------------------------------------------------------ the capacity every command sees


def test_torchjob_queue_shows_the_capacity_the_jobs_were_given(
    queue_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tmp_path = queue_env
    monkeypatch.setenv("TORCHJOB_CAPACITY", "cpu=64,memory=8Gi,nvidia.com/gpu=2")
    held = submit(tmp_path, gpu_job(tmp_path, "held", gpus=0, cpu=3, gate=True))
    other_shell = {k: v for k, v in os.environ.items() if k != "TORCHJOB_CAPACITY"}
    other_shell["TORCHJOB_HOME"] = str(tmp_path / "home")
    listing = subprocess.run(
        [sys.executable, "-m", "torchjob", "queue", "-o", "json"],
        capture_output=True,
        text=True,
        timeout=60,
        env=other_shell,
    )
    assert listing.returncode == 0, listing.stderr
    data = json.loads(listing.stdout)
    assert (data["capacity"]["cpu"], data["free"]["cpu"]) == ("64", "61"), data
    assert data["source"].startswith("as the jobs were given: TORCHJOB_CAPACITY"), data["source"]
    release(tmp_path)
    wait_all(tmp_path, [held])


def test_a_capacity_declared_in_the_settings_file_is_seen_by_every_command(
    queue_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tmp_path = queue_env
    monkeypatch.delenv("TORCHJOB_CAPACITY")
    settings = tmp_path / "queues.yaml"
    settings.write_text("capacity: {cpu: 64, memory: 8Gi, nvidia.com/gpu: 2}\n")
    first = submit(tmp_path, gpu_job(tmp_path, "first", gate=True))
    listing = cli(tmp_path, "queue", "-o", "json")
    data = json.loads(listing.stdout)
    assert (data["capacity"]["nvidia.com/gpu"], data["free"]["nvidia.com/gpu"]) == ("2", "1"), data
    assert (data["capacity"]["cpu"], data["free"]["cpu"]) == ("64", "64"), data
    assert f"capacity in {settings}" in data["source"]
    third = submit(tmp_path, gpu_job(tmp_path, "third", gpus=2, sleep=0))
    assert status(tmp_path, third)["reason"].startswith("waiting for 2 nvidia.com/gpu, 1 free")
    eager = cli(tmp_path, "run", "--no-queue", gpu_job(tmp_path, "eager", gpus=2, sleep=0))
    assert eager.returncode == 0, eager.stdout + eager.stderr
    big = cli(tmp_path, "run", gpu_job(tmp_path, "big", gpus=3))
    assert big.returncode == 2 and f"this machine has 2 (capacity in {settings})" in big.stderr, big.stderr
    release(tmp_path)
    wait_all(tmp_path, [first, third])
    spans = intervals(tmp_path)
    assert spans["eager-main-0"][2] == "0,1"  # the declared GPUs, for a job outside the queue too
    assert spans["first-main-0"][2] == "0" and spans["third-main-0"][0] >= spans["first-main-0"][1]
