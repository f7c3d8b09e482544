"""The job's ports against processes outside it, while the job runs.

A process outside the job that listens on the job's rendezvous port (MASTER_PORT) ends the job at
once, with that as its reason (:meth:`PortGuard.watch`, on the loop's scans): the job's ranks
would otherwise wait for a master that cannot listen, or join that process's rendezvous
(torchrun's c10d backend becomes a client of whatever holds the port) and hang there until a
timeout of many minutes. At the job's first failed container, any of its ports taken by such a
process after the reservation is named (:meth:`PortGuard.check`): the failure is most likely that
(the master's ``Address already in use``), not the program's own error.
"""

from __future__ import annotations

from collections.abc import Callable

from torchjob.controller import Controller
from torchjob.controller.kubelet import Pod
from torchjob.engines.local import runner
from torchjob.engines.local.cleanup import JobProcesses
from torchjob.engines.local.creation import PodFactory
from torchjob.engines.local.listeners import PortWatch


class PortGuard:
    def __init__(
        self,
        factory: PodFactory,
        ctl: Controller[Pod],
        processes: JobProcesses,
        job_id: str,
        record: Callable[[str], None],
    ) -> None:
        self.factory = factory
        self.ctl = ctl
        self.processes = processes
        self.job_id = job_id
        self.record = record
        self.uids = {int(uid) for uid in factory.uids.split()}
        self.rendezvous: PortWatch | None = None  # the rendezvous port's listeners, once watched

    def job_pids(self) -> set[int]:
        """The job's processes known here: containers (a forked one shows no job's marker) and
        their recorded descendants."""
        mine = set(self.processes.job_pids)
        for pod in self.ctl.pods.values():
            mine.update(runner.child_pids(pod))
        return mine

    def watch(self) -> None:
        """A foreign listener on the rendezvous port fails the job."""
        if (
            not self.factory.rendezvous
            or self.ctl.status.phase.final
            or self.factory.net.namespace is not None
        ):
            return  # (in the job's own network nothing outside the job can listen)
        if self.rendezvous is None:
            self.rendezvous = PortWatch(
                self.factory.rendezvous, self.job_id, self.uids, asked=self.factory.net.listeners
            )
        taken = self.rendezvous.taken(self.job_pids())
        if taken:
            self.ctl.suspect = "; ".join(taken)
            self.record(self.ctl.suspect)
            self.ctl.fail_job(
                f"{self.ctl.suspect}; the job's ranks would rendezvous with it, or wait for a master "
                "that cannot listen"
            )

    def check(self) -> None:
        """Once, at the job's first failed container: a port of the job taken is the suspect."""
        if self.ctl.suspect is not None or not self.factory.ports:
            return
        network = self.factory.net.namespace  # the job's own: its listeners are read there
        tables = network.read_tables if network else None
        watch = PortWatch(self.factory.ports, self.job_id, self.uids, tables, self.factory.net.listeners)
        self.ctl.suspect = "; ".join(watch.taken(self.job_pids()))
        if self.ctl.suspect:
            self.record(self.ctl.suspect)
