"""The local queue (engines/local/admission/): jobs wait for CPUs, memory and GPUs, start as a
gang, in priority then submission order, across processes and without a daemon.

No GPU exists where these tests run: ``TORCHJOB_CAPACITY`` gives the machine fake GPUs named 0, 1,
... Every test has a queue of its own (a private ``TORCHJOB_RUNTIME_DIR``) and real detached jobs
whose pods write when they start and end, with the GPUs they were given, to one trace file.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from queue_support import (
    check_no_gpu_shared,
    gpu_job,
    intervals,
    release,
    status,
    submit,
    trace,
    wait_all,
)
from support import cli, container, make_job, read_until, task, wait_until
from torchjob.engines.local.admission import (
    Capacity,
    Settings,
    decide,
    demand_of,
    load_settings,
    parse_capacity,
    pod_requests,
)
from torchjob.errors import SpecError

pytestmark = pytest.mark.timeout(120)

# ------------------------------------------------------------------ whole jobs


def test_a_sweep_of_six_one_gpu_jobs_runs_two_at_a_time_in_priority_then_submission_order(
    queue_env: Path,
) -> None:
    """Each job holds its GPU until the test lets it end, one at a time: every freed GPU admits
    exactly one job, and which one shows in the trace, however late a loaded machine starts it
    (start times alone would need an allowance for pods admitted together but started apart)."""
    tmp_path = queue_env
    (tmp_path / "queues.yaml").write_text("priorityClasses: {high: 100, low: -5}\n")
    blocker = submit(tmp_path, gpu_job(tmp_path, "blocker", gpus=2, gate=True))
    assert status(tmp_path, blocker)["phase"] == "Running"
    classes = ["", "high", "low", "", "high", ""]  # submitted in this order, all while the GPUs are taken
    ids = []
    for i, name in enumerate(classes):
        extra = {"priorityClassName": name} if name else {}
        ids.append(submit(tmp_path, gpu_job(tmp_path, f"sweep-{i}", gate=f"end-{i}", **extra)))
    waiting = status(tmp_path, ids[-1])
    assert waiting["phase"] == "Pending" and waiting["pods"] == []
    # sweep-2 (low) is behind it
    assert "waiting for 1 nvidia.com/gpu, 0 free; 4 jobs ahead in queue default" in waiting["reason"]
    listing = cli(tmp_path, "queue")
    assert listing.returncode == 0, listing.stderr
    assert "default  1       -           1        6" in listing.stdout, listing.stdout

    def started() -> list[int]:
        rows = trace(tmp_path) if (tmp_path / "trace").exists() else []
        return [
            int(pod.split("-")[1]) for what, _, pod, _ in rows if what == "start" and pod.startswith("sweep-")
        ]

    # Higher priority first, then submission order: 1 and 4 (high), then 0, 3, 5, then 2 (low).
    release(tmp_path)  # the blocker's two GPUs: two jobs at once, in either order
    assert wait_until(lambda: len(started()) >= 2, timeout=60), started()
    assert sorted(started()) == [1, 4], started()
    for ending, following in ((1, 0), (4, 3), (0, 5)):  # each GPU freed admits one job
        count = len(started()) + 1
        release(tmp_path, f"end-{ending}")
        assert wait_until(lambda count=count: len(started()) >= count, timeout=60), started()
        assert started()[count - 1] == following, started()
    for last in (3, 5, 2):  # sweep-2 (low) is the one left
        release(tmp_path, f"end-{last}")
    wait_all(tmp_path, [blocker, *ids])
    assert started()[2:] == [0, 3, 5, 2], started()
    spans = intervals(tmp_path)
    assert len(spans) == 7
    assert check_no_gpu_shared(tmp_path, limit=2) == 2
    assert all(spans[f"sweep-{i}-main-0"][2] in ("0", "1") for i in range(6))


def test_a_gang_of_three_waits_whole_while_two_gpus_are_free(
    queue_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tmp_path = queue_env
    monkeypatch.setenv("TORCHJOB_CAPACITY", "nvidia.com/gpu=3")
    blocker = submit(tmp_path, gpu_job(tmp_path, "blocker", gate=True))  # holds its GPU until released
    gang = submit(tmp_path, gpu_job(tmp_path, "gang", replicas=3, gate=True))
    report = status(tmp_path, gang)
    assert report["phase"] == "Pending", report
    assert report["reason"].startswith("waiting for 3 nvidia.com/gpu, 2 free"), report["reason"]
    time.sleep(1.0)  # and it stays so: no pod started, none made
    report = status(tmp_path, gang)
    assert (report["phase"], report["pods"]) == ("Pending", [])
    assert "nameResolution" not in report  # not decided before its pods are prepared
    assert not (tmp_path / "home" / "jobs" / gang / "logs").exists()
    release(tmp_path)
    wait_all(tmp_path, [blocker, gang])
    spans = intervals(tmp_path)
    blocker_end = spans["blocker-main-0"][1]
    gang_starts = [spans[f"gang-main-{i}"][0] for i in range(3)]
    assert min(gang_starts) >= blocker_end  # all three, once the third GPU was free
    assert sorted(spans[f"gang-main-{i}"][2] for i in range(3)) == ["0", "1", "2"]
    check_no_gpu_shared(tmp_path, limit=3)


def test_pods_beyond_min_available_start_when_they_fit(
    queue_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tmp_path = queue_env
    monkeypatch.setenv("TORCHJOB_CAPACITY", "nvidia.com/gpu=3")
    # Each holds its GPUs until its own gate opens, so no timing decides which pod ran first.
    blocker = submit(tmp_path, gpu_job(tmp_path, "blocker", gate="blocker-open"))
    elastic = submit(tmp_path, gpu_job(tmp_path, "elastic", replicas=3, gate=True, task_min_available=2))

    def started() -> set[str]:
        if not (tmp_path / "trace").exists():
            return set()
        return {pod for what, _, pod, _ in trace(tmp_path) if what == "start"}

    assert wait_until(lambda: {"elastic-main-0", "elastic-main-1"} <= started(), 30)
    time.sleep(0.5)  # and the third stays out while the blocker holds its GPU
    assert "elastic-main-2" not in started()
    release(tmp_path, "blocker-open")  # the blocker's GPU, and only it, comes free
    assert wait_until(lambda: "elastic-main-2" in started(), 30)
    release(tmp_path)
    wait_all(tmp_path, [blocker, elastic])
    spans = intervals(tmp_path)
    _, blocker_end, _ = spans["blocker-main-0"]
    assert (
        spans["elastic-main-0"][0] < blocker_end and spans["elastic-main-1"][0] < blocker_end
    )  # the gang of 2
    assert spans["elastic-main-2"][0] >= blocker_end  # the third once its GPU was free
    check_no_gpu_shared(tmp_path, limit=3)
    assert status(tmp_path, elastic)["phase"] == "Completed"


def test_a_pod_that_ended_frees_its_share_for_the_pods_beyond_the_gang(queue_env: Path) -> None:
    """4 CPUs; 3 pods of 2 CPUs with minAvailable 2: the third starts once one of the gang ends."""
    tmp_path = queue_env
    job = submit(
        tmp_path, gpu_job(tmp_path, "cpus", gpus=0, cpu=2, replicas=3, sleep=0.5, task_min_available=2)
    )
    wait_all(tmp_path, [job])
    spans = intervals(tmp_path)
    assert spans["cpus-main-2"][0] >= min(spans["cpus-main-0"][1], spans["cpus-main-1"][1])
    assert status(tmp_path, job)["phase"] == "Completed"


def test_a_sigkilled_supervisor_gives_its_gpus_to_the_next_job(queue_env: Path) -> None:
    tmp_path = queue_env
    hog = submit(tmp_path, gpu_job(tmp_path, "hog", gpus=2, sleep=60))
    nxt = submit(tmp_path, gpu_job(tmp_path, "next", sleep=0.2))
    assert status(tmp_path, nxt)["phase"] == "Pending"
    pid = json.loads((tmp_path / "home" / "jobs" / hog / "supervisor.pid").read_text())["pid"]
    os.kill(pid, signal.SIGKILL)
    wait_all(tmp_path, [nxt], timeout=30)
    assert status(tmp_path, hog)["phase"] == "Unknown"
    assert intervals(tmp_path)["next-main-0"][2] in ("0", "1")
    cli(tmp_path, "delete", hog)


def test_ten_concurrent_submissions_never_share_a_gpu(
    queue_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tmp_path = queue_env
    monkeypatch.setenv("TORCHJOB_CAPACITY", "nvidia.com/gpu=3")
    paths = [gpu_job(tmp_path, f"c{i}", sleep=0.3) for i in range(10)]
    env = {**os.environ, "TORCHJOB_HOME": str(tmp_path / "home")}
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "torchjob", "run", "-d", path], stdout=subprocess.PIPE, text=True, env=env
        )
        for path in paths
    ]
    ids = []
    for proc in procs:
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0
        ids.append(out.strip())
    wait_all(tmp_path, ids)
    assert len(intervals(tmp_path)) == 10
    assert check_no_gpu_shared(tmp_path, limit=3) <= 3


def test_jobs_without_requests_and_no_queue_jobs_never_wait(queue_env: Path) -> None:
    tmp_path = queue_env
    hog = submit(tmp_path, gpu_job(tmp_path, "hog", gpus=2, sleep=30))
    plain = cli(tmp_path, "run", gpu_job(tmp_path, "plain", gpus=0, sleep=0))
    assert plain.returncode == 0, plain.stdout + plain.stderr
    eager = cli(tmp_path, "run", "--no-queue", gpu_job(tmp_path, "eager", sleep=0))
    assert eager.returncode == 0, eager.stdout + eager.stderr
    assert "waiting for" not in eager.stdout + eager.stderr
    assert intervals(tmp_path)["eager-main-0"][2] == "0"  # the capacity's GPUs, not reserved
    setting = subprocess.run(
        [sys.executable, "-m", "torchjob", "run", gpu_job(tmp_path, "unqueued", sleep=0)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "TORCHJOB_HOME": str(tmp_path / "home"), "TORCHJOB_QUEUE": "off"},
    )
    assert setting.returncode == 0 and "waiting for" not in setting.stdout + setting.stderr
    cli(tmp_path, "delete", hog)


def test_a_waiting_job_can_be_waited_for_followed_and_deleted(queue_env: Path) -> None:
    tmp_path = queue_env
    hog = submit(tmp_path, gpu_job(tmp_path, "hog", gpus=2, gate=True))
    followed = submit(tmp_path, gpu_job(tmp_path, "followed", sleep=0))
    doomed = submit(tmp_path, gpu_job(tmp_path, "doomed", sleep=0))
    timed_out = cli(tmp_path, "wait", followed, "--timeout", "0.5")
    assert timed_out.returncode == 124 and "still Pending" in timed_out.stderr
    follow = subprocess.Popen(
        [sys.executable, "-m", "torchjob", "logs", "-f", followed],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "TORCHJOB_HOME": str(tmp_path / "home")},
    )
    listing = cli(tmp_path, "queue", "-o", "json")
    states = {j["id"]: j["state"] for j in json.loads(listing.stdout)["jobs"]}
    assert states == {hog: "Running", followed: "Waiting", doomed: "Waiting"}
    assert follow.poll() is None  # following a job that has not started yet
    deleted = cli(tmp_path, "delete", doomed)
    assert deleted.returncode == 0, deleted.stderr
    listing = cli(tmp_path, "queue", "-o", "json")
    assert [j["id"] for j in json.loads(listing.stdout)["jobs"]] == [hog, followed]
    release(tmp_path)
    out, err = follow.communicate(timeout=30)
    assert follow.returncode == 0, err
    assert "main-0 | hello from followed-main-0" in out
    assert "doomed-main" not in (tmp_path / "trace").read_text()


def test_a_waiting_job_whose_directory_was_removed_leaves_the_queue(queue_env: Path) -> None:
    """Removed while it waits for its turn (``rm -rf`` of its directory), a job would hold its
    place unseen by any command; its supervisor ends the wait instead and it never runs."""
    import shutil

    tmp_path = queue_env
    hog = submit(tmp_path, gpu_job(tmp_path, "hog", gpus=2, gate=True))
    gone = submit(tmp_path, gpu_job(tmp_path, "gone", sleep=0))

    def queued() -> list[str]:
        listing = cli(tmp_path, "queue", "-o", "json")
        return [j["id"] for j in json.loads(listing.stdout)["jobs"]]

    assert queued() == [hog, gone]
    shutil.rmtree(tmp_path / "home" / "jobs" / gone)
    assert wait_until(lambda: queued() == [hog], 15), queued()
    release(tmp_path)
    wait_all(tmp_path, [hog])
    assert "gone-main" not in (tmp_path / "trace").read_text()
    assert not (tmp_path / "home" / "jobs" / gone).exists()


def test_an_attached_job_says_why_it_waits_and_its_timeout_still_applies(queue_env: Path) -> None:
    tmp_path = queue_env
    hog = submit(tmp_path, gpu_job(tmp_path, "hog", gpus=2, sleep=30))
    started = time.monotonic()
    result = cli(tmp_path, "run", "--timeout", "1", gpu_job(tmp_path, "late", sleep=0))
    assert time.monotonic() - started < 15
    assert result.returncode == 1
    output = result.stdout + result.stderr
    assert "waiting for 1 nvidia.com/gpu, 0 free; 0 jobs ahead in queue default" in output
    assert "deadline of 1s passed while it waited" in output
    cli(tmp_path, "delete", hog)


def test_a_job_that_can_never_fit_or_names_an_unknown_queue_is_refused_at_once(queue_env: Path) -> None:
    tmp_path = queue_env
    big = cli(tmp_path, "run", gpu_job(tmp_path, "big", replicas=3))
    assert big.returncode == 2 and "this machine has 2 (TORCHJOB_CAPACITY)" in big.stderr
    (tmp_path / "queues.yaml").write_text("queues:\n  small: {capability: {nvidia.com/gpu: 1}}\n")
    capped = cli(tmp_path, "run", gpu_job(tmp_path, "capped", replicas=2, queue="small"))
    assert capped.returncode == 2 and len(capped.stderr.splitlines()) == 1, capped.stderr
    assert (
        "spec.tasks: the job's gang (2 pods) needs 2 nvidia.com/gpu; queue small's capability has 1"
        in capped.stderr
    )
    lost = cli(tmp_path, "run", gpu_job(tmp_path, "lost", queue="nightly"))
    assert lost.returncode == 2 and "spec.queue" in lost.stderr and "no local queue 'nightly'" in lost.stderr
    vip = cli(tmp_path, "run", gpu_job(tmp_path, "vip", priorityClassName="vip"))
    assert vip.returncode == 2 and "no priority class 'vip'" in vip.stderr
    assert not (tmp_path / "home" / "jobs").exists() or not any((tmp_path / "home" / "jobs").iterdir())
    assert not (tmp_path / "trace").exists()


def test_a_job_asking_more_cpus_than_the_machine_has_runs_alone(queue_env: Path) -> None:
    """CPUs can be oversubscribed: 2 pods of 3 CPUs on 4 wait until no other job holds a CPU."""
    tmp_path = queue_env
    small = submit(tmp_path, gpu_job(tmp_path, "small", gpus=0, cpu=1, gate=True))
    big = gpu_job(tmp_path, "big", gpus=0, cpu=3, replicas=2, sleep=0)
    attached = subprocess.Popen(
        [sys.executable, "-m", "torchjob", "run", big],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "TORCHJOB_HOME": str(tmp_path / "home")},
    )
    # It says it waits for the small job (a fixed sleep could end before a busy machine's CLI
    # had even reached the queue), and it does.
    assert attached.stdout is not None
    said = read_until(attached.stdout, "waiting for 4 cpu, 3 free", 30)
    traced = tmp_path / "trace"
    assert not traced.exists() or "big-main" not in traced.read_text()
    release(tmp_path)
    rest, _ = attached.communicate(timeout=30)
    out = said + rest
    assert attached.returncode == 0, out
    assert (
        "the job asks for 6 cpu; this machine has 4 (TORCHJOB_CAPACITY): it is counted as taking all" in out
    )
    assert "waiting for 4 cpu, 3 free" in out
    spans = intervals(tmp_path)
    assert spans["big-main-0"][0] >= spans["small-main-0"][1]
    wait_all(tmp_path, [small])


def test_a_queue_capability_caps_what_its_jobs_hold(queue_env: Path) -> None:
    tmp_path = queue_env
    (tmp_path / "queues.yaml").write_text("queues:\n  small: {weight: 1, capability: {nvidia.com/gpu: 1}}\n")
    # The first holds its GPU until released: a timed sleep could end before a busy machine
    # had submitted the second (seen under four parallel suites).
    first = submit(tmp_path, gpu_job(tmp_path, "first", gate=True, queue="small"))
    second = submit(tmp_path, gpu_job(tmp_path, "second", sleep=0.2, queue="small"))
    reason = status(tmp_path, second)["reason"]
    assert "under queue small's capability" in reason, reason
    release(tmp_path)
    wait_all(tmp_path, [first, second])
    spans = intervals(tmp_path)
    assert spans["second-main-0"][0] >= spans["first-main-0"][1]


# ------------------------------------------------------------------ the parts


def test_a_pod_counts_the_larger_of_its_largest_init_container_and_its_containers() -> None:
    spec = {
        "initContainers": [{"resources": {"requests": {"cpu": "3", "memory": "1Gi"}}}],
        "containers": [
            {"resources": {"requests": {"cpu": "500m"}, "limits": {"cpu": "1", "memory": "2Gi"}}},
            {"resources": {"limits": {"cpu": "1", "nvidia.com/gpu": 2}}},
            {"name": "no-requests"},
        ],
    }
    assert pod_requests(spec) == {"cpu": 3.0, "memory": 2 * 2.0**30, "nvidia.com/gpu": 2.0}
    assert pod_requests({"containers": [{"name": "best-effort"}]}) == {}


def test_a_machine_found_by_looking_is_named_once() -> None:
    """Kubeflow Trainer's example 04 asks 4 CPUs on a 2-core machine: the note said 'this machine
    has 2 (this machine)'; a declared capacity still says where it was declared."""
    from torchjob.engines.local.admission.capacity import Capacity
    from torchjob.engines.local.admission.demand import Demand
    from torchjob.engines.local.admission.plan import _fit
    from torchjob.engines.local.admission.settings import Settings

    demand = Demand({"node/0": {"cpu": 2.0}, "node/1": {"cpu": 2.0}}, ["node/0", "node/1"])
    found = Capacity({"cpu": 2.0, "memory": 2.0**33, "nvidia.com/gpu": 0.0}, (), "this machine")
    (note,) = _fit(demand, "default", Settings(), found, [])
    assert note.startswith("the job asks for 4 cpu; this machine has 2: it is counted as taking all"), note
    demand = Demand({"node/0": {"cpu": 2.0}, "node/1": {"cpu": 2.0}}, ["node/0", "node/1"])
    declared = Capacity({"cpu": 2.0, "memory": 2.0**33, "nvidia.com/gpu": 0.0}, (), "TORCHJOB_CAPACITY")
    (note,) = _fit(demand, "default", Settings(), declared, [])
    assert "this machine has 2 (TORCHJOB_CAPACITY): it is" in note, note


