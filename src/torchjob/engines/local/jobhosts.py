"""A job's hosts files, and whether its pod names resolve.

The job's file (the machine's ``/etc/hosts``, then a line per pod; in the job's own network, the
entries that network needs) is written once its turn comes; a short-lived child (the names probe,
``podnames.py``) then tries to make it a process's ``/etc/hosts`` as every container's will be,
entering the job's network first. Its answer decides, once per job, whether pod names resolve
(else pods get addresses only), and whether the job's network can be entered at all (else the job
runs on the machine's: ``network.py``). Each pod attempt gets a copy of its own, with its
``hostAliases``, so that no pod sees what another writes into its ``/etc/hosts``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from torchjob import logs
from torchjob.engines.local import netns, podnames, security
from torchjob.engines.local.addressing import LocalAddressing
from torchjob.engines.local.network import JobNetwork
from torchjob.engines.local.state import JobDir, make_private_dirs
from torchjob.files import write_atomic
from torchjob.spec.model import Job


class JobHosts:
    def __init__(self, job: Job, job_dir: JobDir) -> None:
        self.job = job
        self.dir = job_dir
        self.text = ""  # the job's hosts file; each pod attempt gets a copy (pod_file)
        self.mount: podnames.HostsMount | None = None  # set when pod names can resolve
        self.resolution = "addresses only"

    def write(self, private: bool) -> podnames.HostsMount:
        """Write the job's hosts file (``private``: for its own network); how a process gets it."""
        hosts = self.dir.path / "hosts"
        try:
            with open(podnames.ETC_HOSTS) as handle:
                machine = handle.read()
        except OSError:
            machine = ""
        entries = LocalAddressing(self.job).hosts_entries(self.job)  # addresses only: no ports
        if private:  # no name server answers there
            entries += netns.hosts_entries(machine, [address for address, _ in entries])
        self.text = podnames.hosts_text(machine, entries)
        write_atomic(hosts, self.text)
        if security.other_users([t.template.spec for t in self.job.spec.tasks]):
            hosts.chmod(0o644)  # read as /etc/hosts by pods that run as another user; nothing secret
        return podnames.HostsMount.of(str(hosts))

    def decide(
        self,
        mount: podnames.HostsMount,
        probe: podnames.Probe,
        net: JobNetwork,
        record: Callable[[str], None],
    ) -> bool:
        """Decide, once per job, whether pod names resolve (the probe's answer), and whether the
        job's network can be entered (the probe entered it first; without a probe, a child tries)."""
        why_not = probe.result()
        if net.namespace is not None:
            why_not_in = why_not if probe.entered else netns.verify(net.namespace)
            if why_not_in is not None and netns.ENTERING in why_not_in:
                net.drop(why_not_in, record)
                why_not = podnames.probe(mount) if probe.entered else why_not  # the names alone
        if why_not is None:
            self.mount = mount
            self.resolution = "resolved"
            logs.debug("pod names resolve: every container's /etc/hosts is %s", mount.source.decode())
        else:
            self.resolution = f"addresses only ({why_not})"
            logs.debug("pod names do not resolve, addresses are used instead: %s", why_not)
        return why_not is None

    def pod_file(self, pod_dir: Path, aliases: object, hostname: str = "") -> podnames.HostsMount:
        """The pod attempt's own hosts file (the job's, then its hostAliases) and how to mount it:
        no pod sees what another writes into its /etc/hosts; ``hostname``: the pod's, set with it."""
        assert self.mount is not None
        make_private_dirs(pod_dir)
        path = pod_dir / "hosts"
        write_atomic(path, podnames.with_aliases(self.text, aliases))
        if security.other_users([t.template.spec for t in self.job.spec.tasks]):
            path.chmod(0o644)  # as the job's: read by pods that run as another user
        return podnames.HostsMount.of(str(path), hostname=hostname)
