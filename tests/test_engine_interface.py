"""A second engine, written here in a few dozen lines, driven through the real CLI: the Engine
interface and the registry are all the CLI needs (issue 9)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from torchjob.cli import main
from torchjob.engines import registry
from torchjob.engines.base import (
    EngineError,
    JobReport,
    LogLine,
    LogQuery,
    PodReport,
    PortReport,
    StartOptions,
)
from torchjob.spec.model import Job

JOBS: dict[str, JobReport] = {}  # the engine's whole state, shared by every instance
LOGS: dict[str, dict[str, list[str]]] = {}  # job id -> pod short name -> lines


class MemoryEngine:
    name = "memory"

    def __init__(self, **settings: Any) -> None:
        self.settings = settings

    def check(self, job: Job) -> list[tuple[str, str]]:
        return []

    def warnings(self, job: Job) -> list[tuple[str, str]]:
        return []

    def start(self, job: Job, options: StartOptions) -> JobReport:
        report = JobReport(self.name, f"{job.name}-{len(JOBS)}", job.name, "Completed")
        JOBS[report.id] = report
        return report

    def list_jobs(self) -> list[JobReport]:
        return list(reversed(JOBS.values()))

    def status(self, ref: str) -> JobReport:
        if ref not in JOBS:
            raise EngineError(f"no memory job {ref!r}")
        return JOBS[ref]

    def logs(self, ref: str, query: LogQuery) -> Iterator[LogLine]:
        pods = LOGS[self.status(ref).id]
        if query.pod is not None and query.pod not in pods:
            raise EngineError(f"no pod {query.pod!r} (pods: {', '.join(pods)})")
        chosen = [query.pod] if query.pod else list(pods)
        return iter([LogLine(p, text, n, p) for n, p in enumerate(chosen) for text in pods[p]])

    def wait(self, ref: str, timeout: float | None = None) -> JobReport:
        return self.status(ref)

    def delete(self, refs: list[str]) -> list[str]:
        reports = [self.status(ref) for ref in refs]  # every ref resolved before anything goes
        for report in reports:
            del JOBS[report.id]
        return [r.id for r in reports]


@pytest.fixture
def memory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(registry._ENGINES, "memory", "test_engine_interface:MemoryEngine")
    JOBS.clear()
    LOGS.clear()
    pod = PodReport("train-master-0", "master-0", "master", 0, "Succeeded", rank=0, exit_code=0)
    JOBS["train-1"] = JobReport(
        "memory", "train-1", "train", "Completed", "all pods succeeded", pods=[pod], ports=[PortReport(1, 2)]
    )
    JOBS["eval-2"] = JobReport("memory", "eval-2", "eval", "Failed", "pod master-0 failed")
    LOGS["train-1"] = {"master-0": ["step 1", "step 2"], "worker-0": ["ready"]}


def test_the_registry_finds_the_test_engine_and_it_satisfies_the_interface(memory: None) -> None:
    assert "memory" in registry.engine_names()
    assert isinstance(registry.get_engine("memory", state_dir=None), MemoryEngine)


def test_status_lists_and_shows_jobs_of_another_engine(
    memory: None, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["status", "--engine", "memory"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[:2] for line in lines] == [
        ["JOB", "PHASE"],
        ["train-1", "Completed"],
        ["eval-2", "Failed"],
    ]
    assert main(["status", "--engine", "memory", "train-1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("job train-1: Completed  ports 1->2")
    assert "master-0  0" in out and "reason: all pods succeeded" in out
    assert main(["status", "--engine", "memory", "train-1", "-o", "json"]) == 0
    assert json.loads(capsys.readouterr().out) == JOBS["train-1"].to_dict()
    assert main(["status", "--engine", "memory", "nope"]) == 2
    assert "no memory job 'nope'" in capsys.readouterr().err


def test_logs_and_delete_through_the_cli(memory: None, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["logs", "--engine", "memory", "train-1"]) == 0
    assert capsys.readouterr().out == "master-0 | step 1\nmaster-0 | step 2\nworker-0 | ready\n"
    assert main(["logs", "--engine", "memory", "train-1", "worker-9"]) == 2
    assert "pods: master-0, worker-0" in capsys.readouterr().err
    assert main(["delete", "--engine", "memory", "eval-2", "nope"]) == 2  # resolved first: nothing deleted
    assert set(JOBS) == {"train-1", "eval-2"}
    assert main(["delete", "--engine", "memory", "eval-2"]) == 0
    assert capsys.readouterr().out.endswith("deleted eval-2\n") and set(JOBS) == {"train-1"}


def test_an_unknown_engine_is_bad_input(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["status", "--engine", "nosuch"])
    assert info.value.code == 2
    assert "invalid choice: 'nosuch'" in capsys.readouterr().err
