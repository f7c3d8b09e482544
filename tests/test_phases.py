"""One vocabulary of phases: the enums and the one terminal set every layer uses."""

from __future__ import annotations

import json

from torchjob import phases
from torchjob.engine_api import base
from torchjob.engine_api.base import JobReport
from torchjob.lifecycle import types
from torchjob.phases import (
    TERMINAL_JOB_PHASES,
    UNKNOWN,
    UNSUCCESSFUL_JOB_PHASES,
    JobPhase,
    PodPhase,
    is_terminal,
)


def test_the_lifecycle_and_the_engine_interface_share_one_terminal_set() -> None:
    assert types.JobPhase is phases.JobPhase and types.PodPhase is phases.PodPhase
    assert base.TERMINAL_PHASES is TERMINAL_JOB_PHASES
    assert {p for p in JobPhase if p.final} == TERMINAL_JOB_PHASES
    assert {str(p) for p in TERMINAL_JOB_PHASES} == {"Completed", "Failed", "Aborted", "Terminated"}
    assert {str(p) for p in UNSUCCESSFUL_JOB_PHASES} == {"Failed", "Aborted", "Terminated"}


def test_a_phase_string_read_back_tests_as_its_member() -> None:
    assert is_terminal("Failed") and is_terminal(JobPhase.ABORTED)
    assert not is_terminal(UNKNOWN) and not is_terminal("Completing")
    assert UNKNOWN == "Unknown" and UNKNOWN not in set(JobPhase)  # the engine lost track: not Volcano's
    assert PodPhase.RUNNING == "Running" and f"{JobPhase.RESTARTING}" == "Restarting"


def test_a_report_keeps_plain_strings_and_reads_terminal_from_the_one_set() -> None:
    for phase, terminal, ok in (
        ("Completed", True, True),
        ("Failed", True, False),
        ("Unknown", False, False),
    ):
        report = JobReport("local", "id", "demo", phase)
        assert (report.terminal, report.ok) == (terminal, ok)
    report = JobReport("local", "id", "demo", JobPhase.TERMINATED)
    assert json.loads(json.dumps(report.to_dict()))["phase"] == "Terminated"
