"""Making a job's pods: what is decided once per job (ports, names, ranks, GPU shares) and each pod.

:class:`PodFactory` holds the per-job decisions taken before the first pod (``prepare``: the
network, ``network.py``; the hosts files and whether names resolve, ``jobhosts.py``; the ports)
and turns a pod plan into a kubelet :class:`~torchjob.controller.kubelet.Pod` ready to start
(``make``): its directories, environment and resolved containers. Starting it, and everything
after, is the kubelet's over the runner (runner.py).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from pathlib import Path

from torchjob import logs
from torchjob.controller.kubelet import Container, Pod
from torchjob.engines.local import gpus, podnames, process, security
from torchjob.engines.local import ports as port_registry
from torchjob.engines.local.addressing import LocalAddressing
from torchjob.engines.local.containers import ContainerRun, PodSetup, ResolveError, configmaps_of
from torchjob.engines.local.jobhosts import JobHosts
from torchjob.engines.local.mounts import make_empty_dirs
from torchjob.engines.local.network import JobNetwork
from torchjob.engines.local.podtemp import PodTemp
from torchjob.engines.local.resolve import resolve_pod
from torchjob.engines.local.runner import Processes
from torchjob.engines.local.state import JobDir, make_private_dirs
from torchjob.expand import Attempts, DesiredState, PodPlan, expand, readdress
from torchjob.files import write_atomic
from torchjob.lifecycle import JobStatus
from torchjob.plugins import build_plugins
from torchjob.pyrunner import pyrun
from torchjob.spec.model import Job
from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any

    from torchjob.engines.local.preload import Forked, Preloader

    Forker = Callable[[ContainerRun, Path], Forked | str | None]

WAIT_INTERVAL = "0.02"  # wait-for-master polling, so a worker starts soon after the master listens
# (where netlink is refused; below the ranks' CPU priority: process.background_priority)
NUDGED_INTERVAL = "1"  # the same where nudge.py wakes it for a new listener (sock_diag works)
VOLCANO_MOUNT = "/etc/volcano"  # where Volcano's svc plugin mounts its host files
UIDS_ENV = "TORCHJOB_JOB_UIDS"  # plugins.waitmaster.UIDS_ENV, not imported: a job start need not load it

Key = tuple[str, int]


class PodFactory:
    def __init__(
        self,
        job: Job,
        job_dir: JobDir,
        extra_env: dict[str, str],
        prewarm_modules: tuple[str, ...] = (),
        preload_modules: tuple[str, ...] = (),
        planned: DesiredState | None = None,
        pooled: bool = False,
    ) -> None:
        self.job = job
        self.dir = job_dir
        self.extra_env = dict(extra_env)
        self.prewarm_modules = prewarm_modules  # what main containers import while inits run (prewarm.py)
        # --preload: the job's fork server (preload.py), started for the first container it can serve
        self.preloader: Preloader | None = None
        self.pool_checked = False  # the warm pool's server was matched to this job (pool.for_job)
        if preload_modules and pooled:  # the SDK's warm pool: this process's server, kept (pool.py)
            from torchjob.engines.local import pool

            self.preloader = pool.preloader(preload_modules)
        elif preload_modules:
            from torchjob.engines.local.preload import Preloader

            self.preloader = Preloader(preload_modules, job_dir.path)
        self.ports: dict[int, int] = {}  # declared port -> host port
        self.rendezvous: dict[int, int] = {}  # the same, for the plugins' ports (MASTER_PORT) alone
        self.addressing: LocalAddressing | None = None
        self.desired: Attempts | None = None  # the job's one expansion, addressed for its turn
        self.planned = planned  # the plan's expansion (planning.py): addresses only, ports as declared
        self.attempts: dict[Key, int] = {}
        self.rank_of: dict[Key, str | None] = {}
        self.volcano_env: dict[str, str] = {}  # where the /etc/volcano files are here, when mounted
        self.hosts = JobHosts(job, job_dir)  # the job's hosts files; whether pod names resolve
        # Its own network namespace (the warm pool's for a pooled job), which every process of the
        # job enters, or this machine's network; its forwarded ports (network.py).
        self.net = JobNetwork(job, self.preloader is not None and self.preloader.pooled)
        self.gpu_env: dict[Key, gpus.PodEnv] = {}  # CUDA_VISIBLE_DEVICES shares, kept across restarts
        # The local queue's grant (admission.Ticket.gpu_env): the GPUs this job was given; None:
        # the machine's whole inventory, shared out among the job's pods only (run --no-queue).
        self.gpu_shares: Callable[[dict[Key, Any]], dict[Key, gpus.PodEnv]] | None = None
        self.pod_specs: dict[Key, Any] = {}
        self.uids = job_uids(job)  # whose listener wait-for-master may take for the master
        self.temp = PodTemp()  # each pod attempt's TMPDIR, removed with the job (podtemp.py)

    def prepare(
        self, note: Callable[[str], None], record: Callable[[str], None] | None = None
    ) -> DesiredState:
        """Reserve the ports, decide name resolution and the network, write the ConfigMaps; once,
        before any pod. ``record`` (else ``note``) is told what the job's status keeps too."""
        record = record or note
        private = self.net.start()  # made in a child while the hosts file is written
        try:
            mount = self.hosts.write(private)
        finally:
            self.net.finish(record)  # (the child is reaped whatever happened)
        # A child checks, while the ports are reserved, that a process can enter the job's network
        # and then get the job's hosts file as its /etc/hosts, as every container will.
        namespace = self.net.namespace
        probe = podnames.start_probe(mount, namespace.enter if namespace else None)
        try:
            declared = port_registry.declared_ports(self.job)
            hidden = port_registry.rendezvous_ports(self.job)  # a random host port: nobody else's guess
            self.ports = port_registry.reserve(self.dir.id, declared, hidden)
            self.rendezvous = {port: self.ports[port] for port in hidden}
            python = _python()  # not resolved: a venv's python is a symlink
            self.dir.write_shims(python, {pyrun.RANK_SHIM: pyrun.guard_shim(python)})
        finally:
            names_resolve = self.hosts.decide(mount, probe, self.net, record)  # the child is reaped
        self.addressing = LocalAddressing(self.job, self.ports, names=names_resolve)
        uids = {int(uid) for uid in self.uids.split()}
        self.net.forward(
            self.ports, self.rendezvous, self.addressing, uids, (self.dir.id, self.dir.path), record
        )
        self.desired = Attempts(self.addressed(self.planned))
        self.planned = None
        if not names_resolve and any(t.template.spec.get("hostAliases") for t in self.job.spec.tasks):
            note(
                "hostAliases have no effect: pods have no /etc/hosts of their own here "
                f"({self.hosts.resolution})"
            )
        state = self.expansion(0, 0)
        self.dir.write_configmaps(configmaps_of(state))
        self.pod_specs = {(p.task.name, p.index): p.manifest["spec"] for p in state.pods}
        if self.gpu_shares is not None:
            self.gpu_env = self.gpu_shares(self.pod_specs)
        else:
            self.gpu_env, gpu_note = gpus.job_env(self.pod_specs, _declared_gpus)
            if gpu_note:
                note(gpu_note)
        plugins = build_plugins(self.job)
        for plan in state.pods:
            ranks = [plugin.rank(self.job, plan.task, plan.index) for plugin in plugins]
            rank = next((r for r in ranks if r is not None), None)
            self.rank_of[(plan.task.name, plan.index)] = None if rank is None else str(rank)
        for path, configmap in (m for plugin in plugins for m in plugin.config_mounts(self.job).items()):
            if path == VOLCANO_MOUNT:  # programs that open /etc/volcano/... read this instead
                self.volcano_env = {
                    "TORCHJOB_VOLCANO_DIR": str(self.dir.volumes / configmap),
                    "TORCHJOB_CONFIG_MOUNT": path,
                }
        return state

    def regrant(self, keys: list[str]) -> None:
        """The queue granted (again) these pods ("task/index"): their GPU shares, the GPUs now given."""
        if self.gpu_shares is not None:
            shares = self.gpu_shares(self.pod_specs)
            for name in keys:
                task, _, index = name.rpartition("/")
                key = (task, int(index))
                if key in shares:
                    self.gpu_env[key] = shares[key]

    def write_records(self) -> None:
        """job.yaml and pods.yaml are for people and tools, not the pods: written once pods run."""
        from torchjob.render import dump, list_of
        from torchjob.spec.manifest import job_manifest

        state = self.expansion(0, 0)
        write_atomic(self.dir.path / "job.yaml", dump(job_manifest(self.job), "yaml"))
        items = [*state.objects, *(p.manifest for p in state.pods)]
        write_atomic(self.dir.path / "pods.yaml", dump(list_of(items), "yaml"))

    def addressed(self, planned: DesiredState | None) -> DesiredState:
        """The plan's pods given this job's host ports and names (``expand.readdress``): the
        job is not expanded again. Without a plan (or should a plugin not manage), it is."""
        now = self.addressing
        assert now is not None
        was = planned.addressing if planned is not None else None
        if (
            planned is not None
            and isinstance(was, LocalAddressing)
            and (was.ports, was.names) == (now.ports, now.names)
        ):
            return planned  # addressed as planned
        if planned is not None and readdress(planned, now):
            return planned
        if planned is not None:
            logs.debug("a plugin could not readdress the planned pods: the job is expanded again")
        return expand(self.job, now)

    def expansion(self, version: int, retry_count: int) -> DesiredState:
        """The desired pods of one attempt: the job's first, restamped for a restart's version and
        retry count (``expand.Attempts``)."""
        if self.desired is None:  # asked before prepare (defensive): as the addressing stands
            self.desired = Attempts(expand(self.job, self.addressing))
        return self.desired(version, retry_count)

    def make(self, plan: PodPlan, status: JobStatus) -> Pod:
        """The next attempt of a planned pod, not started: its containers' processes to come
        (``runner.Processes``). A pod that cannot run gets no container and a torchjob.log saying
        why (checked before the job started; defensive only)."""
        assert self.addressing is not None
        key = (plan.task.name, plan.index)
        attempt = self.attempts.get(key, -1) + 1
        self.attempts[key] = attempt
        address = self.addressing.address_of(*key)
        pod_dir = self.dir.pod_dir(plan.name, attempt)
        uid = _uuid4()
        ctx = PodSetup(
            plan=plan,
            address=address,
            uid=uid,
            configmaps=configmaps_of(self.expansion(status.version, status.retry_count)),
            configmap_dir=self.dir.volumes,
            pod_dir=pod_dir,
            base_env=self.base_env(plan, address, attempt, uid, status.retry_count),
            extra_env=self.extra_env,
            gpu_env=self.gpu_env.get(key, {}),
        )
        log_dir = self.dir.log_dir(plan.name, attempt)
        try:
            make_empty_dirs(ctx)
            inits, mains = resolve_pod(ctx)
            if "TMPDIR" in ctx.base_env:  # the pod's own: torch's compile cache stays the machine's
                self.temp.keep_caches(ctx.base_env["TMPDIR"], [run.env for run in [*inits, *mains]])
            aliases = plan.manifest["spec"].get("hostAliases")
            # Before the hosts hook: a container's own hook rules it out. A fork server's children
            # share its /etc/hosts, the job's: a pod with hostAliases of its own is not forked.
            forkers = {} if aliases else self.forkers(mains)
            # Init containers a plugin added (wait-for-master) are torchjob's helpers: their polls
            # must not take CPU from ranks importing torch on the same cores.
            own = plan.task.template.init_container_names
            for run in inits:
                if run.name not in own:
                    run.helper = True
                    run.before_exec = security.then(process.background_priority, run.before_exec)
            if self.hosts.mount is not None:  # the pod's own /etc/hosts, so that pod names resolve
                mount = self.hosts.pod_file(
                    pod_dir, aliases, podnames.hostname_of(plan.name, plan.manifest["spec"])
                )
                identity = podnames.machine_identity()  # NCCL's, as outside a pod (podnames.py)
                for run in [*inits, *mains]:  # mounted before the process drops to its runAsUser
                    run.before_exec = security.then(mount.enter, run.before_exec)
                    run.env.setdefault(podnames.NCCL_HOST, identity)
            namespace = self.net.namespace
            if namespace is not None:  # first: its user namespace is the one the mount is made in
                for run in [*inits, *mains]:
                    run.before_exec = security.then(namespace.enter, run.before_exec)
        except (ResolveError, OSError) as err:
            make_private_dirs(log_dir)
            write_atomic(log_dir / "torchjob.log", f"torchjob: cannot run pod {plan.name}: {err}\n")
            inits, mains, forkers = [], [], {}
        with contextlib.suppress(OSError):  # a full disk: its containers then fail to start, and say why
            make_private_dirs(log_dir)
        containers = [
            Container(run.name, run.init, Processes(run, forkers.get(run.name)), log_dir / f"{run.name}.log")
            for run in [*inits, *mains]
        ]
        rank = self.rank_of.get(key)
        return Pod(
            name=plan.name,
            task=plan.task.name,
            index=plan.index,
            attempt=attempt,
            containers=containers,
            restart_policy=plan.task.template.restart_policy,
            log_dir=log_dir,
            address=address,
            rank=int(rank) if rank is not None and rank.isdigit() else None,
            engine=uid,  # the attempt's marker value (TORCHJOB_POD_UID)
        )

    def forkers(self, mains: list[ContainerRun]) -> dict[str, Forker]:
        """The main containers to fork from the preloading server (none without --preload)."""
        if self.preloader is None:
            return {}
        # The fork server's /etc/hosts is the job's file, seen by every pod forked from it: read-only.
        # A kept server's is the pool's file, given each job's entries in turn (pool.hosts_view).
        if self.preloader.pooled:
            from torchjob.engines.local import pool

            if not self.pool_checked and mains:  # once per job: this call's environment or directory
                self.pool_checked = True
                self.preloader = pool.for_job(self.preloader, mains[0])
            if self.preloader.state == "none":  # its server starts in this job's network: the pool's
                self.preloader.network = self.net.namespace
            elif self.preloader.network is not self.net.namespace:
                logs.debug("warm pool: not used: the server runs in another network than the job")
                return {}
            usable, enter = pool.hosts_view(self.preloader, self.hosts.text if self.hosts.mount else None)
            if not usable:
                logs.debug("warm pool: not used: the server was started with another /etc/hosts setting")
                return {}
            self.preloader.before_exec = enter
        else:
            shared = (
                None
                if self.hosts.mount is None
                else podnames.HostsMount.of(str(self.dir.path / "hosts"), True)
            )
            self.preloader.before_exec = shared.enter if shared is not None else None
            self.preloader.network = self.net.namespace
        chosen: dict[str, Forker] = {
            run.name: self.preloader.fork for run in mains if self.preloader.accepts(run)
        }
        if self.preloader.pooled:  # why a call is cold, under -v
            for run in mains:
                if run.name not in chosen:
                    logs.debug("warm pool: %s starts cold: %s", run.name, self.preloader.why_not(run))
        return chosen

    def base_env(
        self, plan: PodPlan, address: str, attempt: int, uid: str, retry_count: int
    ) -> dict[str, str]:
        """The engine's own variables for one pod: addresses, ports, attempt and the job's markers."""
        spec = plan.manifest["spec"]
        env = {
            "HOSTNAME": podnames.hostname_of(plan.name, spec),
            "PYTHONUNBUFFERED": "1",
            "TORCHJOB_JOB_DIR": str(self.dir.path),
            "TORCHJOB_POD_NAME": plan.name,
            "TORCHJOB_POD_IP": address,
            "TORCHJOB_ATTEMPT": str(attempt),
            "TORCHJOB_RETRY_COUNT": str(retry_count),
            "TORCHJOB_WAIT_INTERVAL": NUDGED_INTERVAL if self.nudged else WAIT_INTERVAL,
            "TORCHJOB_BIN": str(self.dir.bin),
            # torchrun starts its ranks with this interpreter: the guard (pyrunner/pyrun.py) that tells
            # an abort in the interpreter's teardown after the program finished from a crash.
            pyrun.PYTHON_EXEC: str(self.dir.bin / pyrun.RANK_SHIM),
            # Only where the machine's ports are shared can a listener there be someone else's: in
            # the job's own network every socket is the job's, and the probe skips reading whose
            # (the /proc tables cost 7 ms of the kernel's time a poll: plugins/waitmaster.py).
            UIDS_ENV: self.uids if self.net.namespace is None else "",
            **self.volcano_env,
        }
        temp = self.temp.for_pod(spec)
        if temp is not None:
            env["TMPDIR"] = temp
        for declared, host in self.ports.items():
            env[f"TORCHJOB_PORT_{declared}"] = str(host)
        env[process.MARKER] = self.dir.id
        env[process.POD_MARKER] = uid
        return env

    @property
    def nudged(self) -> bool:
        """Whether the supervisor can wake the job's waiting helpers (nudge.py): the job's
        network can be asked for its listeners."""
        return self.net.watchable

    def ports_text(self) -> str:
        return ", ".join(f"{d}->{h}" for d, h in self.ports.items()) or "none"


