"""The job controller loop: runs pods, feeds their changes to the lifecycle, carries out decisions.

Each pass of the loop: poll every pod (the kubelet part), turn each observed change into
reactions (events resolved to actions by :mod:`torchjob.lifecycle`), ``step`` the state machine,
stop the pods a decision kills and create missing pods when it says so. Log files are followed and
printed on the same pass. Between passes the loop sleeps until a container process exits, a
signal arrives or something falls due (a delayed reaction, a restart, the next scan or log read):
an exit is seen at once and an idle job costs almost no CPU. When the job's phase is final,
whatever still runs is stopped, every process carrying the job's marker is swept up, and the loop
ends.

The parts around the loop live beside it: :mod:`.creation` makes the pods (ports, names, ranks,
environment), :mod:`.cleanup` tracks every process of the job and shuts it down, :mod:`.report`
builds the job's report; the policies that need no I/O (``dependsOn``, the active deadline) are
in :mod:`torchjob.lifecycle.gates`.
"""

from __future__ import annotations

import errno
import signal
import threading
import time
from collections.abc import Callable
from types import FrameType

from torchjob import logs
from torchjob.display import headline, pod_color, pod_rows, prefix_for
from torchjob.engines.base import JobReport
from torchjob.engines.local import process
from torchjob.engines.local.cleanup import (
    INTERRUPTED_STALL,
    OUTPUT_STALL,
    STUCK_AFTER_KILL,
    TICK,
    JobProcesses,
    grace_of,
    shutdown,
)
from torchjob.engines.local.containers import local_warnings
from torchjob.engines.local.creation import PodFactory
from torchjob.engines.local.output import Console, short_name
from torchjob.engines.local.pod import BACKOFF_CAP, FAILED, PENDING, RUNNING, SUCCEEDED, LocalPod
from torchjob.engines.local.prewarm import modules_of as prewarm_modules
from torchjob.engines.local.report import job_report
from torchjob.engines.local.state import JobDir
from torchjob.engines.local.waiter import ExitWaiter
from torchjob.expand import DesiredState, PodPlan
from torchjob.files import LogFollower
from torchjob.lifecycle import (
    Action,
    Decision,
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
    reactions,
    step,
)
from torchjob.records import record
from torchjob.spec.model import Job
from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any

IDLE_WAIT = 0.1  # longest sleep of the loop; exits and signals wake it at once
LOG_EVERY = 0.05  # seconds between reads of the followed log files when they are printed
TRACK_EVERY = 0.5  # seconds between scans for container descendants
CRASH_LOOP_AFTER = 3  # consecutive quick failures of a container after which its crash loop is told

Key = tuple[str, int]


@record
class _Delayed:
    due: float
    reaction: Reaction


