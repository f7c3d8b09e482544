"""Which pod caused a job's failure, decided from the evidence in the pods' logs.

When one rank of a distributed job raises, its peers fail soon after with errors of their own
(gloo's ``Connection closed by peer``, a store that went away): the pod that failed first is
usually the cause, but not always the first whose end is seen (a busy machine reorders exits).
So each failed pod's log is read and weighed: a Python exception raised by the program beats an
exit without one, which beats a lost connection to a peer, which beats a stop by a signal from
outside; between equals, the pod that ended first. A pod running torchrun is read as torchrun
reports it: the rank that failed (its global rank), its exit code and its own last lines.

The raising rank's pod may not fail at all: a peer's pod fails first, and the job stops the rest
before the raising rank's torchrun (or program) has ended. A pod the job stopped is weighed too,
once it is gone (its log complete): only a program's exception in it counts (a rank's
``[rankN]:`` traceback), and that outweighs any lesser evidence of a failed pod.
"""

from __future__ import annotations

import os
import re

from torchjob.controller.kubelet import ENDED, FAILED, Container, Pod
from torchjob.controller.reasons import CRASH_LOOP, exit_reason, short_name
from torchjob.records import replace
from torchjob.reports import FailureReport
from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from pathlib import Path

    from torchjob.spec.model import Job

LOG_TAIL_LINES = 20  # lines of the root cause's log in its report
TAIL_BYTES = 65536  # read from the end of a failed container's log: torchrun's report and before
ROOT_CAUSE = "Root Cause (first observed failure):"  # in torchrun's report of a failed rank
# The patterns are text: re compiles (and caches) each at its first use, once a container failed,
# not at every job's start (this module is loaded before the first pod: every status report).
# torchrun's own log lines: "E1126 16:19:13.695000 9050 torch/distributed/elastic/...] ..."
_TORCHRUN_LOG = r"[DIWEF]\d{4} [\d:.]+ \d+ torch/distributed/"
_TRACEBACK = "Traceback (most recent call last):"
_EXCEPTION = r"^([A-Za-z_][\w.]*)(?::\s?(.*))?$"
# What a rank says when a peer went away first: not the cause of the job's failure.
_PEER_LOST = (
    r"(?i)Connection closed by peer|Connection reset by peer|Broken pipe|Connection refused|"
    r"DistNetworkError|DistBackendError|DistStoreError|ECONNRESET|ECONNREFUSED|recvValue|"
    r"Socket Timeout|timed out|TCPStore|Gloo connectFullMesh|NCCL communicator was aborted|"
    r"ProcessGroup.*(?:abort|shut ?down)|lost connection"
)
# Exceptions that tell of a stop from outside or of another rank, not of the program's own fault.
_NOT_THE_PROGRAM = ("KeyboardInterrupt", "SignalException", "ChildFailedError", "SystemExit")
_STOPPED = (128 + 1, 128 + 2, 128 + 15)  # SIGHUP, SIGINT, SIGTERM: asked to stop

RAISED, EXITED, PEER_LOST, STOPPED = 3, 2, 1, 0  # the weight of a failed pod's evidence
STOPPED_AFTER_RAISING = "Stopped by the job after its program raised"  # a stopped root cause's reason


def log_tail(path: Path, lines: int | None = LOG_TAIL_LINES, nbytes: int = TAIL_BYTES) -> list[str]:
    """The last ``lines`` lines (None: all) of the last ``nbytes`` of a log file ([] when it
    cannot be read)."""
    try:
        with open(path, "rb") as log:
            size = log.seek(0, os.SEEK_END)
            log.seek(max(0, size - nbytes))
            data = log.read(nbytes)
    except OSError:
        return []
    text = data.decode(errors="replace").splitlines()
    if len(data) == nbytes and size > nbytes:
        text = text[1:]  # the first line read may be cut
    return text if lines is None else text[-lines:]


def rank_lines(lines: list[str]) -> dict[int, list[str]]:
    """The lines torch prefixed with ``[rankN]:`` (a rank's own, after init_process_group), by
    global rank, without the prefix, in the order the ranks first wrote."""
    own: dict[int, list[str]] = {}
    for line in lines:
        found = re.match(r"\[rank(\d+)\]: ?", line)
        if found:
            own.setdefault(int(found[1]), []).append(line[found.end() :])
    return own


def _raising_rank(lines: list[str]) -> tuple[int, list[str]] | None:
    """The first rank whose own lines end in an exception of its program (a pod's log without
    torchrun's report: its ranks' tracebacks are prefixed, which :func:`raised` does not read)."""
    return next(((r, own) for r, own in rank_lines(lines).items() if weigh(own, None) == RAISED), None)


