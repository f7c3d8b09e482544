"""The job state machine: (status, pods, action) -> Decision (Volcano's ``pkg/controllers/job/state``)."""

from __future__ import annotations

from collections.abc import Sequence

from torchjob.lifecycle.types import (
    RETAIN_NONE,
    RETAIN_SOFT,
    Action,
    Decision,
    JobPhase,
    JobStatus,
    Kill,
    PodPhase,
    PodStatus,
    apply_kill,
    pod_label,
)
from torchjob.records import field, record
from torchjob.spec.model import Job

# The action that ends a job in a given phase, and the phase it passes through on the way.
_ENDINGS = {
    Action.ABORT_JOB: JobPhase.ABORTING,
    Action.COMPLETE_JOB: JobPhase.COMPLETING,
    Action.TERMINATE_JOB: JobPhase.TERMINATING,
}
# Draining phases and where they land once no pod is pending, running or terminating.
_DRAINS = {
    JobPhase.ABORTING: JobPhase.ABORTED,
    JobPhase.COMPLETING: JobPhase.COMPLETED,
    JobPhase.TERMINATING: JobPhase.TERMINATED,
}
_TARGETED = (Action.RESTART_TASK, Action.RESTART_POD, Action.RESTART_PARTITION)


@record
class Counts:
    """Pods by phase; a terminating pod counts only as terminating (like Volcano's status)."""

    pending: int = 0
    running: int = 0
    succeeded: int = 0
    failed: int = 0
    terminating: int = 0
    task_succeeded: dict[str, int] = field(default_factory=dict)  # only tasks with a counted pod

    @classmethod
    def of(cls, pods: Sequence[PodStatus]) -> Counts:
        counts = cls()
        for pod in pods:
            if pod.terminating:
                counts.terminating += 1
                continue
            done = counts.task_succeeded.setdefault(pod.task, 0)
            if pod.phase is PodPhase.PENDING:
                counts.pending += 1
            elif pod.phase is PodPhase.RUNNING:
                counts.running += 1
            elif pod.phase is PodPhase.SUCCEEDED:
                counts.succeeded += 1
                counts.task_succeeded[pod.task] = done + 1
            else:
                counts.failed += 1
        return counts

    @property
    def active(self) -> int:
        """Pods that still hold resources: pending, running or being stopped."""
        return self.pending + self.running + self.terminating


def _pods(n: int) -> str:
    return f"{n} pod" if n == 1 else f"{n} pods"


def _text(cause: str, text: str) -> str:
    return f"{cause}; {text}" if cause and text else cause or text


