"""The job lifecycle as a pure state machine, with Volcano's phases, events, actions and policies.

Nothing here does I/O, reads a clock or touches a process: an engine reports what it observed
and carries out what it is told. The loop an engine runs::

    for r in reactions(job, change, pods):          # events_for + resolve, with a human cause
        if r.delay: schedule it (cancels_delay() tells which later events drop it)
        d = step(job, status, pods, r.action, task=r.task, index=r.index, cause=r.cause)
        status = d.status; stop the pods d.kill selects (Kill.selects / apply_kill)
        if d.create_pods: start the pods that do not exist
        if d.resync: step(job, status, pods, Action.SYNC_JOB) again
        if status.phase.final: stop what is left and finish

Modules: :mod:`.types` (vocabulary), :mod:`.policy` (policy resolution), :mod:`.events` (pod
changes to events), :mod:`.machine` (the state machine), :mod:`.gates` (``dependsOn`` and the
active deadline).

maxRetry, exactly
-----------------
``spec.maxRetry`` (default 3) counts *restart actions*, with one counter per job
(``JobStatus.retry_count``), whatever their scope: RestartJob, RestartTask, RestartPod and
RestartPartition taken in Pending or Running, and ResumeJob from Aborting/Aborted, each add one
as the job enters Restarting. Restarting then fails the job as soon as ``retry_count >= maxRetry``,
before any pod is started again. So with maxRetry=3 the first two restart actions restart the
job, and the third ends it in Failed: 2 effective restarts. Restart actions that arrive while the
job is already Restarting (for example the other workers failing because the first one was
killed) stop pods but cost nothing.

A task's ``maxRetry`` is a different thing: it is the threshold on container restarts (the sum
of ``restarts`` over the task's Pending/Running pods, i.e. in-place restarts under
``restartPolicy: OnFailure``/``Always``) at which the TaskFailed event fires. It never stops the
job by itself; only the policy for TaskFailed (if any) decides, and that action then draws on
the job's counter like any other. The threshold fires when the sum *reaches* maxRetry (``>=``);
some Volcano releases compare with ``>``, one restart later.

Where torchjob does better than Volcano
---------------------------------------
* Evidence of the last attempt. Volcano keeps Succeeded/Failed pods on a whole-job kill only when
  ``retryCount >= maxRetry - 1`` and never on a targeted kill, so a RestartTask/RestartPod that
  uses up the budget deletes the very pod that explains the failure. Here every restart that uses
  up the budget retains Succeeded/Failed pods (``RETAIN_SOFT``) whatever its scope, and the local
  engine keeps the logs of every attempt of every pod on disk anyway, so stopping a pod never
  loses its output.
* A pod the engine is stopping (``terminating``, or a change with ``killed=True``) raises no
  policy event: its exit belongs to a decision already taken. Volcano filters these by job
  version, which only whole-job kills bump, so its own targeted kills can trigger PodEvicted
  policies.
* AbortJob, CompleteJob and TerminateJob during Restarting are honoured (Volcano kills the pods
  and carries on restarting, losing the command, e.g. a Ctrl-C while restarting).
* When a pod reaches Running and its task's restart threshold at once, both PodRunning and
  TaskFailed are raised (Volcano keeps only PodRunning and loses TaskFailed).
* A job that finishes while pods still run (minSuccess reached, Restarting -> Failed) stops them in
  the same decision instead of waiting for the next event; kills that select no pod are dropped
  and do not bump ``version`` (Volcano bumps it on every event after the end).
"""

from __future__ import annotations

from torchjob.lifecycle.events import (
    Reaction,
    describe_event,
    events_for,
    reactions,
    task_completed,
    task_failed,
    task_max_retry,
    task_restarts,
)
from torchjob.lifecycle.gates import (
    active_deadline,
    deadline_passed,
    dependencies_ready,
    never_ready,
    task_ready,
)
from torchjob.lifecycle.machine import Counts, initial_status, restarts_allowed, step
from torchjob.lifecycle.policy import Resolution, cancels_delay, resolve, resolve_action
from torchjob.lifecycle.types import (
    RESTART_ACTIONS,
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
    apply_kill,
    pod_label,
)

__all__ = [
    "RESTART_ACTIONS",
    "RETAIN_NONE",
    "RETAIN_SOFT",
    "Action",
    "Counts",
    "Decision",
    "Event",
    "JobPhase",
    "JobStatus",
    "Kill",
    "PodChange",
    "PodPhase",
    "PodStatus",
    "Reaction",
    "Resolution",
    "active_deadline",
    "apply_kill",
    "cancels_delay",
    "deadline_passed",
    "dependencies_ready",
    "describe_event",
    "events_for",
    "initial_status",
    "never_ready",
    "pod_label",
    "reactions",
    "resolve",
    "resolve_action",
    "restarts_allowed",
    "step",
    "task_completed",
    "task_failed",
    "task_max_retry",
    "task_ready",
    "task_restarts",
]
