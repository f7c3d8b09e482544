"""``torchjob status``, ``logs``, ``wait``, ``delete``, ``prune`` and ``queue``: jobs of an engine
(default: this machine); ``run`` is :mod:`torchjob.cli.run_command`'s.

Only parses and prints: everything else is asked of the engine through
:class:`torchjob.engine_api.base.Engine`, found by name in :mod:`torchjob.engine_api.registry`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from torchjob.cli import run_command
from torchjob.cli.settings import chosen_engine, engine_options, number_option
from torchjob.engine_api.registry import engine_info
from torchjob.errors import EXIT_FAILED, EXIT_OK, Problem, SpecError
from torchjob.phases import UNKNOWN
from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from torchjob.engine_api.base import Engine, JobReport, LogQuery, QueueListing

REF_HELP = "job id, unique id prefix, or name (newest)"


def register(commands: Any) -> None:
    run_command.register(commands)
    status = commands.add_parser("status", help="show the jobs, or one job's pods")
    status.add_argument("job", nargs="?", metavar="JOB", help=REF_HELP)
    status.add_argument("-o", "--output", choices=("yaml", "json"), help="print the full status")
    status.add_argument(
        "-w",
        "--watch",
        action="store_true",
        help="redraw JOB's status until it ends; exit as wait does (0 completed, 1 failed)",
    )
    engine_options(status, "status")
    status.set_defaults(func=run_status)

    logs = commands.add_parser("logs", help="print a job's logs, prefixed by pod and rank")
    logs.add_argument("job", metavar="JOB", help=REF_HELP)
    logs.add_argument("pod", nargs="?", metavar="POD", help="pod name, short name (worker-1) or task name")
    logs.add_argument(
        "-f", "--follow", action="store_true", help="keep printing new lines until the job ends"
    )
    logs.add_argument("-c", "--container", help="only this container")
    logs.add_argument("--attempt", metavar="N", help="this attempt of each pod (default: the latest)")
    logs.add_argument("--all-attempts", action="store_true", help="every attempt of each pod, oldest first")
    engine_options(logs, "logs")
    logs.set_defaults(func=run_logs)

    _register_wait(commands)

    delete = commands.add_parser("delete", help="stop a job if it runs, then remove it and its state")
    delete.add_argument(
        "jobs", nargs="*", metavar="JOB", help="job id, id prefix of 4+ characters, or name (newest)"
    )
    delete.add_argument("--all", action="store_true", help="every job of the engine, running or not")
    engine_options(delete, "delete")
    delete.set_defaults(func=run_delete)
    prune = commands.add_parser(
        "prune",
        help="remove finished jobs (Completed, Failed, Aborted, Terminated), and on a cluster "
        "what gone jobs left",
    )
    prune.add_argument(
        "--older-than",
        metavar="DURATION",
        help="only those that ended longer ago than this: 90s, 30m, 12h, 7d, 1h30m",
    )
    engine_options(prune, "prune")
    prune.set_defaults(func=run_prune)
    _register_queue(commands)


# --------------------------------------------------------------------- status


def run_status(args: argparse.Namespace) -> int:
    from torchjob.display import ports_text

    engine = chosen_engine(args)
    if args.watch:
        if args.job is None or args.output:
            message = (
                "expected one JOB to watch, and no --output" if args.output else "expected a JOB to watch"
            )
            raise SpecError([Problem("--watch", message, "<command line>")])
        from torchjob.engine_api.interrupts import sigterm_interrupts

        with sigterm_interrupts():  # ended by SIGTERM as by Ctrl-C, as wait is
            return _watch(engine, args.job)
    if args.job is None:
        reports = list(reversed(engine.list_jobs()))  # oldest first, the newest next to the prompt
        if args.output:
            _dump({"items": [r.to_dict() for r in reports]}, args.output)
            return EXIT_OK
        if not reports:
            namespace = getattr(args, "namespace", None)
            place = getattr(args, "state_dir", None) or (f"namespace {namespace}" if namespace else "")
            where = f" in {place}" if place else ""
            print(f"no {engine.name} jobs{where}")
            print(_calls_line(args), end="")
            return EXIT_OK
        rows: list[tuple[str, ...]] = [("JOB", "PHASE", "PODS", "RETRIES", "PORTS", "STARTED")]
        for r in reports:
            # A job none of whose pods started yet has no start time (not the epoch).
            started = (
                time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r.started_at)) if r.started_at else "-"
            )
            rows.append((r.id, r.phase, _pod_counts(r), str(r.retry_count), ports_text(r), started))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        for row in rows:
            print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
        print(_calls_line(args), end="")
        return EXIT_OK
    report = engine.status(args.job)
    if args.output:
        _dump(report.to_dict(), args.output)
        return EXIT_OK
    print("\n".join(_status_lines(report)))
    return EXIT_OK


def _calls_line(args: argparse.Namespace) -> str:
    """The jobs of Python calls, which keep to a directory of their own (docs/sdk.md): how many
    there are and the command that lists them, under the default listing; else ""."""
    import os

    from torchjob.engine_api.lastrun import calls_root

    own_root = any(s.name == "state_dir" for s in engine_info(args.engine).settings)
    if not own_root or getattr(args, "state_dir", None) is not None:
        return ""
    try:
        count = sum(1 for e in os.scandir(calls_root()) if e.is_dir() and not e.name.startswith("."))
    except OSError:
        return ""
    if not count:
        return ""
    jobs = "1 job" if count == 1 else f"{count} jobs"
    return f"({jobs} of Python calls: torchjob status --state-dir {calls_root()})\n"


WATCH_EVERY = 1.0  # seconds between redraws of status --watch


def _watch(engine: Engine, ref: str) -> int:
    """Redraw the job's status (on a terminal; else print it when it changes) until it ends."""
    terminal = sys.stdout.isatty()
    shown: list[str] = []
    while True:
        report = engine.status(ref)
        lines = _status_lines(report)
        if terminal:  # elapsed times tick: redraw every time, in place
            sys.stdout.write("\x1b[H\x1b[J" + "\n".join(lines) + "\n")
            sys.stdout.flush()
        elif lines != shown:
            print("\n".join(lines), flush=True)
        shown = lines
        if report.terminal or report.phase == UNKNOWN:
            return _ended_code(report)
        time.sleep(WATCH_EVERY)


