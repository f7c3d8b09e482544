"""One line that says what to do about a failure whose fix is outside the job.

:class:`FailureHints` looks at each container's first failure (a crash loop repeats it) and says
each hint once a job. A container whose ``python`` is torchjob's own interpreter and whose first
run fails because that interpreter has no torch would otherwise crash-loop for minutes, each
attempt's log ending in the same ``ModuleNotFoundError``; the fix is an install, not a change to
the job. A container that failed to reach another machine from a job's own network (loopback
only, netns.py) is told how to run the job on the machine's network.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable

from torchjob.controller.kubelet import Container, Pod
from torchjob.engines.local.output import short_name

# Patterns as text: re compiles (and caches) them at a failure's first look, not at every job's
# start, where this module is loaded before the first pod.
_NO_TORCH = r"ModuleNotFoundError: No module named 'torch(?:\.\w+)*'"
# What resolvers and sockets say without a route or a name server (glibc, Python, curl, pip, requests).
_NO_NETWORK = (
    r"Temporary failure in name resolution|Network is unreachable|Could not resolve host"
    r"|Name or service not known|Failed to resolve|\[Errno -3\]|\[Errno 101\]"
)


def _says(container: Container, pattern: str) -> bool:
    """Whether the end of the container's log has a line matching ``pattern``."""
    from torchjob.controller.rootcause import log_tail  # (its own patterns: compiled on import)

    return any(re.search(pattern, line) for line in log_tail(container.log))


def missing_torch(container: Container) -> str | None:
    """The line to print when ``container`` (its run just ended in failure) is torchjob's python and
    its log ends in torch's ModuleNotFoundError; None otherwise."""
    if container.exit_code in (None, 0) or container.spec.run.argv[:1] != [sys.executable]:
        return None
    if not _says(container, _NO_TORCH):
        return None
    return (
        f"container {container.name}: {sys.executable} (the interpreter torchjob runs a container's "
        f"python with) cannot import torch; install it there ({sys.executable} -m pip install torch), "
        "or run torchjob from the environment that has torch"
    )


def no_network(container: Container) -> str | None:
    """The line to print when ``container`` (its run just ended in failure, in the job's own
    network) says it could not resolve a name or reach a network; None otherwise."""
    if container.exit_code in (None, 0):
        return None
    if not _says(container, _NO_NETWORK):
        return None
    return (
        f"container {container.name} could not reach the network: the job has a network of its "
        "own, with the loopback only (docs/local-engine.md); a job that must reach other machines runs "
        "on this machine's network with TORCHJOB_NETWORK=host in torchjob's environment, or with "
        "hostNetwork: true in its pods"
    )


class FailureHints:
    def __init__(self, job_name: str, record: Callable[[str], None]) -> None:
        self.job_name = job_name
        self.record = record
        self.explained: set[tuple[tuple[str, int], str]] = set()  # containers whose first failure was seen
        self.told_no_torch = False  # one line a job
        self.told_no_network = False  # one line a job

    def explain(self, pod: Pod, own_network: bool) -> None:
        """A container's first failure whose fix is outside the job (no torch here; no network in
        the job's own, ``own_network``): said once."""
        key = (pod.task, pod.index)
        for c in pod.containers:
            if c.exit_code in (None, 0) or (key, c.name) in self.explained:
                continue
            self.explained.add((key, c.name))  # only its first failure: a crash loop repeats it
            hint = missing_torch(c) if not self.told_no_torch else None
            if hint is not None:
                self.told_no_torch = True
                self.record(f"pod {short_name(self.job_name, pod.name)}: {hint}")
            hint = no_network(c) if own_network and not self.told_no_network else None
            if hint is not None:
                self.told_no_network = True
                self.record(f"pod {short_name(self.job_name, pod.name)}: {hint}")
