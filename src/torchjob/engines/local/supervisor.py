"""The local engine's loop: the job's processes, driven by the engine-neutral controller.

The policy (Volcano's lifecycle, ``dependsOn``, deadlines, ``--max-restarts``) is
:class:`torchjob.controller.Controller`'s, each pod attempt's containers the kubelet's
(:mod:`torchjob.controller.kubelet`) over this machine's container runner (:mod:`.runner`, whose
host this loop is). Each pass of the loop: the signals received, the controller's deadline, a
scan of the processes, the controller's poll of the pods and its delayed reactions; log files are
followed and printed on the same pass. Between passes the loop sleeps until a container process
exits, a signal arrives or something falls due (a delayed reaction, a restart, the next scan or
log read): an exit is seen at once and an idle job costs almost no CPU. When the job's phase is
final, whatever still runs is stopped, every process carrying the job's marker is swept up, and
the loop ends.

Each of the loop's other jobs is a module of its own, which it calls: :mod:`.creation` makes the
pods, :mod:`.cleanup` tracks every process of the job; :mod:`.signals`, :mod:`.queuewait` (the
local queue), :mod:`.portwatch` (the job's ports against foreign listeners), :mod:`.nudge` (wakes
the wait-for-master probe between passes), :mod:`.silence` (the notice of a silent job),
:mod:`.hints`, :mod:`.notes` (what is said and kept as events), :mod:`.echo` (the console) and
:mod:`.statusfile` (status.json, the controller's report).
"""

from __future__ import annotations

import contextlib
import errno
import os
import time
from collections.abc import Callable

from torchjob.controller import DEFAULT_GRACE, Controller, termination_grace
from torchjob.controller.kubelet import ENDED, Kubelet, Pod
from torchjob.engines.local import process, runner
from torchjob.engines.local.cleanup import STUCK_AFTER_KILL, TICK, JobProcesses
from torchjob.engines.local.creation import PodFactory
from torchjob.engines.local.echo import LOG_EVERY, Echo
from torchjob.engines.local.hints import FailureHints
from torchjob.engines.local.localcheck import local_warnings
from torchjob.engines.local.notes import Notes
from torchjob.engines.local.nudge import Nudges
from torchjob.engines.local.output import Console, SinkConsole, short_name
from torchjob.engines.local.prewarm import modules_of as prewarm_modules
from torchjob.engines.local.signals import Signals
from torchjob.engines.local.silence import Silence
from torchjob.engines.local.state import JobDir
from torchjob.engines.local.statusfile import StatusFile
from torchjob.engines.local.waiter import ExitWaiter
from torchjob.expand import DesiredState
from torchjob.lifecycle import JobPhase, JobStatus
from torchjob.logs import Level
from torchjob.spec.model import Job, own_path
from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterable

    from torchjob.engines.local.admission import Plan
    from torchjob.engines.local.portwatch import PortGuard
    from torchjob.engines.local.queuewait import QueueWait

IDLE_WAIT = 0.1  # longest sleep of the loop; exits and signals wake it at once
TRACK_EVERY = 0.5  # seconds between scans for container descendants
CRASH_GRACE = 2.0  # most seconds of grace for pods of a job that did not reach a final phase


