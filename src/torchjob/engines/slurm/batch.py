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

from torchjob.engine_api.base import ContainerReport, FailureReport, JobReport, PodReport
from torchjob.engine_api.reasons import exit_reason, stopped_because
from torchjob.engines.slurm import steps
from torchjob.engines.slurm.runtime import SlurmPod, SlurmRuntime
from torchjob.files import write_atomic
from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from torchjob.controller import Controller
    from torchjob.engines.slurm.plan import PodLaunch, Resources, SlurmPlan
    from torchjob.expand import Attempts, DesiredState
    from torchjob.spec.model import Job

OPTIONS = "options.json"
STATUS = "status.json"
EXPIRES = "expires"  # when the job may be removed: its ttlSecondsAfterFinished
JOB_FILE = "job.json"  # the job as its Volcano manifest, in JSON
LOG_TAIL_LINES = 20
EVENTS_KEPT = 50
CRASH_LOOP = "CrashLoopBackOff"  # Kubernetes' reason for a container waiting to be restarted again


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> list[str]:
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - 64 * 1024))
            data = handle.read()
    except OSError:
        return []
    return [line.decode("utf-8", "replace") for line in data.splitlines()[-lines:]]


class BatchController:
    """The loop around the controller: passes, status.json, the allocation's end."""

    def __init__(self, job_dir: Path, job: Job, plan: SlurmPlan, options: dict[str, object]) -> None:
        from torchjob.controller import Controller
        from torchjob.engines.slurm.plan import SlurmAddressing, launches, place
        from torchjob.plugins import build_plugins

        self.job_dir = job_dir
        self.job = job
        self.plan = plan
        self.id = str(options["id"])
        self.events: list[dict[str, object]] = []
        self.stop_signal: int | None = None
        self.ended_by_slurm = False  # SIGTERM from Slurm: its state (TIMEOUT, ...) says why
        self.in_allocation = options.get("inAllocation") is True  # salloc's: the engine stops it
        layout = steps.layout_from_env(os.environ, steps.hostnames)
        placements = place(plan, layout)
        by_pod: dict[str, list[PodLaunch]] = {}
        for launch in launches(plan, placements):
            by_pod.setdefault(launch.pod, []).append(launch)
        self.addresses = {key: p.host for key, p in placements.items()}
        plugins = build_plugins(job)
        self.ranks: dict[tuple[str, int], int | None] = {}
        for task in job.spec.tasks:
            for index in range(task.replicas):
                ranks = [r for r in (p.rank(job, task, index) for p in plugins) if r is not None]
                self.ranks[(task.name, index)] = ranks[0] if ranks else None
        self.addressing = SlurmAddressing(placements, plan.master)
        self.desired: Attempts | None = None  # the job's one expansion (expand.Attempts)
        env = {str(k): str(v) for k, v in dict(options.get("extraEnv") or {}).items()}  # type: ignore[call-overload]
        self.runtime = SlurmRuntime(
            os.environ["SLURM_JOB_ID"],
            job_dir,
            by_pod,
            self._resources,
            base_env=dict(os.environ),
            extra_env=env,
            workdir=str(options.get("workdir") or job_dir),
            say=self._say,
            record=self._event,
        )
        timeout = options.get("timeout")
        max_restarts = options.get("maxRestarts")
        self.controller: Controller[SlurmPod] = Controller(
            job,
            self.runtime,
            self.expansion,
            clock=time.monotonic,
            timeout=float(timeout) if isinstance(timeout, (int, float)) else None,
            max_restarts=max_restarts if isinstance(max_restarts, int) else None,
            attached=True,  # the final phase is the report's and the caller's summary says it
        )
        self.started_at = time.time()
        self.finished_at: float | None = None
        self.failure: FailureReport | None = None

    def expansion(self, version: int, retry_count: int) -> DesiredState:
        """The desired pods of one attempt of the job. The controller asks on every pass that may
        create pods: the job is expanded once, then restamped for a restart's version and retry
        count, as the local engine does (``expand.Attempts``)."""
        if self.desired is None:
            from torchjob.expand import Attempts, expand

            self.desired = Attempts(expand(self.job, self.addressing))
        return self.desired(version, retry_count)

    def _resources(self, launch: PodLaunch) -> tuple[Resources, int | None]:
        component = self.plan.component_of(launch.task)
        return component.resources, (component.index if self.plan.heterogeneous else None)

    def _say(self, text: str) -> None:
        print(f"torchjob: {text}", flush=True)
        self._event(text)

    def _event(self, text: str) -> None:
        self.events.append({"time": time.time(), "message": text})
        del self.events[:-EVENTS_KEPT]

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        controller = self.controller
        for task in self.job.spec.tasks:  # as the local engine warns
            if task.template.restart_policy == "Always" and task.replicas:
                self._say(
                    f"task {task.name}: restartPolicy Always (the Kubernetes default) restarts containers "
                    "even after they succeed; set OnFailure or Never for a job that ends"
                )
        controller.begin()
        self.write()
        while not controller.done():
            if self.stop_signal is not None:
                self._stopped()
                return 143
            controller.tick()
            self._note_failure()
            if controller.dirty:
                controller.dirty = False
                self.write()
            due = controller.next_due()
            time.sleep(0.1 if due is None else min(0.1, due))
        self.finished_at = time.time()
        self.write()
        self._expire()
        return 0 if controller.status.phase.value == "Completed" else 1

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
        self.runtime.terminate([(pod, 1.0) for pod in self.controller.pods.values()])
        self.finished_at = time.time()
        self.write()
        self._expire()

    def _note_failure(self) -> None:
        if self.failure is not None:
            return
        failed = [p for p in self.controller.pods.values() if p.phase == "Failed" and not p.terminating]
        if failed:
            pod = min(failed, key=lambda p: p.finished_at or 0.0)
            container, code, reason = pod.failed_container, pod.exit_code, exit_reason(pod.exit_code)
        elif self.controller.status.phase.value == "Failed":
            # Failed with no pod ended (--max-restarts): the pod that kept failing, as locally.
            looping = [
                p
                for p in self.controller.pods.values()
                if p.restarts and any(c.exit_code not in (None, 0) for c in p.containers)
            ]
            if not looping:
                return
            pod = max(looping, key=lambda p: p.restarts)
            bad = next(c for c in pod.containers if c.exit_code not in (None, 0))
            container, code, reason = bad.name, bad.exit_code, CRASH_LOOP
        else:
            return
        log = pod.log_dir / f"{container}.log" if container else None
        self.failure = FailureReport(
            pod=pod.name,
            short=self.controller.short(pod),
            exit_code=code,
            rank=self.ranks.get((pod.task, pod.index)),
            reason=reason,
            time=pod.finished_at,
            log_tail=log_tail(log) if log else [],
        )

    def report(self) -> JobReport:
        controller = self.controller
        pods = []
        for task in self.job.spec.tasks:
            for index in range(task.replicas):
                key = (task.name, index)
                pod = controller.latest.get(key)
                from torchjob.spec.model import pod_name

                name = pod_name(self.job.name, task.name, index)
                short = name[len(self.job.name) + 1 :]
                if pod is None:
                    pods.append(PodReport(name, short, task.name, index, "Pending", rank=self.ranks.get(key)))
                    continue
                phase, reason = pod.phase, ""
                if pod.gone and phase not in ("Succeeded", "Failed"):
                    phase, reason = "Stopped", stopped_because(controller.status.phase)
                elif not pod.terminating and any(c.next_start is not None for c in pod.containers):
                    reason = CRASH_LOOP
                pods.append(
                    PodReport(
                        name=name,
                        short=short,
                        task=task.name,
                        index=index,
                        phase=phase,
                        rank=self.ranks.get(key),
                        reason=reason,  # as locally: why the container failed is its own reason
                        attempt=pod.attempt,
                        restarts=pod.restarts,
                        exit_code=pod.exit_code,
                        started_at=pod.started_at,
                        finished_at=pod.finished_at,
                        address=self.addresses.get(key, ""),
                        terminating=pod.terminating and not pod.gone,
                        containers=containers(pod),
                    )
                )
        status = controller.status
        return JobReport(
            engine="slurm",
            id=self.id,
            name=self.job.name,
            phase=status.phase.value,
            reason=status.reason,
            namespace=self.job.metadata.namespace or "default",
            location=str(self.job_dir),
            retry_count=status.retry_count,
            max_retry=self.job.spec.max_retry,
            started_at=self.started_at,
            finished_at=self.finished_at,
            pods=pods,
            first_failure=self.failure,
            events=list(self.events),
        )

    def write(self) -> None:
        data = self.report().to_dict()
        data["slurmJobId"] = os.environ.get("SLURM_JOB_ID", "")
        data["endedBySlurm"] = self.ended_by_slurm
        write_atomic(self.job_dir / STATUS, json.dumps(data, indent=1) + "\n")


