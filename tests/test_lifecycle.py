"""The lifecycle state machine, table by table, plus a small simulated controller loop (no processes)."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from torchjob.lifecycle import (
    RETAIN_NONE,
    RETAIN_SOFT,
    Action,
    Decision,
    Event,
    JobPhase,
    JobStatus,
    Kill,
    PodChange,
    PodPhase,
    PodStatus,
    active_deadline,
    apply_kill,
    cancels_delay,
    deadline_passed,
    dependencies_ready,
    events_for,
    initial_status,
    never_ready,
    reactions,
    resolve,
    resolve_action,
    restarts_allowed,
    step,
    task_max_retry,
    task_ready,
)
from torchjob.records import replace
from torchjob.spec.defaults import apply_defaults
from torchjob.spec.model import DependsOn, Job, JobRunPolicy, JobSpec, Metadata, PodTemplate, Policy, Task
from torchjob.spec.units import parse_duration

P, R, S, F = PodPhase.PENDING, PodPhase.RUNNING, PodPhase.SUCCEEDED, PodPhase.FAILED
SOFT = RETAIN_SOFT
NONE = RETAIN_NONE
W1 = ("worker", 1)  # the pod most tests are about


def template() -> PodTemplate:
    return PodTemplate({"spec": {"containers": [{"name": "c", "image": "img", "command": ["true"]}]}})


def task(name: str, replicas: int, **kw: Any) -> Task:
    return Task(name=name, replicas=replicas, template=template(), **kw)


def make_job(tasks: Sequence[Task] | None = None, **spec: Any) -> Job:
    """A defaulted job; by default 1 master + 2 workers, maxRetry 3, minAvailable 3."""
    tasks = list(tasks) if tasks is not None else [task("master", 1), task("worker", 2)]
    return apply_defaults(Job(Metadata("demo"), JobSpec(tasks=tasks, **spec)))


def pods(text: str) -> list[PodStatus]:
    """Pods from ``"master-0:R worker-0:S worker-1:F3 worker-2:R+2*"``.

    Phase letter (P, R, S, F), optional exit code, ``+N`` container restarts, ``*`` terminating.
    """
    out: list[PodStatus] = []
    for item in text.split():
        name, state = item.split(":")
        task_name, index = name.rsplit("-", 1)
        terminating = state.endswith("*")
        state, _, restarts = state.rstrip("*").partition("+")
        phase = {"P": P, "R": R, "S": S, "F": F}[state[0]]
        code = int(state[1:]) if len(state) > 1 else None
        out.append(PodStatus(task_name, int(index), phase, int(restarts or 0), code, terminating))
    return out


def kill_shape(kill: Kill | None) -> tuple[Any, ...] | None:
    if kill is None:
        return None
    return (kill.scope, kill.task, kill.index, kill.retain)


# --- vocabulary ---------------------------------------------------------------------------------


def test_enum_values_are_volcanos_strings() -> None:
    assert [p.value for p in JobPhase] == [
        "Pending", "Aborting", "Aborted", "Running", "Restarting",
        "Completing", "Completed", "Terminating", "Terminated", "Failed",
    ]  # fmt: skip
    assert [e.value for e in Event] == [
        "*", "PodPending", "PodRunning", "PodFailed", "PodEvicted", "Unknown",
        "TaskCompleted", "TaskFailed", "JobUpdated", "OutOfSync", "CommandIssued",
    ]  # fmt: skip
    assert [a.value for a in Action] == [
        "SyncJob", "AbortJob", "RestartJob", "RestartTask", "RestartPod", "RestartPartition",
        "TerminateJob", "CompleteJob", "ResumeJob",
    ]  # fmt: skip
    assert {p for p in JobPhase if p.final} == {
        JobPhase.COMPLETED, JobPhase.FAILED, JobPhase.TERMINATED, JobPhase.ABORTED,
    }  # fmt: skip
    assert f"{JobPhase.RUNNING}" == "Running"
    assert JobPhase("Restarting") is JobPhase.RESTARTING


# --- policy resolution --------------------------------------------------------------------------

RESTART = Policy("RestartJob", ["PodFailed"])


# fmt: off
ABORT_ANY = Policy("AbortJob", ["*"])
ABORT_FAIL = Policy("AbortJob", ["PodFailed"])
EVICT_OR_FAIL = Policy("AbortJob", ["PodEvicted", "PodFailed"])
CODE3 = Policy("AbortJob", exit_code=3)
PF, PE, PP, PR = Event.POD_FAILED, Event.POD_EVICTED, Event.POD_PENDING, Event.POD_RUNNING
TC, TF = Event.TASK_COMPLETED, Event.TASK_FAILED
SYNC, ABORT, RESTART_J = Action.SYNC_JOB, Action.ABORT_JOB, Action.RESTART_JOB
TERMINATE, COMPLETE = Action.TERMINATE_JOB, Action.COMPLETE_JOB

# (job policies, worker task policies, event, task of the pod, exit code, expected action)
POLICY_CASES = [
    # job-level policy applies to every task
    ([RESTART], [], PF, "worker", 1, RESTART_J),
    # task-level wins over job-level; it applies to its own task's pods only
    ([RESTART], [ABORT_FAIL], PF, "worker", 1, ABORT),
    ([RESTART], [ABORT_FAIL], PF, "master", 1, RESTART_J),
    ([RESTART], [ABORT_FAIL], PF, None, 1, RESTART_J),  # no task known: job-level only
    ([RESTART], [ABORT_FAIL], PF, "ghost", 1, RESTART_J),  # unknown task: job-level
    # first match in list order wins
    ([Policy("TerminateJob", ["PodFailed"]), RESTART], [], PF, "worker", 1, TERMINATE),
    # an events list matches each of its events
    ([EVICT_OR_FAIL], [], PF, "worker", 1, ABORT),
    ([EVICT_OR_FAIL], [], PE, "worker", None, ABORT),
    ([EVICT_OR_FAIL], [], TF, "worker", None, SYNC),
    # "*" matches any event, except PodPending without a timeout
    ([ABORT_ANY], [], PF, "worker", 2, ABORT),
    ([ABORT_ANY], [], PE, "worker", None, ABORT),
    ([ABORT_ANY], [], TC, "worker", None, ABORT),
    ([ABORT_ANY], [], TF, "worker", None, ABORT),
    ([ABORT_ANY], [], Event.UNKNOWN, None, None, ABORT),
    ([ABORT_ANY], [], PP, "worker", None, SYNC),
    ([Policy("AbortJob", ["*"], timeout="1m")], [], PP, "worker", None, ABORT),
    # a task's "*" beats a job-level policy for that very event
    ([RESTART], [Policy("CompleteJob", ["*"])], PF, "worker", 1, COMPLETE),
    # PodPending: a matching policy without timeout is skipped, later ones are still tried
    ([Policy("AbortJob", ["PodPending"]), Policy("TerminateJob", ["PodPending"], timeout="30s")],
     [], PP, "worker", None, TERMINATE),
    ([Policy("AbortJob", ["PodPending"])], [], PP, "worker", None, SYNC),
    # exitCode policies match PodFailed with that exit code only
    ([CODE3, RESTART], [], PF, "worker", 3, ABORT),
    ([CODE3, RESTART], [], PF, "worker", 4, RESTART_J),
    ([CODE3], [], PF, "worker", None, SYNC),
    ([CODE3], [], PE, "worker", 3, SYNC),
    ([RESTART], [Policy("TerminateJob", exit_code=137)], PF, "worker", 137, TERMINATE),
    ([RESTART], [Policy("TerminateJob", exit_code=137)], PF, "worker", 1, RESTART_J),
    # list order decides between an event policy and an exitCode policy
    ([RESTART, CODE3], [], PF, "worker", 3, RESTART_J),
    # internal events never consult policies
    ([ABORT_ANY], [ABORT_ANY], Event.OUT_OF_SYNC, "worker", None, SYNC),
    ([ABORT_ANY], [ABORT_ANY], Event.COMMAND_ISSUED, "worker", None, SYNC),
    ([ABORT_ANY], [ABORT_ANY], PR, "worker", None, SYNC),
    # nothing matches: SyncJob
    ([], [], PF, "worker", 1, SYNC),
    ([Policy("CompleteJob", ["TaskCompleted"])], [], PF, "worker", 1, SYNC),
]
# fmt: on


@pytest.mark.parametrize(
    ("job_policies", "task_policies", "event", "task_name", "code", "expected"), POLICY_CASES
)
def test_resolve_action(
    job_policies: list[Policy],
    task_policies: list[Policy],
    event: Event,
    task_name: str | None,
    code: int | None,
    expected: Action,
) -> None:
    job = make_job([task("master", 1), task("worker", 2, policies=task_policies)], policies=job_policies)
    assert resolve_action(job, event, task_name, code) is expected


def test_resolve_reports_delay_and_source() -> None:
    job = make_job(
        [
            task("master", 1),
            task("worker", 2, policies=[Policy("RestartTask", ["PodEvicted"], timeout="1m30s")]),
        ],
        policies=[Policy("AbortJob", ["PodPending"], timeout="250ms"), RESTART],
    )
    evicted = resolve(job, Event.POD_EVICTED, "worker", None)
    assert (evicted.action, evicted.delay, evicted.source) == (
        Action.RESTART_TASK, 90.0, "task worker policy PodEvicted -> RestartTask",
    )  # fmt: skip
    pending = resolve(job, Event.POD_PENDING, "master", None)
    assert (pending.action, pending.delay) == (Action.ABORT_JOB, 0.25)
    failed = resolve(job, Event.POD_FAILED, "master", 1)
    assert (failed.action, failed.delay, failed.source) == (
        Action.RESTART_JOB,
        None,
        "policy PodFailed -> RestartJob",
    )
    assert resolve(job, Event.TASK_FAILED, "master", None).source == ""


def test_only_the_matching_policy_timeout_is_read() -> None:
    job = make_job(policies=[Policy("AbortJob", ["PodEvicted"], timeout="soon"), RESTART])
    assert resolve_action(job, Event.POD_FAILED, "worker", 1) is Action.RESTART_JOB
    with pytest.raises(ValueError, match="not a duration: 'soon'"):
        resolve_action(job, Event.POD_EVICTED, "worker", None)


@pytest.mark.parametrize(
    ("text", "seconds"), [("30s", 30.0), ("5m", 300.0), ("1h30m", 5400.0), ("1.5s", 1.5), ("300ms", 0.3)]
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "30", "s", "1x", "5m junk", "-1s"])
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_duration(text)


@pytest.mark.parametrize(
    ("delayed", "later", "cancels"),
    [
        (Event.POD_PENDING, Event.POD_RUNNING, True),
        (Event.POD_PENDING, Event.POD_FAILED, True),
        (Event.POD_PENDING, Event.POD_PENDING, False),
        (Event.POD_FAILED, Event.POD_RUNNING, True),
        (Event.POD_FAILED, Event.POD_FAILED, False),
        (Event.POD_EVICTED, Event.POD_RUNNING, True),
        (Event.POD_EVICTED, Event.POD_PENDING, False),
        (Event.TASK_FAILED, Event.POD_RUNNING, False),
    ],
)
def test_cancels_delay(delayed: Event, later: Event, cancels: bool) -> None:
    assert cancels_delay(delayed, later) is cancels


# --- events_for ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("before", "change", "expected"),
    [
        # creation
        ("master-0:R worker-0:R", PodChange("worker", 1, None, P), [Event.POD_PENDING]),
        ("master-0:R worker-0:R", PodChange("worker", 1, None, R), [Event.POD_PENDING, Event.POD_RUNNING]),
        # phase transitions
        ("master-0:R worker-0:R worker-1:P", PodChange("worker", 1, P, R), [Event.POD_RUNNING]),
        ("master-0:R worker-0:R worker-1:R", PodChange("worker", 1, R, P), [Event.POD_PENDING]),
        ("master-0:R worker-0:R worker-1:R", PodChange("worker", 1, R, F, 3), [Event.POD_FAILED]),
        ("master-0:R worker-0:R worker-1:P", PodChange("worker", 1, P, F, 1), [Event.POD_FAILED]),
        ("master-0:R worker-0:R worker-1:F", PodChange("worker", 1, F, F, 3), [Event.OUT_OF_SYNC]),
        # a task completes when its last replica succeeds
        ("master-0:R worker-0:R worker-1:R", PodChange("worker", 1, R, S), [Event.OUT_OF_SYNC]),
        ("master-0:R worker-0:S worker-1:R", PodChange("worker", 1, R, S), [Event.TASK_COMPLETED]),
        ("master-0:R worker-0:F worker-1:R", PodChange("worker", 1, R, S), [Event.OUT_OF_SYNC]),
        ("master-0:R worker-0:S worker-1:R", PodChange("master", 0, R, S), [Event.TASK_COMPLETED]),
        ("master-0:S worker-0:S worker-1:S", PodChange("master", 0, S, S), [Event.OUT_OF_SYNC]),
        # no change at all
        ("master-0:R worker-0:R worker-1:R", PodChange("worker", 1, R, R), [Event.OUT_OF_SYNC]),
        # disappearance
        ("master-0:R worker-0:R worker-1:R", PodChange("worker", 1, R, None), [Event.POD_EVICTED]),
        ("master-0:R worker-0:R worker-1:S", PodChange("worker", 1, S, None), [Event.POD_EVICTED]),
        # the engine's own kills raise nothing but a sync
        ("master-0:R worker-0:R worker-1:R", PodChange(*W1, R, None, killed=True), [Event.OUT_OF_SYNC]),
        ("master-0:R worker-0:R worker-1:R*", PodChange("worker", 1, R, F, 143), [Event.OUT_OF_SYNC]),
        ("master-0:R worker-0:R worker-1:R*", PodChange("worker", 1, R, None), [Event.OUT_OF_SYNC]),
    ],
)
def test_events_for(before: str, change: PodChange, expected: list[Event]) -> None:
    job = make_job()
    assert events_for(job, change, pods(before)) == expected
    # the pods may also be given with the change already applied
    after = [
        replace(p, phase=change.new) if (p.task, p.index) == (change.task, change.index) and change.new else p
        for p in pods(before)
    ]
    assert events_for(job, change, after) == expected


def test_task_with_no_replicas_never_completes() -> None:
    job = make_job([task("master", 1), task("idle", 0)])
    change = PodChange("master", 0, R, S)
    assert events_for(job, change, pods("master-0:S")) == [Event.TASK_COMPLETED]
    assert events_for(job, PodChange("idle", 0, R, S), pods("master-0:S idle-0:S")) == [Event.OUT_OF_SYNC]


# fmt: off
TASK_FAILED_CASES = [
    # the sum over the task's live pods is compared with the task's maxRetry (default 3)
    (0, "worker-0:R worker-1:R+2", PodChange(*W1, R, R), [Event.OUT_OF_SYNC]),
    (0, "worker-0:R worker-1:R+3", PodChange(*W1, R, R), [Event.TASK_FAILED]),
    (0, "worker-0:R+1 worker-1:R+2", PodChange(*W1, R, R), [Event.TASK_FAILED]),
    (2, "worker-0:R worker-1:R+2", PodChange(*W1, R, R), [Event.TASK_FAILED]),
    (5, "worker-0:R worker-1:R+4", PodChange(*W1, R, R), [Event.OUT_OF_SYNC]),
    # Pending pods (init container restarts) count too
    (2, "worker-0:R worker-1:P+2", PodChange(*W1, P, P), [Event.TASK_FAILED]),
    # finished and terminating pods do not count
    (2, "worker-0:F+5 worker-1:R+1", PodChange(*W1, R, R), [Event.OUT_OF_SYNC]),
    (2, "worker-0:R+5* worker-1:R+1", PodChange(*W1, R, R), [Event.OUT_OF_SYNC]),
    # entering Running/Pending at the threshold raises both events (Volcano would drop TaskFailed)
    (2, "worker-0:R worker-1:P+2", PodChange(*W1, P, R), [Event.POD_RUNNING, Event.TASK_FAILED]),
    (2, "worker-0:R worker-1:R+2", PodChange(*W1, R, P), [Event.POD_PENDING, Event.TASK_FAILED]),
    # -1 means no limit
    (-1, "worker-0:R worker-1:R+99", PodChange(*W1, R, R), [Event.OUT_OF_SYNC]),
    # a pod that fails raises PodFailed, whatever its restarts
    (2, "worker-0:R worker-1:R+2", PodChange(*W1, R, F, 1), [Event.POD_FAILED]),
]
# fmt: on


@pytest.mark.parametrize(("task_max_retry", "state", "change", "expected"), TASK_FAILED_CASES)
def test_task_failed(task_max_retry: int, state: str, change: PodChange, expected: list[Event]) -> None:
    job = make_job([task("worker", 2, max_retry=task_max_retry)])
    assert events_for(job, change, pods(state)) == expected


def test_reactions_resolve_each_event_with_a_cause() -> None:
    job = make_job(
        [task("master", 1, policies=[Policy("CompleteJob", ["TaskCompleted"])]), task("worker", 2)],
        policies=[RESTART],
    )
    failed = reactions(job, PodChange("worker", 1, R, F, 3), pods("master-0:R worker-0:R worker-1:F3"))
    assert [(r.event, r.action, r.task, r.index, r.exit_code, r.delay) for r in failed] == [
        (Event.POD_FAILED, Action.RESTART_JOB, "worker", 1, 3, None)
    ]
    assert failed[0].cause == "pod worker-1 failed with exit code 3; policy PodFailed -> RestartJob"
    done = reactions(job, PodChange("master", 0, R, S), pods("master-0:S worker-0:R worker-1:R"))
    assert [(r.event, r.action) for r in done] == [(Event.TASK_COMPLETED, Action.COMPLETE_JOB)]
    assert done[0].cause == (
        "pod master-0 succeeded and task master completed (1 of 1 succeeded);"
        " task master policy TaskCompleted -> CompleteJob"
    )
    started = reactions(job, PodChange("worker", 0, None, R), pods("master-0:R worker-0:R"))
    assert [(r.event, r.action) for r in started] == [
        (Event.POD_PENDING, Action.SYNC_JOB), (Event.POD_RUNNING, Action.SYNC_JOB),
    ]  # fmt: skip


# --- step: every phase x every action -----------------------------------------------------------

# The job: master x1 + worker x2, minAvailable 3, maxRetry 3. Its pods: master running, one
# worker succeeded, one pending. Actions with a target name worker-1. Status: retry 1, version 5.
MIXED = "master-0:R worker-0:S worker-1:P"
JOB_SOFT = ("job", None, None, SOFT)
JOB_NONE = ("job", None, None, NONE)
TASK_NONE = ("task", "worker", None, NONE)
POD_NONE = ("pod", "worker", 1, NONE)

# (phase, kill, create_pods, retry_count, version) per action; "*" is every other action.
EXPECTED: dict[JobPhase, dict[Action | str, tuple[JobPhase, Any, bool, int, int]]] = {
    JobPhase.PENDING: {
        # 2 of 3 pods started: below minAvailable, stays Pending
        "*": (JobPhase.PENDING, None, True, 1, 5),
        Action.RESTART_JOB: (JobPhase.RESTARTING, JOB_NONE, False, 2, 6),
        Action.RESTART_TASK: (JobPhase.RESTARTING, TASK_NONE, False, 2, 5),
        Action.RESTART_POD: (JobPhase.RESTARTING, POD_NONE, False, 2, 5),
        Action.RESTART_PARTITION: (JobPhase.RESTARTING, POD_NONE, False, 2, 5),
        Action.ABORT_JOB: (JobPhase.ABORTING, JOB_SOFT, False, 1, 6),
        Action.TERMINATE_JOB: (JobPhase.TERMINATING, JOB_SOFT, False, 1, 6),
        Action.COMPLETE_JOB: (JobPhase.COMPLETING, JOB_SOFT, False, 1, 6),
    },
    JobPhase.RUNNING: {
        # 1 pod pending, more than the 0 the job can spare: back to Pending
        "*": (JobPhase.PENDING, None, True, 1, 5),
        Action.RESTART_JOB: (JobPhase.RESTARTING, JOB_NONE, False, 2, 6),
        Action.RESTART_TASK: (JobPhase.RESTARTING, TASK_NONE, False, 2, 5),
        Action.RESTART_POD: (JobPhase.RESTARTING, POD_NONE, False, 2, 5),
        Action.RESTART_PARTITION: (JobPhase.RESTARTING, POD_NONE, False, 2, 5),
        Action.ABORT_JOB: (JobPhase.ABORTING, JOB_SOFT, False, 1, 6),
        Action.TERMINATE_JOB: (JobPhase.TERMINATING, JOB_SOFT, False, 1, 6),
        Action.COMPLETE_JOB: (JobPhase.COMPLETING, JOB_SOFT, False, 1, 6),
    },
    JobPhase.RESTARTING: {
        # nothing terminating: 3 - 0 >= minAvailable 3, so Pending again
        Action.SYNC_JOB: (JobPhase.PENDING, None, True, 1, 5),
        # anything else kills (no extra retry) and then waits for those pods to stop
        "*": (JobPhase.RESTARTING, JOB_NONE, False, 1, 6),
        Action.RESTART_TASK: (JobPhase.RESTARTING, TASK_NONE, False, 1, 5),
        Action.RESTART_POD: (JobPhase.RESTARTING, POD_NONE, False, 1, 5),
        Action.RESTART_PARTITION: (JobPhase.RESTARTING, POD_NONE, False, 1, 5),
        # torchjob honours these during a restart
        Action.ABORT_JOB: (JobPhase.ABORTING, JOB_SOFT, False, 1, 6),
        Action.TERMINATE_JOB: (JobPhase.TERMINATING, JOB_SOFT, False, 1, 6),
        Action.COMPLETE_JOB: (JobPhase.COMPLETING, JOB_SOFT, False, 1, 6),
    },
    JobPhase.ABORTING: {
        "*": (JobPhase.ABORTING, JOB_SOFT, False, 1, 6),
        Action.RESUME_JOB: (JobPhase.RESTARTING, JOB_SOFT, False, 2, 6),
    },
    JobPhase.ABORTED: {
        "*": (JobPhase.ABORTED, JOB_SOFT, False, 1, 6),
        Action.RESUME_JOB: (JobPhase.RESTARTING, JOB_SOFT, False, 2, 6),
    },
    JobPhase.COMPLETING: {"*": (JobPhase.COMPLETING, JOB_SOFT, False, 1, 6)},
    JobPhase.TERMINATING: {"*": (JobPhase.TERMINATING, JOB_SOFT, False, 1, 6)},
    JobPhase.COMPLETED: {"*": (JobPhase.COMPLETED, JOB_SOFT, False, 1, 6)},
    JobPhase.TERMINATED: {"*": (JobPhase.TERMINATED, JOB_SOFT, False, 1, 6)},
    JobPhase.FAILED: {"*": (JobPhase.FAILED, JOB_SOFT, False, 1, 6)},
}


def test_expected_table_covers_every_phase() -> None:
    assert set(EXPECTED) == set(JobPhase)


def check_invariants(before: JobStatus, given: Sequence[PodStatus], decision: Decision) -> None:
    phase = decision.status.phase
    assert decision.create_pods is (phase in (JobPhase.PENDING, JobPhase.RUNNING))
    assert decision.resync is (phase is not before.phase and not phase.final)
    if decision.kill is not None:
        assert any(decision.kill.selects(p) for p in given), "a kill that stops nothing must be dropped"
    bump = 1 if decision.kill is not None and decision.kill.scope == "job" else 0
    assert decision.status.version == before.version + bump
    assert decision.status.reason, "every decision carries a reason"


@pytest.mark.parametrize("action", list(Action))
@pytest.mark.parametrize("phase", list(JobPhase))
def test_step_every_phase_and_action(phase: JobPhase, action: Action) -> None:
    job = make_job()
    given = pods(MIXED)
    status = JobStatus(phase, retry_count=1, version=5, reason="before")
    decision = step(job, status, given, action, task="worker", index=1)
    table = EXPECTED[phase]
    want = table.get(action, table["*"])
    got = (
        decision.status.phase,
        kill_shape(decision.kill),
        decision.create_pods,
        decision.status.retry_count,
        decision.status.version,
    )
    assert got == want
    check_invariants(status, given, decision)


# With every pod gone, the draining phases land and nothing is killed.
DRAINED: dict[JobPhase, JobPhase] = {
    JobPhase.PENDING: JobPhase.PENDING,
    JobPhase.RUNNING: JobPhase.RUNNING,  # no pod finished, none pending: nothing to decide
    JobPhase.RESTARTING: JobPhase.PENDING,
    JobPhase.ABORTING: JobPhase.ABORTED,
    JobPhase.ABORTED: JobPhase.ABORTED,
    JobPhase.COMPLETING: JobPhase.COMPLETED,
    JobPhase.COMPLETED: JobPhase.COMPLETED,
    JobPhase.TERMINATING: JobPhase.TERMINATED,
    JobPhase.TERMINATED: JobPhase.TERMINATED,
    JobPhase.FAILED: JobPhase.FAILED,
}


@pytest.mark.parametrize("phase", list(JobPhase))
def test_sync_with_no_pods(phase: JobPhase) -> None:
    status = JobStatus(phase, retry_count=1, version=2, reason="before")
    decision = step(make_job(), status, [], Action.SYNC_JOB)
    assert (decision.status.phase, decision.kill, decision.status.version) == (DRAINED[phase], None, 2)
    check_invariants(status, [], decision)


@pytest.mark.parametrize("phase", [JobPhase.ABORTING, JobPhase.COMPLETING, JobPhase.TERMINATING])
@pytest.mark.parametrize(
    ("state", "lands"),
    [
        ("master-0:S worker-0:F1 worker-1:S", True),  # only finished pods: they are retained
        ("master-0:S worker-0:F1 worker-1:R*", False),  # still stopping
        ("master-0:S worker-0:F1 worker-1:R", False),  # still running: killed now, lands later
        ("master-0:S worker-0:F1 worker-1:P", False),
    ],
)
def test_draining_waits_for_every_pod(phase: JobPhase, state: str, lands: bool) -> None:
    decision = step(make_job(), JobStatus(phase), pods(state), Action.SYNC_JOB)
    assert (decision.status.phase is not phase) is lands
    assert decision.status.phase.final is lands


# --- Pending and Running sync rules -------------------------------------------------------------


@pytest.mark.parametrize(
    ("min_available", "state", "expected"),
    [
        (3, "master-0:R worker-0:R worker-1:P", JobPhase.PENDING),
        (3, "master-0:R worker-0:R worker-1:R", JobPhase.RUNNING),
        # finished pods count as started
        (3, "master-0:R worker-0:S worker-1:F1", JobPhase.RUNNING),
        # terminating pods do not
        (3, "master-0:R worker-0:R worker-1:R*", JobPhase.PENDING),
        (2, "master-0:R worker-0:R worker-1:P", JobPhase.RUNNING),
        (2, "master-0:P worker-0:R", JobPhase.PENDING),
    ],
)
def test_pending_sync(min_available: int, state: str, expected: JobPhase) -> None:
    job = make_job(min_available=min_available)
    decision = step(job, JobStatus(JobPhase.PENDING), pods(state), Action.SYNC_JOB)
    assert decision.status.phase is expected
    assert decision.kill is None


@dataclass(frozen=True)
class RunCase:
    state: str
    expected: JobPhase
    reason: str = ""
    min_available: int = 0
    min_success: int | None = None
    task_min: tuple[int | None, int | None] = (None, None)
    killed: tuple[str, ...] = ()


RUNNING_CASES = {
    "all running": RunCase("master-0:R worker-0:R worker-1:R", JobPhase.RUNNING),
    "some finished": RunCase("master-0:R worker-0:S worker-1:F1", JobPhase.RUNNING),
    "all succeeded": RunCase(
        "master-0:S worker-0:S worker-1:S",
        JobPhase.COMPLETED,
        "all 3 pods finished, 3 succeeded (minAvailable 3)",
    ),
    "all failed": RunCase(
        "master-0:F1 worker-0:F1 worker-1:F1",
        JobPhase.FAILED,
        "all 3 pods finished, 0 succeeded; task master has 0 succeeded, below its minAvailable 1;"
        " failed: master-0 (exit code 1), worker-0 (exit code 1), worker-1 (exit code 1)",
    ),
    # job minAvailable >= sum of task minAvailable: every task must meet its own minAvailable
    "task below its minAvailable": RunCase(
        "master-0:S worker-0:S worker-1:F2",
        JobPhase.FAILED,
        "all 3 pods finished, 2 succeeded; task worker has 1 succeeded, below its minAvailable 2;"
        " failed: worker-1 (exit code 2)",
    ),
    # job minAvailable below the task sum: task minimums are not checked, the job's is
    "job minAvailable met": RunCase(
        "master-0:S worker-0:S worker-1:F2",
        JobPhase.COMPLETED,
        "all 3 pods finished, 2 succeeded (minAvailable 2)",
        min_available=2,
    ),
    "job minAvailable missed": RunCase(
        "master-0:S worker-0:F1 worker-1:F2",
        JobPhase.FAILED,
        "all 3 pods finished, 1 succeeded, below minAvailable 2;"
        " failed: worker-0 (exit code 1), worker-1 (exit code 2)",
        min_available=2,
    ),
    "task minAvailable 1 of 2": RunCase(
        "master-0:S worker-0:S worker-1:F2",
        JobPhase.COMPLETED,
        "all 3 pods finished, 2 succeeded (minAvailable 2)",
        min_available=2,
        task_min=(1, 1),
    ),
    # minSuccess: early completion, stopping what still runs
    "minSuccess reached early": RunCase(
        "master-0:R worker-0:S worker-1:P",
        JobPhase.COMPLETED,
        "1 pod succeeded, minSuccess 1 reached",
        min_success=1,
        killed=("master-0", "worker-1"),
    ),
    "minSuccess not yet": RunCase("master-0:R worker-0:S worker-1:R", JobPhase.RUNNING, min_success=2),
    "minSuccess missed at the end": RunCase(
        "master-0:S worker-0:F1 worker-1:S",
        JobPhase.FAILED,
        "all 3 pods finished, 2 succeeded, below minSuccess 3; failed: worker-0 (exit code 1)",
        min_available=2,
        min_success=3,
    ),
    # too many pending pods: back to Pending
    "one pending, none to spare": RunCase(
        "master-0:R worker-0:R worker-1:P",
        JobPhase.PENDING,
        "1 pod pending, more than the 0 the job can spare (3 pods, minAvailable 3)",
    ),
    "one pending, one to spare": RunCase(
        "master-0:R worker-0:R worker-1:P", JobPhase.RUNNING, min_available=2
    ),
    "two pending, one to spare": RunCase(
        "master-0:R worker-0:P worker-1:P",
        JobPhase.PENDING,
        "2 pods pending, more than the 1 the job can spare (3 pods, minAvailable 2)",
        min_available=2,
    ),
    # a finished pod that is being stopped is not counted as finished
    "terminating is not finished": RunCase("master-0:S worker-0:S worker-1:F1*", JobPhase.RUNNING),
    # a missing pod (evicted, not yet recreated) keeps the job Running
    "missing pod": RunCase("master-0:S worker-0:S", JobPhase.RUNNING),
}


@pytest.mark.parametrize("case", list(RUNNING_CASES.values()), ids=list(RUNNING_CASES))
def test_running_sync(case: RunCase) -> None:
    tasks = [
        task("master", 1, min_available=case.task_min[0]),
        task("worker", 2, min_available=case.task_min[1]),
    ]
    job = make_job(tasks, min_available=case.min_available, min_success=case.min_success)
    given = pods(case.state)
    status = JobStatus(JobPhase.RUNNING, reason="running")
    decision = step(job, status, given, Action.SYNC_JOB)
    assert decision.status.phase is case.expected
    assert decision.status.reason == (case.reason or "running")
    stopped = tuple(p.label for p in given if decision.kill is not None and decision.kill.selects(p))
    assert stopped == case.killed
    if case.killed:
        assert decision.kill is not None and decision.kill.retain == SOFT
    check_invariants(status, given, decision)


def test_failed_reason_lists_the_first_failed_pods() -> None:
    job = make_job([task("worker", 5)])
    given = pods("worker-0:F1 worker-1:S worker-2:F2 worker-3:F3 worker-4:F")
    decision = step(job, JobStatus(JobPhase.RUNNING), given, Action.SYNC_JOB, cause="pod worker-4 failed")
    assert decision.status.phase is JobPhase.FAILED
    assert decision.status.reason == (
        "all 5 pods finished, 1 succeeded; task worker has 1 succeeded, below its"
        " minAvailable 5; failed: worker-0 (exit code 1), worker-2 (exit code 2), worker-3 (exit code 3),"
        " 1 more; last event: pod worker-4 failed"
    )


def test_running_with_zero_replicas_keeps_its_phase() -> None:
    job = make_job([task("worker", 0)])
    decision = step(job, JobStatus(JobPhase.RUNNING, reason="r"), [], Action.SYNC_JOB)
    assert (decision.status.phase, decision.status.reason, decision.kill) == (JobPhase.RUNNING, "r", None)


# --- Restarting ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("retry", "min_available", "state", "expected", "killed"),
    [
        (1, 3, "", JobPhase.PENDING, ()),
        (1, 3, "master-0:R* worker-0:R*", JobPhase.RESTARTING, ()),
        # 3 - 1 terminating >= minAvailable 2: start again while the last pod stops
        (1, 2, "master-0:R*", JobPhase.PENDING, ()),
        (2, 3, "", JobPhase.PENDING, ()),
        # retry_count reached maxRetry: the job fails; finished pods stay, live ones are stopped
        (3, 3, "", JobPhase.FAILED, ()),
        (3, 3, "master-0:R worker-0:S worker-1:F3", JobPhase.FAILED, ("master-0",)),
        (4, 3, "master-0:R* worker-1:F3", JobPhase.FAILED, ()),
    ],
)
def test_restarting_sync(
    retry: int, min_available: int, state: str, expected: JobPhase, killed: tuple[str, ...]
) -> None:
    job = make_job(min_available=min_available)
    given = pods(state)
    decision = step(job, JobStatus(JobPhase.RESTARTING, retry, reason="why"), given, Action.SYNC_JOB)
    assert decision.status.phase is expected
    assert tuple(p.label for p in given if decision.kill is not None and decision.kill.selects(p)) == killed
    assert decision.status.retry_count == retry


def test_restart_actions_during_restarting_cost_no_retry() -> None:
    job = make_job()
    status = JobStatus(JobPhase.RESTARTING, 1, 1, "r")
    for action in (Action.RESTART_JOB, Action.RESTART_TASK, Action.RESTART_POD, Action.RESUME_JOB):
        decision = step(
            job, status, pods("master-0:R* worker-0:F1 worker-1:R"), action, task="worker", index=0
        )
        assert decision.status.retry_count == 1
        assert decision.status.phase is JobPhase.RESTARTING


def test_failing_out_of_restarting_stops_every_live_pod() -> None:
    """A targeted restart that arrives once the budget is used up must not leave other pods running."""
    given = pods("master-0:R worker-0:S worker-1:R")
    status = JobStatus(JobPhase.RESTARTING, 3, 4, "why")
    decision = step(make_job(), status, given, Action.RESTART_POD, task="worker", index=1)
    assert decision.status.phase is JobPhase.FAILED
    assert kill_shape(decision.kill) == JOB_SOFT
    assert decision.kill is not None
    assert [p.label for p in given if decision.kill.selects(p)] == ["master-0", "worker-1"]
    assert decision.status.version == 5


# --- maxRetry and the evidence kept on the last retry -------------------------------------------


@pytest.mark.parametrize(
    ("retry_before", "retain"),
    [(0, NONE), (1, NONE), (2, SOFT)],  # maxRetry 3: the 3rd restart action fails the job
)
@pytest.mark.parametrize("action", [Action.RESTART_JOB, Action.RESTART_TASK, Action.RESTART_POD])
def test_last_retry_keeps_finished_pods(
    retry_before: int, retain: frozenset[PodPhase], action: Action
) -> None:
    given = pods("master-0:R worker-0:S worker-1:F3")
    decision = step(
        make_job(), JobStatus(JobPhase.RUNNING, retry_before), given, action, task="worker", index=1
    )
    assert decision.status.retry_count == retry_before + 1
    assert decision.status.phase is JobPhase.RESTARTING
    stopped = {p.label for p in given if decision.kill is not None and decision.kill.selects(p)}
    expected = {
        Action.RESTART_JOB: {"master-0", "worker-0", "worker-1"},
        Action.RESTART_TASK: {"worker-0", "worker-1"},
        Action.RESTART_POD: {"worker-1"},
    }[action]
    if retain == SOFT:
        expected = {label for label in expected if label == "master-0"}  # finished pods are the evidence
    assert stopped == expected
    follow = step(make_job(), decision.status, apply_kill(given, decision.kill), Action.SYNC_JOB)
    assert follow.status.phase is (JobPhase.FAILED if retain == SOFT else JobPhase.RESTARTING)


@pytest.mark.parametrize(("max_retry", "restarts_run"), [(1, 0), (2, 1), (3, 2), (5, 4)])
def test_max_retry_means_max_retry_minus_one_restarts(max_retry: int, restarts_run: int) -> None:
    """Each restart action is one retry; the one that reaches maxRetry fails the job."""
    job = make_job(max_retry=max_retry)
    status = JobStatus(JobPhase.RUNNING)
    ran = 0
    while True:
        decision = step(job, status, pods("master-0:R worker-0:R worker-1:F1"), Action.RESTART_JOB)
        after = step(job, decision.status, [], Action.SYNC_JOB)
        if after.status.phase is JobPhase.FAILED:
            break
        assert after.status.phase is JobPhase.PENDING
        ran += 1
        status = replace(after.status, phase=JobPhase.RUNNING)
    assert ran == restarts_run == restarts_allowed(job)
    assert after.status.retry_count == max_retry
    assert f"maxRetry {max_retry} used up" in after.status.reason


def test_restart_reason_names_the_pod_the_policy_and_the_retry() -> None:
    job = make_job(policies=[RESTART])
    given = pods("master-0:R worker-0:R worker-1:F3")
    (r,) = reactions(job, PodChange("worker", 1, R, F, 3), given)
    decision = step(
        job, JobStatus(JobPhase.RUNNING), given, r.action, task=r.task, index=r.index, cause=r.cause
    )
    assert decision.status.reason == (
        "pod worker-1 failed with exit code 3; policy PodFailed -> RestartJob;"
        " restarting the job (retry 1 of maxRetry 3)"
    )
    pending = step(job, decision.status, [], Action.SYNC_JOB)
    assert pending.status.reason == "starting the pods again (retry 1 of maxRetry 3)"
    last = step(job, JobStatus(JobPhase.RUNNING, 2), given, r.action, cause=r.cause)
    assert last.status.reason == (
        "pod worker-1 failed with exit code 3; policy PodFailed -> RestartJob;"
        " maxRetry 3 used up after 2 restarts, so the job fails"
    )
    failed = step(job, last.status, apply_kill(given, last.kill), Action.SYNC_JOB)
    assert failed.status.phase is JobPhase.FAILED
    assert failed.status.reason == last.status.reason
    bare = step(job, JobStatus(JobPhase.RESTARTING, 3), [], Action.SYNC_JOB)
    assert bare.status.reason == "maxRetry 3 used up, so the job fails"


# --- targets ------------------------------------------------------------------------------------


def test_targeted_restart_without_a_target_restarts_the_job() -> None:
    given = pods("master-0:R worker-0:R worker-1:R")
    for action in (Action.RESTART_TASK, Action.RESTART_POD, Action.RESTART_PARTITION):
        decision = step(make_job(), JobStatus(JobPhase.RUNNING), given, action)
        assert kill_shape(decision.kill) == JOB_NONE
        assert "without a known target" in decision.status.reason


def test_restart_partition_stops_the_pods_of_one_partition() -> None:
    worker = task("worker", 4, extra={"partitionPolicy": {"totalPartitions": 2, "partitionSize": 2}})
    job = make_job([task("master", 1), worker])
    given = pods("master-0:R worker-0:R worker-1:R worker-2:R worker-3:F1")
    decision = step(job, JobStatus(JobPhase.RUNNING), given, Action.RESTART_PARTITION, task="worker", index=3)
    assert decision.kill is not None
    assert (decision.kill.scope, decision.kill.task, decision.kill.indices) == (
        "task",
        "worker",
        frozenset({2, 3}),
    )
    assert [p.label for p in given if decision.kill.selects(p)] == ["worker-2", "worker-3"]
    assert decision.status.reason == "restarting pods 2..3 of task worker (retry 1 of maxRetry 3)"


@pytest.mark.parametrize(
    ("kill", "selected"),
    [
        (Kill("job"), ["master-0", "worker-0", "worker-1"]),
        (Kill("job", retain=SOFT), ["master-0"]),
        (Kill("task", task="worker"), ["worker-0", "worker-1"]),
        (Kill("task", task="worker", retain=SOFT), []),
        (Kill("task", task="worker", indices=frozenset({1})), ["worker-1"]),
        (Kill("pod", task="worker", index=0), ["worker-0"]),
        (Kill("pod", task="master", index=1), []),
    ],
)
def test_kill_selects(kill: Kill, selected: list[str]) -> None:
    given = pods("master-0:R worker-0:S worker-1:F1 worker-2:R*")
    assert [p.label for p in given if kill.selects(p)] == selected
    marked = apply_kill(given, kill)
    assert [p.label for p in marked if p.terminating] == sorted([*selected, "worker-2"])
    assert apply_kill(given, None) == tuple(given)


# --- small scenarios at the step level ----------------------------------------------------------


def test_task_completed_completes_the_job() -> None:
    job = make_job(
        [task("master", 1, policies=[Policy("CompleteJob", ["TaskCompleted"])]), task("worker", 2)]
    )
    given = pods("master-0:S worker-0:R worker-1:R")
    (r,) = reactions(job, PodChange("master", 0, R, S), given)
    assert (r.event, r.action) == (Event.TASK_COMPLETED, Action.COMPLETE_JOB)
    completing = step(
        job, JobStatus(JobPhase.RUNNING), given, r.action, task=r.task, index=r.index, cause=r.cause
    )
    assert completing.status.phase is JobPhase.COMPLETING
    assert kill_shape(completing.kill) == JOB_SOFT
    assert completing.resync
    stopping = apply_kill(given, completing.kill)
    assert [p.label for p in stopping if p.terminating] == ["worker-0", "worker-1"]
    still = step(job, completing.status, stopping, Action.SYNC_JOB)
    assert (still.status.phase, still.kill) == (JobPhase.COMPLETING, None)
    done = step(job, still.status, [p for p in stopping if not p.terminating], Action.SYNC_JOB)
    assert done.status.phase is JobPhase.COMPLETED
    assert not done.resync and not done.create_pods


def test_pod_failed_restarts_the_job_and_it_runs_again() -> None:
    job = make_job(policies=[RESTART])
    given = pods("master-0:R worker-0:R worker-1:F3")
    action = resolve_action(job, Event.POD_FAILED, "worker", 3)
    restarting = step(job, JobStatus(JobPhase.RUNNING), given, action)
    assert (restarting.status.phase, restarting.status.retry_count) == (JobPhase.RESTARTING, 1)
    stopping = apply_kill(given, restarting.kill)
    assert all(p.terminating for p in stopping)
    assert step(job, restarting.status, stopping, Action.SYNC_JOB).status.phase is JobPhase.RESTARTING
    pending = step(job, restarting.status, [], Action.SYNC_JOB)
    assert (pending.status.phase, pending.create_pods, pending.resync) == (JobPhase.PENDING, True, True)
    created = pods("master-0:P worker-0:P worker-1:P")
    assert step(job, pending.status, created, Action.SYNC_JOB).status.phase is JobPhase.PENDING
    running = step(job, pending.status, pods("master-0:R worker-0:R worker-1:R"), Action.SYNC_JOB)
    assert (running.status.phase, running.status.retry_count) == (JobPhase.RUNNING, 1)


def test_resume_from_aborted() -> None:
    job = make_job()
    decision = step(job, JobStatus(JobPhase.ABORTED, 0), pods("master-0:S worker-0:F1"), Action.RESUME_JOB)
    assert (decision.status.phase, decision.status.retry_count, decision.kill) == (
        JobPhase.RESTARTING,
        1,
        None,
    )
    assert decision.resync
    again = step(job, decision.status, pods("master-0:S worker-0:F1"), Action.SYNC_JOB)
    assert again.status.phase is JobPhase.PENDING


# --- a simulated controller: plain data, no processes -------------------------------------------


@dataclass
class Sim:
    """A tiny engine: pods start, run and finish in a fixed order; kills finish at once."""

    job: Job
    exit_code: Callable[[str, int, int], int]  # (task, index, attempt) -> container exit code
    in_place: bool = False  # restartPolicy OnFailure: a failing container restarts inside its pod
    status: JobStatus = field(default_factory=initial_status)
    pods: dict[tuple[str, int], PodStatus] = field(default_factory=dict)
    attempts: dict[tuple[str, int], int] = field(default_factory=dict)
    queue: deque[PodChange] = field(default_factory=deque)
    history: list[JobPhase] = field(default_factory=lambda: [JobPhase.PENDING])

    def act(self, action: Action, task: str | None = None, index: int | None = None, cause: str = "") -> None:
        decision = step(
            self.job, self.status, list(self.pods.values()), action, task=task, index=index, cause=cause
        )
        if decision.status.phase is not self.status.phase:
            self.history.append(decision.status.phase)
        self.status = decision.status
        if decision.kill is not None:
            for key, pod in list(self.pods.items()):
                if decision.kill.selects(pod):
                    self.pods[key] = replace(pod, terminating=True)
                    self.queue.append(PodChange(pod.task, pod.index, pod.phase, None, killed=True))
        if decision.create_pods:
            for spec_task in self.job.spec.tasks:
                for i in range(spec_task.replicas):
                    key = (spec_task.name, i)
                    if key not in self.pods:
                        self.pods[key] = PodStatus(spec_task.name, i, P)
                        self.attempts[key] = self.attempts.get(key, 0) + 1
                        self.queue.append(PodChange(spec_task.name, i, None, P))
        if decision.resync:
            self.act(Action.SYNC_JOB)

    def deliver(self, change: PodChange) -> None:
        key = (change.task, change.index)
        if change.new is None:
            self.pods.pop(key, None)
        elif key in self.pods:
            self.pods[key] = replace(self.pods[key], phase=change.new, exit_code=change.exit_code)
        for r in reactions(self.job, change, list(self.pods.values())):
            assert r.delay is None
            self.act(r.action, r.task, r.index, r.cause)

    def advance(self) -> bool:
        """Move one pod along: pending ones start, then running ones finish (workers first)."""
        live = sorted(
            (p for p in self.pods.values() if not p.terminating),
            key=lambda p: (p.phase is not P, p.task == "master", p.index),
        )
        for pod in live:
            if pod.phase is P:
                self.queue.append(PodChange(pod.task, pod.index, P, R))
                return True
            if pod.phase is R:
                code = self.exit_code(
                    pod.task, pod.index, self.attempts[(pod.task, pod.index)] + pod.restarts
                )
                if code == 0:
                    self.queue.append(PodChange(pod.task, pod.index, R, S))
                elif self.in_place:
                    self.pods[(pod.task, pod.index)] = replace(pod, restarts=pod.restarts + 1)
                    self.queue.append(PodChange(pod.task, pod.index, R, R))
                else:
                    self.queue.append(PodChange(pod.task, pod.index, R, F, code))
                return True
        return False

    def run(self, limit: int = 500) -> JobPhase:
        self.act(Action.SYNC_JOB)
        for _ in range(limit):
            if self.status.phase.final:
                return self.status.phase
            if self.queue:
                self.deliver(self.queue.popleft())
            elif not self.advance():
                return self.status.phase
        raise AssertionError(f"no end after {limit} steps: {self.history}")


PYTORCH_POLICIES = {"policies": [Policy("CompleteJob", ["TaskCompleted"])]}
ONE_RUN = [JobPhase.PENDING, JobPhase.RUNNING]


def pytorch_job(**spec: Any) -> Job:
    return make_job([task("master", 1, **PYTORCH_POLICIES), task("worker", 2)], **spec)


def test_sim_clean_run_completes_through_completing() -> None:
    sim = Sim(pytorch_job(), lambda task, index, attempt: 0)
    assert sim.run() is JobPhase.COMPLETED
    assert sim.history == [*ONE_RUN, JobPhase.COMPLETING, JobPhase.COMPLETED]
    assert sim.status.retry_count == 0
    assert sim.attempts == {("master", 0): 1, ("worker", 0): 1, ("worker", 1): 1}


def test_sim_worker_fails_once_then_the_job_completes() -> None:
    def code(task: str, index: int, attempt: int) -> int:
        return 3 if (task, index, attempt) == ("worker", 1, 1) else 0

    sim = Sim(pytorch_job(policies=[RESTART]), code)
    assert sim.run() is JobPhase.COMPLETED
    assert sim.history == [
        *ONE_RUN, JobPhase.RESTARTING, *ONE_RUN, JobPhase.COMPLETING, JobPhase.COMPLETED,
    ]  # fmt: skip
    assert sim.status.retry_count == 1
    assert sim.attempts == {("master", 0): 2, ("worker", 0): 2, ("worker", 1): 2}


@pytest.mark.parametrize("max_retry", [1, 2, 3, 4])
def test_sim_worker_always_fails_uses_up_max_retry(max_retry: int) -> None:
    sim = Sim(
        pytorch_job(policies=[RESTART], max_retry=max_retry),
        lambda t, i, a: 3 if t == "worker" and i == 1 else 0,
    )
    assert sim.run() is JobPhase.FAILED
    runs = max_retry  # the first run plus maxRetry - 1 effective restarts
    assert sim.history == [*([*ONE_RUN, JobPhase.RESTARTING] * runs), JobPhase.FAILED]
    assert sim.attempts[("worker", 1)] == runs
    assert sim.status.retry_count == max_retry
    # The last attempt's evidence is still there: the failed worker and the one that succeeded.
    kept = {(p.label, p.phase, p.exit_code) for p in sim.pods.values() if not p.terminating}
    assert kept == {("worker-0", S, None), ("worker-1", F, 3)}
    assert "pod worker-1 failed with exit code 3" in sim.status.reason
    assert f"maxRetry {max_retry} used up" in sim.status.reason


def test_sim_no_policy_means_the_job_fails_at_the_end() -> None:
    sim = Sim(pytorch_job(), lambda t, i, a: 1 if t == "worker" and i == 0 else 0)
    # worker-0 fails, worker-1 succeeds, the master completes its task: CompleteJob wins
    assert sim.run() is JobPhase.COMPLETED
    plain = Sim(make_job(), lambda t, i, a: 1 if t == "worker" and i == 0 else 0)
    assert plain.run() is JobPhase.FAILED
    assert plain.history == [*ONE_RUN, JobPhase.FAILED]
    # The counts and the failed pod first: the last event, the master succeeding, is no reason to
    # fail, and once read as one ("Failed: pod master-0 succeeded; ...", issue 33).
    assert plain.status.reason == (
        "all 3 pods finished, 2 succeeded; task worker has 1 succeeded, below its minAvailable 2;"
        " failed: worker-0 (exit code 1); last event: pod master-0 succeeded and task master"
        " completed (1 of 1 succeeded)"
    )


def test_sim_min_success_completes_early() -> None:
    job = make_job([task("master", 1), task("worker", 2)], min_success=1)

    sim = Sim(job, lambda t, i, a: 0)
    assert sim.run() is JobPhase.COMPLETED
    assert sim.history == [*ONE_RUN, JobPhase.COMPLETED]
    # the first worker's success ended the job; the other two were stopped, not finished
    assert [p.label for p in sim.pods.values() if p.phase is S] == ["worker-0"]
    assert sorted(p.label for p in sim.pods.values() if p.terminating) == ["master-0", "worker-1"]


def test_sim_task_failed_from_in_place_restarts_aborts() -> None:
    job = make_job(
        [task("master", 1), task("worker", 2, max_retry=2, policies=[Policy("AbortJob", ["TaskFailed"])])]
    )
    sim = Sim(job, lambda t, i, a: 1 if t == "worker" and i == 0 else 0, in_place=True)
    assert sim.run() is JobPhase.ABORTED
    assert sim.history == [*ONE_RUN, JobPhase.ABORTING, JobPhase.ABORTED]
    assert sim.status.retry_count == 0
    assert "task worker restarted containers 2 times (task maxRetry 2)" in sim.status.reason


def test_sim_task_failed_restart_counts_against_job_max_retry() -> None:
    job = make_job(
        [task("master", 1), task("worker", 2, max_retry=1, policies=[Policy("RestartJob", ["TaskFailed"])])],
        max_retry=2,
    )
    sim = Sim(job, lambda t, i, a: 1 if t == "worker" and i == 1 else 0, in_place=True)
    assert sim.run() is JobPhase.FAILED
    assert sim.history == [*ONE_RUN, JobPhase.RESTARTING, *ONE_RUN, JobPhase.RESTARTING, JobPhase.FAILED]
    assert sim.status.retry_count == 2


def test_sim_evicted_pod_is_recreated_without_a_policy() -> None:
    job = make_job()
    sim = Sim(job, lambda t, i, a: 0)
    sim.act(Action.SYNC_JOB)
    for _ in range(20):  # start everything
        if sim.queue:
            sim.deliver(sim.queue.popleft())
        elif sim.status.phase is JobPhase.RUNNING and all(p.phase is R for p in sim.pods.values()):
            break
        else:
            sim.advance()
    assert sim.status.phase is JobPhase.RUNNING
    sim.pods.pop(("worker", 1))
    sim.deliver(PodChange("worker", 1, R, None))
    assert sim.attempts[("worker", 1)] == 2  # recreated by the sync
    assert sim.status.phase is JobPhase.RUNNING  # the new pod is queued, not yet seen as Pending
    sim.deliver(sim.queue.popleft())
    assert sim.history[-1] is JobPhase.PENDING  # one pod pending, none to spare
    assert sim.run() is JobPhase.COMPLETED


# --- properties over random states (hypothesis) ---------------------------------------------------

SLOTS = [("master", 0), ("worker", 0), ("worker", 1)]


@st.composite
def pod_sets(draw: st.DrawFn) -> list[PodStatus]:
    out = []
    for name, index in SLOTS:
        if draw(st.booleans()):
            phase = draw(st.sampled_from(list(PodPhase)))
            code = draw(st.sampled_from([1, 3, 137])) if phase is F else None
            restarts = draw(st.integers(0, 4))
            out.append(PodStatus(name, index, phase, restarts, code, draw(st.booleans())))
    return out


STATUSES = st.builds(
    JobStatus,
    phase=st.sampled_from(list(JobPhase)),
    retry_count=st.integers(0, 4),
    version=st.integers(0, 3),
    reason=st.just("before"),
)
TARGETS = st.sampled_from([(None, None), ("worker", 1), ("master", 0), ("worker", None)])
JOBS = st.builds(
    lambda max_retry, min_available, min_success: make_job(
        max_retry=max_retry, min_available=min_available, min_success=min_success
    ),
    st.integers(1, 4),
    st.integers(0, 3),
    st.sampled_from([None, 1, 2, 3]),
)


@settings(max_examples=400, deadline=None)
@given(job=JOBS, status=STATUSES, given_pods=pod_sets(), action=st.sampled_from(list(Action)), target=TARGETS)
def test_step_invariants(
    job: Job,
    status: JobStatus,
    given_pods: list[PodStatus],
    action: Action,
    target: tuple[str | None, int | None],
) -> None:
    decision = step(job, status, given_pods, action, task=target[0], index=target[1])
    new = decision.status
    check_invariants(status, given_pods, decision)
    # finished jobs stay finished; only ResumeJob brings an Aborted job back
    if status.phase.final and not (status.phase is JobPhase.ABORTED and action is Action.RESUME_JOB):
        assert new.phase is status.phase
    # one retry at most, and only for a restart in Pending/Running or a resume of an aborted job
    assert new.retry_count - status.retry_count in (0, 1)
    if new.retry_count > status.retry_count:
        assert (action.restart and status.phase in (JobPhase.PENDING, JobPhase.RUNNING)) or (
            action is Action.RESUME_JOB and status.phase in (JobPhase.ABORTING, JobPhase.ABORTED)
        )
        assert new.phase is JobPhase.RESTARTING
    if new.phase.final and decision.kill is not None:
        assert decision.kill.scope == "job" and decision.kill.retain == SOFT


@settings(max_examples=200, deadline=None)
@given(job=JOBS, status=STATUSES, given_pods=pod_sets())
def test_syncing_while_pods_stop_always_settles(
    job: Job, status: JobStatus, given_pods: list[PodStatus]
) -> None:
    """Carrying out kills and syncing again reaches a phase that waits for nothing of ours."""
    current, live = status, list(given_pods)
    for _ in range(12):
        decision = step(job, current, live, Action.SYNC_JOB)
        current = decision.status
        # the engine stops the killed pods, and the stopped ones go away
        live = [p for p in apply_kill(live, decision.kill) if not p.terminating]
    assert not current.phase.transient
    if status.phase in (JobPhase.ABORTING, JobPhase.COMPLETING, JobPhase.TERMINATING):
        assert current.phase.final
    assert all(p.phase in (S, F) for p in live) or current.phase in (JobPhase.PENDING, JobPhase.RUNNING)


CHANGES = st.builds(
    PodChange,
    st.sampled_from(["master", "worker"]),
    st.integers(0, 1),
    st.sampled_from([None, *PodPhase]),
    st.sampled_from([None, *PodPhase]),
    st.sampled_from([None, 1, 3]),
    st.booleans(),
)


@settings(max_examples=400, deadline=None)
@given(change=CHANGES, given_pods=pod_sets(), max_retry=st.sampled_from([-1, 1, 2, 3]))
def test_events_for_properties(change: PodChange, given_pods: list[PodStatus], max_retry: int) -> None:
    job = make_job([task("master", 1), task("worker", 2, max_retry=max_retry)])
    events = events_for(job, change, given_pods)
    assert events, "every change at least syncs"
    assert len(set(events)) == len(events)
    known = next((p for p in given_pods if (p.task, p.index) == (change.task, change.index)), None)
    if change.killed or (known is not None and known.terminating):
        assert events == [Event.OUT_OF_SYNC]
    if Event.POD_FAILED in events:
        assert change.new is F and change.old is not F
    if Event.TASK_COMPLETED in events:
        assert change.new is S and change.old is not S
    if Event.POD_EVICTED in events:
        assert change.new is None
    if Event.TASK_FAILED in events:
        assert change.new in (P, R) and task_max_retry(job, change.task) is not None
    if Event.OUT_OF_SYNC in events:
        assert events == [Event.OUT_OF_SYNC]
    for event in events:  # whatever the events, resolution never fails
        resolve(job, event, change.task, change.exit_code)


# ------------------------------------------------------------------ gates: dependsOn, deadline


def gated_job(iteration: str = "any", names: Sequence[str] = ("master", "ps")) -> Job:
    """master (2 pods, minAvailable 1), ps (1 pod), worker (dependsOn master/ps), solo (none)."""
    return make_job(
        [
            task("master", 2, min_available=1),
            task("ps", 1),
            task("worker", 2, depends_on=DependsOn(list(names), iteration)),
            task("solo", 1),
        ]
    )


@pytest.mark.parametrize(
    ("state", "ready"),
    [
        ("", False),
        ("master-0:P master-1:P", False),
        ("master-0:R", True),  # minAvailable 1 of 2
        ("master-0:S", True),  # succeeded counts like running
        ("master-0:F master-1:F", False),
        ("master-0:R* master-1:P", False),  # a pod being stopped does not count
        ("master-0:S* master-1:R", True),
        ("worker-0:R worker-1:R ps-0:R", False),  # other tasks' pods do not count
    ],
)
def test_task_ready_counts_running_and_succeeded_pods_up_to_min_available(state: str, ready: bool) -> None:
    assert task_ready(gated_job(), "master", pods(state)) is ready


def test_task_ready_without_min_available_needs_every_replica() -> None:
    job = Job(Metadata("demo"), JobSpec(tasks=[task("ps", 2)]))  # not defaulted: minAvailable unset
    assert not task_ready(job, "ps", pods("ps-0:R ps-1:P"))
    assert task_ready(job, "ps", pods("ps-0:R ps-1:S"))


def test_task_ready_of_an_unknown_task_or_no_replicas() -> None:
    assert task_ready(gated_job(), "nosuch", [])
    assert task_ready(make_job([task("empty", 0)]), "empty", [])


@pytest.mark.parametrize(
    ("iteration", "state", "ready"),
    [
        ("any", "", False),
        ("any", "master-0:R", True),
        ("any", "ps-0:R", True),
        ("any", "master-0:R ps-0:R", True),
        ("any", "master-0:F ps-0:P", False),
        ("all", "master-0:R", False),
        ("all", "ps-0:R", False),
        ("all", "master-0:R ps-0:R", True),
        ("all", "master-0:R ps-0:R*", False),
        ("all", "master-0:S ps-0:S", True),
    ],
)
def test_dependencies_ready_any_or_all(iteration: str, state: str, ready: bool) -> None:
    assert dependencies_ready(gated_job(iteration), "worker", pods(state)) is ready


@pytest.mark.parametrize(
    ("state", "ready", "failed"),
    [
        ("master-0:R master-1:R ps-0:R", False, None),  # running is not complete
        ("master-0:S master-1:R ps-0:R", False, None),  # every pod, not minAvailable
        ("master-0:S master-1:S ps-0:R", True, None),  # ps: running is enough
        ("master-0:S master-1:S* ps-0:R", False, None),  # a pod being stopped does not count
        ("master-0:S master-1:F ps-0:R", False, "master-1"),  # failed: never, unless restarted
        ("master-0:S master-1:S ps-0:F", False, None),  # ps is not waited for to complete
    ],
)
def test_a_dependency_on_completion_needs_every_pod_succeeded(
    state: str, ready: bool, failed: str | None
) -> None:
    """JobSet's ``dependsOn`` status Complete: the named tasks' pods all succeeded."""
    job = gated_job("all")
    worker = job.task("worker")
    assert worker is not None and worker.depends_on is not None
    worker.depends_on.complete = ["master"]
    assert dependencies_ready(job, "worker", pods(state)) is ready
    blocked = never_ready(job, "worker", pods(state))
    assert (blocked.label if blocked is not None else None) == failed


def test_dependencies_ready_without_dependencies() -> None:
    job = gated_job()
    assert dependencies_ready(job, "solo", [])  # no dependsOn
    assert dependencies_ready(job, "master", [])
    assert dependencies_ready(job, "nosuch", [])  # unknown task: nothing to wait for
    assert dependencies_ready(gated_job(names=()), "worker", [])  # dependsOn with no names


def test_dependencies_on_an_unknown_task_are_met() -> None:
    """A name no task has holds nothing up (validation refuses it before a job runs)."""
    assert dependencies_ready(gated_job("all", names=("nosuch",)), "worker", [])
    assert not dependencies_ready(gated_job("all", names=("nosuch", "ps")), "worker", [])


@pytest.mark.parametrize(
    ("timeout", "own", "expected"),
    [
        (None, None, None),
        (0, None, None),  # 0 means no limit, as an unset field
        (None, 0, None),
        (30, None, 30.0),
        (None, 20, 20.0),
        (30, 20, 20.0),  # the shorter wins
        (10, 20, 10.0),
        (0.5, 0, 0.5),
    ],
)
def test_active_deadline_is_the_shorter_limit(
    timeout: float | None, own: int | None, expected: float | None
) -> None:
    job = make_job()
    if own is not None:
        job = replace(job, run_policy=JobRunPolicy(active_deadline_seconds=own))
    assert active_deadline(job, timeout) == expected
    if expected is not None:
        assert isinstance(active_deadline(job, timeout), float)


@pytest.mark.parametrize("phase", list(JobPhase))
def test_deadline_passed_in_every_phase(phase: JobPhase) -> None:
    ending = phase.final or phase is JobPhase.TERMINATING
    assert deadline_passed(10.0, phase, 10.5) is not ending
    assert not deadline_passed(10.0, phase, 10.0)  # only once it is over
    assert not deadline_passed(10.0, phase, 3.0)
    assert not deadline_passed(None, phase, 1e9)
