"""A second engine, written here in a few dozen lines, driven through the real CLI: the Engine
interface and the registry are all the CLI needs (issue 9)."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from torchjob.cli import main
from torchjob.engine_api import registry
from torchjob.engine_api.base import (
    EngineError,
    JobReport,
    LogLine,
    LogQuery,
    Plan,
    PodReport,
    PortReport,
    StartOptions,
)
from torchjob.errors import Issue
from torchjob.spec.model import Job

if TYPE_CHECKING:
    from torchjob.engine_api.base import Engine, Sink

JOBS: dict[str, JobReport] = {}  # the engine's whole state, shared by every instance
LOGS: dict[str, dict[str, list[str]]] = {}  # job id -> pod short name -> lines


class MemoryEngine:
    name = "memory"

    def __init__(self, **settings: Any) -> None:
        self.settings = settings

    def check(self, job: Job) -> list[Issue]:
        return []

    def warnings(self, job: Job) -> list[Issue]:
        return []

    def plan(self, job: Job, options: StartOptions) -> Plan:
        job_id = f"{job.name}-{len(JOBS)}"  # decided here: the job start makes is the one planned
        return Plan(self.name, job, options, f"memory job {job_id}: {job.total_replicas} pod(s)", job_id)

    def start(self, plan: Plan) -> JobReport:
        job_id: str = plan.detail_for(self.name)
        pods = [
            PodReport(f"{job_id}-{t.name}-{i}", f"{t.name}-{i}", t.name, i, "Succeeded", exit_code=0)
            for t in plan.job.spec.tasks
            for i in range(t.replicas)
        ]
        report = JobReport(self.name, job_id, plan.job.name, "Completed", "all pods succeeded", pods=pods)
        JOBS[report.id] = report
        LOGS[report.id] = {pod.short: [f"{pod.short} ran"] for pod in pods}
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

    def wait(self, ref: str, timeout: float | None = None, sink: Sink | None = None) -> JobReport:
        report = self.status(ref)
        if sink is not None and not report.terminal:
            sink.notice(f"job {ref} is {report.phase}")
        return report

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


_implements: type[Engine] = MemoryEngine  # mypy's check that it has the interface's shape


def test_run_dry_run_run_and_wait_through_the_cli(
    memory: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The engine docs/engines.md points to: its plan is what --dry-run prints, and what run starts."""
    job = tmp_path / "job.yaml"
    job.write_text(JOB_YAML)
    assert main(["run", "--engine", "memory", "--dry-run", str(job)]) == 0
    assert capsys.readouterr().out == "memory job train-2: 1 pod(s)\n"
    assert set(JOBS) == {"train-1", "eval-2"}  # planned, nothing started
    assert main(["run", "--engine", "memory", str(job)]) == 0
    assert capsys.readouterr().err == "torchjob: job train Completed: all pods succeeded\n"
    assert JOBS["train-2"].pods[0].short == "master-0"  # the id the plan decided
    assert main(["wait", "--engine", "memory", "train-2"]) == 0
    said = capsys.readouterr()
    assert "Completed" in said.out + said.err, said
    assert main(["logs", "--engine", "memory", "train-2"]) == 0
    assert capsys.readouterr().out == "master-0 | master-0 ran\n"


def test_start_refuses_a_plan_another_engine_made(memory: None) -> None:
    from torchjob.jobs import load_jobs_from_text

    job = load_jobs_from_text(JOB_YAML)[0].job
    local = registry.get_engine("local").plan(job, StartOptions())
    with pytest.raises(EngineError) as refused:
        registry.get_engine("memory").start(local)
    assert str(refused.value) == "a plan of the local engine cannot be started by the memory engine"


class HalfEngine:
    """What docs/engines.md's first engine once was: no plan, and a wait without a sink."""

    name = "half"

    def __init__(self, **settings: Any) -> None:
        pass

    check = warnings = MemoryEngine.check
    start, list_jobs, status, logs, delete = (
        MemoryEngine.start,
        MemoryEngine.list_jobs,
        MemoryEngine.status,
        MemoryEngine.logs,
        MemoryEngine.delete,
    )

    def wait(self, ref: str, timeout: float | None = None) -> JobReport:
        return self.status(ref)


