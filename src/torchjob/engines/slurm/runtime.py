"""The controller's pod runtime on Slurm: each pod attempt is a set of job steps on its node.

An attempt runs its init containers one at a time, each as a step, then its main containers
together, each as a step (``steps.Step``: one ``srun`` process on the batch host per step, its
output in the attempt's log file). Nothing here blocks the controller's loop: ``poll`` moves an
attempt on (next init container, main containers, ended), ``terminate`` stops an attempt's steps
in a thread of its own (``scancel --signal=TERM``, after the grace ``KILL``, then the ``srun``),
and the attempt is ``gone`` once every ``srun`` of it has exited.

A container that ends is not restarted in place: on Slurm a pod's restart is a new attempt, which
the job's policies (``RestartJob``, ``RestartTask``, ``RestartPod``) decide. ``restarts`` stays 0.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

from torchjob.engines.slurm import steps
from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from torchjob.controller import Backoff
    from torchjob.engines.slurm.plan import PodLaunch, Resources
    from torchjob.expand import PodPlan
    from torchjob.lifecycle import JobStatus

_PYTHONS = ("python", "python3")
CONFIRM_EVERY = 0.2  # seconds between two squeue calls that look for starting steps


class SlurmPod:
    """One attempt of one pod: its launches (init containers first) and the steps started so far."""

    def __init__(self, plan: PodPlan, attempt: int, launches: list[PodLaunch], log_dir: Path) -> None:
        self.task = plan.task.name
        self.index = plan.index
        self.name = plan.name
        self.attempt = attempt
        self.phase = "Pending"
        self.exit_code: int | None = None
        self.terminating = False
        self.gone = False
        self.started_at = time.time()
        self.finished_at: float | None = None
        self.inits = [launch for launch in launches if launch.init]
        self.mains = [launch for launch in launches if not launch.init]
        self.log_dir = log_dir
        self.next_init = 0
        self.init_step: steps.Step | None = None
        self.main_steps: dict[str, steps.Step] = {}
        self.codes: dict[str, int] = {}  # container -> exit code, as each ends
        self.reason = ""
        self.failed_container: str | None = None  # the container whose exit failed the attempt
        self.stopper: threading.Thread | None = None

    @property
    def restarts(self) -> int:
        return 0

    def all_steps(self) -> list[steps.Step]:
        found = list(self.main_steps.values())
        if self.init_step is not None:
            found.append(self.init_step)
        return found

    def running(self) -> list[steps.Step]:
        return [step for step in self.all_steps() if step.poll() is None]


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
        pod = SlurmPod(plan, attempt, self.launches[plan.name], log_dir)
        self._advance(pod)
        return pod

    def poll(self, attempts: Sequence[SlurmPod]) -> None:
        self._confirm([pod for pod in attempts if pod.main_steps and pod.phase == "Pending"])
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
            pod.terminating = True
            pod.stopper = threading.Thread(target=self._stop, args=(pod, grace), daemon=True)
            pod.stopper.start()

    def kill(self, attempts: Sequence[SlurmPod]) -> None:
        for pod in attempts:
            pod.terminating = True
            for step in pod.running():
                step.terminate(0.0)

    def forget(self, attempts: Sequence[SlurmPod]) -> None:
        for pod in attempts:
            pod.init_step = None
            pod.main_steps.clear()

    def observed(self, attempt: SlurmPod, restarted: bool) -> None:
        if attempt.phase == "Failed" and attempt.reason:
            self._say(f"pod {attempt.name} attempt {attempt.attempt}: {attempt.reason}")

    def backoff(self, attempt: SlurmPod) -> Backoff | None:
        return None  # no in-place restarts: a pod's restart is a new attempt

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
            if any(step.name in running or step.poll() is not None for step in pod.main_steps.values()):
                pod.phase = "Running"

    def _advance(self, pod: SlurmPod) -> None:
        """Move an attempt on: the next init container, then the main containers, then its end."""
        if pod.phase in ("Succeeded", "Failed"):
            return
        if pod.init_step is not None:
            code = pod.init_step.poll()
            if code is None:
                return
            container = pod.inits[pod.next_init - 1].container
            pod.codes[container] = code
            pod.init_step = None
            if code != 0:
                pod.failed_container = container
                self._finish(pod, "Failed", code, f"init container {container} exited with code {code}")
                return
        if pod.next_init < len(pod.inits):
            launch = pod.inits[pod.next_init]
            pod.next_init += 1
            pod.init_step = self._start(pod, launch)
            return
        if not pod.main_steps:
            for launch in pod.mains:
                pod.main_steps[launch.container] = self._start(pod, launch)
        for container, step in pod.main_steps.items():
            code = step.poll()
            if code is not None:
                pod.codes[container] = code
        if len(pod.codes) >= len(pod.inits) + len(pod.mains):
            failed = [(c, pod.codes[c]) for c in pod.main_steps if pod.codes[c] != 0]
            if failed:
                container, code = failed[0]
                pod.failed_container = container
                self._finish(pod, "Failed", code, f"container {container} exited with code {code}")
            else:
                self._finish(pod, "Succeeded", 0, "")

    def _finish(self, pod: SlurmPod, phase: str, code: int, reason: str) -> None:
        pod.phase, pod.exit_code, pod.reason = phase, code, reason
        pod.finished_at = time.time()

    def _ended(self, pod: SlurmPod) -> None:
        """A stopped attempt: what its steps' exit codes say, once every srun is gone."""
        if pod.phase in ("Succeeded", "Failed"):
            return
        codes = [step.poll() for step in pod.all_steps()]
        code = next((c for c in codes if c), None)
        pod.exit_code = code if code is not None else pod.exit_code
        pod.finished_at = time.time()

    def _start(self, pod: SlurmPod, launch: PodLaunch) -> steps.Step:
        resources, component = self.resources(launch)
        argv = list(launch.argv)
        if argv[0] in _PYTHONS:  # as locally: a bare python is the interpreter torchjob runs in
            argv[0] = sys.executable
        env = {**self.base_env, **launch.env}
        if not launch.init:
            env.update(self.extra_env)
        env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", os.defpath)])
        # A step name unique in the allocation: a retry's steps are told from the last attempt's.
        name = f"{pod.name}.{launch.container}.{pod.attempt}"
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
