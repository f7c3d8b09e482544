"""The controller's pod runtime on Slurm: each pod attempt is a set of job steps on its node.

An attempt runs its init containers one at a time, each as a step, then its main containers
together, each as a step (``steps.Step``: one ``srun`` process on the batch host per step, its
output in the attempt's log file). Nothing here blocks the controller's loop: ``poll`` moves an
attempt on (next init container, main containers, restarts, ended), ``terminate`` stops an
attempt's steps in a thread of its own (``scancel --signal=TERM``, after the grace ``KILL``, then
the ``srun``), and the attempt is ``gone`` once every ``srun`` of it has exited.

``restartPolicy`` is a kubelet's, as on the local engine: a container that ends is started again
in place, as a new step of the same attempt, under ``Always`` (whatever its exit code) and
``OnFailure`` (a non-zero one; failed init containers too), after the same back-off
(``controller.backoff``); its restarts add up in the attempt's ``restarts``, which the task's
``maxRetry`` (TaskFailed) and ``--max-restarts`` count. A restart of the whole pod is a new
attempt, which the job's policies (``RestartJob``, ``RestartTask``, ``RestartPod``) decide.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from pathlib import Path

from torchjob.controller.driver import BACKOFF_RESET, Backoff, backoff, waiting_backoff
from torchjob.engines.slurm import steps
from torchjob.records import record
from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from torchjob.engines.slurm.plan import PodLaunch, Resources
    from torchjob.expand import PodPlan
    from torchjob.lifecycle import JobStatus

_PYTHONS = ("python", "python3")
CONFIRM_EVERY = 0.2  # seconds between two squeue calls that look for starting steps
_ENDED = ("Succeeded", "Failed")


def _append(path: Path, text: str) -> None:
    """torchjob's own lines in a container's log; lost, not fatal, when the disk is full."""
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        with os.fdopen(fd, "a") as log:
            log.write(text)


@record
class Container:
    """One container of an attempt across its in-place restarts: its latest step, its back-off."""

    launch: PodLaunch
    step: steps.Step | None = None
    started: float | None = None  # monotonic time its latest step started
    exit_code: int | None = None  # of its latest run
    restarts: int = 0
    failures: int = 0  # consecutive quick failures, for the back-off
    next_start: float | None = None  # monotonic time of its next start (waiting out a back-off)
    done: bool = False  # ended, and not to be started again

    @property
    def name(self) -> str:
        return self.launch.container


class SlurmPod:
    """One attempt of one pod: its containers (init containers first) and their steps."""

    def __init__(
        self, plan: PodPlan, attempt: int, launches: list[PodLaunch], log_dir: Path, restart_policy: str
    ) -> None:
        self.task = plan.task.name
        self.index = plan.index
        self.name = plan.name
        self.attempt = attempt
        self.restart_policy = restart_policy
        self.phase = "Pending"
        self.exit_code: int | None = None
        self.terminating = False
        self.gone = False
        self.started_at = time.time()
        self.finished_at: float | None = None
        self.inits = [Container(launch) for launch in launches if launch.init]
        self.mains = [Container(launch) for launch in launches if not launch.init]
        self.log_dir = log_dir
        self.next_init = 0  # the init container running (or waiting to restart)
        self.mains_started = False
        self.reason = ""
        self.failed_container: str | None = None  # the container whose exit failed the attempt
        self.stopper: threading.Thread | None = None

    @property
    def restarts(self) -> int:
        return sum(c.restarts for c in [*self.inits, *self.mains])

    @property
    def containers(self) -> list[Container]:
        return [*self.inits, *self.mains]

    def all_steps(self) -> list[steps.Step]:
        return [c.step for c in self.containers if c.step is not None]

    def running(self) -> list[steps.Step]:
        return [step for step in self.all_steps() if step.poll() is None]

    def restarts_after(self, code: int) -> bool:
        """restartPolicy: does a main container that exited with ``code`` start again?"""
        return self.restart_policy == "Always" or (self.restart_policy == "OnFailure" and code != 0)


class SlurmRuntime:
    """Starts, observes and stops pod attempts as steps of the allocation ``job_id``."""

    def __init__(
        self,
        job_id: str,
        job_dir: Path,
        launches: dict[str, list[PodLaunch]],
        resources: Callable[[PodLaunch], tuple[Resources, int | None]],
        *,
        base_env: dict[str, str],
        extra_env: dict[str, str],
        workdir: str,
        say: Callable[[str], None],
        record: Callable[[str], None],
    ) -> None:
        self.job_id = job_id
        self.listed = steps.component_ids_from_env({"SLURM_JOB_ID": job_id, **base_env})
        self.job_dir = job_dir
        self.launches = launches
        self.resources = resources
        self.base_env = base_env
        self.extra_env = extra_env
        self.workdir = workdir
        self.attempts: dict[str, int] = {}  # pod name -> its latest attempt number
        self.asked_at = 0.0  # when squeue was last asked which steps run
        self._say = say
        self._record = record

    # ------------------------------------------------------------- the protocol

    def create(self, plan: PodPlan, status: JobStatus) -> SlurmPod:
        attempt = self.attempts.get(plan.name, -1) + 1
        self.attempts[plan.name] = attempt
        log_dir = self.job_dir / "logs" / plan.name / str(attempt)
        log_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        policy = plan.task.template.restart_policy
        pod = SlurmPod(plan, attempt, self.launches[plan.name], log_dir, policy)
        self._advance(pod)
        return pod

    def poll(self, attempts: Sequence[SlurmPod]) -> None:
        self._confirm([pod for pod in attempts if pod.mains_started and pod.phase == "Pending"])
        for pod in attempts:
            if pod.terminating:
                if (pod.stopper is None or not pod.stopper.is_alive()) and not pod.running():
                    self._ended(pod)
                    pod.gone = True
                continue
            self._advance(pod)

    def terminate(self, attempts: Sequence[tuple[SlurmPod, float]]) -> None:
        for pod, grace in attempts:
            if pod.terminating:
                continue
            self._stopping(pod)
            pod.stopper = threading.Thread(target=self._stop, args=(pod, grace), daemon=True)
            pod.stopper.start()

    def kill(self, attempts: Sequence[SlurmPod]) -> None:
        for pod in attempts:
            self._stopping(pod)
            for step in pod.running():
                step.terminate(0.0)

    def forget(self, attempts: Sequence[SlurmPod]) -> None:
        for pod in attempts:
            for c in pod.containers:
                c.step = None

    def observed(self, attempt: SlurmPod, restarted: bool) -> None:
        if attempt.phase == "Failed" and attempt.reason:
            self._say(f"pod {attempt.name} attempt {attempt.attempt}: {attempt.reason}")
        # A restart in place is told by the line written into the container's log, as locally.

    def backoff(self, attempt: SlurmPod) -> Backoff | None:
        fields = ((c.name, c.failures, c.exit_code, c.next_start) for c in attempt.containers)
        return waiting_backoff(fields, time.monotonic())

    def note(self, text: str, color: str) -> None:
        self._say(text)

    def record(self, text: str) -> None:
        self._record(text)

    # ------------------------------------------------------------- an attempt's course

    def _confirm(self, starting: list[SlurmPod]) -> None:
        """Running once Slurm runs a main container's step (srun may wait for its resources):
        ``dependsOn`` counts a pod as running only then, as Kubernetes does once containers start."""
        now = time.monotonic()
        if not starting or now - self.asked_at < CONFIRM_EVERY:
            return
        self.asked_at = now
        try:
            running = set(steps.steps(self.listed, self.base_env).values())
        except steps.SlurmError:
            return  # asked again on a later poll
        for pod in starting:
            if any(
                c.restarts or (c.step is not None and (c.step.name in running or c.step.poll() is not None))
                for c in pod.mains
            ):
                pod.phase = "Running"

    def _advance(self, pod: SlurmPod) -> None:
        """Move an attempt on: init containers in order, then the main containers (each restarted
        in place as ``restartPolicy`` says), then its end."""
        if pod.phase in _ENDED:
            return
        now = time.monotonic()
        while pod.next_init < len(pod.inits):
            c = pod.inits[pod.next_init]
            if c.step is None or c.next_start is not None:
                if c.next_start is None or now >= c.next_start:
                    self._run(pod, c, now)
                return
            code = c.step.poll()
            if code is None:
                return
            c.exit_code = code
            self._relay(pod, c)
            if code == 0:
                c.done = True
                pod.next_init += 1
                continue
            if pod.restart_policy == "Never":
                pod.failed_container = c.name
                self._finish(pod, "Failed", code, f"init container {c.name} exited with code {code}")
            else:  # Kubernetes restarts failed init containers under Always and OnFailure
                self._schedule_restart(pod, c, now)
            return
        if not pod.mains_started:
            pod.mains_started = True
            for c in pod.mains:
                self._run(pod, c, now)
        for c in pod.mains:
            if c.done:
                continue
            if c.next_start is not None:
                if now >= c.next_start:
                    self._run(pod, c, now)
                continue
            code = c.step.poll() if c.step is not None else None
            if code is None:
                continue
            c.exit_code = code
            self._relay(pod, c)
            if pod.restarts_after(code):
                self._schedule_restart(pod, c, now)
            else:
                c.done = True
        if all(c.done for c in pod.mains):
            failed = [c for c in pod.mains if c.exit_code != 0]
            if failed:
                c = failed[0]
                code = c.exit_code if c.exit_code is not None else 1
                pod.failed_container = c.name
                self._finish(pod, "Failed", code, f"container {c.name} exited with code {code}")
            else:
                self._finish(pod, "Succeeded", 0, "")

    def _schedule_restart(self, pod: SlurmPod, c: Container, now: float) -> None:
        ran = now - (c.started if c.started is not None else now)
        c.failures = 1 if ran >= BACKOFF_RESET else c.failures + 1
        delay = backoff(c.failures)
        c.restarts += 1
        c.next_start = now + delay
        line = (
            f"--- torchjob: container {c.name!r} exited with code {c.exit_code}; "
            f"restart {c.restarts} in {delay:.1f}s (restartPolicy {pod.restart_policy}) ---\n"
        )
        _append(pod.log_dir / f"{c.name}.log", line)

    def _relay(self, pod: SlurmPod, c: Container) -> None:
        """What srun said of a step that ended, when it says more than the exit code (it could
        not create the step, say): into the container's log, where the user looks for why."""
        said = c.step.messages() if c.step is not None else []
        if said:
            _append(pod.log_dir / f"{c.name}.log", "".join(f"{line}\n" for line in said))

    def _stopping(self, pod: SlurmPod) -> None:
        pod.terminating = True
        for c in pod.containers:
            c.next_start = None  # a stopped attempt starts nothing again

    def _finish(self, pod: SlurmPod, phase: str, code: int, reason: str) -> None:
        pod.phase, pod.exit_code, pod.reason = phase, code, reason
        pod.finished_at = time.time()

    def _ended(self, pod: SlurmPod) -> None:
        """A stopped attempt: what its steps' exit codes say, once every srun is gone."""
        if pod.phase in _ENDED:
            return
        for c in pod.containers:  # a container stopped while it ran: how its step ended (143, ...)
            if c.exit_code is None and c.step is not None:
                c.exit_code = c.step.poll()
        codes = [c.exit_code for c in pod.containers]
        code = next((c for c in codes if c), None)
        pod.exit_code = code if code is not None else pod.exit_code
        pod.finished_at = time.time()

    def _run(self, pod: SlurmPod, c: Container, now: float) -> None:
        """Start (or start again) a container as a step of its own."""
        c.next_start, c.exit_code, c.started = None, None, now
        # A step name unique in the allocation: a retry's (or a restart's) steps are told from
        # the last ones'.
        suffix = f".{c.restarts}" if c.restarts else ""
        c.step = self._start(pod, c.launch, f"{pod.name}.{c.name}.{pod.attempt}{suffix}")

    def _start(self, pod: SlurmPod, launch: PodLaunch, name: str) -> steps.Step:
        resources, component = self.resources(launch)
        argv = list(launch.argv)
        if argv[0] in _PYTHONS:  # as locally: a bare python is the interpreter torchjob runs in
            argv[0] = sys.executable
        env = {**self.base_env, **launch.env}
        if not launch.init:
            env.update(self.extra_env)
        env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", os.defpath)])
        return steps.Step.start(
            self.job_id,
            name,
            argv,
            host=launch.placement.host,
            resources=resources,
            env=env,
            log=pod.log_dir / f"{launch.container}.log",
            component=component,
            working_dir=launch.working_dir or self.workdir,
            image=resources.image,
            listed=self.listed,
        )

    def _stop(self, pod: SlurmPod, grace: float) -> None:
        for step in pod.all_steps():
            if step.poll() is None:
                step.terminate(grace)