def _pod_counts(report: JobReport) -> str:
    """``3 pods: 2 succeeded, 1 stopped``: every pod counted once, by its phase; for a job of
    which only what it left remains, ``0 pods: only leftovers: service/demo, +3 more``."""
    from torchjob.display import plural

    counts: dict[str, int] = {}
    for pod in report.pods:
        counts[pod.phase.lower()] = counts.get(pod.phase.lower(), 0) + 1
    parts = ", ".join(f"{n} {phase}" for phase, n in counts.items())
    if report.leftovers and not parts:  # why it is Unknown, briefly: `status JOB` says it all
        left = report.leftovers
        shown = left if len(left) <= 3 else [*left[:2], f"+{len(left) - 2} more"]
        parts = "only leftovers: " + ", ".join(shown)
    return plural(len(report.pods), "pod") + (f": {parts}" if parts else "")


def _status_lines(report: JobReport) -> list[str]:
    from torchjob.display import crash_loops, headline, pod_rows, root_cause, use_color

    color = use_color(sys.stdout)
    lines = [headline(report, color), *("  " + line for line in pod_rows(report, color))]
    if not report.ok:  # the root cause first: the reason may name a pod that failed after it
        lines += root_cause(report, color)
    lines.append(f"reason: {report.reason}")
    lines += crash_loops(report)
    if report.name_resolution:
        lines.append(f"names: {report.name_resolution}")
    if report.network:
        lines.append(f"network: {report.network}")
    for event in report.events[-5:]:
        when = time.strftime("%H:%M:%S", time.localtime(event.time))
        lines.append(f"  {when} {event.message}")
    if report.location:
        lines.append(f"{_location_label(report.engine)}: {report.location}")
    return lines


def _location_label(engine: str) -> str:
    from torchjob.engine_api.base import EngineError

    try:
        return engine_info(engine).location
    except EngineError:  # a report of an engine no longer installed
        return "location"


def _dump(data: Any, fmt: str) -> None:
    if fmt == "json":
        print(json.dumps(data, indent=2))
        return
    from torchjob.render import dump

    sys.stdout.write(dump(data, "yaml"))