class Supervisor:
    def __init__(
        self,
        job: Job,
        job_dir: JobDir,
        *,
        console: Console | None,
        echo_logs: bool,
        timeout: float | None,
        extra_env: dict[str, str],
        prewarm: bool = True,
        max_restarts: int | None = None,
        preload: tuple[str, ...] = (),
    ) -> None:
        self.job = job
        self.dir = job_dir
        self.id = job_dir.id
        self.console = console
        self.echo_logs = echo_logs and console is not None
        self.timeout = active_deadline(job, timeout)
        self.status: JobStatus = initial_status()
        self.pods: dict[Key, LocalPod] = {}  # pods that exist now (finished ones included)
        self.latest: dict[Key, LocalPod] = {}  # the newest attempt of every pod, for reports
        self.seen: dict[Key, tuple[str, int, int | None]] = {}  # reported phase, restarts, exit code
        self.delayed: list[_Delayed] = []
        self.events: list[dict[str, Any]] = []
        self.follower = LogFollower()
        self.signals: list[int] = []
        self.started = time.time()
        self.finished: float | None = None
        warm = prewarm_modules(job) if prewarm and not preload else ()  # forking from the server is faster
        self.factory = PodFactory(job, job_dir, extra_env, warm, preload)
        if self.factory.preloader is not None:  # a fork server that cannot be used is said once
            self.factory.preloader.note = lambda text: self.note(text, "33")
        self.processes = JobProcesses(self.id, self.pods, self.latest)
        self.waiter = ExitWaiter()  # woken by container exits (pidfds) and signals
        self.dirty = True
        self.interrupted: int | None = None
        self.created: list[PodChange] = []
        self.running = False  # the job started (its pods were created)
        self.status_error = ""  # why status.json could not be written, once said
        self.waiting: set[str] = set()  # tasks whose dependsOn is not met yet
        self.max_restarts = max_restarts  # a local limit (run --max-restarts): Kubernetes has none
        self.looping: set[Key] = set()  # pods whose crash loop has been told
        self.dir_removed = False  # a full disk: nothing of the job could be kept

    # ------------------------------------------------------------------ setup

    def prepare(self) -> DesiredState:
        self.dir.write_pid()
        self.write_status(must=True)  # before any pod: a job whose status cannot be written never starts
        return self.factory.prepare(self.note)

    # -------------------------------------------------------------- the loop

    def run(self, on_started: Callable[[], None] | None = None) -> None:
        """Run the job to its end; ``on_started`` is called once its pods have been started."""
        try:
            self.start()
            self.running = True
            if on_started is not None:
                on_started()
            self.loop()
        except OSError as err:  # the job directory cannot be written (a full disk): end, say why
            # (A bug raising OSError ends the job the same way, with its reason, not a traceback.)
            self.stop_for(err)
        finally:
            shutdown(self)  # whatever happened above, nothing of the job outlives this

    def stop_for(self, err: OSError) -> None:
        where = f" ({err.filename})" if err.filename else ""
        if not where and err.errno in (errno.ENOSPC, errno.EDQUOT):
            where = f" (writing to {self.dir.path})"
        reason = f"torchjob stopped the job: {err.strerror or err}{where}"
        self.note(f"{err.strerror or err}{where}: stopping the job", "31")
        if not self.status.phase.final:
            self.status = JobStatus(JobPhase.FAILED, self.status.retry_count, self.status.version, reason)
            self.dirty = True

    def start(self) -> None:
        self.prepare()
        self.processes.start()
        self.note(f"job {self.id} started; ports {self.factory.ports_text()}; job directory {self.dir.path}")
        for task in self.job.spec.tasks:
            if task.template.restart_policy == "Always" and task.replicas:
                self.note(
                    f"task {task.name}: restartPolicy Always (the Kubernetes default) restarts containers "
                    "even after they succeed; set OnFailure or Never for a job that ends",
                    "33",
                )
        for path, message in local_warnings(self.factory.expansion(0, 0), self.factory.extra_env):
            self.record(f"warning: {path}: {message}")
        self.apply(Decision(self.status, None, True))
        preloader = self.factory.preloader
        if preloader is not None and preloader.state == "none" and not self.waiting:  # every pod is made
            self.note(
                f"--preload {','.join(preloader.modules)}: no container runs torchjob's python in a form "
                "the fork server can serve (python [options] SCRIPT|-m MODULE|-c CODE); they start cold",
                "33",
            )
        self.factory.write_records()

    def loop(self) -> None:
        last_track = time.monotonic()  # the pods have only just started: nothing to find yet
        while True:
            now = time.monotonic()
            self.handle_signals()
            if deadline_passed(self.timeout, self.status.phase, time.time() - self.started):
                self.act(Action.TERMINATE_JOB, None, None, f"the job's deadline of {self.timeout:g}s passed")
            if now - last_track > TRACK_EVERY:
                self.processes.track()
                last_track = now
            self.poll_pods(now)
            self.fire_delayed(now)
            self.print_logs()
            if self.dirty:
                self.write_status()
            if self.status.phase.final and not self.busy():
                return
            self.waiter.wait(self.next_wait(last_track))

    def next_wait(self, last_track: float) -> float:
        """Seconds until something needs the loop that no exit or signal announces."""
        now = time.monotonic()
        if self.created:  # created pods are reported on the next pass
            return 0.0
        if any(p.terminating and not p.gone for p in self.pods.values()):
            return TICK
        due = [last_track + TRACK_EVERY, now + (LOG_EVERY if self.echo_logs else IDLE_WAIT)]
        due += [d.due for d in self.delayed]
        due += [c.next_start for p in self.pods.values() for c in p.containers if c.next_start is not None]
        if self.timeout is not None:
            due.append(now + self.started + self.timeout - time.time())
        return max(0.0, min(due) - now)

    def busy(self) -> bool:
        return any(
            not p.gone and (p.terminating or p.phase in (PENDING, RUNNING)) for p in self.pods.values()
        )

    # ---------------------------------------------------------------- pods

    def pod_statuses(self) -> list[PodStatus]:
        """The pods as reported so far: a change not yet reported is not seen by the lifecycle.

        Several pods can end in one tick; judging the job by their live phases while their
        changes are still being reported one by one would end it before a policy sees them.
        """
        out = []
        for key, pod in self.pods.items():
            phase, restarts, exit_code = self.seen[key]
            out.append(PodStatus(key[0], key[1], PodPhase(phase), restarts, exit_code, pod.terminating))
        return out

    def poll_pods(self, now: float) -> None:
        created, self.created = self.created, []
        for change in created:  # reported on their own, before what happened to them since
            self.on_change(change)
        for pod in self.pods.values():
            pod.poll(now)
            if pod.terminating and not pod.gone and pod.stuck(now, STUCK_AFTER_KILL):
                self.note(
                    f"pod {short_name(self.job.name, pod.name)}: processes {pod.live_pids()} "
                    "survive SIGKILL; giving up on them",
                    "31",
                )
                pod.gone = True
        gone = [pod for pod in self.pods.values() if pod.gone]
        if gone:
            # A pod is gone only with all of its processes, also those that escaped its groups.
            left = process.sweep(process.POD_MARKER, [pod.uid for pod in gone])
            process.reap_adopted(self.processes.job_pids)  # the killed orphans: no zombie is left
            if left:
                self.note(f"processes {[p.pid for p in left]} of stopped pods survive SIGKILL", "31")
        for key, pod in list(self.pods.items()):
            old = self.seen.get(key)
            if pod.gone:
                del self.pods[key]
                self.seen.pop(key, None)
                self.close_logs(pod)
                change = PodChange(
                    key[0], key[1], PodPhase(old[0]) if old else None, None, pod.exit_code, killed=True
                )
                self.on_change(change)
                continue
            current = (pod.phase, pod.restarts, pod.exit_code)
            if old == current:
                continue
            self.seen[key] = current
            if pod.phase in (SUCCEEDED, FAILED):
                self.close_logs(pod)
            if old is not None and old[1] != current[1]:
                self.on_restart(key, pod)
            change = PodChange(
                key[0], key[1], PodPhase(old[0]) if old else None, PodPhase(pod.phase), pod.exit_code
            )
            self.on_change(change)

    def on_restart(self, key: Key, pod: LocalPod) -> None:
        """One line a restart; one notice when the pod starts to crash-loop; --max-restarts."""
        short = short_name(self.job.name, pod.name)
        waiting = [c for c in pod.containers if c.next_start is not None]
        last = waiting[0] if waiting else None
        code = f"exit code {last.exit_code}" if last is not None else "exit"
        delay = f" in {max(0.0, last.next_start - time.monotonic()):.1f}s" if last and last.next_start else ""
        if not self.echo_logs:  # else the line torchjob writes in the container's log says it
            self.note(
                f"pod {short}: {code}; restart {pod.restarts}{delay} (restartPolicy {pod.restart_policy})",
                "33",
            )
        if self.max_restarts is not None and pod.restarts > self.max_restarts:
            self.fail_job(
                f"pod {short} restarted {pod.restarts} times, more than --max-restarts {self.max_restarts}"
            )
            return
        if last is not None and last.failures >= CRASH_LOOP_AFTER and key not in self.looping:
            self.looping.add(key)
            limit = (
                ""
                if self.max_restarts is not None
                else "; torchjob run --max-restarts N fails the job instead"
            )
            self.note(
                f"pod {short} is in CrashLoopBackOff: container {last.run.name} ended "
                f"{last.failures} times in a row (last {code}); it is restarted with a growing "
                f"back-off, up to {BACKOFF_CAP:g}s, for as long as the job runs{limit}",
                "31",
            )

    def fail_job(self, reason: str) -> None:
        """End the job as Failed for a reason of torchjob's own (no Volcano policy says so)."""
        if self.status.phase.final:
            return
        self.status = JobStatus(JobPhase.FAILED, self.status.retry_count, self.status.version, reason)
        self.note(f"job Failed: {reason}" if self.console is None else f"failing the job: {reason}", "31")
        now = time.monotonic()
        tree = process.children_map() if self.pods else None
        for pod in self.pods.values():
            pod.terminate(now, grace_of(self.job, pod), tree)
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
            if reaction.action is not Action.SYNC_JOB:
                self.record(reaction.cause)
            if reaction.delay:
                self.delayed.append(_Delayed(time.monotonic() + reaction.delay, reaction))
                continue
            self.act(reaction.action, reaction.task, reaction.index, reaction.cause)
        self.act(Action.SYNC_JOB, None, None, "")

    def fire_delayed(self, now: float) -> None:
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
        now = time.monotonic()
        if decision.kill is not None:
            selected = [self.pods[(s.task, s.index)] for s in self.pod_statuses() if decision.kill.selects(s)]
            tree = process.children_map() if selected else None  # one scan for all of them
            for pod in selected:
                pod.terminate(now, grace_of(self.job, pod), tree)
                self.dirty = True
        if decision.create_pods and not self.status.phase.final:
            self.create_missing(now)
        if old.phase is not self.status.phase or old.retry_count != self.status.retry_count:
            color = {"Completed": "32", "Failed": "31", "Aborted": "31", "Terminated": "31"}.get(
                self.status.phase.value, "36"
            )
            if not self.status.phase.final or self.console is None:  # else the summary says it
                self.note(f"job {self.status.phase.value}: {self.status.reason}", color)
            self.dirty = True
        if decision.resync and depth < 8:
            # The phase changed because of ``cause``; the follow-up sync keeps it in the reason.
            again = step(self.job, self.status, self.pod_statuses(), Action.SYNC_JOB, cause=cause)
            self.apply(again, cause, depth + 1)

    def create_missing(self, now: float) -> None:
        state = self.factory.expansion(self.status.version, self.status.retry_count)
        # Pods created in this pass are Pending, which no dependsOn counts: one view of the pods
        # serves the whole pass, and a job without dependsOn needs none (no per-pod rescans).
        gated = any(t.depends_on is not None and t.depends_on.names for t in self.job.spec.tasks)
        pods = self.pod_statuses() if gated else []
        for plan in state.pods:
            key = (plan.task.name, plan.index)
            if key not in self.pods and self.may_start(plan.task.name, pods):
                self.create(plan, now)

    def may_start(self, task: str, pods: list[PodStatus]) -> bool:
        """The dependsOn gate (lifecycle.gates), saying once when a task starts to wait."""
        met = dependencies_ready(self.job, task, pods)
        if not met and task not in self.waiting:
            self.waiting.add(task)
            spec = self.job.task(task)
            names = spec.depends_on.names if spec is not None and spec.depends_on is not None else []
            self.note(f"task {task} waits for task(s) {', '.join(names)} to be running")
        if met:
            self.waiting.discard(task)
        return met

    def create(self, plan: PodPlan, now: float) -> None:
        pod = self.factory.make(plan, self.status, self.on_group, self.processes.adopt)
        key = (pod.task, pod.index)
        self.pods[key] = pod
        self.latest[key] = pod
        self.follow_logs(pod)
        if not pod.mains:
            pod.fail_now(2)
        else:
            pod.start(now)
        # Reported as created Pending; what happened since comes with the next poll.
        self.seen[key] = (PENDING, 0, None)
        self.created.append(PodChange(key[0], key[1], None, PodPhase.PENDING))
        self.dirty = True

    def on_group(self, pgid: int, started: bool) -> None:
        if started:  # a container's main process: its pid is its group's id
            self.waiter.add(pgid)
        else:
            self.waiter.remove(pgid)
        self.processes.on_group(pgid, started)

    # ----------------------------------------------------------- signals

    def install_signals(self) -> dict[int, Any]:
        if threading.current_thread() is not threading.main_thread():
            return {}
        previous: dict[int, Any] = {}

        def handler(signum: int, frame: FrameType | None) -> None:
            self.signals.append(signum)
            self.waiter.wake()

        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            previous[sig] = signal.signal(sig, handler)
        return previous

    def handle_signals(self) -> None:
        if not self.signals:
            return
        signals, self.signals = self.signals, []
        for signum in signals:
            name = signal.Signals(signum).name
            if self.status.phase in (JobPhase.TERMINATING, JobPhase.TERMINATED) or self.status.phase.final:
                self.note(f"{name} again: killing every process of the job now", "31")
                for pod in self.pods.values():
                    pod.kill()
                continue
            self.interrupted = self.interrupted or signum
            self.note(f"{name}: stopping the job (again to kill at once)", "33")
            self.act(Action.TERMINATE_JOB, None, None, f"torchjob received {name}")

    # ------------------------------------------------------------- output

    def note(self, text: str, color: str = "2") -> None:
        # Printed once: on the console when there is one, else as a log record (-v, detached).
        if self.console is not None:
            self.console.note(text, color)
        else:
            logs.info(text)

    def record(self, text: str) -> None:
        self.events.append({"time": time.time(), "message": text})
        self.events = self.events[-50:]
        self.note(text, "33")

    def follow_logs(self, pod: LocalPod) -> None:
        if not self.echo_logs:
            return
        short = short_name(self.job.name, pod.name)
        addressing = self.factory.addressing
        ordinal = addressing.ordinals[(pod.task, pod.index)] if addressing else 0
        for c in pod.inits:
            self.follower.follow(c.log, prefix_for(short, pod.rank, c.run.name), pod_color(ordinal))
        for c in pod.mains:
            name = None if len(pod.mains) == 1 else c.run.name
            self.follower.follow(c.log, prefix_for(short, pod.rank, name), pod_color(ordinal))

    def close_logs(self, pod: LocalPod) -> None:
        for c in pod.containers:
            self.follower.close(c.log)

    def print_logs(self) -> None:
        if not self.echo_logs or self.console is None:
            return
        # A slow reader is not fed more than it takes: the log files keep the rest until it has room.
        lines = self.follower.read() if self.console.room() else []
        if lines:
            self.console.lines((item.prefix, item.color, text) for item, text in lines)
        else:
            self.console.stream.flush()
        if self.console.live:  # progress bars (lines redrawn with \r) live, before they end
            self.console.progress((item.prefix, item.color, text) for item, text in self.follower.progress())
        if self.console.live:
            report = self.report()
            self.console.table([headline(report, True), *pod_rows(report, True, limit=20)])

    def remove_job_dir(self) -> None:
        import shutil

        shutil.rmtree(self.dir.path, ignore_errors=True)
        self.dir_removed = True
        self.note(f"job {self.id} removed: its directory could not be written")

    def drain_logs(self) -> None:
        """Print every line still in the log files, or count what a stalled reader never took."""
        for pod in self.latest.values():
            self.close_logs(pod)
        if not self.echo_logs or self.console is None:
            return
        self.follower.seal()  # every process of the job is gone: nothing is waited for beyond this
        interrupted = lambda: bool(self.signals)  # noqa: E731 - Ctrl-C stops the printing, not the count
        # A job stopped by a signal ends promptly: what a stalled reader does not take is only counted.
        stall = INTERRUPTED_STALL if self.interrupted is not None else OUTPUT_STALL
        while self.follower.files and self.console.drain(stall, interrupted):
            self.print_logs()
        self.console.unshown += self.follower.skip()

    # ------------------------------------------------------------- status

    def report(self) -> JobReport:
        return job_report(
            self.job,
            id=self.id,
            location="" if self.dir_removed else str(self.dir.path),  # no logs to point at
            status=self.status,
            # A pod that went in this pass (stopped while in back-off) is not current either.
            pods=[(p, self.pods.get((p.task, p.index)) is p and not p.gone) for p in self.latest.values()],
            ports=self.factory.ports,
            started=self.started,
            finished=self.finished,
            events=self.events,
            name_resolution=self.factory.name_resolution,
        )

    def write_status(self, must: bool = False) -> None:
        """Write status.json; a failure (a full disk) is said once and retried on the next pass."""
        try:
            self.dir.write_status(self.report())
        except OSError as err:
            if must:
                raise
            if str(err) != self.status_error:
                self.status_error = str(err)
                self.note(f"cannot write {self.dir.status_file}: {err.strerror or err}", "31")
            return
        self.dirty = False
        self.status_error = ""
