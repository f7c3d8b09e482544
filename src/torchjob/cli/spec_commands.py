"""``torchjob validate`` and ``torchjob render``: no engine, no side effects."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from torchjob.errors import Problem, SpecError

if TYPE_CHECKING:  # the real imports are lazy, inside the commands
    from torchjob.jobs import LoadedJob
    from torchjob.spec.source import Document


def register(commands: Any) -> None:
    validate = commands.add_parser("validate", help="check job files and print a summary of each job")
    validate.add_argument(
        "files", nargs="+", metavar="FILE", help="job YAML/JSON, '-' for stdin, or FILE.py:TASK"
    )
    validate.set_defaults(func=run_validate)

    render = commands.add_parser("render", help="print the Kubernetes objects a cluster would create")
    render.add_argument("file", metavar="FILE", help="job YAML/JSON, '-' for stdin, or FILE.py:TASK")
    render.add_argument("-o", "--output", choices=("yaml", "json"), default="yaml", help="output format")
    render.set_defaults(func=run_render)


def _print_warnings(document: Document, warnings: list[tuple[str, str]]) -> None:
    """Allowed but worth knowing, as ``FILE:LINE: field.path: warning: ...`` on stderr."""
    for path, message in warnings:
        print(document.problem(path, f"warning: {message}").format(), file=sys.stderr)


def _duplicate_jobs(loaded: list[LoadedJob]) -> list[Problem]:
    """Two jobs of one file with the same namespace and name would overwrite each other's objects."""
    first: dict[tuple[str, str], int] = {}
    problems: list[Problem] = []
    for item in loaded:
        key = (item.job.metadata.namespace, item.job.name)
        if key in first:
            message = (
                f"job {key[1]!r} in namespace {key[0]!r} is already defined by document {first[key] + 1} "
                "of this file; give each job its own name"
            )
            problems.append(item.document.problem("metadata.name", message))
        else:
            first[key] = item.document.index
    return problems


def run_validate(args: argparse.Namespace) -> int:
    from torchjob.expand import expand
    from torchjob.jobs import load_jobs
    from torchjob.plugins import build_plugins

    problems: list[Problem] = []
    for file in args.files:
        try:
            loaded = load_jobs(file)
        except SpecError as err:
            problems += err.problems
            continue
        duplicates = _duplicate_jobs(loaded)
        if duplicates:
            problems += duplicates
            continue
        for item in loaded:
            job = item.job
            state = expand(job)
            _print_warnings(item.document, state.warnings)
            tasks = ", ".join(f"{t.name}x{t.replicas}" for t in job.spec.tasks)
            plugins = ", ".join(p.name for p in build_plugins(job)) or "none"
            print(f"{file}: job {job.name}: valid; {len(state.pods)} pods ({tasks}); plugins: {plugins}")
    if problems:
        raise SpecError(problems)
    return 0


def run_render(args: argparse.Namespace) -> int:
    from torchjob.expand import expand
    from torchjob.jobs import load_jobs
    from torchjob.render import as_list, dump

    loaded = load_jobs(args.file)
    duplicates = _duplicate_jobs(loaded)
    if duplicates:
        raise SpecError(duplicates)
    states = []
    for item in loaded:
        state = expand(item.job)
        _print_warnings(item.document, state.warnings)
        states.append(state)
    # Build the whole text before writing, so bad input never leaves half an output.
    text = dump(as_list(states), args.output)
    sys.stdout.write(text)
    sys.stdout.flush()
    return 0
