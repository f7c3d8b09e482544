"""The local engine's loop: the job's processes, driven by the engine-neutral controller.

The policy (Volcano's lifecycle, ``dependsOn``, deadlines, ``--max-restarts``) is
:class:`torchjob.controller.Controller`'s, each pod attempt's containers the kubelet's
(:mod:`torchjob.controller.kubelet`) over this machine's container runner (:mod:`.runner`); this
module is the loop around them: tracking the job's process tree, signals, the rendezvous port's
watch, the local queue's admission wait, the console, the silence notice and status.json. Each
pass of the loop: the controller's deadline, a scan of the processes, the controller's poll of
the pods and its delayed reactions; log files are followed and printed on the same pass. Between
passes the loop sleeps until a container process exits, a signal arrives or something falls due
(a delayed reaction, a restart, the next scan or log read): an exit is seen at once and an idle
job costs almost no CPU. When the job's phase is final, whatever still runs is stopped, every
process carrying the job's marker is swept up, and the loop ends.

The parts around the loop live beside it: :mod:`.creation` makes the pods (ports, names, ranks,
environment), :mod:`.runner` starts, polls and signals their containers, :mod:`.cleanup` tracks
every process of the job and shuts it down; the report is the controller's
(:mod:`torchjob.controller.report`).
"""

from __future__ import annotations

import contextlib
import errno
import signal
import threading
import time
from collections.abc import Callable
from types import FrameType

from torchjob import logs
from torchjob.controller import Controller
from torchjob.controller.kubelet import ENDED, RUNNING, SUCCEEDED, Kubelet, Pod
from torchjob.controller.report import job_report
from torchjob.display import elapsed, headline, level_color, pod_color, pod_rows, prefix_for
from torchjob.engines.local import hints, process, runner
from torchjob.engines.local.cleanup import (
    INTERRUPTED_STALL,
    OUTPUT_STALL,
    STUCK_AFTER_KILL,
    TICK,
    JobProcesses,
    shutdown,
)
from torchjob.engines.local.containers import local_warnings
from torchjob.engines.local.creation import PodFactory
from torchjob.engines.local.output import Console, SinkConsole, hush, short_name
from torchjob.engines.local.prewarm import modules_of as prewarm_modules
from torchjob.engines.local.state import JobDir
from torchjob.engines.local.waiter import ExitWaiter
from torchjob.expand import DesiredState
from torchjob.files import LogFollower
from torchjob.lifecycle import Action, JobPhase, JobStatus, initial_status
from torchjob.logs import Level
from torchjob.reports import Event, JobReport
from torchjob.spec.model import Job
from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterable
    from typing import Any

    from torchjob.engines.local.admission import Plan, Ticket
    from torchjob.engines.local.listeners import PortWatch

IDLE_WAIT = 0.1  # longest sleep of the loop; exits and signals wake it at once
LOG_EVERY = 0.05  # seconds between reads of the followed log files when they are printed
TRACK_EVERY = 0.5  # seconds between scans for container descendants

Key = tuple[str, int]


