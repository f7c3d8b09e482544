"""The controller: one record per pod slot, the lifecycle's decisions carried out by a runtime.

Each pass (:meth:`Controller.tick`, or its parts from an engine's own loop): the active deadline,
then the pods' changes (:meth:`Controller.poll`: created pods first, then what ended, in the order
it ended, as the first failure is the root cause a policy acts on), then the delayed reactions
that fell due. A change becomes reactions (events resolved to actions by the job's policies), each
``step`` of the state machine is applied: the pods a decision kills are terminated, missing pods
created (``dependsOn`` and an optional admission gate permitting). torchjob's own limits sit on
top: ``--max-restarts`` and the crash-loop notice.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from torchjob.lifecycle import (
    Action,
    Decision,
    Event,
    JobPhase,
    JobStatus,
    PodChange,
    PodPhase,
    PodStatus,
    Reaction,
    active_deadline,
    cancels_delay,
    deadline_passed,
    dependencies_ready,
    initial_status,
    never_ready,
    reactions,
    step,
)
from torchjob.logs import Level
from torchjob.phases import UNSUCCESSFUL_JOB_PHASES
from torchjob.records import record
from torchjob.spec.kinds import ORIGINS
from torchjob.spec.model import Job
from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import Generic, TypeVar

    from torchjob.controller.runtime import Attempt, PodRuntime
    from torchjob.expand import DesiredState, PodPlan

    A = TypeVar("A", bound=Attempt)

    class _Slots(Generic[A]):
        pass

else:  # no typing at run time (torchjob/typecheck.py): a plain base that takes a subscript

    class _Slots:
        def __class_getitem__(cls, item: object) -> type:
            return cls

    A = object

CRASH_LOOP_AFTER = 3  # consecutive quick failures of a container after which its crash loop is told
BACKOFF_CAP = 300.0  # Kubernetes caps its crash-loop back-off at 5 minutes
BACKOFF_BASE = 0.1  # seconds before the first restart of a container; doubles each time
_BACKOFF_DOUBLINGS = 12  # 0.1 * 2**12 > 300: more doublings change nothing (and 2**1024 overflows)
BACKOFF_RESET = 10.0  # a container that ran this long starts its back-off again from the base
# Jobs whose user wrote no Volcano policy: made from a script or an SDK task, or read from a kind.
PLAIN_ORIGINS = ("script", "task", *ORIGINS.values())
_PHASE_LEVELS = {JobPhase.COMPLETED: Level.SUCCESS, **dict.fromkeys(UNSUCCESSFUL_JOB_PHASES, Level.ERROR)}
# Phases a crash-looping pod may explain: the suspect is named in their reason.
_BAD_PHASES = (JobPhase.RESTARTING, JobPhase.ABORTING, JobPhase.TERMINATING, *UNSUCCESSFUL_JOB_PHASES)
_ENDED = (PodPhase.SUCCEEDED.value, PodPhase.FAILED.value)
_ACTIVE = (PodPhase.PENDING.value, PodPhase.RUNNING.value)

Key = tuple[str, int]
Seen = tuple[str, int, "int | None"]  # reported phase, restarts, exit code
ContainerWait = tuple[str, int, "int | None", "float | None"]  # name, failures, exit code, next start


DEFAULT_GRACE = 5.0  # seconds from SIGTERM to SIGKILL when the pod sets no terminationGracePeriodSeconds


@record(frozen=True)
class Backoff:
    """A container of an attempt that failed and waits to be started again in place."""

    container: str
    failures: int  # consecutive quick failures
    exit_code: int | None
    delay: float | None  # seconds until it starts again (None: not scheduled)


def backoff(failures: int) -> float:
    """Delay before restart number ``failures`` (1-based) of one container, on every engine."""
    doublings = min(max(0, failures - 1), _BACKOFF_DOUBLINGS)  # a crash loop can run for days
    return min(BACKOFF_CAP, BACKOFF_BASE * 2.0**doublings)


def waiting_backoff(containers: Iterable[ContainerWait], now: float) -> Backoff | None:
    """The back-off an attempt waits out: its first container with a next start, as
    ``(name, failures, exit_code, next_start)`` (next_start on the engine's monotonic clock, None
    when not waiting), with the delay left at ``now``. Every pod runtime's ``backoff`` is this."""
    for name, failures, exit_code, due in containers:
        if due is not None:  # a due time of 0.0 is a deadline long passed, not "unscheduled"
            return Backoff(name, failures, exit_code, max(0.0, due - now))
    return None


