"""A Slurm job as the commands see it: its job directory, overlaid with what Slurm says of it.

``status.json`` is the controller's report; ``slurm.json`` holds the allocation's id (and Slurm's
final state once seen), ``options.json`` the run's options. Slurm (``squeue``, else ``scontrol show
job``, else accounting) says why a job is pending and how an allocation ended that the controller
could not report itself (TIMEOUT, CANCELLED, NODE_FAIL, PREEMPTED): then every pod that had not
ended is shown ``Stopped`` at the allocation's end, not ``Running (stopping)`` for ever.

When slurmctld does not answer, the report is the job directory's last state with the reason
saying so: the job runs on without the controller, its logs keep coming, and a later question
gets Slurm's answer again.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from torchjob.engine_api import jobdirs
from torchjob.engine_api.base import JobReport, PortReport
from torchjob.engines.slurm import clients
from torchjob.host import procfs
from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any

SLURM_FILE = "slurm.json"  # the Slurm job id, and Slurm's final state once seen
OPTIONS_FILE = "options.json"
JOB_FILE = "job.json"
JOB_MARKS = (JOB_FILE, OPTIONS_FILE)  # what the engine writes into a job directory first
SLURM_EVERY = 1.0  # seconds between two questions to Slurm about one job
UNREACHABLE = "UNREACHABLE"  # not Slurm's: what _ask says when slurmctld does not answer
_UNSHARED = "unshared on "  # _ask's reason for a batch host that did not see the job directory
_ENDED = ("Succeeded", "Failed", "Stopped")
REQUEUED_ON = ("NODE_FAIL", "PREEMPTED")  # the ends after which Slurm requeues a --requeue job
# Slurm's final states that end the job from outside the controller: how the report says them.
ENDED_BY_SLURM = {
    "TIMEOUT": ("Failed", "Slurm: TIMEOUT: the allocation reached its time limit"),
    "CANCELLED": ("Terminated", "Slurm: CANCELLED: the allocation was cancelled"),
    "NODE_FAIL": ("Failed", "Slurm: NODE_FAIL: a node of the allocation failed"),
    "PREEMPTED": ("Failed", "Slurm: PREEMPTED: the allocation was preempted"),
    "BOOT_FAIL": ("Failed", "Slurm: BOOT_FAIL: a node of the allocation failed to boot"),
    "DEADLINE": ("Failed", "Slurm: DEADLINE: the job's deadline passed before it ran"),
    "OUT_OF_MEMORY": ("Failed", "Slurm: OUT_OF_MEMORY: the allocation ran out of memory"),
}


RECHECK = 300.0  # seconds after a failed job's end in which Slurm's state may still name the cause


def _may_be_slurms(report: JobReport) -> bool:
    """A job its controller failed a moment ago: the steps Slurm's time limit (or a cancel, a
    preemption, a node's failure) ended at once may have reached the controller before Slurm's
    signal did, so it took their end for the pods' own failure. Slurm's final state tells."""
    ended = report.finished_at
    return report.phase == "Failed" and ended is not None and time.time() - ended < RECHECK


def read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _mtime(path: Path) -> float | None:
    try:
        return path.stat().st_mtime
    except OSError:
        return None


def process_alive(pid: object, started: object) -> bool:
    """Whether process ``pid`` runs and is the one started at ``started`` (its /proc start time)."""
    if not isinstance(pid, int) or pid <= 0:
        return False
    return started == process_started(pid)


def process_started(pid: int) -> str | None:
    """A process's start time in clock ticks since boot (/proc/PID/stat), which tells it from a
    later process with the same pid; None when there is no such process (or it is a zombie)."""
    try:
        fields = procfs.stat_fields(pid)
        return None if fields[0] == b"Z" else fields[19].decode()
    except (OSError, ValueError, IndexError):
        return None


def settle_pods(report: JobReport, why: str, at: float) -> None:
    """The allocation is over: a pod that had not ended was stopped with it, at ``at``."""
    from torchjob.phases import ContainerState, PodState

    for pod in report.pods:
        if pod.phase in _ENDED:
            continue
        pod.phase, pod.reason, pod.terminating = PodState.STOPPED, why, False
        pod.finished_at = pod.finished_at or at
        for container in pod.containers:
            if container.state != ContainerState.TERMINATED:
                container.state, container.reason = ContainerState.TERMINATED, "Stopped"


class SlurmView:
    """Reads job directories under ``root`` and asks Slurm about their allocations."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._asked: dict[str, tuple[float, str | None, str]] = {}  # Slurm's last answer per job
        self.unreachable = ""  # what was said when slurmctld last did not answer; "" once it does

    def slurm(self, job_dir: Path) -> dict[str, Any]:
        return read_json(job_dir / SLURM_FILE)

    def options(self, job_dir: Path) -> dict[str, Any]:
        return read_json(job_dir / OPTIONS_FILE)

    def job_dirs(self) -> list[Path]:
        if not self.root.is_dir():
            return []
        return [d for d in self.root.iterdir() if jobdirs.is_job_dir(d, JOB_MARKS)]

    def asked(self, slurm_id: str) -> tuple[float, str | None, str] | None:
        """Slurm's last answer about ``slurm_id``: (when, state, reason)."""
        return self._asked.get(slurm_id)

    def report(self, job_dir: Path) -> JobReport:
        """status.json (the controller's) overlaid with Slurm's view of the allocation."""
        from torchjob.engine_api.base import ReportError

        slurm = self.slurm(job_dir)
        slurm_id = str(slurm.get("jobId", ""))
        name = jobdirs.name_of(job_dir.name)
        ended_by_slurm = False
        try:
            data = json.loads((job_dir / "status.json").read_text())
            report = JobReport.from_dict(data)
            ended_by_slurm = data.get("endedBySlurm") is True
        except FileNotFoundError:  # the controller has not started yet
            report = JobReport(engine="slurm", id=job_dir.name, name=name, phase="Pending")
            report.started_at = _mtime(job_dir / OPTIONS_FILE)
        except (OSError, ValueError, ReportError) as err:
            reason = f"{job_dir / 'status.json'} cannot be read: {err}"
            return JobReport("slurm", job_dir.name, name, "Unknown", reason, location=str(job_dir))
        report.location = str(job_dir)
        if not report.ports:  # the job's declared ports, as the master pod has them
            ports = self.options(job_dir).get("ports") or []
            report.ports = [PortReport(p, p) for p in ports if isinstance(p, int)]
        if slurm.get("inAllocation"):
            return self._in_allocation(job_dir, report, slurm)
        if not slurm_id or (report.terminal and not ended_by_slurm and not _may_be_slurms(report)):
            return report
        state, reason = slurm.get("state"), ""
        # With --requeue a node failure or a preemption is not the end: Slurm runs the job again.
        requeues = (self.options(job_dir).get("settings") or {}).get("requeue") is True
        if state is None:
            state, reason = self.state(slurm_id)
            if state in clients.FINAL_STATES and not (requeues and state in REQUEUED_ON):
                self._remember(job_dir, slurm, state, reason)
        if report.terminal and not ended_by_slurm and state not in ENDED_BY_SLURM:
            if state not in clients.FINAL_STATES and state not in (None, UNREACHABLE):
                report.phase = "Terminating"  # Slurm's final state says whether the end was its own
            return report
        if state == UNREACHABLE:
            said = f"Slurm does not answer ({reason}): the job's last state in its directory"
            report.reason = f"{said}; {report.reason}" if report.reason else said
        elif requeues and state in REQUEUED_ON:
            report.phase, report.reason = "Restarting", f"Slurm: {state}: the allocation is requeued"
        elif state == "PENDING" and ended_by_slurm and report.terminal:
            report.phase = "Restarting"
            report.reason = f"Slurm requeued the allocation; Slurm job {slurm_id} is pending: {reason}"
        elif state == "PENDING":
            report.phase, report.reason = "Pending", f"Slurm job {slurm_id} is pending: {reason}"
        elif state == "RUNNING" and not report.pods:
            report.reason = f"Slurm job {slurm_id} is running; its controller is starting"
        elif state in ENDED_BY_SLURM:
            report.phase, report.reason = ENDED_BY_SLURM[state]
            report.finished_at = report.finished_at or _mtime(job_dir / SLURM_FILE) or time.time()
            failure = report.first_failure
            if failure is not None and (failure.exit_code or 0) > 128:
                report.first_failure = None  # killed by the allocation's end: that is the cause
        elif ended_by_slurm and state not in clients.FINAL_STATES:
            report.phase = "Terminating"  # Slurm is ending it; its final state says why
        elif ended_by_slurm and state == "COMPLETED":
            pass
        elif "unsharedOn" in slurm:
            report.phase = "Failed"
            report.reason = (
                f"the job directory {job_dir} is not on the batch host {slurm['unsharedOn']}: the job "
                f"root {self.root} must be on a filesystem that the login node and the compute nodes "
                "share (--job-root, TORCHJOB_SLURM_JOB_ROOT)"
            )
        elif state is None:
            report.phase = "Unknown"
            report.reason = f"Slurm no longer knows job {slurm_id}, and its controller wrote no final state"
        elif state in clients.FINAL_STATES:  # COMPLETED or FAILED without a final status.json
            report.phase = "Failed"
            report.reason = (
                f"Slurm job {slurm_id} ended ({state}) before its controller wrote a final state "
                f"(its output: {job_dir}/slurm-{slurm_id}.out; none there: is the job root "
                f"{self.root} on a filesystem the compute nodes share?)"
            )
        if state in clients.FINAL_STATES and not (requeues and state in REQUEUED_ON):
            ended_at = report.finished_at or _mtime(job_dir / SLURM_FILE) or time.time()
            settle_pods(report, f"Slurm: allocation {state}", ended_at)
        return report

    def _in_allocation(self, job_dir: Path, report: JobReport, slurm: dict[str, Any]) -> JobReport:
        """A job run in an allocation it did not make (salloc): the allocation's state is not the
        job's; its controller, a process on this host, is."""
        if report.terminal:
            settle_pods(report, f"job {report.phase.lower()}", report.finished_at or time.time())
            return report
        if process_alive(slurm.get("controller"), slurm.get("controllerStarted")):
            return report
        report.phase = "Unknown"
        report.reason = (
            f"its controller (pid {slurm.get('controller')}) is gone, in allocation {slurm.get('jobId')}, "
            "without a final state"
        )
        settle_pods(report, "its controller is gone", _mtime(job_dir / "status.json") or time.time())
        return report

    def _remember(self, job_dir: Path, slurm: dict[str, Any], state: str, reason: str) -> None:
        from torchjob.files import write_atomic

        slurm["state"] = state
        if reason.startswith(_UNSHARED):
            slurm["unsharedOn"] = reason[len(_UNSHARED) :]
        write_atomic(job_dir / SLURM_FILE, json.dumps(slurm) + "\n")

    def state(self, slurm_id: str) -> tuple[str | None, str]:
        """Slurm's state of the allocation and its reason (UNREACHABLE and what was said when
        slurmctld does not answer); asked at most once a second per job (a followed job's report
        is read every few tenths of a second)."""
        asked = self._asked.get(slurm_id)
        if asked is not None and time.monotonic() - asked[0] < SLURM_EVERY:
            return asked[1], asked[2]
        try:
            state, reason = self._ask(slurm_id)
            self.unreachable = ""
        except clients.SlurmUnreachable as err:
            state, reason = UNREACHABLE, str(err)
            self.unreachable = reason
        self._asked[slurm_id] = (time.monotonic(), state, reason)
        return state, reason

    def _ask(self, slurm_id: str) -> tuple[str | None, str]:
        said = clients.ping()  # a few ms; squeue would answer an outage only after its own retries
        if said is not None:
            raise clients.SlurmUnreachable(said)
        rows = clients.queue(slurm_id)
        if rows and rows[0][1] != "COMPLETING":
            return rows[0][1], rows[0][2]
        shown = clients.show_job(slurm_id)
        if shown:
            from torchjob.engines.slurm.plan import NOT_SHARED

            job = shown[0]
            if job.state == "FAILED" and job.exit_code == NOT_SHARED:
                return job.state, _UNSHARED + job.fields.get("BatchHost", "its batch host")
            return job.state, job.reason
        return clients.final_state(slurm_id), ""  # forgotten by slurmctld: sacct, the completion file


def owned_root(root: Path) -> None:
    """A job root another user made is not trusted: its job directories could be theirs."""
    from torchjob.engine_api.base import EngineError

    owner = root.stat().st_uid
    if owner != os.geteuid():
        raise EngineError(f"the job root {root} belongs to uid {owner}, not to you: choose another")
