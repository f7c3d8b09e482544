"""``torchjob run``: a job file, an SDK task or workflow, or a script, run on an engine.

Only parses and prints: the job is loaded and checked (:mod:`torchjob.cli.sources`), changed by
the command line (``--set``, ``--workdir``, ``-e``, program arguments: :mod:`torchjob.overrides`),
planned and started by the engine through :class:`torchjob.engine_api.base.Engine`.
"""

from __future__ import annotations

import argparse
import sys

from torchjob.cli.cluster_commands import finish
from torchjob.cli.settings import (
    chosen_engine,
    chosen_settings,
    engine_options,
    given_flags,
    number_option,
    remember_start,
)
from torchjob.engine_api.registry import DEFAULT_ENGINE, engine_info, import_for_start
from torchjob.errors import EXIT_FAILED, EXIT_OK, Problem, SpecError
from torchjob.spec import prefetch
from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any


def register(commands: Any) -> None:
    run = commands.add_parser(
        "run", help="run a job on this machine, every pod as local processes (or --engine kubernetes)"
    )
    run.add_argument(
        "file",
        metavar="FILE",
        help="job YAML/JSON, '-' for stdin, FILE.py:TASK, FILE.py:WORKFLOW [-- --ARG VALUE ...], "
        "or a script run as torchrun would (SCRIPT.py ARGS...: what follows the script is its own)",
    )
    run.add_argument("-d", "--detach", action="store_true", help="run in the background and print the job id")
    run.add_argument("--timeout", metavar="SECONDS", help="terminate the job after this long")
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
    run.add_argument(
        "--dry-run",
        action="store_true",
        help="print what the engine would do with the job (its plan) and start nothing",
    )
    _override_options(run)
    engine_options(run, "run")
    run.add_argument(  # finished jobs do not pile up (and `torchjob prune`)
        "--rm",
        action="store_true",
        help="remove the job and its logs once it has completed; a failed job is kept for its logs "
        "(not with -d)",
    )
    run.set_defaults(func=run_run)


def _override_options(run: argparse.ArgumentParser) -> None:
    """``run``'s changes to the job without editing its file (:mod:`torchjob.overrides`), and
    the quick mode of a script without a file (:mod:`torchjob.quick`)."""
    run.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="TASK.FIELD=VALUE",
        help="set a task's replicas, minAvailable or maxRetry (worker.replicas=4), or the job's "
        "minAvailable, maxRetry or queue (maxRetry=0); in a kind's own names for its files "
        "(Worker.replicas, workers.parallelism, trainer.numNodes: docs/kinds.md); repeatable",
    )
    run.add_argument(
        "--workdir",
        metavar="DIR",
        help="the working directory of every container that has none; /workspace=DIR: a job's own "
        "workingDir /workspace (and paths below it in command and args) read in the local DIR",
    )
    quick_option(run)


def quick_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-j",
        dest="quick",
        metavar="NODESxPROCS",
        help="no job file: FILE is a Python script, run by torchrun on NODES pods of PROCS "
        "processes each (-j 2x4 train.py --lr 0.1); a FILE.py without -j is 1x1",
    )
    parser.add_argument(
        "--image",
        metavar="IMAGE",
        help="quick mode: the image a cluster runs the script in (it must hold the script and torch)",
    )


def parse_env(pairs: list[str]) -> dict[str, str]:
    from torchjob.spec.names import is_env_name

    env: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise SpecError([Problem("--env", f"expected NAME=VALUE, got {pair!r}", "<command line>")])
        if not is_env_name(name):  # as a container's env entries are checked
            message = f"{name!r} is not a valid environment variable name"
            raise SpecError([Problem("--env", message, "<command line>")])
        env[name] = value
    return env


def _run_workflow(args: argparse.Namespace) -> int | None:
    """``FILE.py:WORKFLOW [-- ARGS]``: call the workflow here; None for anything else."""
    from torchjob.cli.sources import is_task_ref

    path, _, name = args.file.rpartition(":")
    if is_task_ref(args.file) and args.quick is None:  # not before: finding it imports the file
        from torchjob.sdk.workflow_cli import run_workflow

        given = {"--detach": args.detach, "--timeout": args.timeout is not None, "--env": args.env}
        given["--job"] = args.job is not None
        given["--dry-run"] = args.dry_run  # a workflow's tasks are decided as it runs: no plan
        given.update(dict.fromkeys(given_flags(args, "run"), True))
        given.update({"--set": args.set, "--workdir": args.workdir is not None})
        given[f"--engine {args.engine}"] = args.engine != DEFAULT_ENGINE
        code = run_workflow(path, name, getattr(args, "program_args", []), [k for k, v in given.items() if v])
        if code is not None:
            return code
    return None


