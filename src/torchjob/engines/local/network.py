"""A job's network as its pods get it: its own namespace (``netns.py``), the warm pool's, or this
machine's (asked for, or none could be made), and its declared ports forwarded into it.

Decided once, when the job's turn comes (``creation.PodFactory.prepare``): :meth:`JobNetwork.start`
starts making the namespace in a child, :meth:`JobNetwork.finish` takes it; the names probe that
follows enters it first, so that a namespace the job's processes could not enter puts the job on
this machine's network (:meth:`JobNetwork.drop`) before any pod starts.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Collection, Mapping
from pathlib import Path

from torchjob import logs
from torchjob.engines.local import netns
from torchjob.engines.local.addressing import LocalAddressing
from torchjob.host import sockdiag
from torchjob.host.tcp import Listener
from torchjob.spec.model import Job
from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from torchjob.engines.local.forward import Forwarder

Note = Callable[[str], None]


class JobNetwork:
    def __init__(self, job: Job, pooled: bool) -> None:
        self.job = job
        self.pooled = pooled  # served by the warm pool: its namespace is the calling process's
        self.namespace: netns.Network | None = None  # None: this machine's network
        self.text = ""  # for the status: "its own ..." or "this machine's (why)"
        self.forwarder: Forwarder | None = None  # declared ports reached from this machine
        self._pending: netns.Pending | None = None
        self._machine_diag: socket.socket | None = None  # sock_diag of this machine's network
        self._machine_refused = False  # netlink refused here (a seccomp filter): not asked again

    @property
    def watchable(self) -> bool:
        """Whether the job's listeners can be asked for cheaply (``listeners``)."""
        return self._diag() is not None

    def listeners(self) -> list[Listener] | None:
        """The listening TCP sockets of the job's network (on this machine's, every user's: the
        caller picks the job's ports); None where they cannot be asked for."""
        diag = self._diag()
        if diag is None:
            return None
        try:
            return sockdiag.listeners(diag)
        except OSError:
            return None

    def _diag(self) -> socket.socket | None:
        """The sock_diag socket to ask: the one made inside the job's own namespace, or on this
        machine's network one of this process's, made at the first question."""
        if self.namespace is not None:
            return self.namespace.diag
        if self._machine_diag is None and not self._machine_refused:
            try:
                self._machine_diag = sockdiag.open_socket()
            except OSError:
                self._machine_refused = True
        return self._machine_diag

    def start(self) -> bool:
        """Start making the namespace in a child (the pool's is made once, by ``finish``);
        whether the job is to have one (else the status says why not)."""
        why = netns.why_host(self.job)
        if why is not None:
            self.text = f"this machine's ({why})"
            return False
        if not self.pooled:
            self._pending = netns.start()
        return True

    def finish(self, note: Note) -> None:
        """Take the namespace made meanwhile; where there is none, say once what the job exposes."""
        if self.text:  # the machine's, as asked
            return
        pending, self._pending = self._pending, None
        if pending is not None:
            made = pending.result()
        else:
            from torchjob.engines.local import pool

            made = pool.network()
        if isinstance(made, str):
            self._on_machine(made, note)
            return
        self.namespace = made
        self.text = "its own (loopback only)"
        logs.debug("the job runs in a network namespace of its own")

    def drop(self, why: str, note: Note) -> None:
        """The namespace was made but cannot be entered: this machine's network (the pool's
        namespace is given up for every later job of this process too)."""
        if self.pooled:
            from torchjob.engines.local import pool

            pool.network_failed(why)
        elif self.namespace is not None:
            self.namespace.close()
        self.namespace = None
        self._on_machine(why, note)

    def _on_machine(self, why: str, note: Note) -> None:
        self.text = f"this machine's (no network namespace: {why})"
        note(
            f"the job runs on this machine's network: no network namespace could be made ({why}); "
            "other local users can connect to its ports (docs/local-engine.md, Security)"
        )
        logs.debug("the job's network is the machine's: %s", why)

    def forward(
        self,
        ports: Mapping[int, int],
        rendezvous: Collection[int],
        addressing: LocalAddressing,
        uids: Collection[int],
        job_dir: tuple[str, Path],
        note: Note,
    ) -> None:
        """The declared ports (``ports``: declared -> host) the user may open from this machine,
        not the plugins' ``rendezvous`` ones, forwarded into the job's own network (forward.py):
        at 127.0.0.1 and at each declaring pod's address."""
        if self.namespace is None:
            return
        places: list[tuple[str, int]] = []
        for task in self.job.spec.tasks:
            containers = [*task.template.init_containers, *task.template.containers]
            for port in (entry.get("containerPort") for c in containers for entry in c.ports):
                if port in rendezvous or not isinstance(port, int) or port not in ports:
                    continue
                places.append(("127.0.0.1", ports[port]))
                places += [(addressing.address_of(task.name, i), ports[port]) for i in range(task.replicas)]
        if not places:
            return
        from torchjob.engines.local import forward

        job_id, path = job_dir
        self.forwarder, problems = forward.start(self.namespace, dict.fromkeys(places), uids, job_id, path)
        for problem in problems:
            note(problem)
        if self.forwarder is not None:
            self.text += f"; forwarded to your processes: {', '.join(self.forwarder.where)}"

    def close(self) -> None:
        """At the job's end: the forwarder stopped, its own namespace let go (not the pool's)."""
        if self.forwarder is not None:
            self.forwarder.close()
            self.forwarder = None
        if self.namespace is not None and not self.pooled:
            self.namespace.close()
        self.namespace = None
        if self._machine_diag is not None:
            self._machine_diag.close()
            self._machine_diag = None
