"""The engine-neutral controller, driven over a fake pod runtime and a fake clock (no processes).

Each test plays what a runtime would observe (a pod runs, fails, restarts in place, ends) and
checks what the controller makes of it: the job's phase, which attempts it creates, terminates
and forgets, and what it tells the user.
"""

from __future__ import annotations

from collections.abc import Sequence

from torchjob.controller import Backoff, Controller, waiting_backoff
from torchjob.expand import DesiredState, PodPlan, expand
from torchjob.jobs import load_jobs_from_text
from torchjob.lifecycle import JobPhase, JobStatus
from torchjob.logs import Level
from torchjob.spec.model import Job

Key = tuple[str, int]


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class FakePod:
    """One attempt, as a runtime would report it; tests set its phase, restarts and exit code."""

    def __init__(self, plan: PodPlan, attempt: int) -> None:
        self.task, self.index, self.name = plan.task.name, plan.index, plan.name
        self.attempt = attempt
        self.phase = "Pending"
        self.restarts = 0
        self.exit_code: int | None = None
        self.terminating = False
        self.gone = False
        self.finished_at: float | None = None
        self.rank: int | None = None
        self.failures = 0  # consecutive failures of its container (for the crash-loop notice)


class FakeRuntime:
    """Records what the controller asks; a terminated attempt is gone at the next poll."""

    def __init__(self) -> None:
        self.created: list[tuple[Key, int]] = []  # (slot, attempt) in creation order
        self.attempts: dict[Key, int] = {}
        self.terminated: list[tuple[Key, float]] = []  # (slot, grace)
        self.killed: list[Key] = []
        self.forgotten: list[Key] = []
        self.notes: list[str] = []
        self.events: list[str] = []
        self.live: dict[Key, FakePod] = {}

    def create(self, plan: PodPlan, status: JobStatus) -> FakePod:
        key = (plan.task.name, plan.index)
        attempt = self.attempts.get(key, -1) + 1
        self.attempts[key] = attempt
        pod = FakePod(plan, attempt)
        self.created.append((key, attempt))
        self.live[key] = pod
        return pod

    def poll(self, attempts: Sequence[FakePod]) -> None:
        for pod in attempts:
            if pod.terminating:
                pod.gone = True

    def terminate(self, attempts: Sequence[tuple[FakePod, float]]) -> None:
        for pod, grace in attempts:
            if not pod.terminating:
                pod.terminating = True
                self.terminated.append(((pod.task, pod.index), grace))

    def kill(self, attempts: Sequence[FakePod]) -> None:
        self.killed += [(p.task, p.index) for p in attempts]

    def forget(self, attempts: Sequence[FakePod]) -> None:
        self.forgotten += [(p.task, p.index) for p in attempts]

    def observed(self, attempt: FakePod, restarted: bool) -> None:
        pass

    def backoff(self, attempt: FakePod) -> Backoff | None:
        if not attempt.failures:
            return None
        return Backoff("main", attempt.failures, attempt.exit_code, 10.0)

    def note(self, text: str, level: Level) -> None:
        self.notes.append(text)

    def record(self, text: str) -> None:
        self.events.append(text)


def job_of(text: str) -> Job:
    return load_jobs_from_text(text)[0].job


def tasks_yaml(*tasks: str, spec: str = "") -> str:
    body = "".join(tasks)
    head = "apiVersion: batch.volcano.sh/v1alpha1\nkind: Job\nmetadata: {name: j}\nspec:\n"
    return f"{head}{spec}  tasks:\n{body}"


def task_yaml(name: str, replicas: int, extra: str = "") -> str:
    return (
        f"  - name: {name}\n    replicas: {replicas}\n{extra}"
        "    template:\n      spec:\n        restartPolicy: Never\n"
        "        containers: [{name: main, image: img, command: ['true']}]\n"
    )


def controller(job: Job, **kw: object) -> tuple[Controller[FakePod], FakeRuntime, FakeClock]:
    runtime, clock = FakeRuntime(), FakeClock()
    expansions: dict[tuple[int, int], DesiredState] = {}

    def expansion(version: int, retry_count: int) -> DesiredState:
        if (version, retry_count) not in expansions:
            expansions[(version, retry_count)] = expand(job, version=version, retry_count=retry_count)
        return expansions[(version, retry_count)]

    ctl: Controller[FakePod] = Controller(job, runtime, expansion, clock=clock, **kw)  # type: ignore[arg-type]
    return ctl, runtime, clock


def set_all(runtime: FakeRuntime, phase: str, exit_code: int | None = None, task: str | None = None) -> None:
    for key, pod in runtime.live.items():
        if task is None or key[0] == task:
            pod.phase = phase
            pod.exit_code = exit_code