def _torchrun_failures(lines: list[str], root: int) -> list[tuple[int, int | None]]:
    """The failed ranks torchrun's report lists, as (global rank, exit code): the root cause it
    names (its "Root Cause" section, from line ``root``) first, then its other "Failures"."""
    begin = max((i for i in range(max(0, root - 200), root) if lines[i].strip() == "Failures:"), default=root)
    sections: dict[bool, list[dict[str, int]]] = {True: [], False: []}
    in_root = False
    for i in range(begin, len(lines)):
        text = lines[i].strip()
        if i > root and text.startswith("===="):
            break
        in_root = in_root or i == root
        if re.fullmatch(r"\[\d+\]:", text):
            sections[in_root].append({})
            continue
        key, _, value = text.partition(":")
        match = re.match(r"\s*(-?\d+)", value)
        if sections[in_root] and match:
            sections[in_root][-1].setdefault(key.strip(), int(match[1]))
    entries = sections[True] + sections[False]
    return [(e["rank"], e.get("exitcode")) for e in entries if "rank" in e]


def torchrun_root_cause(lines: list[str]) -> tuple[int, int | None, list[str]] | None:
    """From the log of a pod whose torchrun reported failed ranks: the rank that caused it (its
    global rank), its exit code (a signal as 128+N, as for a pod) and its own last lines instead of
    torchrun's report. The ranks' own lines are those torch prefixes with ``[rankN]:`` (a
    traceback after init_process_group), weighed as pods are (:func:`weigh`): torchrun's "first
    observed failure" may be a rank that lost its peer, seen to end before the one that raised.
    Without such lines, the lines before torchrun's report, without its own log lines. None
    without a report."""
    starts = [i for i, line in enumerate(lines) if line.strip() == ROOT_CAUSE]
    if not starts:
        return None
    failures = _torchrun_failures(lines, starts[-1])
    if not failures:
        return None
    weighed = []
    ranks = rank_lines(lines)
    for order, (rank, code) in enumerate(failures):
        own = ranks.get(rank, [])
        code = None if code is None else 128 - code if code < 0 else code
        weighed.append((weigh(own, code) if own else -1, -order, rank, code, own))
    _, _, rank, code, own = max(weighed)
    if not own:
        ends = [
            i for i, line in enumerate(lines) if re.match(_TORCHRUN_LOG, line) and "failed (exitcode" in line
        ]
        own = [line for line in lines[: ends[0] if ends else starts[-1]] if not re.match(_TORCHRUN_LOG, line)]
        while own and not own[-1].strip():
            own.pop()
    return rank, code, own


def raised(lines: list[str]) -> str | None:
    """The exception the last Python traceback in ``lines`` ended with (``RuntimeError: boom``)."""
    starts = [i for i, line in enumerate(lines) if line.strip().endswith(_TRACEBACK)]
    if not starts:
        return None
    for line in lines[starts[-1] + 1 :]:
        if line[:1].isspace() or not line.strip():
            continue  # a frame, or its source line
        return line.strip() if re.match(_EXCEPTION, line.strip()) else None
    return None


def weigh(lines: list[str], exit_code: int | None) -> int:
    """How strongly a failed pod's own lines say it caused the failure (RAISED ... STOPPED)."""
    exception = raised(lines)
    if exception is not None:
        name = exception.partition(":")[0].rpartition(".")[2]
        if name not in _NOT_THE_PROGRAM and not re.search(_PEER_LOST, exception):
            return RAISED
        if name in ("KeyboardInterrupt", "SignalException"):
            return STOPPED
        return PEER_LOST
    if exit_code in _STOPPED:
        return STOPPED
    if any(re.search(_PEER_LOST, line) for line in lines[-LOG_TAIL_LINES:]):
        return PEER_LOST
    return EXITED


def _container(pod: Pod) -> Container | None:
    """The container that failed the attempt: an init container that never let it run, else a main one."""
    if pod.failed is not None:
        return pod.failed
    bad = [c for c in pod.containers if c.exit_code not in (None, 0)]
    candidates = bad or pod.mains or pod.inits
    return candidates[0] if candidates else None


def failure_of(job: Job, pod: Pod) -> FailureReport:
    """What a failed attempt's log says of its failure: the rank (torchrun's failed rank, as a
    global rank), the exit code, its last lines."""
    return _evidence(job, pod)[1]


def stopped(pod: Pod) -> bool:
    """The job stopped the attempt before it ended by itself, and nothing of it runs any more."""
    return pod.gone and pod.phase not in ENDED


def _evidence(job: Job, pod: Pod) -> tuple[int, FailureReport]:
    """A failed (or stopped and gone) attempt's weight and its failure report, read from its log
    once (such an attempt's log is complete: each report of the job after that reuses them)."""
    if pod.evidence is None:
        pod.evidence = _read_evidence(job, pod)
    weight, failure = pod.evidence
    return weight, replace(failure, log_tail=list(failure.log_tail))