def _declared_gpus() -> gpus.Inventory | None:
    """The GPUs declared (``TORCHJOB_CAPACITY``, the queue settings' ``capacity``), which replace
    the machine's; None when none are."""
    from torchjob.engines.local.admission.capacity import declared_gpus

    return declared_gpus()


def job_uids(job: Job) -> str:
    """The uids the job's processes run as (torchjob's own, then every runAsUser applied), as
    ``TORCHJOB_JOB_UIDS`` gives them: on a machine whose ports every user shares, a listener of
    another uid on the master's port is not the job's master (see plugins/waitmaster.py)."""
    uids = [os.geteuid()]
    for task in job.spec.tasks:
        spec = task.template.spec
        for container in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
            if isinstance(container, dict):
                uid = security.identity(spec, container).uid
                if uid is not None:
                    uids.append(uid)
    return " ".join(str(uid) for uid in dict.fromkeys(uids))


def _uuid4() -> str:
    """A random UUID as ``str(uuid.uuid4())`` gives, without importing uuid (it loads platform)."""
    raw = bytearray(os.urandom(16))
    raw[6] = raw[6] & 0x0F | 0x40  # version 4
    raw[8] = raw[8] & 0x3F | 0x80  # RFC 4122 variant
    h = raw.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def _python() -> str:
    import sys

    return sys.executable