def test_the_gang_is_each_tasks_min_available_topped_up_to_the_jobs() -> None:
    gpu = {"resources": {"limits": {"nvidia.com/gpu": 1}}}
    job = make_job(
        "g",
        [
            task("master", [container("m", ["true"], **gpu)]),
            task("worker", [container("w", ["true"], **gpu)], replicas=4, minAvailable=1),
        ],
        minAvailable=3,
    )
    demand = demand_of(job)
    assert list(demand.pods) == ["master/0", "worker/0", "worker/1", "worker/2", "worker/3"]
    assert demand.gang == ["master/0", "worker/0", "worker/1"]


def test_capacity_and_settings_are_checked_with_the_field_named(tmp_path: Path) -> None:
    assert parse_capacity("cpu=8, memory=16Gi,nvidia.com/gpu=2") == {
        "cpu": 8.0,
        "memory": 16 * 2.0**30,
        "nvidia.com/gpu": 2.0,
    }
    for bad in ("cpu", "disk=1", "nvidia.com/gpu=1.5", "memory=-1"):
        with pytest.raises(ValueError):
            parse_capacity(bad)
    path = tmp_path / "queues.yaml"
    path.write_text(
        "queues:\n  a: {weight: 0, capability: {cpu: lots}}\npriorityClasses: {x: high}\nbackfil: 2\n"
    )
    with pytest.raises(SpecError) as err:
        load_settings(path)
    paths = [p.path for p in err.value.problems]
    assert paths == ["backfil", "queues.a.weight", "queues.a.capability.cpu", "priorityClasses.x"]
    path.write_text("reserve: {cpu: 1}\nbackfill: 0\nqueues: {gpu: {weight: 2}}\npriorityClasses: {hi: 7}\n")
    settings = load_settings(path)
    assert (settings.reserve, settings.backfill, settings.queues["gpu"].weight, settings.priorities) == (
        {"cpu": 1.0},
        0,
        2.0,
        {"hi": 7},
    )


