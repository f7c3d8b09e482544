"""``torchjob submit``: send a job to a Kubernetes cluster (the ``kubernetes`` engine).

Talks to the engine only through :mod:`torchjob.engine_api.registry` and :mod:`torchjob.engine_api.base`.
"""

from __future__ import annotations

import argparse
import sys

from torchjob.errors import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, Problem, SpecError
from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any

    from torchjob.engine_api.base import JobReport


def _submitting() -> list[str]:
    """The engines that take `submit` (one that cannot be loaded says why when it is used)."""
    from torchjob.engine_api.base import EngineError
    from torchjob.engine_api.registry import engine_info, engine_names

    names = []
    for name in engine_names():
        try:
            if engine_info(name).submits:
                names.append(name)
        except EngineError:
            continue
    return names


def register(commands: Any) -> None:
    submit = commands.add_parser(
        "submit", help="create a job on a Kubernetes cluster, print its name and return"
    )
    submit.add_argument(
        "file",
        metavar="FILE",
        help="job YAML/JSON, '-' for stdin, FILE.py:TASK, or a script (SCRIPT.py ARGS...)",
    )
    submit.add_argument("--wait", action="store_true", help="wait for the job to end; exit 1 if it failed")
    submit.add_argument("--follow", action="store_true", help="stream every pod's logs until the job ends")
    submit.add_argument("--timeout", metavar="SECONDS", help="with --wait/--follow: stop waiting")
    submit.add_argument("--job", metavar="NAME", help="which job to submit when FILE holds several")
    submit.add_argument(
        "--engine",
        choices=_submitting(),
        help="the engine that takes the job (default: the first that submits, kubernetes; slurm: one "
        "allocation, its Slurm job id told on stderr)",
    )
    submit.add_argument(
        "-j", dest="quick", metavar="NODESxPROCS", help="FILE is a Python script run by torchrun (as run -j)"
    )
    submit.add_argument(
        "--image", metavar="IMAGE", help="quick mode: the image that holds the script and torch"
    )
    from torchjob.cli.settings import add_setting_options

    add_setting_options(submit, "submit")  # the submitting engine's (engines/*/settings.py)
    submit.set_defaults(func=run_submit)


def run_submit(args: argparse.Namespace) -> int:
    from torchjob.cli.settings import given_settings, number_option
    from torchjob.cli.sources import choose_job, load_ref, load_script, runtimes_of, told_at
    from torchjob.engine_api.base import StartOptions
    from torchjob.engine_api.registry import engine_for

    runtimes = runtimes_of(args)  # --runtime FILE is the file's TrainJobs', not the target's NAME
    name = args.engine or engine_for("submits")
    settings = given_settings(args, "submit", name)
    if args.timeout is not None:  # read before the job is created: a bad one must create nothing
        message = "expected a non-negative, finite number of seconds, got {value}"
        args.timeout = number_option("--timeout", args.timeout, message, minimum=0)

    program_args = list(getattr(args, "program_args", []))
    script, _ = load_script(args.file, args.quick, program_args, local=False, image=args.image)
    if script is None and program_args:
        raise SpecError([Problem("", "arguments after FILE are a script's (quick mode)", args.file)])
    if script is not None:
        from torchjob.quick import require_image

        require_image(args.image)
    item = script or choose_job(load_ref(args.file, runtimes=runtimes), args.job, args.file)
    options = StartOptions(detach=True, settings=settings, source=told_at(item.document))
    if not (args.wait or args.follow):
        return _submit(args, name, settings, item, options)
    from torchjob.engine_api.interrupts import sigterm_interrupts

    with sigterm_interrupts():  # one scope from the submit to the wait's end: no gap with the default
        return _submit(args, name, settings, item, options)


def _submit(args: argparse.Namespace, name: str, settings: dict[str, Any], item: Any, options: Any) -> int:
    """Start the job; with --wait/--follow, follow it to its end (Ctrl-C stops the following)."""
    from torchjob.cli.settings import remember_start
    from torchjob.engine_api.base import EngineError, LogQuery
    from torchjob.engine_api.registry import engine_info, get_engine

    report: JobReport | None = None
    try:
        engine = get_engine(name, **settings)
        try:
            report = engine.start(engine.plan(item.job, options))
        except SpecError as err:  # what the target cannot express, at the file's lines
            # Problems that already name their file (a flag's: <command line>) keep it.
            raise SpecError(
                [p if p.file else item.document.problem(p.path, p.message) for p in err.problems]
            ) from None
        # What status/logs/delete take: a job's id where several jobs may have its name (Slurm).
        print(report.id if engine_info(name).handle == "id" else report.name, flush=True)
        remember_start("submit", name, settings, item.job.name, report.name, report.id)
        if not (args.wait or args.follow):
            return EXIT_OK
        if args.follow:
            for line in engine.logs(report.id, LogQuery(follow=True)):
                sys.stdout.write(f"{line.prefix} | {line.text}\n")
                sys.stdout.flush()
        final = engine.wait(report.id, timeout=args.timeout)
    except KeyboardInterrupt:
        if report is None:  # stopped while submitting: the engine has said what it left
            raise
        # Ctrl-C stops the watching, not the job (docs/kubernetes.md)
        print(
            f"torchjob: stopped following; job {report.id} keeps running on the cluster "
            f"(delete it with: torchjob delete {report.id} --engine {name})",
            file=sys.stderr,
        )
        return EXIT_INTERRUPTED
    except EngineError as err:
        print(f"torchjob: {err}", file=sys.stderr)
        return err.exit_code
    return finish(final)


def finish(report: JobReport) -> int:
    """One line for how the job ended; a failed pod's last log lines under it."""
    if not report.terminal:
        print(f"torchjob: job {report.name} is still {report.phase} (timed out waiting)", file=sys.stderr)
        return EXIT_FAILED
    reason = f": {report.reason}" if report.reason else ""
    if report.ok:
        print(f"torchjob: job {report.name} {report.phase}{reason}", file=sys.stderr)
        return EXIT_OK
    failure = report.first_failure
    if failure is None:
        print(f"torchjob: job {report.name} {report.phase}{reason}", file=sys.stderr)
        return EXIT_FAILED
    rank = f" (rank {failure.rank})" if failure.rank is not None else ""
    code = f" exited with code {failure.exit_code}" if failure.exit_code is not None else " failed"
    why = f" ({failure.reason})" if failure.reason else ""
    print(
        f"torchjob: job {report.name} {report.phase}: first failure: {failure.short}{rank}{code}{why}",
        file=sys.stderr,
    )
    for text in failure.log_tail:
        print(f"  {failure.short} | {text}", file=sys.stderr)
    return EXIT_FAILED
