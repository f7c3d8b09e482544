"""Which pod caused a failed cluster job, weighed by its log as the local and Slurm engines weigh
theirs (``controller/rootcause.py``'s ``judge``): a rank whose program raised beats a peer that
only lost its connection, which beats a stop by a signal; torchrun's report names the failed
global rank; between equals, the container that ended first.

A job's report is built often while it is followed, so the report names the earliest failed
container (:func:`first_failure`, no request); the engine weighs the logs where it says how the
job ended (``status``, the end of ``wait`` and of an attached run: :func:`weigh_logs`). That reads
the tails of the CANDIDATES earliest failed containers only, each up to TAIL_BYTES, and a log that
cannot be read (no RBAC for pods/log, the pod gone) never fails the report: when no log says
anything, the earliest failure stays named.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torchjob.engine_api.base import EngineError, FailureReport, PodReport
from torchjob.engines.kubernetes.client import Cluster, LineReader
from torchjob.engines.kubernetes.errors import ApiError
from torchjob.engines.kubernetes.phase import timestamp
from torchjob.engines.kubernetes.podlogs import log_path, refused
from torchjob.records import record, replace

CANDIDATES = 8  # the earliest failed containers whose logs are read: the raising rank is among them
FIRST_LINES = 1000  # the tail's lines asked for first; fewer when they are longer than TAIL_BYTES
TRIES = 3  # requests per log at most
_SIGNALLED = (128 + 9, 128 + 15)  # SIGKILL, SIGTERM: how a pod the job deletes ends


@record
class Termination:
    """A pod's earliest failed container run: the failure as known without its log, and where that
    log is (``previous``: the run before the container's current one, restarted in place)."""

    failure: FailureReport
    container: str
    previous: bool
    when: float


def terminations(pods: list[PodReport], raw: dict[str, dict[str, Any]]) -> list[Termination]:
    """Each pod's earliest non-zero main container termination (current or last state), earliest
    first (one without a finish time last; between equals, in the order of ``pods``)."""
    found: list[Termination] = []
    for report in pods:
        pod = raw.get(report.name) or {}
        best: Termination | None = None
        for s in (pod.get("status") or {}).get("containerStatuses") or []:
            for state, previous in ((s.get("state") or {}, False), (s.get("lastState") or {}, True)):
                term = state.get("terminated")
                if not term or not term.get("exitCode"):
                    continue
                when = timestamp(term.get("finishedAt")) or float("inf")
                if best is None or when < best.when:
                    failure = FailureReport(
                        pod=report.name,
                        short=report.short,
                        exit_code=term.get("exitCode"),
                        rank=report.rank,
                        reason=str(term.get("reason") or ""),
                        time=None if when == float("inf") else when,
                    )
                    best = Termination(failure, str(s.get("name") or ""), previous, when)
        if best is not None:
            found.append(best)
    return sorted(found, key=lambda t: t.when)


def first_failure(pods: list[PodReport], raw: dict[str, dict[str, Any]]) -> FailureReport | None:
    """The pod whose main container failed first (by finish time), from current or last states;
    else a Failed pod, as the pod says."""
    ended = terminations(pods, raw)
    if ended:
        return ended[0].failure
    failed = next((p for p in pods if p.phase == "Failed"), None)
    if failed is None:
        return None
    return FailureReport(pod=failed.name, short=failed.short, rank=failed.rank, reason=failed.reason)


def weigh_logs(
    cluster: Cluster,
    namespace: str,
    pods: list[PodReport],
    raw: dict[str, dict[str, Any]],
    on_refused: Callable[[EngineError], None],
) -> FailureReport | None:
    """The root cause by the logs of the earliest failed containers; None when no log could be
    read or said anything (the earliest failure stays the root cause). A refusal to read logs is
    told to ``on_refused``; after it, or any other error, no further log is asked for."""
    from torchjob.controller.rootcause import judge

    weighed: list[tuple[int, int, FailureReport]] = []
    evidence = trouble = False
    for order, ended in enumerate(terminations(pods, raw)[:CANDIDATES]):
        lines: list[str] | None = None
        if not trouble:
            try:
                lines = _tail(cluster, namespace, ended)
            except EngineError as err:
                trouble = True
                if refused(err):
                    on_refused(err)
        failure = replace(ended.failure)
        stopped = failure.exit_code in _SIGNALLED and failure.reason != "OOMKilled"
        weighed.append((judge(failure, lines or [], stopped=stopped), -order, failure))
        evidence = evidence or bool(lines)
    if not evidence:
        return None
    return max(weighed, key=lambda w: (w[0], w[1]))[2]


def _tail(cluster: Cluster, namespace: str, ended: Termination) -> list[str] | None:
    """The last lines of the failed run's log, up to about TAIL_BYTES; None when it has none (the
    pod gone, never started). The API reads ``tailLines`` from the end, then cuts what it sends at
    ``limitBytes`` (the tail's start kept): a tail cut so is asked again with half its lines."""
    from torchjob.controller.rootcause import TAIL_BYTES

    pod, wanted = ended.failure.pod, FIRST_LINES
    for _ in range(TRIES):
        query = {
            "container": ended.container or None,
            "tailLines": wanted,
            "limitBytes": TAIL_BYTES,
            "previous": ended.previous or None,
        }
        try:
            response = cluster.open(
                "GET", log_path(namespace, pod), query=query, doing=f"read the log of pod {pod}"
            )
        except ApiError as err:
            if err.status in (400, 404):  # never started, or gone with its log
                return None
            raise
        try:
            reader = LineReader(response)
            lines = list(reader)
        except Exception as err:  # urllib3's read errors: the log cannot be had, not the report
            raise EngineError(f"cannot read the log of pod {pod}: {err}") from None
        finally:
            response.release_conn()
        size = sum(len(line.encode()) + 1 for line in lines) + len(reader.rest.encode())
        if size < TAIL_BYTES:
            return lines + ([reader.rest] if reader.rest else [])
        wanted = len(lines) // 2  # the whole lines that fit, halved: the end's lines may be longer
        if wanted < 1:
            break
    return None
