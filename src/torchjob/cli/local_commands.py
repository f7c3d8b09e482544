"""``torchjob run``, ``status``, ``logs`` and ``delete``: jobs on this machine (the local engine)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from torchjob.errors import Problem, SpecError

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2


def register(commands: Any) -> None:
    run = commands.add_parser("run", help="run a job on this machine, every pod as local processes")
    run.add_argument("file", metavar="FILE", help="job YAML/JSON, '-' for stdin, or FILE.py:TASK")
    run.add_argument("-d", "--detach", action="store_true", help="run in the background and print the job id")
    run.add_argument("--timeout", type=float, metavar="SECONDS", help="terminate the job after this long")
    run.add_argument(
        "-e",
        "--env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="add an environment variable to every container (repeatable)",
    )
    run.add_argument("-q", "--quiet", action="store_true", help="print only the job id and the final phase")
    run.add_argument("--job", metavar="NAME", help="which job to run when FILE holds several")
    _state_dir(run)
    run.set_defaults(func=run_run)

    status = commands.add_parser("status", help="show local jobs, or one job's pods")
    status.add_argument("job", nargs="?", metavar="JOB", help="job id, unique id prefix, or name (newest)")
    status.add_argument("-o", "--output", choices=("yaml", "json"), help="print the full status")
    _state_dir(status)
    status.set_defaults(func=run_status)

    logs = commands.add_parser("logs", help="print a local job's logs, prefixed by pod and rank")
    logs.add_argument("job", metavar="JOB", help="job id, unique id prefix, or name (newest)")
    logs.add_argument("pod", nargs="?", metavar="POD", help="pod name, short name (worker-1) or task name")
    logs.add_argument(
        "-f", "--follow", action="store_true", help="keep printing new lines until the job ends"
    )
    logs.add_argument("-c", "--container", help="only this container")
    logs.add_argument("--attempt", type=int, help="this attempt of each pod (default: the latest)")
    logs.add_argument("--all-attempts", action="store_true", help="every attempt of each pod, oldest first")
    _state_dir(logs)
    logs.set_defaults(func=run_logs)

    delete = commands.add_parser("delete", help="stop a local job if it runs and remove its directory")
    delete.add_argument("jobs", nargs="+", metavar="JOB", help="job id, unique id prefix, or name (newest)")
    _state_dir(delete)
    delete.set_defaults(func=run_delete)


def _state_dir(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--state-dir",
        type=Path,
        metavar="DIR",
        help="where job directories live (default: $TORCHJOB_HOME/jobs or ~/.torchjob/jobs)",
    )


def _root(args: argparse.Namespace) -> Path:
    from torchjob.engines.local.state import state_root

    return state_root(args.state_dir)


def _fail(message: str) -> int:
    print(f"torchjob: {message}", file=sys.stderr)
    return EXIT_BAD_INPUT


# ------------------------------------------------------------------------ run


def _parse_env(pairs: list[str]) -> dict[str, str]:
    env: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise SpecError([Problem("--env", f"expected NAME=VALUE, got {pair!r}", "<command line>")])
        env[name] = value
    return env


def run_run(args: argparse.Namespace) -> int:
    from torchjob.engines.local import RunOptions, run_job
    from torchjob.expand import expand
    from torchjob.jobs import load_jobs

    extra_env = _parse_env(args.env)
    loaded = load_jobs(args.file)
    if args.job:
        loaded = [item for item in loaded if item.job.name == args.job]
        if not loaded:
            raise SpecError([Problem("metadata.name", f"no job named {args.job!r} in this file", args.file)])
    if len(loaded) > 1:
        names = ", ".join(item.job.name for item in loaded)
        raise SpecError(
            [
                Problem(
                    "", f"the file holds {len(loaded)} jobs ({names}); choose one with --job NAME", args.file
                )
            ]
        )
    item = loaded[0]
    for path, message in expand(item.job).warnings:
        print(item.document.problem(path, f"warning: {message}").format(), file=sys.stderr)
    options = RunOptions(
        state_dir=args.state_dir,
        quiet=args.quiet or args.detach,
        timeout=args.timeout,
        extra_env=extra_env,
        detach=args.detach,
    )
    try:
        result = run_job(item.job, options)  # checks first what stops the job running here
    except SpecError as err:  # with the file's line numbers for the fields it names
        raise SpecError([item.document.problem(p.path, p.message) for p in err.problems]) from None
    if args.detach:
        if not result.started:  # no job id to print: there is no job to follow
            print(f"torchjob: job {result.job_id} did not start: {result.reason}", file=sys.stderr)
            return EXIT_FAILED
        print(result.job_id)
        return EXIT_OK
    if args.quiet:
        print(f"{result.job_id} {result.phase}: {result.reason}")
    return EXIT_OK if result.ok else EXIT_FAILED


# --------------------------------------------------------------------- status


def _live_status(job_dir: Any) -> dict[str, Any]:
    """The stored status, with phase Unknown when its supervisor died before the job ended."""
    status: dict[str, Any] = job_dir.read_status()
    final = status.get("phase") in ("Completed", "Failed", "Aborted", "Terminated")
    if not final and not job_dir.supervisor_alive():
        status["reason"] = (
            f"the supervisor of this job is gone; last known phase {status.get('phase')}: "
            f"{status.get('reason', '')}"
        )
        status["phase"] = "Unknown"
    return status


def run_status(args: argparse.Namespace) -> int:
    from torchjob.engines.local.output import headline, pod_rows, ports_text, use_color
    from torchjob.engines.local.state import find_job, list_jobs

    root = _root(args)
    if args.job is None:
        statuses = [_live_status(j) for j in list_jobs(root)]
        if args.output:
            _dump({"items": statuses}, args.output)
            return EXIT_OK
        if not statuses:
            print(f"no local jobs in {root}")
            return EXIT_OK
        rows: list[tuple[str, ...]] = [("JOB", "PHASE", "SUCCEEDED", "RETRIES", "PORTS", "STARTED")]
        for s in statuses:
            pods = s.get("pods") or []
            done = sum(1 for p in pods if p.get("phase") == "Succeeded")
            started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(s.get("startedAt") or 0)))
            rows.append(
                (
                    str(s.get("id")),
                    str(s.get("phase")),
                    f"{done}/{len(pods)}",
                    str(s.get("retryCount", 0)),
                    ports_text(s),
                    started,
                )
            )
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        for row in rows:
            print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
        return EXIT_OK
    try:
        job_dir = find_job(root, args.job)
    except LookupError as err:
        return _fail(str(err))
    status = _live_status(job_dir)
    if args.output:
        _dump(status, args.output)
        return EXIT_OK
    color = use_color(sys.stdout)
    print(headline(status, color))
    for line in pod_rows(status, color):
        print("  " + line)
    print(f"reason: {status.get('reason', '')}")
    if status.get("names"):  # whether pod names resolve for the job's processes
        print(f"names: {status['names']}")
    for event in (status.get("events") or [])[-5:]:
        when = time.strftime("%H:%M:%S", time.localtime(float(event.get("time", 0))))
        print(f"  {when} {event.get('message', '')}")
    print(f"job directory: {job_dir.path}")
    return EXIT_OK


def _dump(data: Any, fmt: str) -> None:
    if fmt == "json":
        print(json.dumps(data, indent=2))
        return
    from torchjob.render import dump

    sys.stdout.write(dump(data, "yaml"))


# ----------------------------------------------------------------------- logs


def _select_pods(status: dict[str, Any], wanted: str | None) -> list[dict[str, Any]]:
    pods: list[dict[str, Any]] = list(status.get("pods") or [])
    if wanted is None:
        return pods
    for key in ("name", "short"):
        hit = [p for p in pods if p.get(key) == wanted]
        if hit:
            return hit
    return [p for p in pods if p.get("task") == wanted]


def _log_files(job_dir: Any, status: dict[str, Any], args: argparse.Namespace) -> list[tuple[Path, str, str]]:
    """(file, prefix, color) for every log file the arguments ask for, oldest attempt first."""
    from torchjob.engines.local.output import pod_color, prefix_for

    files: list[tuple[Path, str, str]] = []
    for ordinal, pod in enumerate(_select_pods(status, args.pod)):
        pod_logs = job_dir.logs / str(pod["name"])
        if args.all_attempts:
            attempts = sorted(
                int(p.name.split("-", 1)[1])
                for p in pod_logs.glob("attempt-*")
                if p.name.split("-", 1)[1].isdigit()
            )
        else:
            attempts = [args.attempt if args.attempt is not None else int(pod.get("attempt", 0))]
        mains = [c["name"] for c in pod.get("containers") or [] if not c.get("init")]
        inits = [c["name"] for c in pod.get("containers") or [] if c.get("init")]
        for attempt in attempts:
            for name in [*inits, *mains]:
                if args.container and name != args.container:
                    continue
                label = None if (name in mains and len(mains) == 1) else name
                prefix = prefix_for(str(pod.get("short", pod["name"])), pod.get("rank"), label)
                if args.all_attempts:
                    prefix += f" #{attempt}"
                files.append((pod_logs / f"attempt-{attempt}" / f"{name}.log", prefix, pod_color(ordinal)))
    return files


def run_logs(args: argparse.Namespace) -> int:
    from torchjob.engines.local.output import Console, LogFollower
    from torchjob.engines.local.state import find_job

    try:
        job_dir = find_job(_root(args), args.job)
    except LookupError as err:
        return _fail(str(err))
    status = job_dir.read_status()
    if args.pod is not None and not _select_pods(status, args.pod):
        names = ", ".join(str(p.get("short")) for p in status.get("pods") or [])
        return _fail(f"job {job_dir.id} has no pod {args.pod!r} (pods: {names})")
    console = Console(sys.stdout, live=False)
    follower = LogFollower()
    while True:
        for path, prefix, color in _log_files(job_dir, status, args):
            follower.follow(path, prefix, color)
        finished = not args.follow or (
            status.get("phase") in ("Completed", "Failed", "Aborted", "Terminated")
            or not job_dir.supervisor_alive()
        )
        if finished:
            for path in list(follower.files):
                follower.close(path)
        lines = follower.read()
        console.lines((item.prefix, item.color, text) for item, text in lines)
        if finished and not follower.files:
            return EXIT_OK
        if finished:
            continue
        time.sleep(0.1)
        status = job_dir.read_status()


# --------------------------------------------------------------------- delete


def _stop_supervisor(job_dir: Any) -> None:
    """SIGTERM the supervisor (it stops the job's pods), then SIGKILL (its watchdog cleans up)."""
    found = job_dir.supervisor()
    if found is None or not job_dir.supervisor_alive():
        return
    pid = found[0]
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 15
    while job_dir.supervisor_alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    if job_dir.supervisor_alive():
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
        time.sleep(1.5)  # the watchdog needs up to about a second to stop the pods


def run_delete(args: argparse.Namespace) -> int:
    from torchjob.engines.local.process import kill_now
    from torchjob.engines.local.state import find_job

    code = EXIT_OK
    for ref in args.jobs:
        try:
            job_dir = find_job(_root(args), ref)
        except LookupError as err:
            code = _fail(str(err))
            continue
        _stop_supervisor(job_dir)
        kill_now(job_dir.id, [], [], 1.0)  # anything of the job that is left (a killed supervisor)
        import shutil

        shutil.rmtree(job_dir.path, ignore_errors=True)
        print(f"deleted {job_dir.id}")
    return code