def test_every_pod_succeeds_and_the_job_completes() -> None:
    ctl, runtime, _clock = controller(job_of(tasks_yaml(task_yaml("master", 1), task_yaml("worker", 2))))
    ctl.begin()
    assert runtime.created == [(("master", 0), 0), (("worker", 0), 0), (("worker", 1), 0)]
    ctl.tick()
    assert ctl.status.phase is JobPhase.PENDING
    set_all(runtime, "Running")
    ctl.tick()
    assert ctl.status.phase is JobPhase.RUNNING
    set_all(runtime, "Succeeded", 0)
    ctl.tick()
    assert ctl.status.phase is JobPhase.COMPLETED
    assert ctl.done()
    assert runtime.terminated == []


def test_a_failed_pod_restarts_the_job_until_max_retry_fails_it() -> None:
    extra = "  maxRetry: 2\n  policies: [{event: PodFailed, action: RestartJob}]\n"
    ctl, runtime, _clock = controller(job_of(tasks_yaml(task_yaml("worker", 2), spec=extra)))
    ctl.begin()
    set_all(runtime, "Running")
    ctl.tick()
    assert ctl.status.phase is JobPhase.RUNNING
    runtime.live[("worker", 1)].phase = "Failed"
    runtime.live[("worker", 1)].exit_code = 3
    ctl.tick()
    assert ctl.status.phase in (JobPhase.RESTARTING, JobPhase.PENDING)
    assert ("worker", 0) in [k for k, _ in runtime.terminated]  # the whole job is restarted
    for _ in range(3):  # the killed attempts go, then the job's pods are made again
        ctl.tick()
    assert sorted(a for k, a in runtime.created if a == 1) == [1, 1]
    assert ctl.status.retry_count == 1
    assert set(runtime.forgotten) >= {("worker", 0)}
    set_all(runtime, "Running")
    ctl.tick()
    runtime.live[("worker", 0)].phase = "Failed"
    runtime.live[("worker", 0)].exit_code = 1
    for _ in range(3):
        ctl.tick()
    assert ctl.status.phase is JobPhase.FAILED  # maxRetry 2: the second restart action fails it
    assert "worker" in ctl.status.reason
    assert max(a for _, a in runtime.created) == 1  # no third attempt
    assert ctl.done()


def test_depends_on_holds_a_task_until_its_dependency_runs() -> None:
    job = job_of(
        tasks_yaml(task_yaml("master", 1), task_yaml("worker", 2, "    dependsOn: {name: [master]}\n"))
    )
    ctl, runtime, _clock = controller(job)
    ctl.begin()
    ctl.tick()
    assert [k for k, _ in runtime.created] == [("master", 0)]
    assert any("task worker waits for task(s) master" in n for n in runtime.notes)
    runtime.live[("master", 0)].phase = "Running"
    ctl.tick()
    assert [k for k, _ in runtime.created] == [("master", 0), ("worker", 0), ("worker", 1)]
    assert "worker" not in ctl.waiting


def test_a_task_waiting_for_a_failed_task_to_complete_fails_the_job() -> None:
    """No policy restarts the failed pod: the waiting task would never start, and the job would
    wait for ever; it fails, naming what it waited for (as JobSet fails the set for a failed Job)."""
    job = job_of(tasks_yaml(task_yaml("init", 1), task_yaml("train", 2, "    dependsOn: {name: [init]}\n")))
    train = job.task("train")
    assert train is not None and train.depends_on is not None
    train.depends_on.complete = ["init"]
    ctl, runtime, _clock = controller(job)
    ctl.begin()
    runtime.live[("init", 0)].phase = "Running"
    ctl.tick()
    assert any("task train waits for task(s) init to complete" in n for n in runtime.notes)
    assert [k for k, _ in runtime.created] == [("init", 0)]  # running is not enough
    runtime.live[("init", 0)].phase = "Failed"
    runtime.live[("init", 0)].exit_code = 1
    ctl.tick()
    assert ctl.status.phase is JobPhase.FAILED
    assert "task train cannot start: it waits for task init to complete, and its pod init-0 failed" in (
        ctl.status.reason
    )
    assert [k for k, _ in runtime.created] == [("init", 0)]


def test_the_deadline_terminates_the_job_on_the_given_clock() -> None:
    ctl, runtime, clock = controller(job_of(tasks_yaml(task_yaml("worker", 2))), timeout=60.0)
    ctl.begin()
    set_all(runtime, "Running")
    ctl.tick()
    clock.advance(59)
    ctl.tick()
    assert ctl.status.phase is JobPhase.RUNNING and runtime.terminated == []
    assert ctl.next_due() == 1.0
    clock.advance(2)
    ctl.tick()
    assert {k for k, _ in runtime.terminated} == {("worker", 0), ("worker", 1)}
    assert all(grace == 5.0 for _, grace in runtime.terminated)  # no terminationGracePeriodSeconds
    for _ in range(3):
        ctl.tick()
    assert ctl.status.phase is JobPhase.TERMINATED
    assert "deadline of 60s passed" in ctl.status.reason
    assert ctl.done()


