"""The job controller loop: runs pods, feeds their changes to the lifecycle, carries out decisions.

Each pass of the loop: poll every pod (the kubelet part), turn each observed change into
reactions (events resolved to actions by :mod:`torchjob.lifecycle`), ``step`` the state machine,
stop the pods a decision kills and create missing pods when it says so. Log files are followed and
printed on the same pass. Between passes the loop sleeps until a container process exits, a
signal arrives or something falls due (a delayed reaction, a restart, the next scan or log read):
an exit is seen at once and an idle job costs almost no CPU. When the job's phase is final,
whatever still runs is stopped, every process carrying the job's marker is swept up, and the loop
ends.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

from torchjob import logs
from torchjob.display import headline, pod_color, pod_rows, prefix_for, summary
from torchjob.engines.base import ContainerReport, FailureReport, JobReport, PodReport, PortReport
from torchjob.engines.local import gpus, podnames, process, procfs, security
from torchjob.engines.local import ports as port_registry
from torchjob.engines.local.addressing import LocalAddressing
from torchjob.engines.local.containers import (
    PodSetup,
    ResolveError,
    configmaps_of,
    local_warnings,
    make_empty_dirs,
    resolve_pod,
)
from torchjob.engines.local.output import Console, short_name
from torchjob.engines.local.pod import FAILED, PENDING, RUNNING, SUCCEEDED, LocalPod
from torchjob.engines.local.prewarm import modules_of as prewarm_modules
from torchjob.engines.local.state import JobDir, make_private_dirs
from torchjob.engines.local.waiter import ExitWaiter
from torchjob.engines.local.watchdog import Watchdog
from torchjob.expand import DesiredState, PodPlan, expand
from torchjob.files import LogFollower, write_atomic
from torchjob.lifecycle import (
    Action,
    Decision,
    JobPhase,
    JobStatus,
    PodChange,
    PodPhase,
    PodStatus,
    Reaction,
    cancels_delay,
    initial_status,
    reactions,
    step,
)
from torchjob.plugins import build_plugins
from torchjob.records import record
from torchjob.spec.manifest import job_manifest
from torchjob.spec.model import Job

TICK = 0.02  # seconds between polls while pods are being stopped (their strays cannot be waited on)
IDLE_WAIT = 0.1  # longest sleep of the loop; exits and signals wake it at once
LOG_EVERY = 0.05  # seconds between reads of the followed log files when they are printed
TRACK_EVERY = 0.5  # seconds between scans for container descendants
DEFAULT_GRACE = 5.0  # seconds from SIGTERM to SIGKILL when the pod sets no terminationGracePeriodSeconds
WAIT_INTERVAL = "0.05"  # wait-for-master polling, so a worker starts soon after the master listens
STUCK_AFTER_KILL = 5.0  # a process that outlives SIGKILL this long is given up on (D state)
STOPPED = "Stopped"  # reported phase of a pod the engine stopped before it ended by itself
VOLCANO_MOUNT = "/etc/volcano"  # where Volcano's svc plugin mounts its host files
OUTPUT_STALL = 2.0  # at the end, seconds a reader may take nothing before the rest is only counted

Key = tuple[str, int]


@record
class _Delayed:
    due: float
    reaction: Reaction


class Supervisor:
    def __init__(
        self,
        job: Job,
        job_dir: JobDir,
        *,
        console: Console | None,
        echo_logs: bool,
        timeout: float | None,
        extra_env: dict[str, str],
        prewarm: bool = True,
    ) -> None:
        self.job = job
        self.dir = job_dir
        self.id = job_dir.id
        self.console = console
        self.echo_logs = echo_logs and console is not None
        self.extra_env = dict(extra_env)
        self.prewarm_modules = prewarm_modules(job) if prewarm else ()  # prewarm.py
        deadlines = [t for t in (timeout, job.run_policy and job.run_policy.active_deadline_seconds) if t]
        self.timeout: float | None = float(min(deadlines)) if deadlines else None
        self.status: JobStatus = initial_status()
        self.pods: dict[Key, LocalPod] = {}  # pods that exist now (finished ones included)
        self.latest: dict[Key, LocalPod] = {}  # the newest attempt of every pod, for reports
        self.seen: dict[Key, tuple[str, int, int | None]] = {}  # reported phase, restarts, exit code
        self.attempts: dict[Key, int] = {}
        self.delayed: list[_Delayed] = []
        self.events: list[dict[str, Any]] = []
        self.follower = LogFollower()
        self.signals: list[int] = []
        self.started = time.time()
        self.finished: float | None = None
        self.ports: dict[int, int] = {}
        self.addressing: LocalAddressing | None = None
        self.expansions: dict[tuple[int, int], DesiredState] = {}
        self.watchdog: Watchdog | None = None
        self.waiter = ExitWaiter()  # woken by container exits (pidfds) and signals
        self.dirty = True
        self.rank_of: dict[Key, str | None] = {}
        self.volcano_env: dict[str, str] = {}  # where the /etc/volcano files are here, when mounted
        self.interrupted: int | None = None
        self.created: list[PodChange] = []
        self.job_pids: set[int] = set()  # descendants seen, to reap once they are adopted
        self.foreign: set[int] = set()  # this process's children from before the job: not the job's
        self.told: set[int] = set()  # job processes the watchdog knows of
        self.running = False  # the job started (its pods were created)
        self.status_error = ""  # why status.json could not be written, once said
        self.waiting: set[str] = set()  # tasks whose dependsOn is not met yet
        self.hosts_mount: podnames.HostsMount | None = None  # set when pod names can resolve
        self.name_resolution = "addresses only"
        self.gpu_env: dict[Key, gpus.PodEnv] = {}  # CUDA_VISIBLE_DEVICES shares, kept across restarts

    # ------------------------------------------------------------------ setup

    def prepare(self) -> DesiredState:
        self.dir.write_pid()
        self.write_status(must=True)  # before any pod: a job whose status cannot be written never starts
        probe = self.start_names_probe()  # runs in a child while the ports are reserved
        try:
            self.ports = port_registry.reserve(self.id, port_registry.declared_ports(self.job))
            self.dir.write_shims(_python())  # not resolved: a venv's python is a symlink
        finally:
            names_resolve = self.finish_names_probe(probe)  # the child is reaped whatever happened
        self.addressing = LocalAddressing(self.job, self.ports, names=names_resolve)
        state = self.expansion(0, 0)
        self.dir.write_configmaps(configmaps_of(state))
        pod_specs = {(p.task.name, p.index): p.manifest["spec"] for p in state.pods}
        self.gpu_env, gpu_note = gpus.job_env(pod_specs)
        if gpu_note:
            self.note(gpu_note)
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

    def start_names_probe(self) -> tuple[podnames.HostsMount, podnames.Probe]:
        """Write the job's hosts file and start checking whether its processes can get it as /etc/hosts."""
        hosts = self.dir.path / "hosts"
        try:
            with open(podnames.ETC_HOSTS) as handle:
                machine = handle.read()
        except OSError:
            machine = ""
        entries = LocalAddressing(self.job).hosts_entries(self.job)  # addresses only: no ports
        write_atomic(hosts, podnames.hosts_text(machine, entries))
        if security.other_users([t.template.spec for t in self.job.spec.tasks]):
            hosts.chmod(0o644)  # read as /etc/hosts by pods that run as another user; nothing secret
        mount = podnames.HostsMount.of(str(hosts))
        return mount, podnames.start_probe(mount)

    def finish_names_probe(self, probe: tuple[podnames.HostsMount, podnames.Probe]) -> bool:
        """Decide, once per job, whether pod names resolve (the probe's answer)."""
        mount, running = probe
        why_not = running.result()
        if why_not is None:
            self.hosts_mount = mount
            self.name_resolution = "resolved"
            logs.debug("pod names resolve: every container's /etc/hosts is %s", mount.source.decode())
        else:
            self.name_resolution = f"addresses only ({why_not})"
            logs.debug("pod names do not resolve, addresses are used instead: %s", why_not)
        return why_not is None

    def write_records(self) -> None:
        """job.yaml and pods.yaml are for people and tools, not the pods: written once pods run."""
        from torchjob.render import dump, list_of

        state = self.expansion(0, 0)
        write_atomic(self.dir.path / "job.yaml", dump(job_manifest(self.job), "yaml"))
        items = [*state.objects, *(p.manifest for p in state.pods)]
        write_atomic(self.dir.path / "pods.yaml", dump(list_of(items), "yaml"))

    def expansion(self, version: int, retry_count: int) -> DesiredState:
        key = (version, retry_count)
        if key not in self.expansions:
            self.expansions = {
                key: expand(self.job, self.addressing, version=version, retry_count=retry_count)
            }
        return self.expansions[key]

    # -------------------------------------------------------------- the loop

    def run(self, on_started: Callable[[], None] | None = None) -> None:
        """Run the job to its end; ``on_started`` is called once its pods have been started."""
        try:
            self.start()
            self.running = True
            if on_started is not None:
                on_started()
            self.loop()
        except OSError as err:  # the job directory cannot be written (a full disk): end, say why
            # (A bug raising OSError ends the job the same way, with its reason, not a traceback.)
            self.stop_for(err)
        finally:
            self.shutdown()  # whatever happened above, nothing of the job outlives this

    def stop_for(self, err: OSError) -> None:
        where = f" ({err.filename})" if err.filename else ""
        if not where and err.errno in (errno.ENOSPC, errno.EDQUOT):
            where = f" (writing to {self.dir.path})"
        reason = f"torchjob stopped the job: {err.strerror or err}{where}"
        self.note(f"{err.strerror or err}{where}: stopping the job", "31")
        if not self.status.phase.final:
            self.status = JobStatus(JobPhase.FAILED, self.status.retry_count, self.status.version, reason)
            self.dirty = True

    def start(self) -> None:
        self.prepare()
        self.foreign = set(process.children_of_self())  # a library caller's own processes
        process.set_child_subreaper(True)
        self.watchdog = Watchdog(self.id)
        self.note(f"job {self.id} started; ports {self.ports_text()}; job directory {self.dir.path}")
        for task in self.job.spec.tasks:
            if task.template.restart_policy == "Always" and task.replicas:
                self.note(
                    f"task {task.name}: restartPolicy Always (the Kubernetes default) restarts containers "
                    "even after they succeed; set OnFailure or Never for a job that ends",
                    "33",
                )
        for path, message in local_warnings(self.expansion(0, 0), self.extra_env):
            self.record(f"warning: {path}: {message}")
        self.apply(Decision(self.status, None, True))
        self.write_records()

    def loop(self) -> None:
        last_track = time.monotonic()  # the pods have only just started: nothing to find yet
        while True:
            now = time.monotonic()
            self.handle_signals()
            if self.deadline_passed():
                self.act(Action.TERMINATE_JOB, None, None, f"the job's deadline of {self.timeout:g}s passed")
            if now - last_track > TRACK_EVERY:
                self.track()
                last_track = now
            self.poll_pods(now)
            self.fire_delayed(now)
            self.print_logs()
            if self.dirty:
                self.write_status()
            if self.status.phase.final and not self.busy():
                return
            self.waiter.wait(self.next_wait(last_track))

    def next_wait(self, last_track: float) -> float:
        """Seconds until something needs the loop that no exit or signal announces."""
        now = time.monotonic()
        if self.created:  # created pods are reported on the next pass
            return 0.0
        if any(p.terminating and not p.gone for p in self.pods.values()):
            return TICK
        due = [last_track + TRACK_EVERY, now + (LOG_EVERY if self.echo_logs else IDLE_WAIT)]
        due += [d.due for d in self.delayed]
        due += [c.next_start for p in self.pods.values() for c in p.containers if c.next_start is not None]
        if self.timeout is not None:
            due.append(now + self.started + self.timeout - time.time())
        return max(0.0, min(due) - now)

    def track(self) -> None:
        """Record every container's descendants and reap the ones that were adopted and ended."""
        tree = process.children_map()
        for pod in self.pods.values():
            pod.track(tree)
        self.job_pids.update(p.pid for pod in self.pods.values() for p in pod.tracked())
        self.job_pids.update(process.adopted(tree, self.known_children(), self.id))
        self.tell_watchdog()
        process.reap_adopted(self.job_pids)
        self.job_pids = {pid for pid in self.job_pids if process.pid_exists(pid)}

    def known_children(self) -> set[int]:
        """This process's children that are not adopted orphans: container main processes not yet
        reaped, the watchdog, the caller's own."""
        known = set(self.foreign)
        for pod in [*self.pods.values(), *self.latest.values()]:
            known.update(pod.child_pids())
        if self.watchdog is not None:
            known.add(self.watchdog.pid)
        return known

    def adopt(self) -> list[int]:
        """Job processes this process adopted (orphans of container main processes that ended)."""
        found = process.adopted(process.children_map(), self.known_children(), self.id)
        self.job_pids.update(found)
        return found

    def tell_watchdog(self) -> None:
        """The watchdog learns every job process seen, to stop also those without the job's marker."""
        if self.watchdog is None:
            return
        for pid in self.job_pids - self.told:
            with contextlib.suppress(OSError, ValueError, IndexError):
                self.watchdog.watch_pid(pid, procfs.start_ticks(pid))
        self.told = set(self.job_pids)

    def deadline_passed(self) -> bool:
        if self.timeout is None or self.status.phase.final or self.status.phase is JobPhase.TERMINATING:
            return False
        return time.time() - self.started > self.timeout

    def busy(self) -> bool:
        return any(
            not p.gone and (p.terminating or p.phase in (PENDING, RUNNING)) for p in self.pods.values()
        )

    # ---------------------------------------------------------------- pods

    def pod_statuses(self) -> list[PodStatus]:
        """The pods as reported so far: a change not yet reported is not seen by the lifecycle.

        Several pods can end in one tick; judging the job by their live phases while their
        changes are still being reported one by one would end it before a policy sees them.
        """
        out = []
        for key, pod in self.pods.items():
            phase, restarts, exit_code = self.seen[key]
            out.append(PodStatus(key[0], key[1], PodPhase(phase), restarts, exit_code, pod.terminating))
        return out

    def poll_pods(self, now: float) -> None:
        created, self.created = self.created, []
        for change in created:  # reported on their own, before what happened to them since
            self.on_change(change)
        for pod in self.pods.values():
            pod.poll(now)
            if pod.terminating and not pod.gone and pod.stuck(now, STUCK_AFTER_KILL):
                self.note(
                    f"pod {short_name(self.job.name, pod.name)}: processes {pod.live_pids()} "
                    "survive SIGKILL; giving up on them",
                    "31",
                )
                pod.gone = True
        gone = [pod for pod in self.pods.values() if pod.gone]
        if gone:
            # A pod is gone only with all of its processes, also those that escaped its groups.
            left = process.sweep(process.POD_MARKER, [pod.uid for pod in gone])
            process.reap_adopted(self.job_pids)  # the killed orphans: no zombie is left of the pods
            if left:
                self.note(f"processes {[p.pid for p in left]} of stopped pods survive SIGKILL", "31")
        for key, pod in list(self.pods.items()):
            old = self.seen.get(key)
            if pod.gone:
                del self.pods[key]
                self.seen.pop(key, None)
                self.close_logs(pod)
                change = PodChange(
                    key[0], key[1], _phase(old[0]) if old else None, None, pod.exit_code, killed=True
                )
                self.on_change(change)
                continue
            current = (pod.phase, pod.restarts, pod.exit_code)
            if old == current:
                continue
            self.seen[key] = current
            if pod.phase in (SUCCEEDED, FAILED):
                self.close_logs(pod)
            if old is not None and old[1] != current[1]:
                self.note(
                    f"pod {short_name(self.job.name, pod.name)}: container restart {pod.restarts} "
                    f"(restartPolicy {pod.restart_policy})",
                    "33",
                )
            change = PodChange(
                key[0], key[1], _phase(old[0]) if old else None, PodPhase(pod.phase), pod.exit_code
            )
            self.on_change(change)

    def on_change(self, change: PodChange) -> None:
        self.dirty = True
        for reaction in reactions(self.job, change, self.pod_statuses()):
            self.delayed = [
                d
                for d in self.delayed
                if not (
                    (d.reaction.task, d.reaction.index) == (reaction.task, reaction.index)
                    and cancels_delay(d.reaction.event, reaction.event)
                )
            ]
            if reaction.action is not Action.SYNC_JOB:
                self.record(reaction.cause)
            if reaction.delay:
                self.delayed.append(_Delayed(time.monotonic() + reaction.delay, reaction))
                continue
            self.act(reaction.action, reaction.task, reaction.index, reaction.cause)
        self.act(Action.SYNC_JOB, None, None, "")

    def fire_delayed(self, now: float) -> None:
        due = [d for d in self.delayed if d.due <= now]
        if not due:
            return
        self.delayed = [d for d in self.delayed if d.due > now]
        for d in due:
            r = d.reaction
            self.act(r.action, r.task, r.index, f"{r.cause} (after its timeout)")

    def act(self, action: Action, task: str | None, index: int | None, cause: str) -> None:
        decision = step(
            self.job, self.status, self.pod_statuses(), action, task=task, index=index, cause=cause
        )
        self.apply(decision, cause)

    def apply(self, decision: Decision, cause: str = "", depth: int = 0) -> None:
        old = self.status
        self.status = decision.status
        now = time.monotonic()
        if decision.kill is not None:
            selected = [self.pods[(s.task, s.index)] for s in self.pod_statuses() if decision.kill.selects(s)]
            tree = process.children_map() if selected else None  # one scan for all of them
            for pod in selected:
                pod.terminate(now, self.grace_of(pod), tree)
                self.dirty = True
        if decision.create_pods and not self.status.phase.final:
            self.create_missing(now)
        if old.phase is not self.status.phase or old.retry_count != self.status.retry_count:
            color = {"Completed": "32", "Failed": "31", "Aborted": "31", "Terminated": "31"}.get(
                self.status.phase.value, "36"
            )
            self.note(f"job {self.status.phase.value}: {self.status.reason}", color)
            self.dirty = True
        if decision.resync and depth < 8:
            # The phase changed because of ``cause``; the follow-up sync keeps it in the reason.
            again = step(self.job, self.status, self.pod_statuses(), Action.SYNC_JOB, cause=cause)
            self.apply(again, cause, depth + 1)

    def grace_of(self, pod: LocalPod) -> float:
        task = self.job.task(pod.task)
        value = task.template.spec.get("terminationGracePeriodSeconds") if task else None
        return (
            float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else DEFAULT_GRACE
        )

    def create_missing(self, now: float) -> None:
        state = self.expansion(self.status.version, self.status.retry_count)
        for plan in state.pods:
            key = (plan.task.name, plan.index)
            if key not in self.pods and self.dependencies_ready(plan.task.name):
                self.create(plan, now)

    def task_ready(self, name: str) -> bool:
        """A task other tasks may depend on is ready once minAvailable of its pods run or succeeded."""
        task = self.job.task(name)
        if task is None:
            return True
        need = task.min_available if task.min_available is not None else task.replicas
        up = 0
        for key, (phase, _restarts, _code) in self.seen.items():
            if key[0] == name and phase in (RUNNING, SUCCEEDED) and not self.pods[key].terminating:
                up += 1
        return up >= need

    def dependencies_ready(self, name: str) -> bool:
        """Volcano's dependsOn: pods of a task start once any (or all) of the named tasks are ready."""
        task = self.job.task(name)
        if task is None or task.depends_on is None or not task.depends_on.names:
            return True
        ready = [self.task_ready(dep) for dep in task.depends_on.names]
        met = all(ready) if task.depends_on.iteration == "all" else any(ready)
        if not met and name not in self.waiting:
            self.waiting.add(name)
            self.note(f"task {name} waits for task(s) {', '.join(task.depends_on.names)} to be running")
        if met:
            self.waiting.discard(name)
        return met

    def create(self, plan: PodPlan, now: float) -> None:
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
            configmaps=configmaps_of(self.expansion(self.status.version, self.status.retry_count)),
            configmap_dir=self.dir.volumes,
            pod_dir=pod_dir,
            base_env=self.base_env(plan, address, attempt, uid),
            extra_env=self.extra_env,
            gpu_env=self.gpu_env.get(key, {}),
        )
        log_dir = self.dir.log_dir(plan.name, attempt)
        try:
            make_empty_dirs(ctx)
            inits, mains = resolve_pod(ctx)
            if self.hosts_mount is not None:  # the job's /etc/hosts, so that pod names resolve
                for run in [*inits, *mains]:  # mounted before the process drops to its runAsUser
                    run.before_exec = security.then(self.hosts_mount.enter, run.before_exec)
        except (ResolveError, OSError) as err:  # checked before the job started; defensive only
            make_private_dirs(log_dir)
            write_atomic(log_dir / "torchjob.log", f"torchjob: cannot run pod {plan.name}: {err}\n")
            inits, mains = [], []
        pod = LocalPod(
            name=plan.name,
            task=plan.task.name,
            index=plan.index,
            attempt=attempt,
            inits=inits,
            mains=mains,
            restart_policy=plan.task.template.restart_policy,
            log_dir=log_dir,
            on_group=self.on_group,
            adopt=self.adopt,
            prewarm_modules=self.prewarm_modules,
        )
        pod.address = address
        pod.uid = uid
        pod.rank = self.rank_of.get(key)
        self.pods[key] = pod
        self.latest[key] = pod
        self.follow_logs(pod)
        if not mains:
            pod.fail_now(2)
        else:
            pod.start(now)
        # Reported as created Pending; what happened since comes with the next poll.
        self.seen[key] = (PENDING, 0, None)
        self.created.append(PodChange(key[0], key[1], None, PodPhase.PENDING))
        self.dirty = True

    def base_env(self, plan: PodPlan, address: str, attempt: int, uid: str) -> dict[str, str]:
        spec = plan.manifest["spec"]
        env = {
            "HOSTNAME": str(spec.get("hostname") or plan.name),
            "PYTHONUNBUFFERED": "1",
            "TORCHJOB_JOB_DIR": str(self.dir.path),
            "TORCHJOB_POD_NAME": plan.name,
            "TORCHJOB_POD_IP": address,
            "TORCHJOB_ATTEMPT": str(attempt),
            "TORCHJOB_RETRY_COUNT": str(self.status.retry_count),
            "TORCHJOB_WAIT_INTERVAL": WAIT_INTERVAL,
            "TORCHJOB_BIN": str(self.dir.bin),
            **self.volcano_env,
        }
        for declared, host in self.ports.items():
            env[f"TORCHJOB_PORT_{declared}"] = str(host)
        env[process.MARKER] = self.id
        env[process.POD_MARKER] = uid
        return env

    def on_group(self, pgid: int, started: bool) -> None:
        if started:  # a container's main process: its pid is its group's id
            self.waiter.add(pgid)
        else:
            self.waiter.remove(pgid)
        if self.watchdog is None:
            return
        if started:
            self.watchdog.watch(pgid)
        else:
            self.watchdog.forget(pgid)

    # ----------------------------------------------------------- signals

    def install_signals(self) -> dict[int, Any]:
        if threading.current_thread() is not threading.main_thread():
            return {}
        previous: dict[int, Any] = {}

        def handler(signum: int, frame: FrameType | None) -> None:
            self.signals.append(signum)
            self.waiter.wake()

        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            previous[sig] = signal.signal(sig, handler)
        return previous

    def handle_signals(self) -> None:
        if not self.signals:
            return
        signals, self.signals = self.signals, []
        for signum in signals:
            name = signal.Signals(signum).name
            if self.status.phase in (JobPhase.TERMINATING, JobPhase.TERMINATED) or self.status.phase.final:
                self.note(f"{name} again: killing every process of the job now", "31")
                for pod in self.pods.values():
                    pod.kill()
                continue
            self.interrupted = self.interrupted or signum
            self.note(f"{name}: stopping the job (again to kill at once)", "33")
            self.act(Action.TERMINATE_JOB, None, None, f"torchjob received {name}")

    # ------------------------------------------------------------- output

    def note(self, text: str, color: str = "2") -> None:
        logs.info(text)
        if self.console is not None:
            self.console.note(text, color)

    def record(self, text: str) -> None:
        self.events.append({"time": time.time(), "message": text})
        self.events = self.events[-50:]
        self.note(text, "33")

    def follow_logs(self, pod: LocalPod) -> None:
        if not self.echo_logs:
            return
        short = short_name(self.job.name, pod.name)
        ordinal = self.addressing.ordinals[(pod.task, pod.index)] if self.addressing else 0
        for c in pod.inits:
            self.follower.follow(c.log, prefix_for(short, pod.rank, c.run.name), pod_color(ordinal))
        for c in pod.mains:
            name = None if len(pod.mains) == 1 else c.run.name
            self.follower.follow(c.log, prefix_for(short, pod.rank, name), pod_color(ordinal))

    def close_logs(self, pod: LocalPod) -> None:
        for c in pod.containers:
            self.follower.close(c.log)

    def print_logs(self) -> None:
        if not self.echo_logs or self.console is None:
            return
        # A slow reader is not fed more than it takes: the log files keep the rest until it has room.
        lines = self.follower.read() if self.console.room() else []
        if lines:
            self.console.lines((item.prefix, item.color, text) for item, text in lines)
        else:
            self.console.stream.flush()
        if self.console.live:
            report = self.report()
            self.console.table([headline(report, True), *pod_rows(report, True, limit=20)])

    def remove_job_dir(self) -> None:
        import shutil

        shutil.rmtree(self.dir.path, ignore_errors=True)
        self.note(f"job {self.id} removed: its directory could not be written")

    def drain_logs(self) -> None:
        """Print every line still in the log files, or count what a stalled reader never took."""
        for pod in self.latest.values():
            self.close_logs(pod)
        if not self.echo_logs or self.console is None:
            return
        self.follower.seal()  # every process of the job is gone: nothing is waited for beyond this
        interrupted = lambda: bool(self.signals)  # noqa: E731 - Ctrl-C stops the printing, not the count
        while self.follower.files and self.console.drain(OUTPUT_STALL, interrupted):
            self.print_logs()
        self.console.unshown += self.follower.skip()

    def ports_text(self) -> str:
        return ", ".join(f"{d}->{h}" for d, h in self.ports.items()) or "none"

    # ------------------------------------------------------------- status

    def pod_report(self, pod: LocalPod) -> PodReport:
        containers = [
            ContainerReport(
                name=c.run.name,
                init=c.run.init,
                state="running" if c.running else ("terminated" if c.exit_code is not None else "waiting"),
                exit_code=c.exit_code,
                restarts=c.restarts,
            )
            for c in pod.containers
        ]
        current = self.pods.get((pod.task, pod.index)) is pod
        return PodReport(
            name=pod.name,
            short=short_name(self.job.name, pod.name),
            task=pod.task,
            index=pod.index,
            phase=pod.phase if current else _ended_phase(pod),
            rank=int(pod.rank) if pod.rank is not None and pod.rank.isdigit() else None,
            attempt=pod.attempt,
            restarts=pod.restarts,
            exit_code=pod.exit_code,
            started_at=pod.started_at,
            finished_at=pod.finished_at,
            address=pod.address,
            containers=containers,
            terminating=pod.terminating and not pod.gone,
        )

    def report(self) -> JobReport:
        pods = [self.pod_report(p) for p in self.latest.values()]
        failed = [p for p in pods if p.phase == FAILED]
        first = min(failed, key=lambda p: p.finished_at or 0.0) if failed else None
        return JobReport(
            engine="local",
            id=self.id,
            name=self.job.name,
            phase=self.status.phase.value,
            reason=self.status.reason,
            namespace=self.job.metadata.namespace,
            location=str(self.dir.path),
            retry_count=self.status.retry_count,
            max_retry=self.job.spec.max_retry,
            started_at=self.started,
            finished_at=self.finished,
            pods=pods,
            ports=[PortReport(d, h) for d, h in self.ports.items()],
            first_failure=None
            if first is None
            else FailureReport(
                first.name, first.short, first.exit_code, first.rank, "Error", first.finished_at
            ),
            events=list(self.events),
            name_resolution=self.name_resolution,
        )

    def write_status(self, must: bool = False) -> None:
        """Write status.json; a failure (a full disk) is said once and retried on the next pass."""
        try:
            self.dir.write_status(self.report())
        except OSError as err:
            if must:
                raise
            if str(err) != self.status_error:
                self.status_error = str(err)
                self.note(f"cannot write {self.dir.status_file}: {err.strerror or err}", "31")
            return
        self.dirty = False
        self.status_error = ""

    # ------------------------------------------------------------ the end

    def shutdown(self) -> None:
        """Stop everything left, whatever happened; bounded in time."""
        now = time.monotonic()
        for pod in self.pods.values():
            if not pod.gone:
                pod.terminate(
                    now, min(self.grace_of(pod), 2.0) if not self.status.phase.final else self.grace_of(pod)
                )
        deadline = time.monotonic() + DEFAULT_GRACE + STUCK_AFTER_KILL
        while any(not p.gone for p in self.pods.values() if p.terminating) and time.monotonic() < deadline:
            self.handle_signals()
            for pod in self.pods.values():
                pod.poll(time.monotonic())
            self.print_logs()
            self.waiter.wait(TICK)
        tracked = [p for pod in self.latest.values() for c in pod.containers for p in c.tracked.values()]
        tracked += _processes(self.adopt())  # orphans without the job's marker, adopted as subreaper
        killed = process.kill_now(self.id, [], tracked, 1.0)
        # Reap what was adopted (subreaper); waiting on our own children reaps them.
        process.wait_gone(process.alive(killed), timeout=1.0)
        process.reap_adopted({p.pid for p in tracked} | {p.pid for p in killed} | self.job_pids)
        process.set_child_subreaper(False)
        if self.watchdog is not None:  # nothing of the job is left to watch; reaped at the end
            self.watchdog.stop()
        try:
            self.waiter.close()
            with contextlib.suppress(OSError):
                port_registry.release(self.id)
            self.drain_logs()
            if not self.status.phase.final:
                self.status = JobStatus(
                    JobPhase.TERMINATED,
                    self.status.retry_count,
                    self.status.version,
                    self.status.reason or "the supervisor stopped",
                )
            self.finished = time.time()
            self.write_status()
            if not self.dir.status_file.exists():  # never written: no command could see the job
                self.remove_job_dir()
            if self.console is not None:
                self.console.end_live()
                for line in summary(self.report(), self.console.color, self.console.unshown):
                    self.console.print(line)
                self.console.finish(OUTPUT_STALL, lambda: bool(self.signals))
        finally:
            if self.watchdog is not None:  # it died while the above was done
                self.watchdog.reap()


def _processes(pids: list[int]) -> list[Any]:
    if not pids:
        return []
    import psutil

    found = []
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            found.append(psutil.Process(pid))
    return found


def _phase(value: str) -> PodPhase:
    return PodPhase(value)


def _ended_phase(pod: LocalPod) -> str:
    """How a pod the engine deleted is reported: ``Stopped`` unless it had finished by itself."""
    return pod.phase if pod.phase in (SUCCEEDED, FAILED) else STOPPED


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
