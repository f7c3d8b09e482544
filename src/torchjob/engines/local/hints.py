"""One line that says what to do about a failure whose fix is outside the job.

A container whose ``python`` is torchjob's own interpreter and whose first run fails because that
interpreter has no torch would otherwise crash-loop for minutes, each attempt's log ending in the
same ``ModuleNotFoundError``; the fix is an install, not a change to the job. A container that
failed to reach another machine from a job's own network (loopback only, netns.py) is told how to
run the job on the machine's network.
"""

from __future__ import annotations

import re
import sys

from torchjob.controller.kubelet import Container
from torchjob.controller.rootcause import log_tail

_NO_TORCH = re.compile(r"ModuleNotFoundError: No module named 'torch(?:\.\w+)*'")
# What resolvers and sockets say without a route or a name server (glibc, Python, curl, pip, requests).
_NO_NETWORK = re.compile(
    r"Temporary failure in name resolution|Network is unreachable|Could not resolve host"
    r"|Name or service not known|Failed to resolve|\[Errno -3\]|\[Errno 101\]"
)


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


def no_network(container: Container) -> str | None:
    """The line to print when ``container`` (its run just ended in failure, in the job's own
    network) says it could not resolve a name or reach a network; None otherwise."""
    if container.exit_code in (None, 0):
        return None
    if not any(_NO_NETWORK.search(line) for line in log_tail(container.log)):
        return None
    return (
        f"container {container.name} could not reach the network: the job has a network of its "
        "own, with the loopback only (docs/local-engine.md); a job that must reach other machines runs "
        "on this machine's network with TORCHJOB_NETWORK=host in torchjob's environment, or with "
        "hostNetwork: true in its pods"
    )