def entry(job: str, seq: int, gpus: int, *, pods: int = 1, priority: int = 0, **more: Any) -> dict[str, Any]:
    return {
        "job": job,
        "seq": seq,
        "queue": "default",
        "priority": priority,
        "pods": {f"m/{i}": {"nvidia.com/gpu": float(gpus)} for i in range(pods)},
        "gang": [f"m/{i}" for i in range(pods)],
        "granted": {},
        "passed": 0,
        **more,
    }


FOUR = Capacity({"cpu": 8.0, "memory": 2.0**34, "nvidia.com/gpu": 4.0}, ("0", "1", "2", "3"), "test")


def test_small_jobs_pass_a_blocked_large_one_only_a_bounded_number_of_times() -> None:
    jobs = {
        "run": entry("run", 1, 3, granted={"m/0": ["0", "1", "2"]}),
        "big": entry("big", 2, 2),  # 2 GPUs wanted, 1 free
    }
    settings = Settings(backfill=2)
    for n in range(2):  # two small jobs may use the free GPU first
        jobs[f"small{n}"] = entry(f"small{n}", 3 + n, 1)
        verdict = decide(jobs, f"small{n}", FOUR, settings)
        assert verdict.granted == {"m/0": ["3"]}
        jobs[f"small{n}"]["granted"] = {}  # it ended at once: the GPU is free again
        del jobs[f"small{n}"]
    assert jobs["big"]["passed"] == 2
    jobs["small2"] = entry("small2", 9, 1)
    verdict = decide(jobs, "small2", FOUR, settings)
    assert verdict.granted is None and "waiting for job big to start first" in verdict.reason
    # A job that wants nothing the blocked one is short of is not held up by it.
    jobs["cpu"] = {**entry("cpu", 10, 0), "pods": {"m/0": {"cpu": 1.0}}}
    assert decide(jobs, "cpu", FOUR, settings).granted == {"m/0": []}