class Supervisor:
    def __init__(
        self,
        job: Job,
        job_dir: JobDir,
        *,
        console: Console | SinkConsole | None,  # SinkConsole: a caller's sink of lines
        echo_logs: bool,
        timeout: float | None,
        extra_env: dict[str, str],
        prewarm: bool = True,
        max_restarts: int | None = None,
        preload: tuple[str, ...] = (),
        admission: Plan | None = None,
        remove: bool = False,
        hang_notice: float = 0.0,
        planned: DesiredState | None = None,
        pooled: bool = False,
    ) -> None:
        self.job = job
        self.dir = job_dir
        self.id = job_dir.id
        self.remove = remove  # run --rm: the caller removes the job if it completed
        self.notes = Notes(console, told=lambda text: setattr(self.ctl, "told", text))
        warm = prewarm_modules(job) if prewarm and not preload else ()  # forking from the server is faster
        # pooled: the SDK's warm pool
        self.factory = PodFactory(job, job_dir, extra_env, warm, preload, planned, pooled)
        if self.factory.preloader is not None:  # a fork server that cannot be used is said once
            self.factory.preloader.note = lambda text: self.notes.note(text, Level.WARNING)
        ticket = None  # the job's place in the local queue (admission/)
        if admission is not None:
            from torchjob.engines.local.admission import Ticket

            ticket = Ticket(admission, self.id, job.name)
            self.factory.gpu_shares = ticket.gpu_env  # the GPUs the queue grants the job
        self.runner = runner.LocalRunner(
            self.factory.make,
            on_group=self.on_group,
            adopt=lambda: self.processes.adopt(),
            prewarm_modules=self.factory.prewarm_modules,
            host=self,
        )
        self.kubelet = Kubelet(self.runner)
        self.ctl: Controller[Pod] = Controller(
            job,
            self.kubelet,
            self.factory.expansion,
            clock=time.monotonic,
            timeout=timeout,
            max_restarts=max_restarts,
            admits=ticket.admits if ticket is not None else None,
            attached=console is not None,
        )
        self.processes = JobProcesses(self.id, self.ctl.pods, self.ctl.latest, self.factory.uids)
        self.processes.helpers = self._helpers
        self.waiter = ExitWaiter(Nudges(self.ctl.pods, self.factory).look)  # exits, signals, nudges
        self.signals = Signals(self.waiter)
        self.status_file = StatusFile(job, job_dir, self.ctl, self.factory, self.notes)
        self.echo = Echo(console, echo_logs, job.name, self.status_file.report, self.ordinal)
        self.hints = FailureHints(job.name, self.notes.record)
        self.silence = Silence(hang_notice, self.id, self.notes.record)
        self.queue: QueueWait | None = None
        if ticket is not None:
            from torchjob.engines.local.queuewait import QueueWait

            self.queue = QueueWait(
                ticket,
                job,
                self.id,
                ctl=self.ctl,
                factory=self.factory,
                notes=self.notes,
                status=self.status_file,
                signals=self.signals,
                waiter=self.waiter,
                check_dir=self.check_dir,
            )
        self.ports: PortGuard | None = None  # once the job has ports (start)
        self.running = False  # the job started (its pods were created)
        self.pid_fd = -1  # supervisor.pid, open while this process supervises (state.JobDir.write_pid)
        self.dir_identity: tuple[int, int] | None = None  # the job directory's (check_dir)

    @property
    def interrupted(self) -> int | None:
        """The signal that stopped the job, if one did."""
        return self.signals.interrupted

    def _helpers(self) -> list[int]:
        preloader = self.factory.preloader  # read each time: the warm pool may hand over its own
        return preloader.server_pids() if preloader is not None else []

    def ordinal(self, pod: Pod) -> int:
        """The pod's place in the job (its colour on the console)."""
        addressing = self.factory.addressing
        return addressing.ordinals[(pod.task, pod.index)] if addressing else 0

    def run(self, on_started: Callable[[], None] | None = None) -> None:
        """Run the job to its end; ``on_started`` is called once its pods have been started."""
        try:
            self.pid_fd = self.dir.write_pid()  # held open while this process supervises the job
            self.dir_identity = self.dir.identity()
            # Before any pod: a job whose status cannot be written never starts.
            self.status_file.write(must=True)
            if self.queue is not None and not self.queue.admit(on_started):
                return
            self.start()
            self.running = True
            if on_started is not None and not (self.queue is not None and self.queue.told_waiting):
                # Said and on disk before the caller returns: its next status shows the pods started
                # (else the Pending written before they were made, until the loop's first turn).
                self.ctl.poll()
                if self.ctl.dirty:
                    self.status_file.write()
                on_started()
            self.loop()
        except OSError as err:  # the job directory cannot be written (a full disk): end, say why
            # (A bug raising OSError ends the job the same way, with its reason, not a traceback.)
            self.stop_for(self._removed() or err)
        finally:
            self.shutdown()  # whatever happened above, nothing of the job outlives this

    def check_dir(self) -> None:
        """A job whose directory was removed under it (``rm -rf``, a test's temporary directory
        cleaned up) is stopped: no command could see, follow or delete it any more, and its pods
        would run on unseen. The directory is known by its identity, so one made again at the same
        path (by someone else) is not taken for it and is never written to."""
        if self.dir.identity() != self.dir_identity:
            self.status_file.gone = True
            raise FileNotFoundError(errno.ENOENT, "the job directory was removed", str(self.dir.path))

    def _removed(self) -> OSError | None:
        """The directory's removal, when that is why a write failed: said as that, not as the file."""
        if self.dir_identity is None:  # failed before it was known (a full disk): not a removal
            return None
        try:
            self.check_dir()
        except FileNotFoundError as gone:
            return gone
        return None

    def stop_for(self, err: OSError) -> None:
        where = f" ({err.filename})" if err.filename else ""
        if not where and err.errno in (errno.ENOSPC, errno.EDQUOT):
            where = f" (writing to {self.dir.path})"
        reason = f"torchjob stopped the job: {err.strerror or err}{where}"
        self.notes.note(f"{err.strerror or err}{where}: stopping the job", Level.ERROR)
        status = self.ctl.status
        if not status.phase.final:
            self.ctl.status = JobStatus(JobPhase.FAILED, status.retry_count, status.version, reason)
            self.ctl.dirty = True

    def start(self) -> None:
        factory = self.factory
        factory.prepare(self.notes.note, self.notes.record)
        if factory.ports:
            from torchjob.engines.local.portwatch import PortGuard

            self.ports = PortGuard(factory, self.ctl, self.processes, self.id, self.notes.record)
        self.processes.start()
        self.notes.note(f"job {self.id} started; ports {factory.ports_text()}; job directory {self.dir.path}")
        for note in local_warnings(factory.expansion(0, 0), factory.extra_env):
            self.notes.record(f"warning: {own_path(self.job, note.path)}: {note.message}")
        self.ctl.begin()
        preloader = factory.preloader
        if (
            preloader is not None
            and preloader.state == "none"
            and not self.ctl.waiting  # every pod is made
            and not preloader.pooled
        ):
            self.notes.note(
                f"--preload {','.join(preloader.modules)}: no container runs torchjob's python in a form "
                "the fork server can serve (python [options] SCRIPT|-m MODULE|-c CODE); they start cold",
                Level.WARNING,
            )
        factory.write_records()

    def loop(self) -> None:
        ctl = self.ctl
        last_track = time.monotonic()  # the pods have only just started: nothing to find yet
        while True:
            now = time.monotonic()
            self.signals.handle(ctl, self.kubelet, self.notes, self.id)
            ctl.check_deadline()
            if now - last_track > TRACK_EVERY:
                self.check_dir()
                self.processes.track()
                if self.ports is not None:
                    self.ports.watch()
                last_track = now
            self.wake_forks()
            self.give_up_stuck(now)
            ctl.poll()
            if self.queue is not None:
                self.queue.grow(now)
            ctl.fire_delayed()
            self.silence.check(now, ctl.status.phase, ctl.pods.values())
            self.echo.show()
            if ctl.dirty:
                self.status_file.write()
            if ctl.done():
                return
            preloader = self.factory.preloader
            self.waiter.wait(self.next_wait(last_track), preloader.importing() if preloader else None)

    def wake_forks(self) -> None:
        """Containers waiting for the fork server are tried the moment its import is over, not on
        their next retry (``FORK_RETRY`` later): the loop also wakes for the server's answer."""
        preloader = self.factory.preloader
        if preloader is None or preloader.importing() is None or not preloader.imported():
            return
        now = time.monotonic()
        for pod in self.ctl.pods.values():
            for c in pod.mains:
                if runner.of(c).fork_wait and c.next_start is not None and not pod.terminating:
                    c.next_start = now

    def next_wait(self, last_track: float) -> float:
        """Seconds until something needs the loop that no exit or signal announces."""
        now = time.monotonic()
        if self.ctl.created:  # created pods are reported on the next pass
            return 0.0
        pods = self.ctl.pods.values()
        if any(p.terminating and not p.gone for p in pods):
            return TICK
        due = [last_track + TRACK_EVERY, now + (LOG_EVERY if self.echo.echo_logs else IDLE_WAIT)]
        due += [c.next_start for p in pods for c in p.containers if c.next_start is not None]
        timed = self.ctl.next_due()  # a delayed reaction, the deadline
        if timed is not None:
            due.append(now + timed)
        return max(0.0, min(due) - now)

    def give_up_stuck(self, now: float) -> None:
        """A stopped attempt whose processes outlive SIGKILL (stuck in the kernel) is given up on."""
        for pod in self.ctl.pods.values():
            if pod.terminating and not pod.gone and pod.stuck(now, STUCK_AFTER_KILL):
                self.notes.note(
                    f"pod {short_name(self.job.name, pod.name)}: processes {runner.live_pids(pod)} "
                    "survive SIGKILL; giving up on them",
                    Level.ERROR,
                )
                pod.gone = True

    def on_group(self, pgid: int, started: bool) -> None:
        if started:  # a container's main process: its pid is its group's id
            self.waiter.add(pgid)
        else:
            self.waiter.remove(pgid)
        self.processes.on_group(pgid, started)

    # ------------------------------------------------ what the runner tells its host (RunnerHost)

    def created(self, pod: Pod) -> None:
        self.processes.created(pod)
        self.echo.follow(pod)

    def released(self, pods: Iterable[Pod]) -> None:
        pods = list(pods)
        # A pod is gone only with all of its processes, also those that escaped its groups.
        left = process.sweep(process.POD_MARKER, [str(p.engine) for p in pods], 1.0, self.processes.uids)
        process.reap_adopted(self.processes.job_pids)  # the killed orphans: no zombie is left
        if left:
            self.notes.note(f"processes {[p.pid for p in left]} of stopped pods survive SIGKILL", Level.ERROR)
        for pod in pods:
            self.echo.close(pod)

    def observed(self, pod: Pod, restarted: bool) -> None:
        if pod.phase in ENDED:
            self.echo.close(pod)
        self.hints.explain(pod, self.factory.net.namespace is not None)
        if pod.exit_code not in (None, 0) and self.ports is not None:  # before the policy ends the job
            self.ports.check()
        # Said here only when the container's log does not show the line torchjob writes into it.
        if restarted and not self.echo.echo_logs:
            last = self.kubelet.backoff(pod)
            code = f"exit code {last.exit_code}" if last is not None else "exit"
            delay = f" in {last.delay:.1f}s" if last is not None and last.delay is not None else ""
            self.notes.note(
                f"pod {short_name(self.job.name, pod.name)}: {code}; restart {pod.restarts}{delay} "
                f"(restartPolicy {pod.restart_policy})",
                Level.WARNING,
            )

    def note(self, text: str, level: Level = Level.INFO) -> None:
        self.notes.note(text, level)

    def record(self, text: str) -> None:
        self.notes.record(text)

    # ---------------------------------------------------------------- the end

    def shutdown(self) -> None:
        """Stop everything left, whatever happened; bounded in time."""
        self.stop_pods()
        self.factory.net.close()  # its forwarder first: the sweep below then has one process less to wait for
        self.processes.kill_the_rest()
        self.factory.temp.remove()  # after the last process: nothing writes there any more
        if self.queue is not None:
            self.queue.release()
        try:
            self.waiter.close()
            if self.factory.ports:  # a job without ports reserved none: the registry is not touched
                from torchjob.engines.local import ports as port_registry

                with contextlib.suppress(OSError):
                    port_registry.release(self.id)
            interrupted = self.signals.interrupted is not None
            self.echo.drain(list(self.ctl.latest.values()), interrupted, self.signals.pending)
            status = self.ctl.status
            if not status.phase.final:
                reason = status.reason or "the supervisor stopped"
                self.ctl.status = JobStatus(JobPhase.TERMINATED, status.retry_count, status.version, reason)
            kept = self.status_file.write_final()
            if self.remove and self.ctl.status.phase is JobPhase.COMPLETED:
                kept = ""  # the caller removes it
            self.echo.finish(self.status_file.report(), self.remove, kept, interrupted, self.signals.pending)
        finally:
            self.processes.reap_watchdog()  # it died while the above was done
            if self.pid_fd >= 0:  # this process supervises the job no more (an SDK caller goes on)
                with contextlib.suppress(OSError):
                    os.close(self.pid_fd)
                self.pid_fd = -1

    def stop_pods(self) -> None:
        """Terminate the pods still there and wait, bounded, until they are gone. A job that did
        not reach a final phase (an error, a crash) gives its pods at most ``CRASH_GRACE``."""
        final = self.ctl.status.phase.final
        pods = self.ctl.pods
        graces = [(pod, termination_grace(self.job, pod.task)) for pod in pods.values() if not pod.gone]
        self.kubelet.terminate([(pod, grace if final else min(grace, CRASH_GRACE)) for pod, grace in graces])
        deadline = time.monotonic() + DEFAULT_GRACE + STUCK_AFTER_KILL
        while any(not p.gone for p in pods.values() if p.terminating) and time.monotonic() < deadline:
            self.signals.handle(self.ctl, self.kubelet, self.notes, self.id)
            self.kubelet.poll(list(pods.values()))
            self.echo.show()
            self.waiter.wait(TICK)