def test_the_registry_refuses_an_engine_without_the_interface_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for engine in registry.engine_names():  # every engine the registry knows, whichever exist
        assert registry.interface_gaps(registry.get_engine(engine)) == [], engine
    assert registry.interface_gaps(MemoryEngine()) == []
    monkeypatch.setitem(registry._ENGINES, "half", "test_engine_interface:HalfEngine")
    assert main(["status", "--engine", "half"]) == 2  # refused when loaded, whatever the command
    assert capsys.readouterr().err == (
        "torchjob: engine half: test_engine_interface:HalfEngine does not implement the engine "
        "interface: no plan; wait takes no sink\n"
    )


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


# ------------------------------------------------ an engine with settings of its own (issue 20)

# The test engine's own package: its settings declared apart from the engine (imported only when
# used), and an engine that records what reached it. Written to a directory on sys.path.
_DECLARATION = """
from torchjob.engine_api.base import EngineInfo, Setting

ENGINE = EngineInfo(
    factory="memengine.engine:SettingsEngine",
    settings=(
        Setting("partition", "memory: the partition to run in", metavar="NAME",
                commands=("run", "status"), flags=("-p", "--partition")),
        Setting("slots", "memory: how many slots", type="int", default=1, metavar="N", minimum=1,
                commands=("run",)),
    ),
)
"""
_ENGINE = """
from torchjob.engine_api.base import JobReport, Plan
from memengine.settings import ENGINE

SEEN = []


class SettingsEngine:
    name = "withsettings"

    def __init__(self, **settings):
        self.made_with = settings

    def check(self, job):
        return []

    def warnings(self, job):
        return []

    def plan(self, job, options):
        return Plan(self.name, job, options, f"would run {job.name} with {options.settings}")

    def start(self, plan):
        options = plan.options
        SEEN.append((self.made_with, options.settings, ENGINE.value(options, "slots")))
        return JobReport(self.name, plan.job.name + "-1", plan.job.name, "Completed")

    def list_jobs(self):
        SEEN.append((self.made_with, {}, None))
        return []

    def status(self, ref):
        return JobReport(self.name, ref, ref, "Completed")

    def logs(self, ref, query):
        return iter([])

    def wait(self, ref, timeout=None, sink=None):
        return self.status(ref)

    def delete(self, refs):
        return list(refs)
"""


@pytest.fixture
def memengine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    package = tmp_path / "memengine"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "settings.py").write_text(_DECLARATION)
    (package / "engine.py").write_text(_ENGINE)
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [m for m in sys.modules if m.startswith("memengine")]:
        monkeypatch.delitem(sys.modules, name)
    job = tmp_path / "job.yaml"
    job.write_text(JOB_YAML)
    return job


JOB_YAML = """\
apiVersion: batch.volcano.sh/v1alpha1
kind: Job
metadata: {name: train}
spec:
  tasks:
    - name: master
      replicas: 1
      template:
        spec:
          restartPolicy: OnFailure
          containers: [{name: main, image: python:3.12, command: [python, -c, "print(1)"]}]
"""


def _seen() -> list[Any]:
    seen: list[Any] = sys.modules["memengine.engine"].SEEN
    return seen