def test_a_policy_timeout_delays_its_action_and_a_later_event_cancels_it() -> None:
    extra = "  policies: [{event: PodPending, action: AbortJob, timeout: 30s}]\n"
    job = job_of(tasks_yaml(task_yaml("worker", 1), spec=extra))
    # The pod stays Pending past the timeout: the job is aborted then, not before.
    ctl, runtime, clock = controller(job)
    ctl.begin()
    ctl.tick()
    clock.advance(29)
    ctl.tick()
    assert ctl.status.phase is JobPhase.PENDING and runtime.terminated == []
    assert ctl.next_due() == 1.0
    clock.advance(1)
    ctl.tick()
    for _ in range(3):
        ctl.tick()
    assert ctl.status.phase is JobPhase.ABORTED
    assert "after its timeout" in ctl.status.reason
    # The pod runs within the timeout: the delayed abort is dropped.
    ctl, runtime, clock = controller(job)
    ctl.begin()
    ctl.tick()
    clock.advance(10)
    runtime.live[("worker", 0)].phase = "Running"
    ctl.tick()
    assert ctl.delayed == [] and ctl.next_due() is None
    clock.advance(60)
    ctl.tick()
    assert ctl.status.phase is JobPhase.RUNNING


def test_max_restarts_fails_a_job_whose_pod_restarts_in_place_too_often() -> None:
    ctl, runtime, _clock = controller(job_of(tasks_yaml(task_yaml("worker", 1))), max_restarts=2)
    ctl.begin()
    pod = runtime.live[("worker", 0)]
    pod.phase = "Running"
    ctl.tick()
    for restarts in (1, 2):
        pod.restarts, pod.failures, pod.exit_code = restarts, restarts, 1
        ctl.tick()
        assert ctl.status.phase is JobPhase.RUNNING
    pod.restarts = 3
    ctl.tick()
    assert ctl.status.phase is JobPhase.FAILED
    assert ctl.status.reason == "pod worker-0 restarted 3 times, more than --max-restarts 2"
    assert runtime.terminated == [(("worker", 0), 5.0)]
    ctl.tick()
    assert ctl.done()


def test_a_crash_loop_is_told_once_without_max_restarts() -> None:
    ctl, runtime, _clock = controller(job_of(tasks_yaml(task_yaml("worker", 1))))
    ctl.begin()
    pod = runtime.live[("worker", 0)]
    pod.phase = "Running"
    ctl.tick()
    for restarts in range(1, 6):
        pod.restarts, pod.failures, pod.exit_code = restarts, restarts, 7
        ctl.tick()
    loops = [n for n in runtime.notes if "CrashLoopBackOff" in n]
    assert len(loops) == 1
    assert "ended 3 times in a row (last exit code 7)" in loops[0]
    assert "--max-restarts N fails the job instead" in loops[0]
    assert ctl.status.phase is JobPhase.RUNNING


def test_complete_job_stops_the_other_pods() -> None:
    master = task_yaml("master", 1, "    policies: [{event: TaskCompleted, action: CompleteJob}]\n")
    ctl, runtime, _clock = controller(job_of(tasks_yaml(master, task_yaml("worker", 2))))
    ctl.begin()
    set_all(runtime, "Running")
    ctl.tick()
    set_all(runtime, "Succeeded", 0, task="master")
    ctl.tick()
    assert {k for k, _ in runtime.terminated} == {("worker", 0), ("worker", 1)}
    assert ctl.status.phase in (JobPhase.COMPLETING, JobPhase.COMPLETED)
    for _ in range(3):
        ctl.tick()
    assert ctl.status.phase is JobPhase.COMPLETED
    assert set(runtime.forgotten) == {("worker", 0), ("worker", 1)}
    assert ctl.done()


def test_an_admission_gate_holds_pods_it_does_not_admit() -> None:
    granted = {("worker", 0)}
    ctl, runtime, _clock = controller(
        job_of(tasks_yaml(task_yaml("worker", 2))), admits=lambda task, index: (task, index) in granted
    )
    ctl.begin()
    assert [k for k, _ in runtime.created] == [("worker", 0)]
    granted.add(("worker", 1))
    ctl.create_missing()
    assert [k for k, _ in runtime.created] == [("worker", 0), ("worker", 1)]


def test_a_grace_period_of_the_template_reaches_the_runtime() -> None:
    text = tasks_yaml(task_yaml("worker", 1)).replace(
        "restartPolicy: Never", "restartPolicy: Never\n        terminationGracePeriodSeconds: 12"
    )
    ctl, runtime, _clock = controller(job_of(text))
    ctl.begin()
    ctl.fail_job("stopped by the test")
    assert runtime.terminated == [(("worker", 0), 12.0)]
    assert runtime.notes[-1] == "job Failed: stopped by the test"


