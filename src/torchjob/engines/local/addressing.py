"""Local addressing: a loopback address per pod and the job's ports mapped to host ports.

On Linux the whole 127.0.0.0/8 block reaches this machine, so pod number ``n`` of a job (in task
order, then index) gets its own address, starting at 127.0.1.1, without any setup. ``MASTER_ADDR``
is then the master pod's own address, as on a cluster where every pod has an IP. Other systems
route only 127.0.0.1, so every pod uses that there.

When the job's processes can resolve pod names (a private ``/etc/hosts``, see
:mod:`torchjob.engines.local.podnames`), plugins get the cluster's names instead, so ``MASTER_ADDR``
and the host files are the same as on a cluster; the names resolve to the addresses above.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping

from torchjob.addressing import ClusterAddressing
from torchjob.spec.model import Job, Task, pod_name

LOOPBACK = "127.0.0.1"
_PER_BLOCK = 254  # .1 to .254 in each /24; .0 and .255 are avoided


def pod_address(ordinal: int, *, per_pod: bool = sys.platform.startswith("linux")) -> str:
    """The loopback address of the job's ``ordinal``-th pod (0-based)."""
    if not per_pod:
        return LOOPBACK
    if ordinal < 0 or ordinal >= _PER_BLOCK * 65535:
        raise ValueError(f"pod ordinal {ordinal} out of range")
    block, host = divmod(ordinal, _PER_BLOCK)
    block += 1
    return f"127.{block >> 8}.{block & 255}.{host + 1}"


def pod_ordinals(job: Job) -> dict[tuple[str, int], int]:
    """Every pod's ordinal: tasks in order, then index."""
    ordinals: dict[tuple[str, int], int] = {}
    for task in job.spec.tasks:
        for index in range(task.replicas):
            ordinals[(task.name, index)] = len(ordinals)
    return ordinals


class LocalAddressing:
    """Implements :class:`torchjob.addressing.Addressing` for processes on this machine."""

    def __init__(self, job: Job, ports: Mapping[int, int] | None = None, *, names: bool = False) -> None:
        self.ordinals = pod_ordinals(job)
        self.ports = dict(ports or {})
        self.names = names  # pod names resolve for the job's processes

    def host(self, job: Job, task: Task, index: int) -> str:
        if self.names:
            return ClusterAddressing().host(job, task, index)
        # A template hostname collapses a task to one name on a cluster; here pod 0 stands for it.
        if task.template.hostname:
            index = 0
        return pod_address(self.ordinals[(task.name, index)])

    def hosts_entries(self, job: Job) -> list[tuple[str, list[str]]]:
        """``(address, names)`` per pod: its hostname, its cluster name and its pod name."""
        cluster = ClusterAddressing()
        entries = []
        for task in job.spec.tasks:
            for index in range(task.replicas):
                pod = pod_name(job.name, task.name, index)
                names = [task.template.hostname or pod, cluster.host(job, task, index), pod]
                entries.append((self.address_of(task.name, index), names))
        return entries

    def address_of(self, task: str, index: int) -> str:
        return pod_address(self.ordinals[(task, index)])

    def port(self, job: Job, port: int) -> int:
        return self.ports.get(port, port)

    def service(self, job: Job, task: Task, index: int) -> str:
        """Where pod names resolve (the job's hosts view lists each pod's name), the pod's name is
        the one a Service for that pod alone has on a cluster; elsewhere the pod's address."""
        if self.names:
            return pod_name(job.name, task.name, index)
        return self.host(job, task, index)
