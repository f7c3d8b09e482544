"""``torchjob submit``: send a job to a Kubernetes cluster (the ``kubernetes`` engine).

Talks to the engine only through :mod:`torchjob.engines.registry` and :mod:`torchjob.engines.base`.
"""

from __future__ import annotations

import argparse
import sys

from torchjob.errors import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, Problem, SpecError
from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any

    from torchjob.engines.base import JobReport

TARGETS = ("volcano", "kubeflow", "jobset", "trainjob", "pods")


def add_cluster_options(parser: argparse.ArgumentParser) -> None:
    """--kubeconfig, --context and -n/--namespace: which cluster, as kubectl spells them."""
    parser.add_argument(
        "--kubeconfig", metavar="FILE", help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config)"
    )
    parser.add_argument("--context", metavar="NAME", help="kubeconfig context (default: the current one)")
    parser.add_argument(
        "-n",
        "--namespace",
        metavar="NS",
        help="namespace (default: the job's, else the context's, else default)",
    )


def cluster_settings(args: argparse.Namespace) -> dict[str, Any]:
    return {"kubeconfig": args.kubeconfig, "context": args.context, "namespace": args.namespace}


def register(commands: Any) -> None:
    submit = commands.add_parser(
        "submit", help="create a job on a Kubernetes cluster, print its name and return"
    )
    submit.add_argument(
        "file",
        metavar="FILE",
        help="job YAML/JSON, '-' for stdin, FILE.py:TASK, or a script (SCRIPT.py ARGS...)",
    )
    submit.add_argument(
        "--target",
        choices=TARGETS,
        help="how the cluster runs it (default: the first of volcano, kubeflow, jobset, trainjob it has)",
    )
    submit.add_argument("--runtime", metavar="NAME", help="the Trainer runtime for --target trainjob")
    submit.add_argument("--replace", action="store_true", help="delete a job of the same name first")
    submit.add_argument("--wait", action="store_true", help="wait for the job to end; exit 1 if it failed")
    submit.add_argument("--follow", action="store_true", help="stream every pod's logs until the job ends")
    submit.add_argument("--timeout", type=float, metavar="SECONDS", help="with --wait/--follow: stop waiting")
    submit.add_argument(
        "--pending-timeout",
        type=float,
        default=300.0,
        metavar="SECONDS",
        help="with --wait/--follow: fail when the job stays unscheduled this long (default 300)",
    )
    submit.add_argument("--job", metavar="NAME", help="which job to submit when FILE holds several")
    submit.add_argument(
        "--engine",
        choices=("kubernetes", "slurm"),
        default="kubernetes",
        help="kubernetes (default) or slurm: one allocation, printed as its Slurm job id and torchjob's id",
    )
    submit.add_argument(
        "-j", dest="quick", metavar="NODESxPROCS", help="FILE is a Python script run by torchrun (as run -j)"
    )
    submit.add_argument(
        "--image", metavar="IMAGE", help="quick mode: the image that holds the script and torch"
    )
    add_cluster_options(submit)
    submit.set_defaults(func=run_submit)


def run_submit(args: argparse.Namespace) -> int:
    from torchjob.cli.sources import choose_job, load_ref, load_script
    from torchjob.engines.base import EngineError, LogQuery, StartOptions
    from torchjob.engines.registry import get_engine

    program_args = list(getattr(args, "program_args", []))
    script, _ = load_script(args.file, args.quick, program_args, local=False, image=args.image)
    if script is None and program_args:
        raise SpecError([Problem("", "arguments after FILE are a script's (quick mode)", args.file)])
    if script is not None:
        from torchjob.quick import default_image_warning

        note = default_image_warning(args.file, args.image)
        if note:
            print(note, file=sys.stderr)
    item = script or choose_job(load_ref(args.file), args.job, args.file)
    options = StartOptions(detach=True, replace=args.replace, target=args.target, runtime=args.runtime)
    try:
        if args.engine == "kubernetes":
            engine = get_engine("kubernetes", pending_timeout=args.pending_timeout, **cluster_settings(args))
        else:  # its settings are its own (TORCHJOB_SLURM_*); the cluster flags mean nothing to it
            engine = get_engine(args.engine)
        try:
            report = engine.start(item.job, options)
        except SpecError as err:  # what the target cannot express, at the file's lines
            raise SpecError([item.document.problem(p.path, p.message) for p in err.problems]) from None
        print(report.name if args.engine == "kubernetes" else report.id, flush=True)
        if not (args.wait or args.follow):
            return EXIT_OK
        try:
            if args.follow:
                for line in engine.logs(report.id, LogQuery(follow=True)):
                    sys.stdout.write(f"{line.prefix} | {line.text}\n")
                    sys.stdout.flush()
            final = engine.wait(report.id, timeout=args.timeout)
        except KeyboardInterrupt:  # Ctrl-C stops the watching, not the job (docs/kubernetes.md)
            print(
                f"torchjob: stopped following; job {report.id} keeps running on the cluster "
                f"(delete it with: torchjob delete {report.id} --engine {args.engine})",
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
