"""What the commands' FILE argument names: a YAML/JSON file of jobs, or an SDK task (``FILE.py:TASK``).

Here, above both :mod:`torchjob.jobs` and :mod:`torchjob.sdk`, so that neither imports the other.
"""

from __future__ import annotations

import os
import re

from torchjob.jobs import LoadedJob, load_jobs
from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable

    from torchjob.spec.kinds.runtimes import Runtimes
    from torchjob.spec.source import Document

_SDK_REF = r"^(?P<path>.+\.py):(?P<name>[A-Za-z_][A-Za-z0-9_]*)$"


def _sdk_ref(ref: str) -> re.Match[str] | None:
    # A job file's name skips the pattern (compiled, and cached by re, on first use).
    return re.fullmatch(_SDK_REF, ref) if ".py:" in ref else None


def is_task_ref(ref: str) -> bool:
    return _sdk_ref(ref) is not None


def is_script_ref(ref: str, quick: str | None = None) -> bool:
    """FILE runs in quick mode: ``-j`` was given, or FILE is a Python script (``torchjob run
    train.py``, torchrun's habit) and not an SDK task reference."""
    if is_task_ref(ref):
        return False
    if quick is not None:
        return True
    if ref == "-" or ref.lower().endswith((".yaml", ".yml", ".json")):
        return False  # the usual case, without importing quick mode
    from torchjob.quick import is_script

    return is_script(ref)


def load_script(
    ref: str,
    quick: str | None,
    program_args: list[str],
    *,
    local: bool,
    workdir: str | None = None,
    image: str | None = None,
    sets: list[str] | None = None,
) -> tuple[LoadedJob | None, list[str]]:
    """The quick-mode job of a script (None when FILE is not one) and the ``--set`` assignments
    left to apply to it; ``--image`` given for anything else is an error."""
    from torchjob.errors import Problem, SpecError

    if not is_script_ref(ref, quick):
        if image is not None:
            message = "sets the image of a script's job (quick mode); a job file names its own images"
            raise SpecError([Problem("--image", message, "<command line>")])
        return None, list(sets or [])
    from torchjob.quick import nodes_from_sets, quick_job

    nodes, rest = nodes_from_sets(list(sets or []))
    job = quick_job(quick, ref, program_args, workdir, local=local, image=image, nodes=nodes)
    return job, rest


def is_runtime_file(value: str) -> bool:
    """``--runtime`` names a file of runtimes (for a TrainJob to read), not a runtime (a target's)."""
    return value == "-" or value.lower().endswith((".yaml", ".yml", ".json")) or os.path.isfile(value)


def runtimes_of(args: argparse.Namespace) -> Runtimes | None:
    """``--runtime FILE``: the TrainingRuntimes and ClusterTrainingRuntimes a TrainJob may name,
    read once (the flag is then no longer the target's runtime NAME); None without one."""
    if hasattr(args, "runtimes"):
        found: Runtimes | None = args.runtimes
        return found
    value = getattr(args, "runtime", None)
    runtimes = None
    if isinstance(value, str) and is_runtime_file(value):
        from torchjob.spec.kinds.runtimes import load_runtimes

        runtimes = load_runtimes(value)
        args.runtime = None
    args.runtimes = runtimes
    return runtimes


def load_ref(
    ref: str,
    task_args: list[str] | None = None,
    *,
    every_rank: bool = False,
    runtimes: Runtimes | None = None,
) -> list[LoadedJob]:
    """Every job in a YAML/JSON file (``-`` for stdin), or the job of an SDK task reference
    (called with ``task_args``, ``--NAME VALUE`` tokens, when given: see ``load_task_job``).

    ``every_rank``: a task's job ends when every rank has ended, not when the master completes
    (Kubeflow's rule, which ``render`` shows): what ``torchjob run`` of a task waits for.
    ``runtimes``: those of ``--runtime FILE``, for the file's TrainJobs.
    """
    match = _sdk_ref(ref)
    if match:
        from torchjob.sdk.loader import load_task_job  # lazy: only SDK references need it

        return [load_task_job(match["path"], match["name"], task_args, every_rank=every_rank)]
    path, colon, name = ref.rpartition(":")
    if colon and path.endswith(".py") and os.path.isfile(path) and not os.path.exists(ref):
        from torchjob.errors import Problem, SpecError

        message = f"expected FILE.py:NAME, NAME a task or workflow of the file (a Python name), got {name!r}"
        raise SpecError([Problem("", message, ref)])
    return load_jobs(ref, runtimes)


def default_image_warning(ref: str, loaded: list[LoadedJob]) -> str | None:
    """For ``render FILE.py:TASK``: a pod left on the SDK's default image, which holds neither the
    user's code nor torchjob, cannot run on a cluster; say so and how to choose the image."""
    if not _sdk_ref(ref):
        return None
    from torchjob.sdk.tojob import DEFAULT_IMAGE

    tasks = [
        task.name
        for item in loaded
        for task in item.job.spec.tasks
        if any(
            isinstance(c, dict) and c.get("image") == DEFAULT_IMAGE
            for c in task.template.spec.get("containers") or []
        )
    ]
    if not tasks:
        return None
    return (
        f"{ref}: warning: task(s) {', '.join(tasks)} use the default image {DEFAULT_IMAGE}, which holds "
        "neither your code nor torchjob; on a cluster set an image that does: @task(image=...), or "
        "PyTorch(master=Master(image=...), worker=Worker(image=...))"
    )


def choose_job(loaded: list[LoadedJob], name: str | None, file: str) -> LoadedJob:
    """The one job a command starts: the one called ``name`` (``--job``), else the file's only one."""
    from torchjob.errors import Problem, SpecError

    if name:
        loaded = [item for item in loaded if item.job.name == name]
        if not loaded:
            raise SpecError([Problem("metadata.name", f"no job named {name!r} in this file", file)])
    if len(loaded) > 1:
        names = ", ".join(item.job.name for item in loaded)
        message = f"the file holds {len(loaded)} jobs ({names}); choose one with --job NAME"
        raise SpecError([Problem("", message, file)])
    return loaded[0]


def told_at(document: Document) -> Callable[[str, str], str]:
    """How an engine names a field of the job's file in a note (StartOptions.source): at the
    file's line and the path it has there, as validate and render name it."""
    return lambda path, message: document.problem(path, message).format()