def containers(pod: SlurmPod) -> list[ContainerReport]:
    """Each container of the attempt: init containers first, as far as its steps went; one
    waiting out a restart's back-off is in CrashLoopBackOff with its last exit code, as locally."""
    found = []
    for c in pod.containers:
        reason = ""
        if c.next_start is not None:
            state, reason = "waiting", CRASH_LOOP
        elif c.exit_code is not None:
            state, reason = "terminated", exit_reason(c.exit_code) or "Completed"
        else:
            state = "running" if c.step is not None else "waiting"
        found.append(
            ContainerReport(
                name=c.name,
                init=c.launch.init,
                state=state,
                exit_code=c.exit_code,
                reason=reason,
                restarts=c.restarts,
            )
        )
    return found


def load_job(path: Path) -> Job:
    """The job of ``job.json``, checked as any job file is. It is JSON (the engine wrote it), read
    with the json module: PyYAML, which a YAML file needs, is never imported on this host."""
    from torchjob.jobs import check_jobs
    from torchjob.spec.source import Document

    data = json.loads(path.read_text(encoding="utf-8"))
    return check_jobs([Document(data=data, file=str(path))], str(path))[0].job


def main(argv: list[str]) -> int:
    from torchjob.engines.slurm.plan import plan_job
    from torchjob.engines.slurm.settings import SlurmSettings
    from torchjob.errors import SpecError

    if len(argv) != 1:
        print("usage: python -m torchjob.engines.slurm.batch JOB_DIR", file=sys.stderr)
        return 2
    job_dir = Path(argv[0])
    options = json.loads((job_dir / OPTIONS).read_text())
    try:
        job = load_job(job_dir / JOB_FILE)
    except (ValueError, SpecError) as err:  # written by the engine: damaged, not a user's mistake
        print(f"torchjob: {job_dir / JOB_FILE} holds no valid job: {err}", file=sys.stderr)
        return 2
    given = dict(options.get("settings") or {})
    given["sbatch_args"] = tuple(given.get("sbatch_args") or ())
    settings = SlurmSettings(**given)
    plan = plan_job(job, settings, str(job_dir), ["true"], in_allocation=options.get("inAllocation") is True)
    return BatchController(job_dir, job, plan, options).run()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