# ----------------------------------------------------------------------- logs


def run_logs(args: argparse.Namespace) -> int:
    from torchjob.engine_api.base import LogQuery

    attempt = args.attempt
    if attempt is not None:  # attempts are counted from 0, as in the job's status
        attempt = number_option(
            "--attempt",
            attempt,
            "expected an attempt number (0 or more), got {value}",
            integer=True,
            minimum=0,
        )
    query = LogQuery(
        pod=args.pod,
        container=args.container,
        attempt=attempt,
        all_attempts=args.all_attempts,
        follow=args.follow,
    )
    if not args.follow:
        return _print_logs(args, query)
    from torchjob.engine_api.interrupts import sigterm_interrupts

    # One scope to the end: the job's status read after the logs takes SIGTERM as Ctrl-C too.
    with sigterm_interrupts():
        _print_logs(args, query)
        return _ended_code(chosen_engine(args).status(args.job))  # a script learns how it ended


def _print_logs(args: argparse.Namespace, query: LogQuery) -> int:
    from torchjob.display import paint, pod_color, use_color

    lines = chosen_engine(args).logs(args.job, query)  # streamed: a log of any size in bounded memory
    width = 0  # prefixes padded to the widest seen so far
    color = use_color(sys.stdout)
    for line in lines:
        width = max(width, len(line.prefix))
        label = paint(line.prefix.ljust(width), pod_color(line.pod_ordinal), color)
        sys.stdout.write(f"{label} | {line.text}\n")
        if args.follow:
            sys.stdout.flush()
    sys.stdout.flush()
    return EXIT_OK


# ---------------------------------------------------------------------- queue


def _register_queue(commands: Any) -> None:
    queue = commands.add_parser(
        "queue", help="the machine's queue: capacity, queues, the jobs that run and those that wait, and why"
    )
    queue.add_argument("-o", "--output", choices=("yaml", "json"), help="print it all as data")
    engine_options(queue, "queue")
    queue.set_defaults(func=run_queue)


def run_queue(args: argparse.Namespace) -> int:
    from torchjob.engine_api.base import EngineError

    engine = chosen_engine(args)
    listing: Callable[[], QueueListing] | None = getattr(engine, "queues", None)
    if listing is None:
        raise EngineError(f"engine {engine.name} keeps no queue of its own; its cluster's scheduler does")
    found = listing()
    if args.output:
        _dump(found.to_dict(), args.output)
        return EXIT_OK
    print(f"capacity: {_amounts(found.capacity)} ({found.source})")
    print(f"free:     {_amounts(found.free)}")
    if found.where:
        print(f"kept in:  {found.where}")
    for note in found.notes:
        print(f"note:     {note}")
    rows: list[tuple[str, ...]] = [("QUEUE", "WEIGHT", "CAPABILITY", "RUNNING", "WAITING")]
    for q in found.queues:
        rows.append((q.name, f"{q.weight:g}", _amounts(q.capability) or "-", str(q.running), str(q.waiting)))
    _table(rows)
    if not found.jobs:
        print("no job holds or waits for resources")
        return EXIT_OK
    print()
    users = any(j.user for j in found.jobs)  # a queue users share: whose each job is
    rows = [("JOB", *(("USER",) if users else ()), "QUEUE", "PRIORITY", "STATE", "RESOURCES", "REASON")]
    for j in found.jobs:
        who = (j.user,) if users else ()
        rows.append((j.id, *who, j.queue, str(j.priority), j.state, _amounts(j.requests), j.reason))
    _table(rows)
    return EXIT_OK


def _amounts(given: dict[str, str]) -> str:
    return ", ".join(f"{v} {k}" for k, v in given.items())


def _table(rows: list[tuple[str, ...]]) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())


# ----------------------------------------------------------------------- wait

EXIT_WAIT_TIMEOUT = 124  # as GNU timeout(1): the job had not ended when --timeout passed


