"""``logs`` of a cluster job as it is now (without ``-f``): each pod's containers, by attempt.

A pod's attempt is the run of the whole job it belongs to, as the controller counts the job's
restarts (``PodReport.attempt``): a restarted job's pods are made again, and the pods of earlier
attempts are deleted with their logs. So ``--attempt N`` reaches the pods of attempt N while they
exist, and says which attempts there are when none does. Within an attempt a container restarted
in place keeps the log of its run before the current one (the kubelet keeps that one only):
``--attempt N`` and ``--all-attempts`` print it first, then the current run; without either,
the current run alone.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from torchjob.display import first_failed_first
from torchjob.engine_api.base import EngineError, JobReport, LogLine, LogQuery
from torchjob.engines.kubernetes.client import Cluster
from torchjob.engines.kubernetes.phase import prefix_for
from torchjob.engines.kubernetes.podlogs import read_log, refused, stream_log

LOG_TAIL_LINES = 20  # a failed pod's last lines in its job's report


def wanted(query: LogQuery, pod: str, short: str) -> bool:
    """Whether a pod is asked for: every pod, or the one named by its name, short name or task."""
    return query.pod is None or query.pod in (pod, short, short.rsplit("-", 1)[0])


def current_logs(cluster: Cluster, report: JobReport, query: LogQuery) -> Iterator[LogLine]:
    """Every wanted container's log as it is now, the first failure's pod first, as it is read
    (a log may be endless)."""
    pods = first_failed_first(report, [p for p in report.pods if wanted(query, p.name, p.short)])
    if query.pod is not None and not pods:
        raise EngineError(f"job {report.name} has no pod {query.pod!r}")
    if query.attempt is not None and not query.all_attempts:
        chosen = [p for p in pods if p.attempt == query.attempt]
        if not chosen:
            listed = "; ".join(f"{p.short}: {p.attempt}" for p in pods) or "none"
            raise EngineError(
                f"job {report.name} has no pod of attempt {query.attempt} on the cluster "
                f"(attempts: {listed}); a controller that restarts a job deletes the pods of its "
                "earlier attempts, and their logs"
            )
        pods = chosen
    earlier = query.all_attempts or query.attempt is not None
    for ordinal, pod in enumerate(pods):
        main = [c for c in pod.containers if not c.init and (query.container in (None, c.name))]
        for container in main:
            prefix = prefix_for(pod.short, pod.rank, container.name if len(main) > 1 else None)
            runs = [True, False] if earlier and container.restarts else [False]
            for previous in runs:
                for text in stream_log(
                    cluster, report.namespace, pod.name, container.name, previous=previous
                ):
                    yield LogLine(prefix=prefix, text=text, pod_ordinal=ordinal)


def add_log_tail(cluster: Cluster, report: JobReport, on_refused: Callable[[EngineError], None]) -> None:
    """The first failure's last log lines, read into the report when it has none (the run before
    the current one of a container restarted and not ended: the run that failed). A refusal to
    read it goes to ``on_refused``: the job's outcome matters more than its log."""
    failure = report.first_failure
    if failure is None or failure.log_tail:
        return
    pod = next((p for p in report.pods if p.name == failure.pod), None)
    container = next((c for c in pod.containers if not c.init), None) if pod else None
    if pod is None or container is None:
        return
    previous = container.state != "terminated" and container.restarts > 0
    try:
        failure.log_tail = read_log(
            cluster, report.namespace, pod.name, container.name, tail=LOG_TAIL_LINES, previous=previous
        )
    except EngineError as err:
        if not refused(err):
            raise
        on_refused(err)