class _Step:
    """One call of :func:`step`; holds the inputs so the per-phase rules read like the table."""

    def __init__(
        self,
        job: Job,
        status: JobStatus,
        pods: Sequence[PodStatus],
        action: Action,
        task: str | None,
        index: int | None,
        cause: str,
    ) -> None:
        self.job = job
        self.status = status
        self.pods = tuple(pods)
        self.action = action
        self.task = task
        self.index = index
        self.cause = cause

    # --- building blocks -------------------------------------------------------------------

    def decide(
        self,
        phase: JobPhase,
        kill: Kill | None,
        reason: str | None = None,
        retry_count: int | None = None,
    ) -> Decision:
        """The Decision for moving to ``phase`` after issuing ``kill`` (dropped if it stops nothing)."""
        if phase.final:
            # A finished job keeps nothing running, whatever narrower kill led here (minSuccess
            # reached, Restarting -> Failed after a RestartPod): stop every live pod, keep the rest.
            kill = Kill("job", retain=RETAIN_SOFT)
        if kill is not None and not any(kill.selects(p) for p in self.pods):
            kill = None
        version = self.status.version + (1 if kill is not None and kill.scope == "job" else 0)
        status = JobStatus(
            phase=phase,
            retry_count=self.status.retry_count if retry_count is None else retry_count,
            version=version,
            reason=self.status.reason if reason is None else reason,
        )
        changed = phase is not self.status.phase
        return Decision(
            status=status,
            kill=kill,
            create_pods=phase in (JobPhase.PENDING, JobPhase.RUNNING),
            resync=changed and not phase.final,
        )

    def counts_after(self, kill: Kill | None) -> Counts:
        return Counts.of(apply_kill(self.pods, kill))

    @property
    def max_retry(self) -> int:
        return self.job.spec.max_retry

    def retain_for_restart(self, retry_after: int) -> frozenset[PodPhase]:
        """Keep finished pods when this restart uses up the budget: the job fails, they are its evidence."""
        return RETAIN_SOFT if retry_after >= self.max_retry else RETAIN_NONE

    def target_kill(self, retain: frozenset[PodPhase]) -> tuple[Kill, str]:
        """The kill of a targeted restart and a description; a whole-job kill if no target is known."""
        task, index = self.task, self.index
        spec_task = self.job.task(task) if task is not None else None
        if self.action is Action.RESTART_TASK and spec_task is not None and task is not None:
            return Kill("task", task=task, retain=retain), f"restarting task {task}"
        if task is not None and index is not None and spec_task is not None:
            if self.action is Action.RESTART_PARTITION:
                size = _partition_size(spec_task.extra)
                if size:
                    first = index - index % size
                    indices = frozenset(range(first, first + size))
                    return (
                        Kill("task", task=task, retain=retain, indices=indices),
                        f"restarting pods {first}..{first + size - 1} of task {task}",
                    )
            kill = Kill("pod", task=task, index=index, retain=retain)
            return kill, f"restarting pod {pod_label(task, index)}"
        return Kill("job", retain=retain), f"{self.action.value} without a known target: restarting the job"

    # --- actions shared by several phases --------------------------------------------------

    def retry_note(self, what: str, retry: int) -> str:
        """``restarting the job (retry 1 of maxRetry 3)``, or why this retry ends the job instead."""
        if retry >= self.max_retry:
            return f"maxRetry {self.max_retry} used up after {retry - 1} restarts, so the job fails"
        return f"{what} (retry {retry} of maxRetry {self.max_retry})"

    def restart(self) -> Decision:
        """A restart action in Pending/Running: kill, one more retry, -> Restarting."""
        retry = self.status.retry_count + 1
        retain = self.retain_for_restart(retry)
        if self.action is Action.RESTART_JOB:
            kill, what = Kill("job", retain=retain), "restarting the job"
        else:
            kill, what = self.target_kill(retain)
        return self.decide(JobPhase.RESTARTING, kill, _text(self.cause, self.retry_note(what, retry)), retry)

    def end(self) -> Decision:
        """AbortJob / CompleteJob / TerminateJob: stop what runs, keep finished pods, drain."""
        phase = _ENDINGS[self.action]
        kill = Kill("job", retain=RETAIN_SOFT)
        return self.decide(phase, kill, _text(self.cause, f"{self.action.value}: stopping the job's pods"))

    def resume(self) -> Decision:
        retry = self.status.retry_count + 1
        note = self.retry_note("resuming the job", retry)
        kill = Kill("job", retain=RETAIN_SOFT)
        return self.decide(JobPhase.RESTARTING, kill, _text(self.cause, note), retry)

    # --- phases ----------------------------------------------------------------------------

    def pending(self) -> Decision:
        if self.action.restart:
            return self.restart()
        if self.action in _ENDINGS:
            return self.end()
        counts = self.counts_after(None)
        started = counts.running + counts.succeeded + counts.failed
        need = self.job.spec.min_available
        if need <= started:
            text = f"{started} of {_pods(self.job.total_replicas)} started (minAvailable {need})"
            return self.decide(JobPhase.RUNNING, None, text)
        return self.decide(JobPhase.PENDING, None)

    def running(self) -> Decision:
        if self.action.restart:
            return self.restart()
        if self.action in _ENDINGS:
            return self.end()
        phase, text = self.running_sync(self.counts_after(None))
        if phase is JobPhase.FAILED:
            # The counts and the failed pods say why, so they come first; the change that ended
            # the job (often the last pod succeeding) read as its reason: "Failed: pod w-2 succeeded".
            last = f"; last event: {self.cause}" if self.cause else ""
            return self.decide(phase, None, f"{text}; failed: {_failed_pods(self.pods)}{last}")
        return self.decide(phase, None, None if phase is JobPhase.RUNNING else _text(self.cause, text))

    def running_sync(self, counts: Counts) -> tuple[JobPhase, str]:
        """Volcano's Running-phase sync rules, in their order."""
        spec = self.job.spec
        total = self.job.total_replicas
        if total == 0:
            return JobPhase.RUNNING, ""
        ok, bad = counts.succeeded, counts.failed
        if spec.min_success is not None and ok >= spec.min_success:
            return JobPhase.COMPLETED, f"{_pods(ok)} succeeded, minSuccess {spec.min_success} reached"
        if ok + bad == total:
            done = (
                f"all {total} pods finished, {ok} succeeded"
                if total != 1
                else f"the pod finished, {ok} succeeded"
            )
            task_min_total = sum(
                t.replicas if t.min_available is None else t.min_available for t in spec.tasks
            )
            if spec.min_available >= task_min_total:
                for task in spec.tasks:
                    got = counts.task_succeeded.get(task.name)
                    if task.min_available is not None and got is not None and got < task.min_available:
                        return JobPhase.FAILED, (
                            f"{done}; task {task.name} has {got} succeeded, below its minAvailable"
                            f" {task.min_available}"
                        )
            if spec.min_success is not None and ok < spec.min_success:
                return JobPhase.FAILED, f"{done}, below minSuccess {spec.min_success}"
            if ok >= spec.min_available:
                return JobPhase.COMPLETED, f"{done} (minAvailable {spec.min_available})"
            return JobPhase.FAILED, f"{done}, below minAvailable {spec.min_available}"
        spare = total - spec.min_available
        if counts.pending > spare:
            return JobPhase.PENDING, (
                f"{_pods(counts.pending)} pending, more than the {spare} the job can spare"
                f" ({total} pods, minAvailable {spec.min_available})"
            )
        return JobPhase.RUNNING, ""

    def restarting(self) -> Decision:
        retain = self.retain_for_restart(self.status.retry_count)
        kill: Kill | None
        if self.action is Action.SYNC_JOB:
            kill = None
        elif self.action in _ENDINGS:
            # Volcano lets a restart swallow AbortJob/CompleteJob/TerminateJob; torchjob honours them.
            return self.end()
        elif self.action in _TARGETED:
            kill = self.target_kill(retain)[0]
        else:  # RestartJob, ResumeJob: stop everything again, no extra retry
            kill = Kill("job", retain=retain)
        counts = self.counts_after(kill)
        if self.status.retry_count >= self.max_retry:
            # The restart that got here already said why the job fails (see retry_note).
            fallback = f"maxRetry {self.max_retry} used up, so the job fails"
            return self.decide(JobPhase.FAILED, kill, self.status.reason or fallback)
        if self.job.total_replicas - counts.terminating >= self.job.spec.min_available:
            text = f"starting the pods again (retry {self.status.retry_count} of maxRetry {self.max_retry})"
            return self.decide(JobPhase.PENDING, kill, text)
        return self.decide(JobPhase.RESTARTING, kill)

    def draining(self) -> Decision:
        if self.action is Action.RESUME_JOB and self.status.phase is JobPhase.ABORTING:
            return self.resume()
        kill = Kill("job", retain=RETAIN_SOFT)
        counts = self.counts_after(kill)
        if counts.active == 0:
            target = _DRAINS[self.status.phase]
            return self.decide(target, kill, _text(self.status.reason, "all pods stopped"))
        return self.decide(self.status.phase, kill)

    def finished(self) -> Decision:
        if self.action is Action.RESUME_JOB and self.status.phase is JobPhase.ABORTED:
            return self.resume()
        return self.decide(self.status.phase, Kill("job", retain=RETAIN_SOFT))

    def run(self) -> Decision:
        phase = self.status.phase
        if phase is JobPhase.PENDING:
            return self.pending()
        if phase is JobPhase.RUNNING:
            return self.running()
        if phase is JobPhase.RESTARTING:
            return self.restarting()
        if phase in _DRAINS:
            return self.draining()
        return self.finished()


