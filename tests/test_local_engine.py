"""The local engine behind the Engine interface, through the real CLI: damaged state, references
that must be exact to delete, and log queries naming what does not exist."""

from __future__ import annotations

import json
import os
import shutil
import signal
from pathlib import Path
from typing import Any

import pytest

from support import cli, container, leftovers, make_job, sh, task, wait_until, write_job
from torchjob.engine_api.base import JobReport, ReportError, StartOptions
from torchjob.engine_api.registry import get_engine
from torchjob.engines.local.state import JobDir

pytestmark = pytest.mark.timeout(120)


def _run(tmp_path: Path, name: str, script: str = "echo hi from $HOSTNAME") -> str:
    job = make_job(name, [task("main", [container("app", sh(script))])])
    proc = cli(tmp_path, "run", "-q", write_job(tmp_path, job, f"{name}.json"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout.split()[0]


def _status_file(tmp_path: Path, job_id: str) -> Path:
    return tmp_path / "home" / "jobs" / job_id / "status.json"


DAMAGE = {
    "not JSON": "{not json",
    "truncated": '{"engine": "local", "id": "x", "name": "bro',
    "a list": "[1, 2, 3]",
    "phase a number": None,  # filled in from the real report below
    "pods not a list": None,
    "a pod's exit code a string": None,
}


def _damage(text: str, how: str) -> str:
    if DAMAGE[how] is not None:
        return str(DAMAGE[how])
    data = json.loads(text)
    if how == "phase a number":
        data["phase"] = 3
    elif how == "pods not a list":
        data["pods"] = {"main-0": {}}
    else:
        data["pods"][0]["exitCode"] = "zero"
    return json.dumps(data)


@pytest.mark.parametrize("how", list(DAMAGE))
def test_a_damaged_status_is_that_job_unknown_and_nothing_else_breaks(tmp_path: Path, how: str) -> None:
    good = _run(tmp_path, "good")
    broken = _run(tmp_path, "broken")
    path = _status_file(tmp_path, broken)
    path.write_text(_damage(path.read_text(), how))

    listing = cli(tmp_path, "status")
    assert listing.returncode == 0, listing.stderr
    rows = {line.split()[0]: line.split()[1] for line in listing.stdout.splitlines()[1:]}
    assert rows == {good: "Completed", broken: "Unknown"}

    one = cli(tmp_path, "status", broken)
    assert one.returncode == 0, one.stderr
    assert "Unknown" in one.stdout and "status.json is damaged" in one.stdout

    dumped = json.loads(cli(tmp_path, "status", "-o", "json").stdout)
    assert sorted(item["phase"] for item in dumped["items"]) == ["Completed", "Unknown"]

    logs = cli(tmp_path, "logs", good)
    assert logs.returncode == 0 and logs.stdout == "main-0 | hi from good-main-0\n", logs.stderr
    # The pods' logs are still there: printed, with one line on stderr naming the damaged file.
    logs = cli(tmp_path, "logs", broken)
    assert logs.returncode == 0 and logs.stdout == "main-0 | hi from broken-main-0\n", logs.stderr
    told = logs.stderr.splitlines()
    assert len(told) == 1 and told[0].startswith(f"torchjob: {path}"), logs.stderr
    assert "showing the pods' logs found on disk" in told[0]
    assert cli(tmp_path, "logs", broken, "main-0").stdout == "main-0 | hi from broken-main-0\n"
    # Nothing to read at all: one line, exit 2.
    shutil.rmtree(path.parent / "logs")
    logs = cli(tmp_path, "logs", broken)
    assert logs.returncode == 2 and logs.stdout == "", logs.stdout
    assert len(logs.stderr.splitlines()) == 1 and str(path) in logs.stderr, logs.stderr
    assert "no pod of job" in logs.stderr and "has a log to show" in logs.stderr
    assert cli(tmp_path, "delete", broken).returncode == 0
    assert not _status_file(tmp_path, broken).exists()


def test_report_round_trips_and_names_the_bad_field() -> None:
    report = JobReport.from_dict(
        {
            "engine": "local",
            "id": "a-123456",
            "name": "a",
            "phase": "Running",
            "pods": [
                {"name": "a-m-0", "short": "m-0", "task": "m", "index": 0, "phase": "Running", "rank": 0}
            ],
            "ports": [{"declared": 23456, "host": 40000}],
        }
    )
    assert JobReport.from_dict(report.to_dict()) == report
    with pytest.raises(ReportError, match=r"pods\[0\]\.index: expected an integer, got bool"):
        JobReport.from_dict({**report.to_dict(), "pods": [{**report.pods[0].to_dict(), "index": True}]})
    with pytest.raises(ReportError, match="phase: missing"):
        JobReport.from_dict({"engine": "local", "id": "x", "name": "x"})


def test_delete_needs_an_exact_name_id_or_a_4_character_prefix(tmp_path: Path) -> None:
    job_id = _run(tmp_path, "delme")
    for ref in ("", "d", "del"):
        proc = cli(tmp_path, "delete", ref)
        assert proc.returncode == 2, (ref, proc.stdout)
        assert proc.stdout == "" and _status_file(tmp_path, job_id).exists()
    assert "too short a prefix" in cli(tmp_path, "delete", "d").stderr
    assert "cannot be empty" in cli(tmp_path, "delete", "").stderr
    proc = cli(tmp_path, "delete", "delm")
    assert proc.returncode == 0 and proc.stdout == f"deleted {job_id}\n", proc.stderr


def test_delete_of_several_deletes_nothing_when_one_is_bad(tmp_path: Path) -> None:
    first = _run(tmp_path, "first")
    proc = cli(tmp_path, "delete", first, "nosuchjob")
    assert proc.returncode == 2
    assert "no local job 'nosuchjob'" in proc.stderr and "nothing was deleted" in proc.stderr
    assert _status_file(tmp_path, first).exists()
    both = cli(tmp_path, "delete", first, "first")  # the same job twice: deleted once
    assert both.returncode == 0 and both.stdout == f"deleted {first}\n"


def test_logs_of_an_attempt_or_container_that_does_not_exist_say_what_exists(tmp_path: Path) -> None:
    job_id = _run(tmp_path, "logsy")
    attempt = cli(tmp_path, "logs", job_id, "--attempt", "99")
    assert attempt.returncode == 2 and attempt.stdout == ""
    assert "no attempt 99 (attempts: main-0: 0)" in attempt.stderr
    container = cli(tmp_path, "logs", job_id, "-c", "nosuch")
    assert container.returncode == 2 and container.stdout == ""
    assert "no container 'nosuch' (containers: app)" in container.stderr
    good = cli(tmp_path, "logs", job_id, "-c", "app", "--attempt", "0")
    assert good.returncode == 0 and good.stdout == "main-0 | hi from logsy-main-0\n"


def test_a_job_whose_supervisor_died_is_unknown_and_wait_returns(tmp_path: Path) -> None:
    engine = get_engine("local", state_dir=tmp_path / "jobs")
    job = make_job("orphan", [task("main", [container("app", sh("echo up; sleep 300"))])])
    started = engine.start(engine.plan(job, StartOptions(detach=True)))
    assert wait_until(lambda: engine.status(started.id).phase == "Running", 15)
    assert engine.wait(started.id, timeout=0.3).phase == "Running"  # the timeout: its latest report
    found = JobDir(Path(started.location)).supervisor()
    assert found is not None
    os.kill(found[0], signal.SIGKILL)
    final = engine.wait(started.id, timeout=15)
    assert final.phase == "Unknown", final
    assert "the supervisor of this job is gone; last known phase Running" in final.reason
    assert [r.id for r in engine.list_jobs()] == [started.id]
    assert engine.delete([started.id]) == [started.id]
    assert wait_until(lambda: leftovers(started.id) == [], 5)
    assert engine.list_jobs() == []


def test_a_detached_start_returns_once_the_status_shows_its_pods_started(tmp_path: Path) -> None:
    """What ``run -d`` returns on is on disk: the next status shows the job Running, not the Pending
    written before its pods were made (a loaded machine's supervisor wrote it only a turn later)."""
    engine = get_engine("local", state_dir=tmp_path / "jobs")
    for name in ("soon-a", "soon-b", "soon-c"):
        job = make_job(name, [task("main", [container("app", sh("sleep 30"))], replicas=2)])
        started = engine.start(engine.plan(job, StartOptions(detach=True)))
        status = json.loads((Path(started.location) / "status.json").read_text())
        assert status["phase"] == "Running", status["reason"]
        assert engine.delete([started.id]) == [started.id]


class _Lines:
    """A caller's sink that takes lines only (no stream of its own), as the SDK's."""

    stream = None

    def __init__(self) -> None:
        self.logs: list[tuple[str, str, str]] = []
        self.notices: list[str] = []
        self.reports: list[str] = []

    def log(self, line: Any) -> None:
        self.logs.append((line.pod, line.prefix, line.text))

    def notice(self, text: str) -> None:
        self.notices.append(text)

    def report(self, text: str) -> None:
        self.reports.append(text)


def test_an_attached_job_writes_to_the_callers_sink_not_to_stdout(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    engine = get_engine("local", state_dir=tmp_path / "jobs")
    init = container("prep", sh("echo prepared"))
    job = make_job("sunk", [task("main", [container("app", sh("echo hello from the pod"))], init=[init])])
    sink = _Lines()
    report = engine.start(engine.plan(job, StartOptions(sink=sink)))
    assert report.phase == "Completed"
    assert sink.logs == [("main-0", "main-0/prep", "prepared"), ("main-0", "main-0", "hello from the pod")]
    assert any(line.startswith("job sunk-") for line in sink.notices), sink.notices
    assert any("Completed" in line for line in sink.reports), sink.reports  # the summary
    assert capfd.readouterr().out == ""