def test_higher_priority_goes_first_and_gets_the_gpus() -> None:
    jobs = {
        "run": entry("run", 1, 3, granted={"m/0": ["0", "1", "2"]}),
        "early": entry("early", 2, 1),
        "urgent": entry("urgent", 3, 1, priority=10),
    }
    assert decide(jobs, "early", FOUR, Settings(backfill=0)).granted is None
    assert decide(jobs, "urgent", FOUR, Settings(backfill=0)).granted == {"m/0": ["3"]}


def test_a_queue_over_its_weights_share_yields_to_the_others() -> None:
    from torchjob.engines.local.admission import QueueSettings

    settings = Settings(queues={"a": QueueSettings(1.0), "b": QueueSettings(1.0)})
    jobs = {
        "run": entry(
            "run", 1, 3, granted={"m/0": ["0", "1", "2"]}, admitted=1.0, queue="a"
        ),  # 3 of 4: over half
        "a2": entry("a2", 2, 1, queue="a"),
        "b1": entry("b1", 3, 1, queue="b"),  # submitted later, in the queue under its share
    }
    assert decide(jobs, "a2", FOUR, settings).granted is None
    assert decide(jobs, "b1", FOUR, settings).granted == {"m/0": ["3"]}
    settings.queues["b"] = QueueSettings(1.0, {"nvidia.com/gpu": 0.0})  # unless b's capability forbids it
    assert decide(jobs, "a2", FOUR, settings).granted == {"m/0": ["3"]}


