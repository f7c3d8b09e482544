"""The job's controller on the batch host: ``python -m torchjob.engines.slurm.batch JOB_DIR``.

The batch script ``exec``s this. It reads the job and its options from the job directory, asks
Slurm where the allocation runs (``SLURM_*``), places each pod on its node, and drives the job
with the engine-neutral :class:`~torchjob.controller.Controller` over :class:`SlurmRuntime`:
every pod attempt a set of job steps. ``status.json`` in the job directory is rewritten on every
change (the engine's ``status`` reads it); each attempt's logs go to ``logs/<pod>/<attempt>/``.
Its exit code is 0 when the job completed, 1 otherwise: Slurm's own view agrees with torchjob's.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

from torchjob.controller.kubelet import Kubelet, Pod
from torchjob.engines.slurm import steps
from torchjob.engines.slurm.runtime import SlurmRuntime, write_rank_guard, write_runner
from torchjob.files import write_atomic
from torchjob.reports import Event
from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any

    from torchjob.controller import Controller
    from torchjob.engines.slurm.limits import StepLimit
    from torchjob.engines.slurm.plan import PodLaunch, Resources, SlurmPlan
    from torchjob.expand import Attempts, DesiredState
    from torchjob.reports import JobReport
    from torchjob.spec.model import Job

OPTIONS = "options.json"
STATUS = "status.json"
EXPIRES = "expires"  # when the job may be removed: its ttlSecondsAfterFinished
JOB_FILE = "job.json"  # the job as its Volcano manifest, in JSON
EVENTS_KEPT = 50


class BatchController:
    """The loop around the controller: passes, status.json, the allocation's end."""

    def __init__(self, job_dir: Path, job: Job, plan: SlurmPlan, options: dict[str, object]) -> None:
        from torchjob.controller import Controller
        from torchjob.controller.report import pod_ranks
        from torchjob.engines.slurm.masterport import MasterPorts, on_this_node, probe_on
        from torchjob.engines.slurm.plan import SlurmAddressing, place, rendezvous_ports

        self.job_dir = job_dir
        self.job = job
        self.plan = plan
        self.id = str(options["id"])
        self.events: list[Event] = []
        self.stop_signal: int | None = None
        self.ended_by_slurm = False  # SIGTERM from Slurm: its state (TIMEOUT, ...) says why
        self.in_allocation = options.get("inAllocation") is True  # salloc's: the engine stops it
        layout = steps.layout_from_env(os.environ, steps.hostnames)
        placements = place(plan, layout)
        self.ranks = pod_ranks(job)
        self.placements = placements
        self.addressing = SlurmAddressing(placements, plan.master)
        self.desired: Attempts | None = None  # the job's expansion (expand.Attempts), for its ports
        self.desired_ports: dict[int, int] = {}
        master = placements.get(plan.master) if plan.master is not None else None
        # The master's ports are probed where the controller runs: on the master's node or not at all.
        self.master_ports = MasterPorts(
            rendezvous_ports(job) if master is not None else [],
            avoid={
                self.addressing.port_of(key, port)
                for key, where in placements.items()
                if master is not None and where.host == master.host
                for port in plan.ports
            },
            local=master is None or on_this_node(master.host, os.environ),
            say=self._say,
            remote=None
            if master is None
            else probe_on(
                os.environ["SLURM_JOB_ID"],
                master.host,
                master.component if plan.heterogeneous else None,
                dict(os.environ),
            ),
        )
        env = {str(k): str(v) for k, v in dict(options.get("extraEnv") or {}).items()}  # type: ignore[call-overload]
        runner: str | None = None
        rank_guard: str | None = None
        if not plan.settings.container_images:  # an image has its own python, and no job directory
            try:
                runner = write_runner(job_dir)
                rank_guard = write_rank_guard(job_dir, runner)
            except OSError as err:
                runner = None
                self._say(f"python containers and torchrun's ranks run without torchjob's runner: {err}")
        self.runtime = SlurmRuntime(
            os.environ["SLURM_JOB_ID"],
            job_dir,
            plan,
            placements,
            self.expansion,
            self._resources,
            ranks=self.ranks,
            base_env=dict(os.environ),
            extra_env=env,
            workdir=str(options.get("workdir") or job_dir),
            say=self._say,
            record=self._event,
            rank_guard=rank_guard,
            runner=runner,
        )
        self.kubelet = Kubelet(self.runtime)
        timeout = options.get("timeout")
        max_restarts = options.get("maxRestarts")
        self.controller: Controller[Pod] = Controller(
            job,
            self.kubelet,
            self.expansion,
            clock=time.monotonic,
            timeout=float(timeout) if isinstance(timeout, (int, float)) else None,
            max_restarts=max_restarts if isinstance(max_restarts, int) else None,
            attached=True,  # the final phase is the report's and the caller's summary says it
        )
        self.started_at = time.time()
        self.finished_at: float | None = None

    def expansion(self, version: int, retry_count: int) -> DesiredState:
        """The desired pods of one attempt of the job. The controller asks on every pass that may
        create pods: the job is expanded once, then restamped for a restart's version and retry
        count, as the local engine does (``expand.Attempts``). A new attempt of the whole job
        claims the master's ports again (masterport.py): expanded anew when they changed."""
        ports = self.master_ports.for_version(version)
        if self.desired is None or ports != self.desired_ports:
            from torchjob.engines.slurm.plan import SlurmAddressing
            from torchjob.expand import Attempts, expand

            self.addressing = SlurmAddressing(self.placements, self.plan.master, ports)
            self.desired = Attempts(expand(self.job, self.addressing))
            self.desired_ports = dict(ports)
        return self.desired(version, retry_count)

    def _resources(self, launch: PodLaunch) -> tuple[Resources, int | None]:
        component = self.plan.component_of(launch.task)
        return component.resources, (component.index if self.plan.heterogeneous else None)

    def _say(self, text: str) -> None:
        print(f"torchjob: {text}", flush=True)
        self._event(text)

    def _event(self, text: str) -> None:
        self.events.append(Event(time.time(), text))
        del self.events[:-EVENTS_KEPT]

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        controller = self.controller
        self._requeued()
        controller.begin()
        self.write()
        while not controller.done():
            if self.stop_signal is not None:
                self._stopped()
                return 143
            controller.tick()
            self._over_limit()
            self.master_ports.watch()
            if controller.dirty:
                controller.dirty = False
                self.write()
            due = controller.next_due()
            time.sleep(0.1 if due is None else min(0.1, due))
        self.finished_at = time.time()
        self.write()
        self._expire()
        return 0 if controller.status.phase.value == "Completed" else 1

    def _over_limit(self) -> None:
        """Slurm refused a step for MaxStepCount: the job fails with that reason, not a retry of
        its pod (every retry is a step, refused too)."""
        refused = self.runtime.over_limit
        if refused is not None and not self.controller.status.phase.final:
            from torchjob.engines.slurm.limits import reached

            self.controller.fail_job(reached(self.plan.step_limit, refused))

    def _expire(self) -> None:
        """ttlSecondsAfterFinished: when the engine may remove the job (``expires``), as locally;
        the first command after that time removes it once Slurm has let the allocation go."""
        ttl = self.job.spec.ttl_seconds_after_finished
        if ttl is None or self.finished_at is None:
            return
        try:
            write_atomic(self.job_dir / EXPIRES, f"{self.finished_at + ttl!r}\n")
        except OSError:
            return  # then kept, as a job without a TTL is
        self._say(
            f"ttlSecondsAfterFinished {ttl}: the first torchjob command from {ttl}s after the end "
            "removes the job and its logs"
        )
        self.write()

    def _requeued(self) -> None:
        """Slurm requeued the job (requeue.py): go on from the run before, a restart of the job."""
        from torchjob.engines.slurm import requeue
        from torchjob.lifecycle import JobPhase, JobStatus

        previous = requeue.previous_run(self.job_dir, os.environ)
        if previous is None:
            return
        self.runtime.attempts.update(previous.attempts)  # each pod's next attempt follows its last
        self.events = list(previous.events)
        lost = requeue.lost_nodes(previous.nodes, [p.host for p in self.runtime.placements.values()])
        why = f"Slurm requeued the allocation (restart {previous.restarts})"
        why += f": node {', '.join(lost)} lost" if lost else ""
        retry, limit = previous.retry_count + 1, self.job.spec.max_retry
        version = previous.version + 1
        if retry >= limit:  # counted as RestartJob is: the job fails once maxRetry is used up
            status = JobStatus(JobPhase.FAILED, retry, version, f"{why}; maxRetry {limit} used up")
        else:
            status = JobStatus(JobPhase.PENDING, retry, version, why)
        self.controller.status = status
        self._say(f"{why}; retry {retry} of maxRetry {limit}")

    def _on_signal(self, signum: int, frame: object) -> None:
        self.stop_signal = signum

    def _stopped(self) -> None:
        """Slurm ends the allocation (scancel, time limit): it stops the steps; say so and go."""
        from torchjob.lifecycle import JobPhase, JobStatus

        status = self.controller.status
        if not status.phase.final:
            reason = "the allocation was ended by Slurm (cancelled, or its time limit reached)"
            if self.in_allocation:
                reason = "stopped (Ctrl-C, SIGTERM or torchjob delete)"
            self.controller.status = JobStatus(
                JobPhase.TERMINATED, status.retry_count, status.version, reason
            )
        self.ended_by_slurm = True
        self.kubelet.terminate([(pod, 1.0) for pod in self.controller.pods.values()])
        self.finished_at = time.time()
        self.write()
        self._expire()

    def report(self) -> JobReport:
        from torchjob.controller.report import job_report

        controller = self.controller
        return job_report(
            self.job,
            engine="slurm",
            id=self.id,
            location=str(self.job_dir),
            status=controller.status,
            latest=controller.latest,
            current=controller.pods,
            started=self.started_at,
            finished=self.finished_at,
            events=self.events,
            ports=self.addressing.master_ports(self.plan.ports),  # as the master's pod has them
        )

    def write(self) -> None:
        data = self.report().to_dict()
        data["slurmJobId"] = os.environ.get("SLURM_JOB_ID", "")
        data["endedBySlurm"] = self.ended_by_slurm
        data["version"] = self.controller.status.version  # a requeued run goes on from it
        write_atomic(self.job_dir / STATUS, json.dumps(data, indent=1) + "\n")


