"""The kubernetes engine's root cause, by the failed pods' logs as the local engine weighs its own
(controller/rootcause.py): the real client over HTTP against kubeapi.py, the test playing Volcano."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("kubernetes")

from kube_fixtures import TERMINAL_STATUS, demo_job, install_stand_in, make_pod, terminated
from kubeapi import FakeKubeAPI
from test_rootcause import raised, torchrun_report
from torchjob.cli import main
from torchjob.engine_api.base import StartOptions
from torchjob.engine_api.registry import get_engine
from torchjob.jobs import load_jobs_from_text

pytestmark = pytest.mark.timeout(120)

VOLCANO = "batch.volcano.sh/v1alpha1"
# What rank 0 says when the rank that raised went away first: gloo's error, in a traceback.
PEER_LOST = [
    "Traceback (most recent call last):",
    '  File "/app/train.py", line 30, in <module>',
    "    dist.all_reduce(t)",
    "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer "
    "[10.0.0.3]:5678",
]
RAISED = [
    "Traceback (most recent call last):",
    '  File "/app/train.py", line 28, in <module>',
    "    batch = next(loader)",
    "ValueError: bad batch 17",
]


@pytest.fixture(autouse=True)
def renderer(monkeypatch: pytest.MonkeyPatch) -> None:
    install_stand_in(monkeypatch)


@pytest.fixture
def config(api: FakeKubeAPI, tmp_path: Path) -> Path:
    return api.kubeconfig(tmp_path / "kubeconfig", namespace="team")


def failed_job(
    api: FakeKubeAPI, config: Path, logs: dict[str, list[str]], workers: int = 2, code: int = 1
) -> Any:
    """A detached volcano job whose pods ended in the order of ``logs`` (exit code 1, the last
    ``code``, a minute apart; the others 0), each with its log, and the job Failed."""
    engine = get_engine("kubernetes", kubeconfig=str(config))
    job = load_jobs_from_text(demo_job("demo", workers=workers, pytorch=False), "job.yaml")[0].job
    engine.start(engine.plan(job, StartOptions(detach=True, target="volcano")))
    top = api.get(VOLCANO, "Job", "demo", namespace="team")
    assert top is not None
    pods = [make_pod("demo", "master", 0, owner=top, namespace="team", rank=0)]
    pods += [make_pod("demo", "worker", i, owner=top, namespace="team", rank=i + 1) for i in range(workers)]
    order = list(logs)
    for pod in pods:
        short = pod["metadata"]["name"].removeprefix("demo-")
        ended = (code if short == order[-1] else 1) if short in logs else 0
        minute = order.index(short) + 1 if short in logs else 30
        api.put(terminated(pod, ended, finished=f"2026-01-01T00:{minute:02}:00Z"))
        api.log(pod["metadata"]["name"], pod["spec"]["containers"][0]["name"], *logs.get(short, ["done"]))
    api.set_status(VOLCANO, "Job", "demo", TERMINAL_STATUS["volcano"]["Failed"], namespace="team")
    return engine


def named(report: Any) -> tuple[str, int | None, int | None, str]:
    failure = report.first_failure
    assert failure is not None
    return failure.short, failure.rank, failure.exit_code, failure.log_tail[-1] if failure.log_tail else ""


def test_the_rank_that_raised_beats_rank_0_that_lost_its_peer_first(api: FakeKubeAPI, config: Path) -> None:
    engine = failed_job(api, config, {"master-0": ["step 1", *PEER_LOST], "worker-1": ["step 1", *RAISED]})
    expected = ("worker-1", 2, 1, "ValueError: bad batch 17")
    assert named(engine.status("demo")) == expected
    assert named(engine.wait("demo", timeout=30)) == expected  # the end of a wait says the same
    # Each failed container's log read once for the root cause, its tail kept: none read again.
    assert (
        api.count("GET", "/pods/demo-master-0/log") == 2 and api.count("GET", "/pods/demo-worker-1/log") == 2
    )
    assert api.count("GET", "/pods/demo-worker-0/log") == 0


def test_status_json_and_wait_print_the_rank_that_raised(
    api: FakeKubeAPI, config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    failed_job(api, config, {"master-0": PEER_LOST, "worker-1": RAISED})
    args = ["--engine", "kubernetes", "--kubeconfig", str(config)]
    assert main(["status", "demo", "-o", "json", *args]) == 0
    failure = json.loads(capsys.readouterr().out)["firstFailure"]
    assert (failure["short"], failure["rank"], failure["logTail"][-1]) == (
        "worker-1",
        2,
        "ValueError: bad batch 17",
    )
    assert main(["wait", "demo", "--timeout", "30", *args]) == 1
    out = capsys.readouterr().out
    assert "root cause: worker-1 (rank 2), exit code 1" in out, out


def test_torchruns_report_names_the_global_rank_that_raised(api: FakeKubeAPI, config: Path) -> None:
    """worker-0 runs torchrun with two ranks: its report's first observed failure is rank 2 (a lost
    peer), but rank 3 raised; master-0 failed first, of a lost peer."""
    worker = [
        *raised(2, "RuntimeError: Connection closed by peer [10.0.0.1]:29500"),
        *raised(3, "KeyError: 'label'"),
        *torchrun_report((2, 1), [(3, 1)]),
    ]
    engine = failed_job(api, config, {"master-0": PEER_LOST, "worker-0": worker})
    assert named(engine.status("demo")) == ("worker-0", 3, 1, "KeyError: 'label'")


def test_a_log_that_cannot_be_read_leaves_the_earliest_failure_named(
    api: FakeKubeAPI, config: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    engine = failed_job(api, config, {"master-0": PEER_LOST, "worker-1": RAISED})
    api.refuse("GET", "pods", 403, 'pods "x" is forbidden: cannot {verb} pods/log', subresource="log")
    report = engine.status("demo")
    assert report.phase == "Failed"
    assert named(report) == ("master-0", 0, 1, "")
    assert api.count("GET", "/log") == 1  # refused once: no other log asked for
    assert "going on without logs" in capsys.readouterr().err


def test_a_pod_gone_with_its_log_is_weighed_by_its_exit_code(api: FakeKubeAPI, config: Path) -> None:
    """The raising rank's log is gone (404): rank 0's log says it only lost its peer, so the pod
    that exited without a word is named; with no log at all, the earliest failure is."""
    engine = failed_job(api, config, {"master-0": PEER_LOST, "worker-1": RAISED})
    api.refuse("GET", "pods", 404, 'pods "demo-worker-1" not found', name="demo-worker-1", subresource="log")
    assert named(engine.status("demo"))[:3] == ("worker-1", 2, 1)
    api.refuse("GET", "pods", 404, 'pods "demo-master-0" not found', name="demo-master-0", subresource="log")
    assert named(engine.status("demo")) == ("master-0", 0, 1, "")


def test_only_the_tails_of_the_earliest_failed_pods_are_read(api: FakeKubeAPI, config: Path) -> None:
    """Long logs cost a tail of about 64 KiB each (tailLines, then fewer lines when limitBytes cut
    them), and of ten failed pods only the eight earliest are read."""
    noise = [f"step {i} " + "." * 200 for i in range(3000)]  # 600 KB before each pod's end
    logs = {"master-0": [*noise, *PEER_LOST]}
    logs |= {f"worker-{i}": [*noise, *PEER_LOST] for i in range(8)}
    logs["worker-8"] = [*noise, *RAISED]  # the tenth to end: not read
    engine = failed_job(api, config, logs, workers=9)
    report = engine.status("demo")
    assert named(report) == ("master-0", 0, 1, PEER_LOST[-1])
    asked = [query for method, path, query in api.requests if path.endswith("/log")]
    assert all(q["limitBytes"] == ["65536"] for q in asked)
    assert not any("demo-worker-7" in path or "demo-worker-8" in path for _, path, _ in api.requests)
    assert len(asked) == 8 * 2  # each tail asked for again with fewer lines, once
    assert len(report.first_failure.log_tail) == 20


def test_a_container_restarted_in_place_is_read_from_its_failed_run(api: FakeKubeAPI, config: Path) -> None:
    """worker-1's container failed (raising), then ran again: its failed run is the previous log."""
    engine = failed_job(api, config, {"master-0": PEER_LOST, "worker-1": ["step 1"]})
    pod = api.get("v1", "Pod", "demo-worker-1", namespace="team")
    assert pod is not None
    status = pod["status"]["containerStatuses"][0]
    status["lastState"] = {
        "terminated": {"exitCode": 1, "reason": "Error", "finishedAt": "2026-01-01T00:02:00Z"}
    }
    status["restartCount"] = 1
    status["state"] = {"running": {"startedAt": "2026-01-01T00:02:10Z"}}
    pod["status"]["phase"] = "Running"
    api.put(pod)
    api.log("demo-worker-1", status["name"], *RAISED)
    api.restart_log("demo-worker-1", status["name"])
    api.log("demo-worker-1", status["name"], "starting again")
    assert named(engine.status("demo")) == ("worker-1", 2, 1, "ValueError: bad batch 17")


def test_a_pod_stopped_after_its_rank_raised_says_so(api: FakeKubeAPI, config: Path) -> None:
    """worker-0's torchrun was stopped (SIGTERM, 143) before its report: its rank 3 had raised."""
    worker = ["[rank2]: step 9", *raised(3, "KeyError: 'label'")]
    engine = failed_job(api, config, {"master-0": PEER_LOST, "worker-0": worker}, code=143)
    failure = engine.status("demo").first_failure
    assert failure is not None
    assert (failure.short, failure.rank, failure.exit_code) == ("worker-0", 3, 143)
    assert failure.reason == "Stopped by the job after its program raised"
    assert failure.log_tail[-1] == "KeyError: 'label'"
