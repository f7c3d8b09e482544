"""What the commands' FILE argument names: a YAML/JSON file of jobs, or an SDK task (``FILE.py:TASK``).

Here, above both :mod:`torchjob.jobs` and :mod:`torchjob.sdk`, so that neither imports the other.
"""

from __future__ import annotations

import re

from torchjob.jobs import LoadedJob, load_jobs

_SDK_REF = re.compile(r"^(?P<path>.+\.py):(?P<name>[A-Za-z_][A-Za-z0-9_]*)$")


def is_task_ref(ref: str) -> bool:
    return _SDK_REF.fullmatch(ref) is not None


def load_ref(ref: str, task_args: list[str] | None = None, *, every_rank: bool = False) -> list[LoadedJob]:
    """Every job in a YAML/JSON file (``-`` for stdin), or the job of an SDK task reference
    (called with ``task_args``, ``--NAME VALUE`` tokens, when given: see ``load_task_job``).

    ``every_rank``: a task's job ends when every rank has ended, not when the master completes
    (Kubeflow's rule, which ``render`` shows): what ``torchjob run`` of a task waits for.
    """
    match = _SDK_REF.fullmatch(ref)
    if match:
        from torchjob.sdk.loader import load_task_job  # lazy: only SDK references need it

        return [load_task_job(match["path"], match["name"], task_args, every_rank=every_rank)]
    return load_jobs(ref)
