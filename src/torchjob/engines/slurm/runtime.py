"""The kubelet's container runtime on Slurm: each container run is a job step on its pod's node.

The kubelet (:mod:`torchjob.controller.kubelet`) runs each pod attempt: init containers in order,
then the containers, restarts in place, back-off, the attempt's phase. It asks this runtime only
to make an attempt's containers, to start one (``srun`` on the batch host: one step of one task
on the pod's node, its output in the container's log), to poll it (the ``srun``'s exit) and to
signal it (``scancel --signal``, in a thread of its own so that the controller's loop never
waits on Slurm). Two things are Slurm's own: a started step may wait for its resources, so an
attempt is Running only once ``squeue`` lists one of its steps (``dependsOn`` counts it then, as
Kubernetes does once containers start); and what srun itself says of a step that ended (it could
not create it, say) goes into the container's log, where the user looks for why.

Each attempt's containers are built from that attempt's pod (``plan.pod_launches``), so a
restarted pod's steps see its retry count and job version, as on every engine, and the master's
ports of that attempt of the job (``masterport.py``).

Python runs as locally (``pyrunner/pycommand.py``, one rule for both engines): a bare
``python`` is the interpreter the controller runs in, which a bare ``python`` already means on
every node, and a main container whose command is that interpreter starts through torchjob's
runner, which records that its program ended (``$TORCHJOB_FINISHED``, a file beside the
container's log) before the interpreter's teardown; a step that then aborted in the teardown
(exit code 134) is counted as a success with a note in its log. torchrun's ranks start through
the runner's rank guard: each step gets ``PYTHON_EXEC`` naming ``bin/torchjob-rank``. The
controller copies the runner into the job directory's ``bin`` and writes the guard there before
the first step (:func:`write_runner`, :func:`write_rank_guard`): the job directory is on the
filesystem every node shares (the batch script proved it), at an absolute path, so a step on any
node, with any ``--chdir``, reads them there. A container's own ``PYTHON_EXEC`` (or ``-e``) wins;
its own ``TORCHJOB_FINISHED`` does not (the engine's bookkeeping). With ``--container-images``
neither is used: an image has its own Python and no job directory.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import threading
import time

from torchjob.controller.kubelet import PENDING, CannotStart, Container, Pod, RuntimeHooks
from torchjob.engines.slurm import steps
from torchjob.engines.slurm.limits import STEP_LIMIT
from torchjob.engines.slurm.plan import SlurmAddressing, configmaps_of, pod_launches
from torchjob.files import append_private, write_atomic
from torchjob.pyrunner import pycommand, pyrun
from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence
    from pathlib import Path

    from torchjob.engines.slurm.plan import Placement, PodLaunch, Resources, SlurmPlan
    from torchjob.expand import DesiredState, PodPlan
    from torchjob.lifecycle import JobStatus
    from torchjob.logs import Level

CONFIRM_EVERY = 0.2  # seconds between two squeue calls that look for starting steps


def write_runner(job_dir: Path) -> str:
    """Copy torchjob's runner (warmstart.py and what it loads beside it) into the job's ``bin``
    (0700, files 0600); the copy's path. An OSError when it cannot be read or written."""
    bin_dir = job_dir / "bin"
    bin_dir.mkdir(mode=0o700, exist_ok=True)
    here = os.path.dirname(pyrun.RUNNER)
    for name in (os.path.basename(pyrun.RUNNER), *pyrun.BESIDE):
        with open(os.path.join(here, name), "rb") as source:
            write_atomic(bin_dir / name, source.read())
    return str(bin_dir / os.path.basename(pyrun.RUNNER))


def write_rank_guard(job_dir: Path, runner: str = pyrun.RUNNER) -> str:
    """Write the job's rank guard (``bin/torchjob-rank``, 0700 in a 0700 directory) for this
    interpreter and ``runner``; its path, for ``PYTHON_EXEC``. An OSError when it cannot be written."""
    bin_dir = job_dir / "bin"
    bin_dir.mkdir(mode=0o700, exist_ok=True)
    shim = bin_dir / pyrun.RANK_SHIM
    write_atomic(shim, pyrun.guard_shim(sys.executable, runner))
    shim.chmod(0o700)
    return str(shim)