def _register_wait(commands: Any) -> None:
    wait = commands.add_parser(
        "wait",
        help="wait until a job ends: exit 0 if it completed, 1 if it failed",
        description=(
            "Wait until JOB ends. Exit 0 if it completed, 1 if it failed (or was aborted or "
            f"terminated, or its supervisor died), 2 if JOB names no job, {EXIT_WAIT_TIMEOUT} if "
            "--timeout passed first (the job goes on)."
        ),
    )
    wait.add_argument("job", metavar="JOB", help=REF_HELP)
    wait.add_argument("--timeout", metavar="SECONDS", help="give up after this long")
    engine_options(wait, "wait")
    wait.set_defaults(func=run_wait)


def run_wait(args: argparse.Namespace) -> int:
    from torchjob.display import root_cause

    if args.timeout is not None:
        message = "expected a non-negative, finite number of seconds, got {value}"
        args.timeout = number_option("--timeout", args.timeout, message, minimum=0)
    from torchjob.engine_api.base import StreamSink
    from torchjob.engine_api.interrupts import sigterm_interrupts

    with sigterm_interrupts():  # a CI runner's SIGTERM ends it as Ctrl-C does: a word, exit 130
        report = chosen_engine(args).wait(args.job, args.timeout, sink=StreamSink())
    if not (report.terminal or report.phase == UNKNOWN):
        print(
            f"torchjob: job {report.id} is still {report.phase} after {args.timeout:g}s (timed out)",
            file=sys.stderr,
        )
        return EXIT_WAIT_TIMEOUT
    print(f"{report.id} {report.phase}: {report.reason}".rstrip(": "))  # first: a script reads it
    if not report.ok:
        for line in root_cause(report):
            print(line)
    return _ended_code(report)


def _ended_code(report: JobReport) -> int:
    """0 for a job that completed; 1 for one that ended otherwise or that nobody runs any more."""
    return EXIT_OK if report.ok else EXIT_FAILED


# --------------------------------------------------------------------- delete


def run_delete(args: argparse.Namespace) -> int:
    if args.all == bool(args.jobs):
        message = "give the jobs to delete, or --all for every job" if not args.all else "--all takes no JOB"
        raise SpecError([Problem("", message, "<command line>")])
    engine = chosen_engine(args)
    refs = [r.id for r in engine.list_jobs()] if args.all else list(args.jobs)
    for job_id in engine.delete(refs):  # also with none: a root that is not torchjob's is refused
        print(f"deleted {job_id}")
    if not refs:  # --all of none: said, as prune says it
        print(f"no {engine.name} jobs to delete")
    return EXIT_OK


_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_duration(text: str) -> float:
    """``90s``, ``30m``, ``1h30m``, ``7d`` in seconds; SpecError naming --older-than otherwise."""
    import re

    # ASCII digits, as in a job's durations (spec/units.py): \d would take '٣d' for 3d
    parts = re.findall(r"([0-9]+(?:\.[0-9]+)?)([smhdw])", text)
    if not text or "".join(n + u for n, u in parts) != text:
        message = f"expected a duration such as 90s, 30m, 12h, 7d or 1h30m, got {text!r}"
        raise SpecError([Problem("--older-than", message, "<command line>")])
    return sum(float(n) * _DURATION_UNITS[u] for n, u in parts)


def run_prune(args: argparse.Namespace) -> int:
    """Finished jobs (a terminal phase), those that ended before ``--older-than`` ago."""
    age = None if args.older_than is None else parse_duration(args.older_than)
    engine = chosen_engine(args)
    finished = [r for r in engine.list_jobs() if r.terminal]
    # A cluster's jobs end by its clock, which this machine's may not agree with (ClockEngine).
    clock: Callable[[], float] = getattr(engine, "now", time.time)
    now = clock()
    if age is not None:
        finished = [r for r in finished if now - (r.finished_at or r.started_at or now) > age]
    for job_id in engine.delete([r.id for r in finished]):  # [] still checks the root
        print(f"deleted {job_id}")
    # Jobs of which only what they left remains (a cluster's): the engine picks them, as it
    # alone can tell them from a job being submitted (LeftoverEngine).
    prune_leftovers: Callable[[float | None], list[str]] | None = getattr(engine, "prune_leftovers", None)
    pruned = prune_leftovers(age) if prune_leftovers is not None else []
    for job_id in pruned:
        print(f"deleted {job_id}")
    if not finished and not pruned:
        print("no finished jobs to remove")
    return EXIT_OK
