"""A job Slurm requeued (``--requeue``: after NODE_FAIL, or a preemption whose mode is REQUEUE).

Slurm runs the batch script again from its beginning, with ``SLURM_RESTART_COUNT`` set, in the
same job directory. The controller then continues the job instead of starting it over: the run
before left ``status.json`` and every attempt's logs, so the job's retry count goes on from it
(a requeue is a restart of the whole job, counted against ``maxRetry`` as ``RestartJob`` is), each
pod's next attempt follows its last one (new attempt logs, the old ones kept), the events go on,
and the requeue is told with the node that was lost (a node of the last run that is down now).
"""

from __future__ import annotations

import json
from pathlib import Path

from torchjob.records import field, record
from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Mapping

    from torchjob.reports import Event

STATUS = "status.json"


@record
class PreviousRun:
    """What the run before a requeue left in the job directory."""

    restarts: int  # SLURM_RESTART_COUNT: how many times Slurm requeued the job
    retry_count: int
    version: int
    attempts: dict[str, int]  # pod name -> its last attempt number
    nodes: list[str]  # the nodes its pods ran on
    events: list[Event] = field(default_factory=list)


def previous_run(job_dir: Path, environ: Mapping[str, str]) -> PreviousRun | None:
    """The run before this one, when Slurm requeued the job (None on its first run)."""
    from torchjob.reports import JobReport, ReportError

    restarts = environ.get("SLURM_RESTART_COUNT", "")
    if not restarts.isdigit() or int(restarts) == 0:
        return None
    try:
        data = json.loads((job_dir / STATUS).read_text())
        report = JobReport.from_dict(data)
    except (OSError, ValueError, ReportError):  # requeued before its controller wrote anything
        data, report = {}, None
    attempts = {}
    for pod_dir in (job_dir / "logs").glob("*"):
        numbers = [int(d.name) for d in pod_dir.iterdir() if d.name.isdigit()] if pod_dir.is_dir() else []
        if numbers:
            attempts[pod_dir.name] = max(numbers)
    version = data.get("version") if isinstance(data.get("version"), int) else None
    retry = report.retry_count if report is not None else 0
    return PreviousRun(
        restarts=int(restarts),
        retry_count=retry,
        version=version if version is not None else retry,
        attempts=attempts,
        nodes=sorted({p.address for p in report.pods if p.address}) if report is not None else [],
        events=list(report.events) if report is not None else [],
    )


def lost_nodes(previous: list[str], now: list[str]) -> list[str]:
    """The nodes of the run before that this one does not have, with Slurm's state of each
    (``localhost (DOWN)``): the node a NODE_FAIL lost."""
    from torchjob.engines.slurm import clients

    lost = []
    for node in sorted(set(previous) - set(now)):
        state = ""
        try:
            for line in clients.run(["scontrol", "show", "node", "-o", node]).splitlines():
                state = clients.parse_show(line).get("State", "") or state
        except clients.SlurmError:
            pass
        lost.append(f"{node} ({state})" if state else node)
    return lost