def through_runner(argv: list[str], env: dict[str, str], runner: str | None, marker: str) -> list[str]:
    """A main container's command (its python already ``sys.executable``) as its step runs it:
    through ``runner`` with ``marker`` as ``$TORCHJOB_FINISHED`` when pycommand's rule lets the
    runner start it, else as it is. ``env``, the step's, is changed to match: no
    ``TORCHJOB_FINISHED`` but the engine's."""
    env.pop(pyrun.FINISHED, None)
    started = (
        None if runner is None else pycommand.runner_argv(argv, env, pyrun.NO_WAIT, "0", (), ".", runner)
    )
    if started is None:
        return argv
    env[pyrun.FINISHED] = marker
    return started


def step_argv(argv: Sequence[str], image: str | None) -> list[str]:
    """A container's command as its step runs it: a bare ``python`` is the interpreter torchjob
    runs in, as locally; in an image (pyxis) it is the image's own, found on the image's PATH
    (the controller's interpreter is a path on the cluster's file system, not in the image)."""
    argv = list(argv)
    if image is None and argv and pycommand.PYTHON.fullmatch(argv[0]):
        argv[0] = sys.executable
    return argv


def step_env(
    base: Mapping[str, str],
    launch: PodLaunch,
    extra: Mapping[str, str],
    rank_guard: str | None,
    image: str | None = None,
) -> dict[str, str]:
    """A step's environment: the controller's, the rank guard, the pod's (its container's own
    ``PYTHON_EXEC`` among them), then, for a main container, the run's ``-e``; torchjob's
    interpreter first on ``PATH``, except in an image, which has its own."""
    env = {**base}
    if rank_guard is not None:
        env[pyrun.PYTHON_EXEC] = rank_guard
    env.update(launch.env)
    if not launch.init:
        env.update(extra)
    if image is None:
        env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", os.defpath)])
    return env