def _drive_withsettings(job: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Its flags are in run's help; their values reach the engine; another engine refuses them."""
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    helped = capsys.readouterr().out
    assert "-p NAME, --partition NAME" in helped and "memory: how many slots" in helped
    assert main(["run", "--engine", "withsettings", "-p", "gpu", "--slots", "4", str(job)]) == 0
    assert _seen()[-1] == ({"partition": "gpu", "slots": 4}, {"partition": "gpu", "slots": 4}, 4)
    assert main(["run", "--engine", "withsettings", str(job)]) == 0  # its default, as declared
    assert _seen()[-1] == ({}, {}, 1)
    assert main(["status", "--engine", "withsettings", "--partition", "cpu"]) == 0
    assert _seen()[-1][0] == {"partition": "cpu"}
    capsys.readouterr()
    started = len(_seen())
    assert main(["run", "--engine", "withsettings", "--dry-run", "-p", "x", str(job)]) == 0
    assert capsys.readouterr().out == "would run train with {'partition': 'x'}\n"
    assert len(_seen()) == started  # planned, not started
    assert main(["run", "--engine", "withsettings", "--slots", "0", str(job)]) == 2
    assert "--slots: expected a finite number of 1 or more, got 0" in capsys.readouterr().err
    assert main(["run", "--engine", "local", "--slots", "2", str(job)]) == 2
    err = capsys.readouterr().err
    assert (
        err.strip() == "<command line>: --slots: applies only to --engine withsettings, not to --engine local"
    )


def test_an_engine_declares_settings_and_the_cli_makes_its_flags(
    memengine: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(registry._ENGINES, "withsettings", "memengine.settings:ENGINE")  # its one line
    assert "memengine.engine" not in sys.modules
    registry.settings_of("run")  # listing settings imports the declaration, not the engine
    assert "memengine.settings" in sys.modules and "memengine.engine" not in sys.modules
    _drive_withsettings(memengine, capsys)


def test_an_engine_of_another_distribution_registers_by_entry_point(
    memengine: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    info = tmp_path / "memengine-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: memengine\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        "[torchjob.engines]\nwithsettings = memengine.settings:ENGINE\nbroken = no_such_module:ENGINE\n"
    )
    monkeypatch.setattr(registry, "_ENGINES", dict(registry._ENGINES))  # what it reads is undone after
    monkeypatch.setattr(registry, "_entry_points_read", False)
    assert main(["status", "--engine", "local", "--state-dir", str(tmp_path / "state")]) == 0
    assert "withsettings" not in registry._ENGINES  # a built-in engine: no metadata read
    assert main(["run", "--engine", "withsettings", "-p", "a100", str(memengine)]) == 0  # read now
    assert _seen()[-1][1] == {"partition": "a100"}
    _drive_withsettings(memengine, capsys)
    assert "withsettings" in registry.engine_names()
    capsys.readouterr()
    assert main(["status", "--engine", "broken"]) == 2  # its flags missing from --help, not a traceback
    err = capsys.readouterr().err
    assert (
        err
        == "torchjob: engine broken: cannot load no_such_module:ENGINE: No module named 'no_such_module'\n"
    )


def test_run_dry_run_prints_the_local_engines_plan_and_starts_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = tmp_path / "job.yaml"
    job.write_text(JOB_YAML)
    state = tmp_path / "state"
    assert main(["run", "--dry-run", "--state-dir", str(state), str(job)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("local job train: 1 pod(s) on this machine\n"), out
    assert "\npod train-master-0\n" in out and "  main: " in out and " -c 'print(1)'" in out, out
    assert not state.exists()
    example = Path(__file__).parent.parent / "examples" / "sdk" / "adaptive_training.py"
    assert main(["run", "--dry-run", f"{example}:adaptive_training"]) == 2  # not run: refused
    assert "--dry-run: not for a workflow" in capsys.readouterr().err


def test_max_restarts_is_one_setting_of_local_and_slurm(capsys: pytest.CaptureFixture[str]) -> None:
    # Declared once (engines.common_settings); each engine lists it for its own commands.
    slots = ("name", "help", "type", "default", "flags", "metavar", "minimum", "invalid")
    declared = {
        (engine, s.commands): tuple(getattr(s, k) for k in slots)
        for command in ("run", "submit")
        for engine, s in registry.settings_of(command)
        if s.name == "max_restarts"
    }
    assert set(declared) == {("local", ("run",)), ("slurm", ("run", "submit"))}
    assert len(set(declared.values())) == 1
    for command in ("run", "submit"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        helped = capsys.readouterr().out
        listed = [line for line in helped.splitlines() if line.strip().startswith("--max-restarts N")]
        assert len(listed) == 1 and "fail the job once a pod's containers restarted" in listed[0]
