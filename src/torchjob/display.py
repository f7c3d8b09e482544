"""How a job report reads to a person: phase colors, log prefixes, the pod table, the summary.

Shared by every engine's attached output and by the CLI's ``status`` and ``logs``, so a job looks
the same whichever engine runs it. Reads only :class:`~torchjob.reports.JobReport`.
"""

from __future__ import annotations

import os
import time

from torchjob.logs import Level
from torchjob.phases import UNSUCCESSFUL_JOB_PHASES, JobPhase, PodPhase, PodState
from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import TextIO

    from torchjob.reports import JobReport, PodReport

_COLORS = ("36", "33", "35", "32", "34", "91", "96", "93", "95", "92", "94")
# Keyed by plain strings: a member of JobPhase or PodPhase looks up as its value.
PHASE_COLORS: dict[str, str] = {
    "Stopped": "33",
    "CrashLoopBackOff": "31",
    PodPhase.SUCCEEDED: "32",
    JobPhase.COMPLETED: "32",
    **dict.fromkeys(UNSUCCESSFUL_JOB_PHASES, "31"),  # Failed, Aborted, Terminated
    JobPhase.RUNNING: "36",
    JobPhase.PENDING: "33",
    JobPhase.RESTARTING: "33",
}


# A note's colour by its level: dim for what merely happens, red for what failed.
LEVEL_COLORS = {
    Level.INFO: "2",
    Level.NOTICE: "36",
    Level.SUCCESS: "32",
    Level.WARNING: "33",
    Level.ERROR: "31",
}


def level_color(level: Level) -> str:
    return LEVEL_COLORS.get(level, "2")


def use_color(stream: TextIO) -> bool:
    return stream.isatty() and not os.environ.get("NO_COLOR") and os.environ.get("TERM") != "dumb"


def paint(text: str, code: str, color: bool) -> str:
    return f"\x1b[{code}m{text}\x1b[0m" if color and code else text


def pod_color(ordinal: int) -> str:
    return _COLORS[ordinal % len(_COLORS)]


def prefix_for(short: str, rank: int | str | None, container: str | None) -> str:
    """``<task>-<index>[/<container>] [r<RANK>]``: the prefix of a pod's log lines."""
    head = short if container is None else f"{short}/{container}"
    return f"{head} r{rank}" if rank is not None else head


def elapsed(start: float | None, end: float | None) -> str:
    if start is None:
        return "-"
    seconds = (end if end is not None else time.time()) - start
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, secs = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    return f"{minutes // 60}h{minutes % 60:02d}m"


def ports_text(report: JobReport) -> str:
    return ", ".join(f"{p.declared}->{p.host}" for p in report.ports) or "none"


def pod_rows(report: JobReport, color: bool = False, limit: int | None = None) -> list[str]:
    """The pod table: one row a pod (``limit`` rows at most, then a count of the rest)."""
    header: tuple[str, ...] = ("POD", "RANK", "ADDRESS", "PHASE", "RESTARTS", "EXIT", "ATTEMPT", "ELAPSED")
    # How long a running pod has been silent (a hang shows as a growing age), where the engine knows.
    output = any(pod.last_output_at is not None for pod in report.pods)
    if output:
        header += ("LAST OUTPUT",)
    rows: list[tuple[str, ...]] = []
    for pod in report.pods:
        phase = pod.phase + (f" ({pod.reason})" if pod.reason else "")
        phase += " (stopping)" if pod.terminating else ""
        exit_code = pod.exit_code
        if exit_code is None:  # still running: a crash-looping container's last exit code
            exit_code = next((c.exit_code for c in pod.containers if c.reason == "CrashLoopBackOff"), None)
        rows.append(
            (
                pod.short or pod.name,
                "-" if pod.rank is None else str(pod.rank),
                pod.address,
                phase,
                str(pod.restarts),
                "-" if exit_code is None else str(exit_code),
                str(pod.attempt),
                elapsed(pod.started_at, pod.finished_at),
            )
        )
        if output:
            silent = pod.phase == PodState.RUNNING and pod.last_output_at is not None
            rows[-1] += (f"{elapsed(pod.last_output_at, None)} ago" if silent else "-",)
    hidden = 0
    if limit is not None and len(rows) > limit:
        hidden, rows = len(rows) - limit, rows[:limit]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    out = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)).rstrip()]
    for row in rows:
        cells = [c.ljust(w) for c, w in zip(row, widths, strict=True)]
        base = row[3].split(" ")[0]
        cells[3] = paint(cells[3], PHASE_COLORS.get(base, ""), color)
        out.append("  ".join(cells).rstrip())
    if hidden:
        out.append(f"... and {plural(hidden, 'more pod')}")
    return out