def termination_grace(job: Job, task: str) -> float:
    """The task's terminationGracePeriodSeconds: seconds from SIGTERM to SIGKILL."""
    spec = job.task(task)
    value = spec.template.spec.get("terminationGracePeriodSeconds") if spec else None
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else DEFAULT_GRACE


@record
class _Delayed:
    due: float
    reaction: Reaction


class Controller(_Slots[A]):
    """Drives one job: ``status`` is its lifecycle state, ``pods`` the attempts that exist now
    (finished ones included), ``latest`` the newest attempt of every slot, ``seen`` what has
    been reported of each to the lifecycle.

    ``clock`` gives seconds (monotonic); the active deadline counts from the controller's
    creation. ``expansion(version, retry_count)`` gives the desired pods of an attempt of the job.
    ``admits(task, index)``, when given, holds back pods not granted yet (a queue's gang).
    ``attached``: a summary follows the job's end, so the final phase is not told here.
    """

    def __init__(
        self,
        job: Job,
        runtime: PodRuntime[A],
        expansion: Callable[[int, int], DesiredState],
        *,
        clock: Callable[[], float],
        timeout: float | None = None,
        max_restarts: int | None = None,
        admits: Callable[[str, int], bool] | None = None,
        attached: bool = False,
    ) -> None:
        self.job = job
        self.runtime = runtime
        self.expansion = expansion
        self.clock = clock
        self.started = clock()
        self.timeout = active_deadline(job, timeout)
        self.max_restarts = max_restarts  # a local limit (run --max-restarts): Kubernetes has none
        self.admits = admits
        self.attached = attached
        self.status: JobStatus = initial_status()
        self.pods: dict[Key, A] = {}
        self.latest: dict[Key, A] = {}
        self.seen: dict[Key, Seen] = {}
        self.delayed: list[_Delayed] = []
        self.created: list[PodChange] = []  # created since the last poll: reported first
        self.waiting: set[str] = set()  # tasks whose dependsOn is not met yet
        self.looping: set[Key] = set()  # pods whose crash loop has been told
        self.told = ""  # the last event told, which a phase change it causes does not repeat
        self.suspect: str | None = None  # a likelier cause of any failure, added to the reason
        # The pod failure a plain job failed on: its reason names the root cause, settled again
        # once the pods the failure stopped are gone (their logs complete): see settle().
        self.failed_on: Reaction | None = None
        # A job made from a script or an SDK task, or read from a PyTorchJob, TrainJob or JobSet:
        # its user wrote no Volcano policy, so its failure is told in the user's terms (which pod
        # and rank, how, whether anything restarted).
        self.plain = job.origin in PLAIN_ORIGINS
        self.dirty = True  # something changed since the caller last wrote the job's status

    # ------------------------------------------------------------- the pass

    def tick(self) -> None:
        """One pass: the deadline, the pods' changes, the delayed reactions due."""
        self.check_deadline()
        self.poll()
        self.fire_delayed()

    def begin(self) -> None:
        """Start the job: the first sync creates its pods."""
        for task in self.job.spec.tasks:
            if task.template.restart_policy == "Always" and task.replicas:
                self.runtime.note(
                    f"task {task.name}: restartPolicy Always (the Kubernetes default) restarts containers "
                    "even after they succeed; set OnFailure or Never for a job that ends",
                    Level.WARNING,
                )
        self.apply(Decision(self.status, None, True))

    def check_deadline(self) -> None:
        if deadline_passed(self.timeout, self.status.phase, self.clock() - self.started):
            self.act(Action.TERMINATE_JOB, None, None, f"the job's deadline of {self.timeout:g}s passed")

    def next_due(self) -> float | None:
        """Seconds until a delayed reaction or the deadline falls due (None: nothing timed)."""
        now = self.clock()
        due = [d.due for d in self.delayed]
        if self.timeout is not None and not self.status.phase.final:
            due.append(self.started + self.timeout)
        return max(0.0, min(due) - now) if due else None

    def busy(self) -> bool:
        """Some attempt has not ended yet, or is still being stopped."""
        return any(not p.gone and (p.terminating or p.phase in _ACTIVE) for p in self.pods.values())

    def done(self) -> bool:
        return self.status.phase.final and not self.busy()

    # ------------------------------------------------------------- the pods

    def pod_statuses(self) -> list[PodStatus]:
        """The pods as reported so far: a change not yet reported is not seen by the lifecycle.

        Several pods can end in one pass; judging the job by their live phases while their
        changes are still being reported one by one would end it before a policy sees them.
        """
        out = []
        for key, pod in self.pods.items():
            phase, restarts, exit_code = self.seen[key]
            out.append(PodStatus(key[0], key[1], PodPhase(phase), restarts, exit_code, pod.terminating))
        return out

    def poll(self) -> None:
        created, self.created = self.created, []
        for change in created:  # reported on their own, before what happened to them since
            self.on_change(change)
        self.runtime.poll(list(self.pods.values()))
        gone = [pod for pod in self.pods.values() if pod.gone]
        if gone:
            self.runtime.forget(gone)
        # Pods that ended in the same pass are reported in the order they ended: the first failure
        # is the one a policy acts on and the job's reason names, as it is the root cause.
        for key, pod in sorted(self.pods.items(), key=lambda item: item[1].finished_at or float("inf")):
            old = self.seen.get(key)
            if pod.gone:
                del self.pods[key]
                self.seen.pop(key, None)
                change = PodChange(
                    key[0], key[1], PodPhase(old[0]) if old else None, None, pod.exit_code, killed=True
                )
                self.on_change(change)
                continue
            current = (pod.phase, pod.restarts, pod.exit_code)
            if old == current:
                continue
            self.seen[key] = current
            restarted = old is not None and old[1] != current[1]
            self.runtime.observed(pod, restarted)
            if restarted:
                self.on_restart(key, pod)
            change = PodChange(
                key[0], key[1], PodPhase(old[0]) if old else None, PodPhase(pod.phase), pod.exit_code
            )
            self.on_change(change)
        if self.failed_on is not None and not self.busy():
            self.settle(self.failed_on)

    def settle(self, reaction: Reaction) -> None:
        """The failed job's reason, formed again now that the pods it stopped are gone: the rank
        that raised may be in one of them, its pod stopped before it failed by itself."""
        self.failed_on = None
        status = self.status
        reason = self.pod_failure(reaction)
        if reason != status.reason and status.phase is JobPhase.FAILED:
            self.status = JobStatus(status.phase, status.retry_count, status.version, reason)
            if self.attached:  # the summary that follows says it
                self.runtime.record(f"root cause: {reason}")
            else:
                self.runtime.note(f"root cause: {reason}", Level.ERROR)
            self.dirty = True

    def on_restart(self, key: Key, pod: A) -> None:
        """--max-restarts, and one notice when the pod starts to crash-loop."""
        if self.max_restarts is not None and pod.restarts > self.max_restarts:
            self.fail_job(
                f"pod {self.short(pod)} restarted {pod.restarts} times, more than --max-restarts "
                f"{self.max_restarts}"
            )
            return
        last = self.runtime.backoff(pod)
        if last is not None and last.failures >= CRASH_LOOP_AFTER and key not in self.looping:
            self.looping.add(key)
            limit = (
                ""
                if self.max_restarts is not None
                else "; torchjob run --max-restarts N fails the job instead"
            )
            code = f"exit code {last.exit_code}"
            self.runtime.note(
                f"pod {self.short(pod)} is in CrashLoopBackOff: container {last.container} ended "
                f"{last.failures} times in a row (last {code}); it is restarted with a growing "
                f"back-off, up to {BACKOFF_CAP:g}s, for as long as the job runs{limit}",
                Level.ERROR,
            )

    def short(self, pod: A) -> str:
        """A pod's name without its job's name in front (``worker-0`` for ``job-worker-0``)."""
        prefix = f"{self.job.name}-"
        return pod.name[len(prefix) :] if pod.name.startswith(prefix) else pod.name

    def create_missing(self) -> None:
        state = self.expansion(self.status.version, self.status.retry_count)
        # Pods created in this pass are Pending, which no dependsOn counts: one view of the pods
        # serves the whole pass, and a job without dependsOn needs none (no per-pod rescans).
        gated = any(t.depends_on is not None and t.depends_on.names for t in self.job.spec.tasks)
        pods = self.pod_statuses() if gated else []
        for plan in state.pods:
            key = (plan.task.name, plan.index)
            if self.admits is not None and not self.admits(*key):
                continue  # beyond the gang, not granted yet: the caller creates it once it is
            if key not in self.pods and self.may_start(plan.task.name, pods):
                self.create(plan)

    def may_start(self, task: str, pods: list[PodStatus]) -> bool:
        """The dependsOn gate (lifecycle.gates), saying once when a task starts to wait."""
        met = dependencies_ready(self.job, task, pods)
        spec = self.job.task(task)
        depends = spec.depends_on if spec is not None else None
        if not met and task not in self.waiting and depends is not None:
            self.waiting.add(task)
            running = [n for n in depends.names if n not in depends.complete]
            said = [
                f"task(s) {', '.join(names)} to {what}"
                for names, what in ((running, "be running"), (depends.complete, "complete"))
                if names
            ]
            self.runtime.note(f"task {task} waits for {' and '.join(said)}", Level.INFO)
        if met:
            self.waiting.discard(task)
        return met

    def check_waiting(self) -> None:
        """A task that waits for a task to complete one of whose pods failed, when no policy
        restarted it (nor has a reaction still to come): it would wait for ever, and the job with
        it. JobSet fails the set for the failed Job unless its failure policy restarts it."""
        if not self.waiting or self.delayed or self.status.phase not in (JobPhase.PENDING, JobPhase.RUNNING):
            return
        pods = self.pod_statuses()
        for task in sorted(self.waiting):
            failed = never_ready(self.job, task, pods)
            if failed is not None:
                self.fail_job(
                    f"task {task} cannot start: it waits for task {failed.task} to complete, and its "
                    f"pod {failed.label} failed"
                )
                return

    def create(self, plan: PodPlan) -> None:
        pod = self.runtime.create(plan, self.status)
        key = (plan.task.name, plan.index)
        self.pods[key] = pod
        self.latest[key] = pod
        # Reported as created Pending; what happened since comes with the next poll.
        self.seen[key] = (PodPhase.PENDING.value, 0, None)
        self.created.append(PodChange(key[0], key[1], None, PodPhase.PENDING))
        self.dirty = True

    def terminate(self, pods: list[A]) -> None:
        if pods:
            self.runtime.terminate([(pod, termination_grace(self.job, pod.task)) for pod in pods])
            self.dirty = True

    # ------------------------------------------------------------ decisions

    def fail_job(self, reason: str) -> None:
        """End the job as Failed for a reason of torchjob's own (no Volcano policy says so)."""
        if self.status.phase.final:
            return
        self.status = JobStatus(JobPhase.FAILED, self.status.retry_count, self.status.version, reason)
        self.runtime.note(
            f"failing the job: {reason}" if self.attached else f"job Failed: {reason}", Level.ERROR
        )
        self.terminate(list(self.pods.values()))
        self.delayed = []
        self.dirty = True

    def on_change(self, change: PodChange) -> None:
        self.dirty = True
        for reaction in reactions(self.job, change, self.pod_statuses()):
            self.delayed = [
                d
                for d in self.delayed
                if not (
                    (d.reaction.task, d.reaction.index) == (reaction.task, reaction.index)
                    and cancels_delay(d.reaction.event, reaction.event)
                )
            ]
            if self.plain and reaction.event is Event.POD_FAILED and self.ends_job(reaction.action):
                self.fail_job(self.pod_failure(reaction))
                self.failed_on = self.failed_on or reaction
                continue
            if self.plain and reaction.event is Event.TASK_FAILED and self.ends_job(reaction.action):
                self.fail_job(self.words(reaction.cause))  # a restart limit (a kind's backoffLimit)
                continue
            cause = self.words(reaction.cause)
            if reaction.action is not Action.SYNC_JOB:
                self.runtime.record(cause)
            if reaction.delay:
                self.delayed.append(_Delayed(self.clock() + reaction.delay, reaction))
                continue
            self.act(reaction.action, reaction.task, reaction.index, cause)
        self.act(Action.SYNC_JOB, None, None, "")
        self.check_waiting()

    def words(self, cause: str) -> str:
        """A reaction's cause as the user is told it: a job file's with the policy that acted
        (Volcano's words), a script's or a task's without (its user wrote none)."""
        if not self.plain:
            return cause
        found = re.search(r"; (task \S+ )?policy ", cause)
        return cause[: found.start()] if found else cause

    def ends_job(self, action: Action) -> bool:
        """The action fails the job without restarting anything: a restart beyond maxRetry, or
        TerminateJob, whose Volcano phase Terminated would read as "stopped" to a script's user."""
        if action in (Action.TERMINATE_JOB, Action.ABORT_JOB):
            return not self.status.phase.final
        running = self.status.phase in (JobPhase.PENDING, JobPhase.RUNNING)  # a restart costs a retry there
        return action.restart and running and self.status.retry_count + 1 >= self.job.spec.max_retry

    def pod_failure(self, reaction: Reaction) -> str:
        """``rank 3 (pod worker-0) failed with exit code 1: RuntimeError: boom; nothing was
        restarted``: the root cause among the pods (rootcause.py: the rank that raised, not a peer
        that lost it) as its log tells it; the pod the policy acted on when that is another."""
        from torchjob.controller.kubelet import Pod
        from torchjob.controller.rootcause import failure_of, first_failure, told

        pod = self.latest.get((reaction.task, reaction.index))
        acted = f"pod {reaction.task}-{reaction.index}"
        if not isinstance(pod, Pod):
            who = acted if pod is None or pod.rank is None else f"rank {pod.rank} ({acted})"
            cause = (
                who
                + " failed"
                + ("" if reaction.exit_code is None else f" with exit code {reaction.exit_code}")
            )
        else:
            pods: list[Pod] = [p for p in self.latest.values() if isinstance(p, Pod)]
            acted_on = failure_of(self.job, pod)
            cause = told(first_failure(self.job, pods) or acted_on, acted_on)
        restarts = self.status.retry_count
        after = (
            "nothing was restarted"
            if not restarts
            else f"after {restarts} restart{'s' * (restarts > 1)} of the job"
        )
        return f"{cause}; {after}"

    def fire_delayed(self) -> None:
        now = self.clock()
        due = [d for d in self.delayed if d.due <= now]
        if not due:
            return
        self.delayed = [d for d in self.delayed if d.due > now]
        for d in due:
            r = d.reaction
            self.act(r.action, r.task, r.index, f"{r.cause} (after its timeout)")

    def act(self, action: Action, task: str | None, index: int | None, cause: str) -> None:
        decision = step(
            self.job, self.status, self.pod_statuses(), action, task=task, index=index, cause=cause
        )
        self.apply(decision, cause)

    def apply(self, decision: Decision, cause: str = "", depth: int = 0) -> None:
        old = self.status
        self.status = decision.status
        suspect = self.suspect
        if suspect and self.status.phase in _BAD_PHASES and suspect not in self.status.reason:
            # Whatever the policy made of the failure, the suspect is the likelier cause: say it.
            self.status = JobStatus(
                self.status.phase,
                self.status.retry_count,
                self.status.version,
                f"{self.status.reason}; {suspect}".lstrip("; "),
            )
        if decision.kill is not None:
            kill = decision.kill
            self.terminate([self.pods[(s.task, s.index)] for s in self.pod_statuses() if kill.selects(s)])
        if decision.create_pods and not self.status.phase.final:
            self.create_missing()
        if old.phase is not self.status.phase or old.retry_count != self.status.retry_count:
            level = _PHASE_LEVELS.get(self.status.phase, Level.NOTICE)
            if not self.status.phase.final or not self.attached:  # else the summary says it
                reason = self.status.reason
                if cause and cause == self.told and reason.startswith(cause):  # just told: not again
                    reason = reason[len(cause) :].lstrip("; ") or reason
                self.runtime.note(f"job {self.status.phase.value}: {reason}", level)
            self.dirty = True
        if decision.resync and depth < 8:
            # The phase changed because of ``cause``; the follow-up sync keeps it in the reason.
            again = step(self.job, self.status, self.pod_statuses(), Action.SYNC_JOB, cause=cause)
            self.apply(again, cause, depth + 1)
