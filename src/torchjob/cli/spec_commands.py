"""``torchjob validate`` and ``torchjob render``: no engine, no side effects."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator, Sequence

from torchjob.errors import Issue, Problem, SpecError
from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:  # the real imports are lazy, inside the commands
    from typing import Any

    from torchjob.spec.source import Document


def register(commands: Any) -> None:
    from torchjob.targets import target_names  # the names only: no target module is imported

    targets = target_names()
    validate = commands.add_parser("validate", help="check job files and print a summary of each job")
    validate.add_argument(
        "files", nargs="+", metavar="FILE", help="job YAML/JSON, '-' for stdin, FILE.py:TASK, or SCRIPT.py"
    )
    validate.add_argument(
        "--local",
        action="store_true",
        help="also check what `torchjob run` needs on this machine (commands, Secrets, "
        "working directories, script files), all at once",
    )
    validate.add_argument(
        "--target",
        choices=targets,
        help="also check what that target needs (names its controller makes, features it cannot express)",
    )
    validate.add_argument(
        "--runtime",
        metavar="NAME|FILE",
        help="the ClusterTrainingRuntime of --target trainjob; or a FILE of the runtimes the file's "
        "TrainJobs name",
    )
    validate.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="TASK.FIELD=VALUE",
        help="check each job as `run --set` would change it; repeatable",
    )
    validate.add_argument(
        "--workdir",
        metavar="DIR",
        help="check each job as `run --workdir` would run it (DIR, or /workspace=DIR)",
    )
    validate.set_defaults(func=run_validate)

    render = commands.add_parser("render", help="print the Kubernetes objects a cluster would create")
    render.add_argument(
        "file",
        metavar="FILE",
        help="job YAML/JSON, '-' for stdin, FILE.py:TASK, FILE.py:WORKFLOW [-- --ARG VALUE ...], "
        "or a script run as torchrun would (SCRIPT.py ARGS...: what follows the script is its own)",
    )
    render.add_argument("-o", "--output", choices=("yaml", "json"), default="yaml", help="output format")
    render.add_argument(
        "--target",
        choices=targets,
        default=None,
        help="what to render: the pods Volcano would create (the default for a Volcano Job; a PyTorchJob, "
        "TrainJob or JobSet is its own kind by default), or the job for a training stack: volcano "
        "(Volcano Job), kubeflow (PyTorchJob), trainjob (Kubeflow Trainer v2), jobset (JobSet)",
    )
    render.add_argument(
        "--runtime",
        metavar="NAME|FILE",
        help="the ClusterTrainingRuntime of --target trainjob (torch-distributed); or a FILE of the "
        "TrainingRuntimes the file's TrainJobs name",
    )
    render.add_argument(
        "--as-sent",
        action="store_true",
        help="with --target pods (the default) and neither -n nor -e: print exactly what `submit --target "
        "pods` sends (pods labelled for torchjob, without Volcano's scheduler defaults); every other "
        "target always is",
    )
    render.add_argument(
        "-n",
        "--namespace",
        metavar="NS",
        help="render for this namespace, as `submit -n NS` sends it (default: the job's own); with -n or -e "
        "every target, pods included, is printed as sent",
    )
    render.add_argument(
        "-e",
        "--env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="add an environment variable to every container, as `run -e` on a cluster does (repeatable)",
    )
    render.add_argument(
        "-j",
        dest="quick",
        metavar="NODESxPROCS",
        help="no job file: FILE is a Python script; print the job `torchjob run -j` would run "
        "(a FILE.py without -j is 1x1)",
    )
    render.add_argument(
        "--image",
        metavar="IMAGE",
        help="quick mode: the image a cluster runs the script in (it must hold the script and torch)",
    )
    render.set_defaults(func=run_render)


def _print_warnings(document: Document, warnings: Sequence[Issue | tuple[str, str]]) -> None:
    """Allowed but worth knowing, as ``FILE:LINE: field.path: warning: ...`` on stderr."""
    for note in warnings:  # an Issue, or a target's (path, message)
        path, message = (note.path, note.message) if isinstance(note, Issue) else note
        print(document.problem(path, f"warning: {message}").format(), file=sys.stderr)


def run_validate(args: argparse.Namespace) -> int:
    from torchjob.cli.sources import runtimes_of
    from torchjob.display import plural
    from torchjob.expand import Expansion

    problems: list[Problem] = []
    runtimes = runtimes_of(args)
    for file in args.files:
        try:
            workflow = _describe_workflow(file)
            if workflow is not None:
                print(f"{file}: {workflow}")
                continue
            loaded = _load_validated(file, runtimes, _overrides(args))
        except SpecError as err:
            problems += err.problems
            continue
        for item in loaded:
            job = item.job
            # Warnings need the plugins, not the pods: validating a huge job stays cheap.
            expansion = Expansion(job)
            _print_warnings(item.document, expansion.warnings())
            if getattr(args, "local", False):
                from torchjob.engine_api.registry import engine_for, get_engine

                engine = get_engine(engine_for("runs_here"))  # one engine: the job is planned once
                _print_warnings(item.document, engine.warnings(item.job))  # those `run` prints
                local = _local_problems(item, engine)
                if local:
                    problems += local
                    continue
            if getattr(args, "target", None):
                target = _target_problems(item, args.target, getattr(args, "runtime", None))
                if target:
                    problems += target
                    continue
            tasks = task_summary([(t.name, t.replicas) for t in job.spec.tasks])
            plugins = ", ".join(p.name for p in expansion.plugins) or "none"
            pods = plural(job.total_replicas, "pod")
            what = f"{job.kind.kind} {job.name}" if job.kind is not None else f"job {job.name}"
            print(f"{file}: {what}: valid; {pods} ({tasks}); plugins: {plugins}")
    if problems:
        raise SpecError(problems)
    return 0


def task_summary(tasks: list[tuple[str, int]]) -> str:
    """``NAMExREPLICAS`` per task; a run of tasks ``P-i``, ``P-i+1``, ... of the same size (a
    JobSet's Jobs, a task each) as one ``P-i..jxREPLICAS``: 20,000 Jobs are one entry, not 300 KB."""
    runs: list[tuple[str, int, int, int]] = []  # (prefix or name, first, last, replicas); -1: no index
    for name, replicas in tasks:
        prefix, _, index = name.rpartition("-")
        if not (prefix and index.isascii() and index.isdigit() and str(int(index)) == index):
            runs.append((name, -1, -1, replicas))
            continue
        i = int(index)
        if runs and runs[-1] == (prefix, runs[-1][1], i - 1, replicas) and runs[-1][1] >= 0:
            runs[-1] = (prefix, runs[-1][1], i, replicas)  # the run goes on
        else:
            runs.append((prefix, i, i, replicas))
    return ", ".join(
        f"{name}x{n}" if first < 0 else f"{name}-{first}" + (f"..{last}" if last > first else "") + f"x{n}"
        for name, first, last, n in runs
    )


def _target_problems(item: Any, target: str, runtime: str | None) -> list[Problem]:
    """What ``render --target`` would refuse, with the file's lines; its warnings are printed."""
    from torchjob.targets import render_target

    try:
        rendered = render_target(item.job, target, runtime=runtime)
    except SpecError as err:  # the Jobs of one replicated job are told once, at its field
        return list(dict.fromkeys(item.document.problem(p.path, p.message) for p in err.problems))
    _print_warnings(item.document, rendered.warnings)
    return []


def _overrides(args: argparse.Namespace) -> Any:
    """``--set`` and ``--workdir`` as `run` takes them (None when neither was given)."""
    sets, workdir = list(getattr(args, "set", None) or []), getattr(args, "workdir", None)
    if not sets and workdir is None:
        return None
    from torchjob.overrides import Overrides

    return Overrides(sets=sets, workdir=workdir)


def _load_validated(file: str, runtimes: Any = None, overrides: Any = None) -> list[Any]:
    """FILE's jobs, or a script's job (quick mode, 1x1, as `torchjob run FILE` runs it), with the
    overrides `run` would make: a script's job takes --workdir and the node count as it is made."""
    from torchjob.cli.sources import load_ref, load_script

    workdir = overrides.workdir if overrides is not None else None
    sets = overrides.sets if overrides is not None else []
    script, rest = load_script(file, None, [], local=True, workdir=workdir, sets=sets)
    if script is not None:
        loaded, workdir = [script], None
    else:
        loaded = load_ref(file, runtimes=runtimes)
    if not rest and workdir is None:
        return loaded
    from torchjob.overrides import Overrides, apply

    return [apply(item, Overrides(sets=rest, workdir=workdir)) for item in loaded]


def _describe_workflow(file: str) -> str | None:
    """``FILE.py:WORKFLOW``'s summary; None for anything else."""
    from torchjob.cli.sources import is_task_ref

    if not is_task_ref(file):
        return None
    from torchjob.sdk.workflow_cli import describe_workflow

    path, _, name = file.rpartition(":")
    return describe_workflow(path, name)


def _local_problems(item: Any, engine: Any) -> list[Problem]:
    """What the local engine's check finds (through the engine interface), with the file's lines."""
    return [item.document.problem(issue.path, issue.message) for issue in engine.check(item.job)]


def _render_workflow(args: argparse.Namespace) -> int | None:
    """``FILE.py:WORKFLOW [-- ARGS]``: one List per task call; None for anything else."""
    from torchjob.cli.sources import is_task_ref

    path, _, name = args.file.rpartition(":")
    quick = getattr(args, "quick", None) is not None or getattr(args, "image", None) is not None
    if is_task_ref(args.file) and not quick:  # not before: finding it imports the file
        from torchjob.sdk.workflow_cli import render_workflow

        code = render_workflow(
            path,
            name,
            getattr(args, "program_args", []),
            args.output,
            sys.stdout.write,
            args.target or "pods",
        )
        if code is not None:
            sys.stdout.flush()
            return code
    return None


def _load_for_render(args: argparse.Namespace) -> list[Any]:
    """FILE's jobs with the program arguments after ``--``, or with ``-j`` the job of a script."""
    program_args = list(getattr(args, "program_args", []))
    from torchjob.cli.sources import is_task_ref, load_ref, load_script

    # What a cluster would run: no working directory of this machine, the --image given.
    script, _ = load_script(args.file, args.quick, program_args, local=False, image=args.image)
    if script is not None:
        from torchjob.quick import default_image_warning

        note = default_image_warning(args.file, args.image)
        if note:
            print(note, file=sys.stderr)
        return [script]

    if is_task_ref(args.file):  # the arguments after -- are the task's
        return load_ref(args.file, program_args)
    loaded = load_ref(args.file, runtimes=getattr(args, "runtimes", None))
    if not program_args:
        return loaded
    from torchjob.overrides import Overrides, apply

    return [apply(item, Overrides(program_args=program_args)) for item in loaded]


def run_render(args: argparse.Namespace) -> int:
    workflow_code = _render_workflow(args)
    if workflow_code is not None:
        return workflow_code
    from torchjob.cli.sources import default_image_warning, runtimes_of

    runtimes_of(args)  # --runtime FILE: the runtimes of the file's TrainJobs
    from torchjob.expand import Expansion
    from torchjob.render import write_list

    if args.runtime is not None:
        from torchjob.targets import all_targets

        takes = [t.name for t in all_targets() if t.runtime]
        if (args.target or "pods") not in takes:
            message = f"--runtime applies to --target {' or '.join(takes)} only, not --target {args.target}"
            raise SpecError([Problem("", message, args.file)])
    env = _render_env(args)
    loaded = _load_for_render(args)
    if env:  # as `run -e` changes the job before its engine adds the variables to what it sends
        from torchjob.overrides import Overrides, apply

        loaded = [apply(item, Overrides(env=env)) for item in loaded]
    note = default_image_warning(args.file, loaded)
    if note:
        print(note, file=sys.stderr)
    # -n and -e describe a submission: with either (or --as-sent) every target, pods included, is
    # printed as it is sent. Plain `render` (--target pods or none) keeps Volcano's view of the pods;
    # a job read from a PyTorchJob, TrainJob or JobSet is its own kind without --target.
    sent = getattr(args, "as_sent", False) or getattr(args, "namespace", None) or env
    if args.target not in (None, "pods") or sent or any(item.job.kind is not None for item in loaded):
        return _render_target(loaded, args, env)
    # The pods Volcano's controller would create from the Job (no cluster's changes: see --as-sent).
    expansions = [Expansion(item.job) for item in loaded]
    for item, expansion in zip(loaded, expansions, strict=True):
        _print_warnings(item.document, expansion.warnings())

    def items() -> Iterator[dict[str, Any]]:
        # Pods are built as they are written, so memory stays flat however large the job.
        for expansion in expansions:
            yield from expansion.objects()
            for pod in expansion.pods():
                yield pod.manifest

    # Every input problem is found above, before the first byte goes out.
    write_list(items(), args.output, sys.stdout.write)
    sys.stdout.flush()
    return 0


def _render_env(args: argparse.Namespace) -> dict[str, str]:
    from torchjob.cli.run_command import parse_env

    return parse_env(list(getattr(args, "env", None) or []))


def _render_target(loaded: list[Any], args: argparse.Namespace, env: dict[str, str]) -> int:
    """Every job as ``--target``'s objects, byte for byte what the kubernetes engine sends for it
    (the same function makes them); all problems of all jobs before any output."""
    from torchjob.render import write_list
    from torchjob.targets import for_cluster

    items: list[dict[str, Any]] = []
    problems: list[Problem] = []
    for item in loaded:
        kind = item.job.kind
        target = args.target or (kind.target if kind is not None else "pods")
        if (
            target == "pods"
            and kind is None
            and not (getattr(args, "as_sent", False) or args.namespace or env)
        ):
            from torchjob.expand import Expansion  # Volcano's view, as plain `render` prints it

            expansion = Expansion(item.job)
            _print_warnings(item.document, expansion.warnings())
            items += [*expansion.objects(), *(pod.manifest for pod in expansion.pods())]
            continue
        try:
            namespace = getattr(args, "namespace", None) or item.job.metadata.namespace
            rendered = for_cluster(item.job, target, namespace, env, runtime=args.runtime)
        except SpecError as err:  # the target's paths become FILE:LINE like any input problem
            problems += dict.fromkeys(item.document.problem(p.path, p.message) for p in err.problems)
            continue
        _print_warnings(item.document, rendered.warnings)
        items += rendered.objects
    if problems:
        raise SpecError(problems)
    write_list(items, args.output, sys.stdout.write)
    sys.stdout.flush()
    return 0