def plural(count: int, noun: str) -> str:
    """``1 pod``, ``2 pods``."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def root_cause(report: JobReport, color: bool = False) -> list[str]:
    """The pod (and rank) the engine found to cause the failure, and the end of its log ([] if none):
    the engines that run pods themselves weigh the failed pods' logs and those of the pods the job
    stopped (controller/rootcause.py), the kubernetes engine the tails of its earliest failed pods'."""
    failure = report.first_failure
    if failure is None:
        return []
    who = failure.short or failure.pod
    if failure.rank is not None:
        who += f" (rank {failure.rank})"
    code = "-" if failure.exit_code is None else str(failure.exit_code)
    when = "" if failure.time is None else time.strftime(" at %H:%M:%S", time.localtime(failure.time))
    reason = f" ({failure.reason})" if failure.reason else ""
    lines = [paint(f"root cause: {who}, exit code {code}{reason}{when}", "31", color)]
    if failure.log_tail:
        lines.append(f"  last {plural(len(failure.log_tail), 'line')} of its log:")
        lines += [f"    {line}" for line in failure.log_tail]
    return lines


def outcome(report: JobReport, color: bool = False) -> list[str]:
    """How the job ended, the root cause first: the phase's reason may name a pod that failed later
    (the one whose failure a policy acted on), which would otherwise be read as the culprit."""
    phase = paint(report.phase, PHASE_COLORS.get(report.phase, ""), color)
    cause = [] if report.ok else root_cause(report, color)
    return [*cause, f"{phase}: {report.reason}".rstrip(": ")]


def crash_loops(report: JobReport) -> list[str]:
    """A line for each container in CrashLoopBackOff: its last exit code and restarts."""
    lines = []
    for pod in report.pods:
        for c in pod.containers:
            if c.reason == "CrashLoopBackOff":
                code = "-" if c.exit_code is None else str(c.exit_code)
                lines.append(
                    f"{pod.short or pod.name}: container {c.name} in CrashLoopBackOff, last exit code {code}"
                    f" ({'Completed' if c.exit_code == 0 else 'Error'}), {plural(c.restarts, 'restart')}"
                )
    return lines


def first_failed_first(report: JobReport, pods: list[PodReport]) -> list[PodReport]:
    """``pods`` with the root cause's pod first (``torchjob logs`` prints its log before the others')."""
    failure = report.first_failure
    if failure is None:
        return list(pods)
    return sorted(pods, key=lambda p: p.name != failure.pod)


def headline(report: JobReport, color: bool = False) -> str:
    phase = paint(report.phase, PHASE_COLORS.get(report.phase, ""), color)
    return (
        f"job {report.id or report.name}: {phase}"
        f"  ports {ports_text(report)}  retries {report.retry_count}"
        f"  elapsed {elapsed(report.started_at, report.finished_at)}"
    )


def summary(report: JobReport, color: bool = False, unshown: int = 0, remove: bool = False) -> list[str]:
    """The closing lines; ``unshown`` counts container lines that were not printed above;
    ``remove`` (run --rm): a job that completed is about to be removed, a failed one is kept."""
    lines = [headline(report, color)]
    lines += ["  " + row for row in pod_rows(report, color)]
    lines += outcome(report, color)
    if not report.location:  # nothing kept (the job directory could not be written): no logs to name
        return lines
    logs = f"{report.location}/logs"
    if unshown:
        text = f"{unshown} line{'s' if unshown != 1 else ''} of container output not shown above"
        lines.append(paint(f"{text} (the output was not read in time); every line is in {logs}", "33", color))
    if remove and report.ok:  # its logs go with it: no path to a file that is about to vanish
        lines.append(f"job {report.id} and its logs are removed (--rm)")
        return lines
    lines.append(f"logs: {logs}  (torchjob logs {report.id})")
    if remove:
        lines.append(f"kept for its logs: --rm removes only a completed job (torchjob delete {report.id})")
    return lines