def test_a_gang_pod_wanted_again_comes_back_only_with_the_whole_missing_gang() -> None:
    """A restarted job whose succeeded gang pods gave their GPUs away waits for them together."""
    from torchjob.engines.local.admission import Demand, Plan, Ticket, grow

    mine = entry("mine", 1, 1, pods=3, granted={"m/0": ["0"]}, admitted=1.0)
    others = entry("other", 2, 3, granted={"m/0": ["1", "2", "3"]}, admitted=1.0)
    jobs = {"mine": mine, "other": others}
    assert grow(jobs, "mine", FOUR, Settings()) == {}  # m/1 and m/2 (the gang) need 2, none is free
    others["granted"] = {"m/0": ["1", "2"]}
    others["pods"]["m/0"] = {"nvidia.com/gpu": 2.0}
    assert grow(jobs, "mine", FOUR, Settings()) == {}  # 1 free: still not both
    others["granted"] = {}
    assert grow(jobs, "mine", FOUR, Settings()) == {"m/1": ["1"], "m/2": ["2"]}
    ticket = Ticket(Plan(Demand(mine["pods"], mine["gang"]), "default", 0, Settings(), FOUR), "mine", "mine")
    ticket.granted = {"m/0": ["0"]}
    assert not ticket.admits("m", 0)  # not even the pod it still holds, while its gang is short
    ticket.finished = {"m/1", "m/2"}  # they succeeded: nothing is missing
    assert ticket.admits("m", 0)


def test_a_state_file_in_a_directory_open_to_others_is_refused(queue_env: Path) -> None:
    from torchjob.engines.local.admission import QueueDirError, locked_state

    runtime = Path(os.environ["TORCHJOB_RUNTIME_DIR"])
    runtime.chmod(0o755)
    try:
        with pytest.raises(QueueDirError), locked_state():
            pass
    finally:
        runtime.chmod(0o700)
    with locked_state() as data:
        data["x"] = 1
    state = runtime / "admission.json"
    assert state.stat().st_mode & 0o777 == 0o600
    (runtime / "admission.json").unlink()
    (runtime / "admission.json").symlink_to(runtime / "elsewhere")
    with pytest.raises(QueueDirError, match=r"admission\.json"), locked_state() as data:
        assert data == {}  # never read through a symlink
    assert not (runtime / "elsewhere").exists()  # nor written