class SlurmRuntime(RuntimeHooks):
    """Starts, polls and signals containers as steps of the allocation ``job_id``."""

    def __init__(
        self,
        job_id: str,
        job_dir: Path,
        plan: SlurmPlan,
        placements: Mapping[tuple[str, int], Placement],
        expansion: Callable[[int, int], DesiredState],
        resources: Callable[[PodLaunch], tuple[Resources, int | None]],
        *,
        ranks: Mapping[tuple[str, int], int | None],
        base_env: dict[str, str],
        extra_env: dict[str, str],
        workdir: str,
        say: Callable[[str], None],
        record: Callable[[str], None],
        rank_guard: str | None = None,
        runner: str | None = None,
    ) -> None:
        self.job_id = job_id
        self.listed = steps.component_ids_from_env({"SLURM_JOB_ID": job_id, **base_env})
        self.job_dir = job_dir
        self.plan = plan
        self.placements = placements
        self.expansion = expansion
        self.resources = resources
        self.ranks = ranks
        self.base_env = base_env
        self.extra_env = extra_env
        self.workdir = workdir
        self.rank_guard = rank_guard  # PYTHON_EXEC for torchrun's ranks; None: torchrun's own python
        self.runner = runner  # the job's copy of the runner for python containers; None: none
        self.markers: dict[str, str] = {}  # step name -> its $TORCHJOB_FINISHED, for those run through it
        self.attempts: dict[str, int] = {}  # pod name -> its latest attempt number
        self.asked_at = 0.0  # when squeue was last asked which steps run
        self.running_steps: set[str] = set()  # the step names squeue listed then
        self.signalling: dict[str, list[threading.Thread]] = {}  # pod name -> threads signalling it
        self.over_limit: str | None = None  # a step Slurm refused for MaxStepCount: the job ends
        self._say = say
        self._record = record

    # ------------------------------------------------------------- the kubelet's asks

    def prepare(self, plan: PodPlan, status: JobStatus) -> Pod:
        attempt = self.attempts.get(plan.name, -1) + 1
        self.attempts[plan.name] = attempt
        log_dir = self.job_dir / "logs" / plan.name / str(attempt)
        log_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        state = self.expansion(status.version, status.retry_count)
        addressing = state.addressing  # the attempt's: its master's ports (masterport.py)
        if not isinstance(addressing, SlurmAddressing):
            addressing = SlurmAddressing(self.placements, self.plan.master)
        launches = pod_launches(self.plan, plan, addressing, configmaps_of(state))
        key = (plan.task.name, plan.index)
        return Pod(
            name=plan.name,
            task=plan.task.name,
            index=plan.index,
            attempt=attempt,
            containers=[Container(x.container, x.init, x, log_dir / f"{x.container}.log") for x in launches],
            restart_policy=plan.task.template.restart_policy,
            log_dir=log_dir,
            address=self.placements[key].host,
            rank=self.ranks.get(key),
        )

    def start(self, pod: Pod, container: Container) -> steps.Step:
        """A new step for the container's run; its name is unique in the allocation (a retry's or a
        restart's steps are told from the last ones')."""
        launch: PodLaunch = container.spec
        suffix = f".{container.restarts}" if container.restarts else ""
        name = f"{pod.name}.{container.name}.{pod.attempt}{suffix}"
        if self.over_limit is not None:  # refused as well: no srun for it (the job ends this pass)
            raise CannotStart(1, f"Slurm creates no more job steps for this job (step {self.over_limit})")
        resources, component = self.resources(launch)
        argv = step_argv(launch.argv, resources.image)
        env = step_env(self.base_env, launch, self.extra_env, self.rank_guard, resources.image)
        marker = str(pod.log_dir / f"{container.name}.finished")
        argv = through_runner(argv, env, None if launch.init or resources.image else self.runner, marker)
        if pyrun.FINISHED in env:  # a restart's step: the last run's marker does not speak for it
            pycommand.forget(marker)
            self.markers[name] = marker
        return steps.Step.start(
            self.job_id,
            name,
            argv,
            host=launch.placement.host,
            resources=resources,
            env=env,
            log=container.log,
            component=component,
            working_dir=launch.working_dir or self.workdir,
            image=resources.image,
            listed=self.listed,
        )

    def poll(self, pod: Pod, container: Container) -> int | None:
        step: steps.Step = container.handle
        code = step.poll()
        if code is None:
            return None
        said = step.messages()  # srun's own words of a step that ended, when it says more
        if self.over_limit is None and any(re.search(STEP_LIMIT, line) for line in said):
            self.over_limit = step.name  # the controller's loop ends the job (batch.py)
        marker = self.markers.get(step.name)
        finished = code == pycommand.TEARDOWN_ABORT and marker is not None and pycommand.finished(marker)
        if finished:  # the abort is told by the note (srun's line that the task aborted is not said)
            said.append(f"torchjob: {pycommand.TEARDOWN_NOTE}")
        if said:
            append_private(container.log, "".join(f"{line}\n" for line in said))
        return 0 if finished else code

    def signal(self, pod: Pod, container: Container, signum: int) -> None:
        step: steps.Step = container.handle
        thread = threading.Thread(target=self._signal, args=(step, signum), daemon=True)
        self.signalling.setdefault(pod.name, []).append(thread)
        thread.start()

    # ------------------------------------------------------------- the optional hooks

    def refresh(self, pods: Sequence[Pod]) -> None:
        """Which steps run, asked once for every attempt whose containers started (srun may wait
        for resources): an attempt is Running only once Slurm runs one of them."""
        starting = [pod for pod in pods if pod.mains_started and pod.phase == PENDING and not pod.terminating]
        now = time.monotonic()
        if not starting or now - self.asked_at < CONFIRM_EVERY:
            return
        self.asked_at = now
        with contextlib.suppress(steps.SlurmError):  # asked again on a later poll
            self.running_steps = set(steps.steps(self.listed, self.base_env).values())

    def confirmed(self, pod: Pod) -> bool:
        for c in pod.mains:
            step: steps.Step | None = c.handle
            if c.restarts or (
                step is not None and (step.name in self.running_steps or step.poll() is not None)
            ):
                return True
        return False

    def lingering(self, pod: Pod) -> bool:
        threads = [t for t in self.signalling.get(pod.name, []) if t.is_alive()]
        self.signalling[pod.name] = threads
        return bool(threads)

    def release(self, pods: Sequence[Pod]) -> None:
        for pod in pods:
            for c in pod.containers:
                c.handle = None

    def observed(self, pod: Pod, restarted: bool) -> None:
        if pod.phase == "Failed" and pod.reason:
            self._say(f"pod {pod.name} attempt {pod.attempt}: {pod.reason}")
        # A restart in place is told by the line the kubelet writes into the container's log.

    def note(self, text: str, level: Level) -> None:
        self._say(text)

    def record(self, text: str) -> None:
        self._record(text)

    # ------------------------------------------------------------- signals

    def _signal(self, step: steps.Step, signum: int) -> None:
        """SIGTERM and SIGKILL as steps.Step.send sends them, through a slurmctld outage too."""
        step.send(signum)