def _failed_pods(pods: Sequence[PodStatus], limit: int = 3) -> str:
    """``worker-1 (exit code 3), master-0 (exit code 1)`` for the failed pods, the first few of them."""
    failed = [p for p in pods if p.phase is PodPhase.FAILED and not p.terminating]
    if not failed:
        return "none"
    parts = [
        p.label + (f" (exit code {p.exit_code})" if p.exit_code is not None else "") for p in failed[:limit]
    ]
    if len(failed) > limit:
        parts.append(f"{len(failed) - limit} more")
    return ", ".join(parts)


def _partition_size(extra: dict[str, object]) -> int:
    partition = extra.get("partitionPolicy")
    if isinstance(partition, dict):
        size = partition.get("partitionSize")
        if isinstance(size, int) and size > 0:
            return size
    return 0


def step(
    job: Job,
    status: JobStatus,
    pods: Sequence[PodStatus],
    action: Action,
    *,
    task: str | None = None,
    index: int | None = None,
    cause: str = "",
) -> Decision:
    """Apply ``action`` to a job in ``status`` whose current pods are ``pods``.

    ``task``/``index`` name the pod whose event led to the action; RestartTask, RestartPod and
    RestartPartition need them (without them they restart the whole job). ``cause`` is the human
    reason for the action (see :class:`~torchjob.lifecycle.Reaction`) and starts the new
    ``status.reason``. ``job`` must be defaulted (``spec.max_retry`` >= 1, min_available set).
    Restart actions count against ``spec.max_retry`` as :func:`restarts_allowed` explains.
    """
    return _Step(job, status, pods, action, task, index, cause).run()


def restarts_allowed(job: Job) -> int:
    """How many times the job really restarts before a restart action fails it: ``maxRetry - 1``.

    Every restart action adds one to ``retry_count`` and Restarting fails the job once
    ``retry_count >= maxRetry``, so maxRetry=3 gives 2 restarts and the 3rd restart action ends
    the job in Failed (maxRetry=1: the first failure that asks for a restart fails the job).
    """
    return max(job.spec.max_retry - 1, 0)


def initial_status() -> JobStatus:
    """The status of a job that was just accepted."""
    return JobStatus(JobPhase.PENDING, 0, 0, "waiting for pods to start")