def _last_output(pod: Pod) -> float:
    """When the pod last wrote to any of its logs (its start, if it never did)."""
    times = [pod.started_at or 0.0]
    for c in pod.containers:
        with contextlib.suppress(OSError):
            times.append(c.log.stat().st_mtime)
    return max(times)


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
        self.console = console
        self.echo_logs = echo_logs and console is not None
        self.events: list[Event] = []
        self.follower = LogFollower()
        self.signals: list[int] = []
        self.started = time.time()
        self.finished: float | None = None
        warm = prewarm_modules(job) if prewarm and not preload else ()  # forking from the server is faster
        # pooled: the SDK's warm pool
        self.factory = PodFactory(job, job_dir, extra_env, warm, preload, planned, pooled)
        if self.factory.preloader is not None:  # a fork server that cannot be used is said once
            self.factory.preloader.note = lambda text: self.note(text, Level.WARNING)
        self.ticket: Ticket | None = None  # the job's place in the local queue (admission/)
        if admission is not None:
            from torchjob.engines.local.admission import Ticket

            self.ticket = Ticket(admission, self.id, job.name)
        # The policy is the controller's, each attempt's containers the kubelet's over the runner.
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
            admits=self.ticket.admits if self.ticket is not None else None,
            attached=console is not None,
        )
        self.processes = JobProcesses(self.id, self.ctl.pods, self.ctl.latest)
        self.waiter = ExitWaiter()  # woken by container exits (pidfds) and signals
        self.interrupted: int | None = None
        self.running = False  # the job started (its pods were created)
        self.status_error = ""  # why status.json could not be written, once said
        self.next_grow = 0.0  # when to try again to grant pods beyond the gang
        self.told_waiting = False  # a detached job's caller was let go while the job waits its turn
        self.remove = remove  # run --rm: the caller removes the job if it completed
        self.explained: set[tuple[Key, str]] = set()  # containers whose first failure was looked at
        self.told_no_torch = False  # hints.missing_torch: one line a job
        self.told_no_network = False  # hints.no_network: one line a job
        self.hang_notice = hang_notice  # seconds of silence from every pod before one notice; 0: never
        self.silence_checked = 0.0  # monotonic time of the last look at the pods' logs
        self.silence_told = False  # said for this silence; output from any pod re-arms it
        self.pid_fd = -1  # supervisor.pid, open while this process supervises (state.JobDir.write_pid)
        self.port_watch: PortWatch | None = None  # the rendezvous port's listeners, while the job runs
        self.dir_removed = False  # a full disk: nothing of the job could be kept

    # The controller's state, read and set as the supervisor's own (cleanup, reports, the engine).

    @property
    def status(self) -> JobStatus:
        return self.ctl.status

    @status.setter
    def status(self, value: JobStatus) -> None:
        self.ctl.status = value

    @property
    def pods(self) -> dict[Key, Pod]:
        """Pods that exist now (finished ones included)."""
        return self.ctl.pods

    @property
    def latest(self) -> dict[Key, Pod]:
        """The newest attempt of every pod, for reports."""
        return self.ctl.latest

    @property
    def timeout(self) -> float | None:
        return self.ctl.timeout

    @property
    def dirty(self) -> bool:
        return self.ctl.dirty

    @dirty.setter
    def dirty(self, value: bool) -> None:
        self.ctl.dirty = value

    @property
    def port_lost(self) -> str | None:
        """What took a port of the job, once a container failed: the likelier cause of a failure."""
        return self.ctl.suspect

    @port_lost.setter
    def port_lost(self, value: str | None) -> None:
        self.ctl.suspect = value

    # ------------------------------------------------------------------ setup

    def prepare(self) -> DesiredState:
        if self.ticket is not None:
            self.factory.gpu_shares = self.ticket.gpu_env
        return self.factory.prepare(self.note, self.record)

    def admit(self, on_waiting: Callable[[], None] | None) -> bool:
        """Wait for the job's turn in the local queue (no ticket: at once); False when it ended
        while waiting (a signal, its deadline). ``on_waiting`` is told once if it has to wait."""
        ticket = self.ticket
        if ticket is None:
            return True  # a job that asks for nothing loads nothing of the queue
        from torchjob.engines.local.admission import POLL, POLL_MAX

        for note in ticket.plan.notes:
            self.record(note)
        shown = ""
        while not ticket.poll():
            if ticket.reason != shown:  # in status.json and on the console, once per change
                shown = ticket.reason
                self.status = JobStatus(JobPhase.PENDING, 0, 0, shown)
                self.note(f"job {self.id} is {shown}", Level.WARNING)
                self.write_status()
                if on_waiting is not None and not self.told_waiting:
                    on_waiting()
                    self.told_waiting = True
            if self.signals:
                name = signal.Signals(self.signals[-1]).name
                self.interrupted = self.signals[-1]
                if self.interrupted == signal.SIGINT and self.console is not None:
                    hush(self.console, self.id, [], f"waiting in queue {ticket.plan.queue}")
                return self.end_waiting(
                    f"torchjob received {name} while the job waited in queue {ticket.plan.queue}"
                )
            elapsed = time.time() - self.started
            if self.timeout is not None and elapsed >= self.timeout:
                return self.end_waiting(
                    f"the job's deadline of {self.timeout:g}s passed while it waited in the queue"
                )
            every = min(POLL_MAX, POLL + elapsed / 20)  # 0.2 s at first, 1 s after 16 s of waiting
            wait = every if self.timeout is None else min(every, self.timeout - elapsed)
            self.waiter.wait(wait)
        if shown:
            self.record(f"admitted to queue {ticket.plan.queue} after {time.time() - self.started:.1f}s")
        self.status = initial_status()  # the deadline counts on from the submission, waiting included
        return True

    def end_waiting(self, reason: str) -> bool:
        self.status = JobStatus(JobPhase.TERMINATED, 0, 0, reason)
        self.dirty = True
        return False

    def grow(self, now: float) -> None:
        """Pods beyond the gang start once the queue grants them."""
        if self.ticket is None or now < self.next_grow or self.status.phase.final:
            return
        from torchjob.engines.local.admission import GROW_EVERY

        self.next_grow = now + GROW_EVERY
        # A pod that succeeded holds nothing any more (a failed one keeps its share: the job may
        # well be restarted by a policy, and must not then start below its gang).
        finished = {
            f"{t}/{i}" for (t, i), p in self.pods.items() if p.phase == SUCCEEDED and not p.terminating
        }
        more = self.ticket.grow(finished)  # never raises over the queue's state: see notice
        said = self.ticket.notice()
        if said:  # in the job's events (status) and on its console
            self.record(said)
            self.dirty = True
        if more:
            self.factory.regrant(list(more))
        # As Volcano's sync creates the pods that do not exist: those the queue lets start now.
        if (
            self.status.phase in (JobPhase.PENDING, JobPhase.RUNNING)
            and len(self.pods) < self.job.total_replicas
        ):
            self.ctl.create_missing()

    # -------------------------------------------------------------- the loop

    def run(self, on_started: Callable[[], None] | None = None) -> None:
        """Run the job to its end; ``on_started`` is called once its pods have been started."""
        try:
            self.pid_fd = self.dir.write_pid()  # held open while this process supervises the job
            self.write_status(must=True)  # before any pod: a job whose status cannot be written never starts
            if not self.admit(on_started):
                return
            self.start()
            self.running = True
            if on_started is not None and not self.told_waiting:
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
        self.note(f"{err.strerror or err}{where}: stopping the job", Level.ERROR)
        if not self.status.phase.final:
            self.status = JobStatus(JobPhase.FAILED, self.status.retry_count, self.status.version, reason)
            self.dirty = True

    def start(self) -> None:
        self.prepare()
        self.processes.start()
        self.note(f"job {self.id} started; ports {self.factory.ports_text()}; job directory {self.dir.path}")
        for note in local_warnings(self.factory.expansion(0, 0), self.factory.extra_env):
            self.record(f"warning: {note.path}: {note.message}")
        self.ctl.begin()
        preloader = self.factory.preloader
        if (
            preloader is not None
            and preloader.state == "none"
            and not self.ctl.waiting  # every pod is made
            and not preloader.pooled
        ):
            self.note(
                f"--preload {','.join(preloader.modules)}: no container runs torchjob's python in a form "
                "the fork server can serve (python [options] SCRIPT|-m MODULE|-c CODE); they start cold",
                Level.WARNING,
            )
        self.factory.write_records()

    def loop(self) -> None:
        last_track = time.monotonic()  # the pods have only just started: nothing to find yet
        while True:
            now = time.monotonic()
            self.handle_signals()
            self.ctl.check_deadline()
            if now - last_track > TRACK_EVERY:
                self.processes.track()
                self.watch_rendezvous()
                last_track = now
            self.wake_forks()
            self.give_up_stuck(now)
            self.ctl.poll()
            self.grow(now)
            self.ctl.fire_delayed()
            self.check_silence(now)
            self.print_logs()
            if self.dirty:
                self.write_status()
            if self.ctl.done():
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
        for pod in self.pods.values():
            for c in pod.mains:
                if runner.of(c).fork_wait and c.next_start is not None and not pod.terminating:
                    c.next_start = now

    def next_wait(self, last_track: float) -> float:
        """Seconds until something needs the loop that no exit or signal announces."""
        now = time.monotonic()
        if self.ctl.created:  # created pods are reported on the next pass
            return 0.0
        if any(p.terminating and not p.gone for p in self.pods.values()):
            return TICK
        due = [last_track + TRACK_EVERY, now + (LOG_EVERY if self.echo_logs else IDLE_WAIT)]
        due += [c.next_start for p in self.pods.values() for c in p.containers if c.next_start is not None]
        timed = self.ctl.next_due()  # a delayed reaction, the deadline
        if timed is not None:
            due.append(now + timed)
        return max(0.0, min(due) - now)

    # ---------------------------------------------------------------- pods

    # What the runner tells its host (runner.RunnerHost).

    def created(self, pod: Pod) -> None:
        self.follow_logs(pod)

    def give_up_stuck(self, now: float) -> None:
        """A stopped attempt whose processes outlive SIGKILL (stuck in the kernel) is given up on."""
        for pod in self.pods.values():
            if pod.terminating and not pod.gone and pod.stuck(now, STUCK_AFTER_KILL):
                self.note(
                    f"pod {short_name(self.job.name, pod.name)}: processes {runner.live_pids(pod)} "
                    "survive SIGKILL; giving up on them",
                    Level.ERROR,
                )
                pod.gone = True

    def released(self, pods: Iterable[Pod]) -> None:
        pods = list(pods)
        # A pod is gone only with all of its processes, also those that escaped its groups.
        left = process.sweep(process.POD_MARKER, [str(pod.engine) for pod in pods])
        process.reap_adopted(self.processes.job_pids)  # the killed orphans: no zombie is left
        if left:
            self.note(f"processes {[p.pid for p in left]} of stopped pods survive SIGKILL", Level.ERROR)
        for pod in pods:
            self.close_logs(pod)

    def observed(self, pod: Pod, restarted: bool) -> None:
        if pod.phase in ENDED:
            self.close_logs(pod)
        self.explain_failure((pod.task, pod.index), pod)
        if pod.exit_code not in (None, 0):  # before the policy ends the job: its reason tells
            self.check_ports()
        if restarted and not self.echo_logs:  # else the line torchjob writes in the container's log says it
            last = self.kubelet.backoff(pod)
            code = f"exit code {last.exit_code}" if last is not None else "exit"
            delay = f" in {last.delay:.1f}s" if last is not None and last.delay is not None else ""
            self.note(
                f"pod {short_name(self.job.name, pod.name)}: {code}; restart {pod.restarts}{delay} "
                f"(restartPolicy {pod.restart_policy})",
                Level.WARNING,
            )

    def check_silence(self, now: float) -> None:
        """One notice once every pod of the running job has written nothing for ``hang_notice``
        seconds: a hang (a rank waiting for a peer that never comes) is otherwise silent until a
        timeout. Looked at once a second, by the modification times of the pods' log files."""
        if (
            not self.hang_notice
            or self.status.phase is not JobPhase.RUNNING
            or now < self.silence_checked + 1
        ):
            return
        self.silence_checked = now
        pods = [p for p in self.pods.values() if not p.gone and not p.terminating]
        if not pods or any(p.phase != RUNNING for p in pods):
            return
        last = max(_last_output(p) for p in pods)
        silent = time.time() - last
        if silent < self.hang_notice:
            self.silence_told = False
        elif not self.silence_told:
            self.silence_told = True
            self.record(
                f"no pod has written any output for {elapsed(last, None)}; if the job hangs, "
                f"torchjob status {self.id} shows each pod's last output (run --hang-notice SECONDS "
                "sets when this is said, 0 never)"
            )

    def explain_failure(self, key: Key, pod: Pod) -> None:
        """A container's first failure whose fix is outside the job (no torch here): said once."""
        for c in pod.containers:
            if c.exit_code in (None, 0) or (key, c.name) in self.explained:
                continue
            self.explained.add((key, c.name))  # only its first failure: a crash loop repeats it
            hint = hints.missing_torch(c) if not self.told_no_torch else None
            if hint is not None:
                self.told_no_torch = True
                self.record(f"pod {short_name(self.job.name, pod.name)}: {hint}")
            hint = hints.no_network(c) if self.factory.net.namespace and not self.told_no_network else None
            if hint is not None:
                self.told_no_network = True
                self.record(f"pod {short_name(self.job.name, pod.name)}: {hint}")

    def watch_rendezvous(self) -> None:
        """A process outside the job that listens on the job's rendezvous port (MASTER_PORT) ends
        the job at once, with that as its reason: its ranks would otherwise wait for a master
        that cannot listen, or join that process's rendezvous (torchrun's c10d backend becomes a
        client of whatever holds the port) and hang there until a timeout of many minutes."""
        if not self.factory.rendezvous or self.status.phase.final or self.factory.net.namespace is not None:
            return  # (in the job's own network nothing outside the job can listen)
        if self.port_watch is None:
            from torchjob.engines.local.listeners import PortWatch

            uids = {int(uid) for uid in self.factory.uids.split()}
            self.port_watch = PortWatch(self.factory.rendezvous, self.id, uids)
        taken = self.port_watch.taken(self.job_pids())
        if taken:
            self.port_lost = "; ".join(taken)
            self.record(self.port_lost)
            self.ctl.fail_job(
                f"{self.port_lost}; the job's ranks would rendezvous with it, or wait for a master "
                "that cannot listen"
            )

    def check_ports(self) -> None:
        """Once, at the job's first failed container: did a process outside the job take one of its
        ports after the reservation? Then say so (the port, the process): the failure is most
        likely that (the master's ``Address already in use``), not the program's own error."""
        if self.port_lost is not None or not self.factory.ports:
            return
        from torchjob.engines.local.listeners import PortWatch

        uids = {int(uid) for uid in self.factory.uids.split()}
        network = self.factory.net.namespace  # the job's own: its listeners are read there
        watch = PortWatch(self.factory.ports, self.id, uids, network.read_tables if network else None)
        self.port_lost = "; ".join(watch.taken(self.job_pids()))
        if self.port_lost:
            self.record(self.port_lost)

    def job_pids(self) -> set[int]:
        """The job's processes known here: containers (a forked one shows no job's marker) and
        their recorded descendants."""
        mine = set(self.processes.job_pids)
        for pod in self.pods.values():
            mine.update(runner.child_pids(pod))
        return mine

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
                self.note(f"{name} again: killing every process of the job now", Level.ERROR)
                self.kubelet.kill(list(self.pods.values()))
                continue
            self.interrupted = self.interrupted or signum
            if signum == signal.SIGINT and self.console is not None:  # Ctrl-C: one line (hush)
                stopping = [p.name for p in self.latest.values() if not p.gone and p.phase not in ENDED]
                hush(self.console, self.id, stopping)
            else:
                self.note(f"{name}: stopping the job (again to kill at once)", Level.WARNING)
            self.ctl.act(Action.TERMINATE_JOB, None, None, f"torchjob received {name}")

    # ------------------------------------------------------------- output

    def note(self, text: str, level: Level = Level.INFO) -> None:
        # Printed once: on the console when there is one, else as a log record (-v, detached).
        if self.console is not None:
            self.console.note(text, level_color(level))
        else:
            logs.info(text)

    def record(self, text: str) -> None:
        self.events.append(Event(time.time(), text))
        self.events = self.events[-50:]
        self.note(text, Level.WARNING)
        self.ctl.told = text

    def follow_logs(self, pod: Pod) -> None:
        if not self.echo_logs:
            return
        short = short_name(self.job.name, pod.name)
        addressing = self.factory.addressing
        ordinal = addressing.ordinals[(pod.task, pod.index)] if addressing else 0
        for c in pod.inits:
            self.follower.follow(c.log, prefix_for(short, pod.rank, c.name), pod_color(ordinal))
        for c in pod.mains:
            name = None if len(pod.mains) == 1 else c.name
            self.follower.follow(c.log, prefix_for(short, pod.rank, name), pod_color(ordinal))

    def close_logs(self, pod: Pod) -> None:
        for c in pod.containers:
            self.follower.close(c.log)

    def print_logs(self) -> None:
        if self.console is not None:
            self.console.tick()
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
        report = job_report(
            self.job,
            engine="local",
            id=self.id,
            location="" if self.dir_removed else str(self.dir.path),  # no logs to point at
            status=self.status,
            latest=self.latest,
            current=self.pods,
            ports=self.factory.ports,
            started=self.started,
            finished=self.finished,
            events=self.events,
            # Not decided before the pods are prepared (a job waiting in the queue): not said.
            name_resolution=self.factory.name_resolution if self.factory.addressing is not None else "",
        )
        report.network = self.factory.net.text  # the job's own namespace, or why the machine's
        return report

    def write_status(self, must: bool = False) -> None:
        """Write status.json; a failure (a full disk) is said once and retried on the next pass."""
        try:
            self.dir.write_status(self.report())
        except OSError as err:
            if must:
                raise
            if str(err) != self.status_error:
                self.status_error = str(err)
                self.note(f"cannot write {self.dir.status_file}: {err.strerror or err}", Level.ERROR)
            return
        self.dirty = False
        self.status_error = ""