def load_job(path: Path) -> Job:
    """The job of ``job.json``, checked as any job file is. It is JSON (the engine wrote it), read
    with the json module: PyYAML, which a YAML file needs, is never imported on this host."""
    from torchjob.jobs import check_jobs
    from torchjob.spec.source import Document

    data = json.loads(path.read_text(encoding="utf-8"))
    return check_jobs([Document(data=data, file=str(path))], str(path))[0].job


def step_limit_of(options: dict[str, Any]) -> StepLimit:
    """The step limit the job was planned under on the login node (options.json), else Slurm's
    default: the batch host plans the job again and must not refuse what was accepted."""
    from torchjob.engines.slurm.limits import DEFAULT, StepLimit

    given = options.get("stepLimit")
    if not isinstance(given, dict) or not isinstance(given.get("count"), int):
        return DEFAULT
    return StepLimit(given["count"], read=given.get("read") is True, why=str(given.get("why") or ""))


def main(argv: list[str]) -> int:
    from torchjob.engines.slurm.plan import plan_job
    from torchjob.engines.slurm.settings import SlurmSettings
    from torchjob.errors import SpecError
    from torchjob.spec.model import wait_for_completions

    if len(argv) != 1:
        print("usage: python -m torchjob.engines.slurm.batch JOB_DIR", file=sys.stderr)
        return 2
    job_dir = Path(argv[0])
    options = json.loads((job_dir / OPTIONS).read_text())
    try:
        job = load_job(job_dir / JOB_FILE)
        wait_for_completions(job, options.get("completes") or {})  # what job.json cannot say (engine.py)
    except (ValueError, SpecError) as err:  # written by the engine: damaged, not a user's mistake
        print(f"torchjob: {job_dir / JOB_FILE} holds no valid job: {err}", file=sys.stderr)
        return 2
    given = dict(options.get("settings") or {})
    given["sbatch_args"] = tuple(given.get("sbatch_args") or ())
    settings = SlurmSettings(**given)
    plan = plan_job(
        job,
        settings,
        str(job_dir),
        ["true"],
        in_allocation=options.get("inAllocation") is True,
        step_limit=step_limit_of(options),
    )
    return BatchController(job_dir, job, plan, options).run()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