def test_the_back_off_an_attempt_waits_out_is_its_first_waiting_container() -> None:
    # Both pod runtimes (local, Slurm) answer ``backoff`` with this: the first container that has
    # a next start, with the time left (never negative); None when no container waits.
    assert waiting_backoff([("init", 0, None, None), ("main", 0, 0, None)], now=50.0) is None
    waiting = [("init", 0, None, None), ("main", 3, 7, 52.5), ("side", 1, 1, 60.0)]
    assert waiting_backoff(waiting, now=50.0) == Backoff("main", 3, 7, 2.5)
    assert waiting_backoff(waiting, now=53.0) == Backoff("main", 3, 7, 0.0)
    # A due time of 0.0 is a real (long passed) deadline: due now, not "not scheduled".
    assert waiting_backoff([("main", 1, 1, 0.0)], now=5.0) == Backoff("main", 1, 1, 0.0)


def _origin(spec: str, origin: str) -> str:
    """A job as torchjob makes it from a script or an SDK task: its origin annotation."""
    meta = f"metadata:\n  name: j\n  annotations: {{torchjob.io/origin: {origin}}}\n"
    head = f"apiVersion: batch.volcano.sh/v1alpha1\nkind: Job\n{meta}spec:\n"
    return f"{head}{spec}  tasks:\n{task_yaml('master', 1)}{task_yaml('worker', 2)}"


def _fail_worker(ctl: Controller[FakePod], runtime: FakeRuntime) -> None:
    ctl.begin()
    set_all(runtime, "Running")
    ctl.tick()
    runtime.live[("worker", 1)].rank = 2
    runtime.live[("worker", 1)].phase = "Failed"
    runtime.live[("worker", 1)].exit_code = 1
    for _ in range(3):
        ctl.tick()


def test_a_scripts_first_failure_fails_it_in_the_users_terms() -> None:
    """``run -j`` makes PodFailed -> RestartJob with maxRetry 1: the job fails, told as such, not as
    a restart that used up maxRetry; nothing restarted, so the retry count stays 0."""
    spec = "  maxRetry: 1\n  policies: [{event: PodFailed, action: RestartJob}]\n"
    ctl, runtime, _clock = controller(job_of(_origin(spec, "script")), attached=True)
    _fail_worker(ctl, runtime)
    assert (ctl.status.phase, ctl.status.retry_count) == (JobPhase.FAILED, 0)
    assert ctl.status.reason == "rank 2 (pod worker-1) failed with exit code 1; nothing was restarted"
    said = "\n".join([*runtime.notes, *runtime.events])
    assert "maxRetry" not in said and "Restarting" not in said and "policy" not in said, said
    assert max(a for _, a in runtime.created) == 0  # no second attempt
    assert ctl.done()


def test_an_sdk_task_whose_rank_raised_fails_rather_than_terminates() -> None:
    spec = "  policies: [{event: PodFailed, action: TerminateJob}]\n"
    ctl, runtime, _clock = controller(job_of(_origin(spec, "task")))
    _fail_worker(ctl, runtime)
    assert ctl.status.phase is JobPhase.FAILED
    assert ctl.status.reason.startswith("rank 2 (pod worker-1) failed with exit code 1")


def test_an_sdk_task_with_a_backoff_limit_restarts_then_fails_saying_how_often() -> None:
    spec = "  maxRetry: 2\n  policies: [{event: PodFailed, action: RestartJob}]\n"
    ctl, runtime, _clock = controller(job_of(_origin(spec, "task")))
    _fail_worker(ctl, runtime)
    assert ctl.status.retry_count == 1 and not ctl.status.phase.final  # one restart: backoff_limit 1
    set_all(runtime, "Running")
    ctl.tick()
    runtime.live[("worker", 1)].phase = "Failed"
    runtime.live[("worker", 1)].exit_code = 1
    for _ in range(3):
        ctl.tick()
    assert ctl.status.phase is JobPhase.FAILED
    assert ctl.status.reason == "pod worker-1 failed with exit code 1; after 1 restart of the job"


def test_a_job_file_keeps_volcanos_words() -> None:
    extra = "  maxRetry: 1\n  policies: [{event: PodFailed, action: RestartJob}]\n"
    ctl, runtime, _clock = controller(job_of(tasks_yaml(task_yaml("worker", 2), spec=extra)))
    _fail_worker(ctl, runtime)
    assert ctl.status.phase is JobPhase.FAILED and "maxRetry 1 used up" in ctl.status.reason
    assert any("policy PodFailed -> RestartJob" in e for e in runtime.events)