def _load(args: argparse.Namespace, extra_env: dict[str, str]) -> list[Any]:
    """The jobs FILE holds, or the job of a script (quick mode, with ``-j`` or for a FILE.py)."""
    from torchjob.cli.sources import is_task_ref, load_ref, load_script

    local = engine_info(args.engine).runs_here
    program_args = list(args.program_args)
    script, args.set = load_script(
        args.file,
        args.quick,
        program_args,
        local=local,
        workdir=args.workdir,
        image=args.image,
        sets=args.set,
    )
    if script is not None:
        args.quick = args.quick or "1x1"  # the job's arguments and working directory are in it
        if not local:
            from torchjob.quick import require_image

            require_image(args.image)
        return [script]

    if is_task_ref(args.file):  # the arguments after -- are the task's
        return load_ref(args.file, list(args.program_args), every_rank=True)
    return load_ref(args.file, runtimes=getattr(args, "runtimes", None))


def _overridden(item: Any, args: argparse.Namespace, extra_env: dict[str, str]) -> Any:
    """The job with ``--set``, ``--workdir``, ``-e`` and the program arguments applied."""
    from torchjob.cli.sources import is_task_ref

    # -j's arguments and working directory are in its job already; a task's arguments are its own.
    quick = args.quick is not None
    program_args = [] if quick or is_task_ref(args.file) else list(args.program_args)
    workdir = None if quick else args.workdir
    if not (args.set or extra_env or workdir is not None or program_args):
        return item  # nothing to change: the start-up path stays as short as it was
    from torchjob.overrides import Overrides, apply

    overrides = Overrides(sets=list(args.set), workdir=workdir, env=extra_env, program_args=program_args)
    return apply(item, overrides)


def run_run(args: argparse.Namespace) -> int:
    from torchjob.cli.sources import runtimes_of

    runtimes_of(args)  # --runtime FILE is the file's TrainJobs', not an engine's setting
    settings = chosen_settings(args)
    workflow_code = _run_workflow(args)
    if workflow_code is not None:
        return workflow_code
    from torchjob.engine_api.base import StartOptions, StreamSink
    from torchjob.expand import Expansion

    extra_env = parse_env(args.env)
    if args.timeout is not None:
        message = "expected a positive, finite number of seconds, got {value}"
        args.timeout = number_option("--timeout", args.timeout, message, positive=True)
    from torchjob.cli.sources import choose_job, told_at

    info = engine_info(args.engine)
    if prefetch.reading(args.file):  # the engine's imports, while another process reads the file
        import_for_start(args.engine)
    chosen = choose_job(_load(args, extra_env), args.job, args.file)
    item = _overridden(chosen, args, extra_env)
    for note in Expansion(item.job).warnings():  # the plugins' notes: no pod is built
        print(item.document.problem(note.path, f"warning: {note.message}").format(), file=sys.stderr)
    preload = settings.get("preload")
    if isinstance(preload, tuple) and preload and info.runs_here:  # refused here, not ignored later
        from torchjob.cli.preload import check_preload

        check_preload(preload, item.job, extra_env)
    options = StartOptions(
        detach=args.detach,
        quiet=args.quiet,
        timeout=args.timeout,
        extra_env=extra_env,
        on_start=_print_id if args.quiet and not args.detach else None,
        remove=args.rm,
        sink=StreamSink(),  # the engine's output, printed here: log lines, notes, its table
        settings=settings,
        source=told_at(item.document),
    )
    if args.rm and args.detach:
        raise SpecError(
            [Problem("--rm", "a detached job is removed with `torchjob delete`", "<command line>")]
        )
    engine = chosen_engine(args)
    try:
        plan = engine.plan(item.job, options)  # what the engine will do; nothing started yet
        if args.dry_run:  # the plan, then what `run` would refuse it with (exit 2): nothing starts
            print(plan.text, flush=True)
            refused = plan.refused()
            if refused is not None:
                raise refused
            return EXIT_OK
        report = engine.start(plan)  # that plan carried out: checks first what stops the job there
    except SpecError as err:  # with the file's line numbers for the fields it names
        # Problems that already name their file (the port registry) keep it.
        raise SpecError(
            [p if p.file else item.document.problem(p.path, p.message) for p in err.problems]
        ) from None
    except KeyboardInterrupt:  # it was started: `status NAME` elsewhere can still say where
        remember_start("run", args.engine, settings, item.job.name)
        raise
    remember_start("run", args.engine, settings, item.job.name, report.name, report.id)
    if args.detach:
        print(report.id)
        return EXIT_OK
    if args.quiet:
        print(f"{report.id} {report.phase}: {report.reason}".rstrip(": "))
    code = EXIT_OK if report.ok else EXIT_FAILED
    if not info.summarizes and not args.quiet:  # an engine that summarizes has said how it ended
        code = finish(report)  # a cluster job ends in one line
    if args.rm and report.ok:  # its logs and state go with it: what was printed is all that is kept
        engine.delete([report.id])
    elif args.rm and (args.quiet or not info.summarizes):  # the engine's summary says it otherwise
        kept = f"kept {report.id} for its logs: --rm removes only a completed job"
        print(f"{kept} (torchjob delete {report.id})")
    return code


def _print_id(job_id: str) -> None:
    """-q: the job's id as it starts, for a script or a second terminal to follow it."""
    print(job_id, flush=True)