def _read_evidence(job: Job, pod: Pod) -> tuple[int, FailureReport]:
    container = _container(pod)
    lines = [] if container is None else log_tail(container.log, None)
    failure = FailureReport(
        pod=pod.name,
        short=short_name(job.name, pod.name),
        exit_code=pod.exit_code,
        rank=pod.rank,
        reason=exit_reason(pod.exit_code),
        time=pod.finished_at,
    )
    return judge(failure, lines, stopped=stopped(pod)), failure


def judge(failure: FailureReport, lines: list[str], *, stopped: bool = False) -> int:
    """The weight of a failed (or ``stopped``) pod's evidence, from the tail of its log
    (``lines``, up to TAIL_BYTES) and its exit code (``failure``'s); ``failure`` is made to say
    what the log says: torchrun's failed rank, that rank's exit code and own last lines. Pure, so
    that an engine reading its logs elsewhere (a cluster's API) weighs them alike."""
    failure.log_tail = lines[-LOG_TAIL_LINES:]
    found = torchrun_root_cause(lines) if any(line.strip() == ROOT_CAUSE for line in lines) else None
    if found is not None:  # the rank that failed under the pod's torchrun, not the node
        failure.rank, failure.exit_code, own = found
        failure.reason = exit_reason(failure.exit_code)
        failure.log_tail = own[-LOG_TAIL_LINES:]
        weight = weigh(own, failure.exit_code)
    else:
        own = lines
        weight = weigh(lines, failure.exit_code)
        found_rank = _raising_rank(lines) if weight < RAISED else None
        if found_rank is not None:  # a rank's traceback, which raised() does not read prefixed
            weight = RAISED
            own = found_rank[1]
            if stopped:  # its torchrun stopped before a report: the rank's own lines say it
                failure.rank = found_rank[0]
                failure.log_tail = own[-LOG_TAIL_LINES:]
    failure.exception = raised(own) or ""
    if stopped and weight == RAISED:
        failure.reason = STOPPED_AFTER_RAISING
    return weight


def told(failure: FailureReport, acted: FailureReport) -> str:
    """The root cause in a script's user's words: ``rank 2 (pod worker-0) failed with exit code 1:
    RuntimeError: boom``; for a pod the job stopped after its program raised, also the failure
    the job acted on (``acted``: another pod's, which stopped it)."""
    who = f"pod {failure.short}" if failure.rank is None else f"rank {failure.rank} (pod {failure.short})"
    what = failure.exception or raised(failure.log_tail)
    if failure.reason == STOPPED_AFTER_RAISING and acted.pod != failure.pod:
        other = f"pod {acted.short}" if acted.rank is None else f"rank {acted.rank} (pod {acted.short})"
        code = "" if failure.exit_code is None else f" (exit code {failure.exit_code})"
        if what is None:  # its traceback is longer than the tail kept: it ends the tail
            last = failure.log_tail[-1].strip() if failure.log_tail else ""
            what = last if re.match(_EXCEPTION, last) else "an exception"
        return f"{who} raised {what}, and the job stopped its pod{code} when {other} failed"
    code = "" if failure.exit_code is None else f" with exit code {failure.exit_code}"
    return f"{who} failed{code}" + (f": {what}" if what else "")


def first_failure(job: Job, pods: list[Pod], *, crash_loops: bool = False) -> FailureReport | None:
    """The root cause among the failed attempts (the newest of each pod) and those the job stopped
    whose program had raised, by the evidence of their logs, then a failed one before a stopped
    one, then by the time each ended; without either, when the job failed all the same
    (``crash_loops``: ``--max-restarts``), the pod that kept failing."""
    weighed = [(*_evidence(job, pod), True, pod.finished_at or 0.0) for pod in pods if pod.phase == FAILED]
    for pod in pods:
        if stopped(pod):  # its end was the job's doing, not evidence; an exception it raised is
            weight, failure = _evidence(job, pod)
            if weight == RAISED:
                weighed.append((weight, failure, False, pod.finished_at or 0.0))
    if weighed:
        return max(weighed, key=lambda w: (w[0], w[2], -w[3]))[1]
    if not crash_loops:
        return None
    looping = [p for p in pods if p.restarts and any(c.exit_code not in (None, 0) for c in p.containers)]
    if not looping:
        return None
    pod = max(looping, key=lambda p: p.restarts)
    container = _container(pod)
    return FailureReport(
        pod=pod.name,
        short=short_name(job.name, pod.name),
        exit_code=container.exit_code if container else None,
        rank=pod.rank,
        reason=CRASH_LOOP,
        time=pod.finished_at,
        log_tail=[] if container is None else log_tail(container.log),
    )
