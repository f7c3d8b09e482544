"""One line that says what to do about a failure whose fix is outside the job.

:class:`FailureHints` looks at each container's first failure (a crash loop repeats it) and says
each hint once a job. A container whose ``python`` is torchjob's own interpreter and whose first
run fails because that interpreter has no torch would otherwise crash-loop for minutes, each
attempt's log ending in the same ``ModuleNotFoundError``; the fix is an install, not a change to
the job.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable

from torchjob.controller.kubelet import Container, Pod
from torchjob.controller.rootcause import log_tail
from torchjob.engines.local.output import short_name

_NO_TORCH = re.compile(r"ModuleNotFoundError: No module named 'torch(?:\.\w+)*'")


def missing_torch(container: Container) -> str | None:
    """The line to print when ``container`` (its run just ended in failure) is torchjob's python and
    its log ends in torch's ModuleNotFoundError; None otherwise."""
    if container.exit_code in (None, 0) or container.spec.run.argv[:1] != [sys.executable]:
        return None
    if not any(_NO_TORCH.search(line) for line in log_tail(container.log)):
        return None
    return (
        f"container {container.name}: {sys.executable} (the interpreter torchjob runs a container's "
        f"python with) cannot import torch; install it there ({sys.executable} -m pip install torch), "
        "or run torchjob from the environment that has torch"
    )


class FailureHints:
    def __init__(self, job_name: str, record: Callable[[str], None]) -> None:
        self.job_name = job_name
        self.record = record
        self.explained: set[tuple[tuple[str, int], str]] = set()  # containers whose first failure was seen
        self.told_no_torch = False  # one line a job

    def explain(self, pod: Pod) -> None:
        """A container's first failure whose fix is outside the job (no torch here): said once."""
        key = (pod.task, pod.index)
        for c in pod.containers:
            if c.exit_code in (None, 0) or (key, c.name) in self.explained:
                continue
            self.explained.add((key, c.name))  # only its first failure: a crash loop repeats it
            hint = missing_torch(c) if not self.told_no_torch else None
            if hint is not None:
                self.told_no_torch = True
                self.record(f"pod {short_name(self.job_name, pod.name)}: {hint}")
