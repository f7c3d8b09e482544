"""The smallest engine that runs pods itself: a container runtime in this process, for the kubelet.

:class:`FakeRuntime` is all an engine has to write to run Volcano's lifecycle through
``torchjob.controller`` (the controller, the kubelet, the report builder): make an attempt's
containers from its pod, start one (here a shell process of this process, its output in the
container's log), poll it and signal it. :class:`FakeHost` is the loop an engine runs around the
controller, in this process: the shared lifecycle scenarios (test_engine_lifecycle.py) run on it as
a third leg beside the local and Slurm engines.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from torchjob.controller import Controller
from torchjob.controller.kubelet import CannotStart, Container, Kubelet, Pod, RuntimeHooks
from torchjob.controller.report import job_report, pod_ranks, short_name
from torchjob.display import prefix_for
from torchjob.expand import Attempts, DesiredState, PodPlan, expand
from torchjob.files import LogFollower
from torchjob.lifecycle import Action, JobStatus
from torchjob.logs import Level
from torchjob.reports import Event, JobReport
from torchjob.spec.model import Job, Task

_REF = re.compile(r"\$(\$|\(([A-Za-z_][A-Za-z0-9_.-]*)\))")
_FIELD = re.compile(r"^metadata\.(labels|annotations)\['([^']*)'\]$")


def expand_refs(text: str, env: dict[str, str]) -> str:
    """Kubernetes' ``$(VAR)``: a defined name is replaced, ``$$`` is a ``$``."""
    return _REF.sub(lambda m: "$" if m[1] == "$" else env.get(m[2], m[0]), text)


def container_env(container: dict[str, object], meta: dict[str, dict[str, str]]) -> dict[str, str]:
    """The container's ``env``: values (with ``$(VAR)``) and the downward API's pod metadata."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHJOB_")}
    for item in container.get("env") or []:  # type: ignore[attr-defined]
        ref = ((item.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath", "")
        found = _FIELD.match(ref)
        value = meta[found[1]].get(found[2], "") if found else expand_refs(str(item.get("value", "")), env)
        env[item["name"]] = value
    return env


class FakeRuntime(RuntimeHooks):
    """Containers as shell processes of this process: start, poll, signal."""

    def __init__(self, host: FakeHost) -> None:
        self.host = host
        self.attempts: dict[str, int] = {}

    def prepare(self, plan: PodPlan, status: JobStatus) -> Pod:
        attempt = self.attempts[plan.name] = self.attempts.get(plan.name, -1) + 1
        log_dir = self.host.dir / "logs" / plan.name / str(attempt)
        log_dir.mkdir(parents=True)
        spec, meta = plan.manifest["spec"], plan.manifest["metadata"]
        containers = []
        for kind in ("initContainers", "containers"):
            for c in spec.get(kind) or []:
                env = container_env(c, meta)
                argv = [expand_refs(a, env) for a in [*(c.get("command") or []), *(c.get("args") or [])]]
                if argv[:1] in (["python"], ["python3"]):  # as on every engine: this interpreter
                    argv[0] = sys.executable
                containers.append(
                    Container(c["name"], kind == "initContainers", (argv, env), log_dir / f"{c['name']}.log")
                )
        pod = Pod(
            name=plan.name,
            task=plan.task.name,
            index=plan.index,
            attempt=attempt,
            containers=containers,
            restart_policy=plan.task.template.restart_policy,
            log_dir=log_dir,
            rank=self.host.ranks.get((plan.task.name, plan.index)),
        )
        self.host.follow(pod)
        return pod

    def start(self, pod: Pod, container: Container) -> subprocess.Popen[bytes]:
        argv, env = container.spec
        try:
            with open(container.log, "ab") as log:
                return subprocess.Popen(
                    argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
                )
        except OSError as err:
            raise CannotStart(127, str(err)) from None

    def poll(self, pod: Pod, container: Container) -> int | None:
        code = container.handle.poll()
        return None if code is None else 128 - code if code < 0 else code

    def signal(self, pod: Pod, container: Container, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(container.handle.pid, signum)

    def note(self, text: str, level: Level) -> None:
        self.host.said.append(f"torchjob: {text}")

    def record(self, text: str) -> None:
        self.host.events.append(Event(time.time(), text))
        self.note(text, Level.WARNING)


class _Loopback:
    """Every pod at this machine's loopback address; each declared port a free one of this machine
    (another copy of the suite may run beside this one)."""

    def __init__(self) -> None:
        self.ports: dict[int, int] = {}

    def host(self, job: Job, task: Task, index: int) -> str:
        return "127.0.0.1"

    def service(self, job: Job, task: Task, index: int) -> str:
        return "127.0.0.1"

    def port(self, job: Job, port: int) -> int:
        if port not in self.ports:
            with socket.socket() as free:
                free.bind(("127.0.0.1", 0))
                self.ports[port] = free.getsockname()[1]
        return self.ports[port]


class FakeHost:
    """One job run in this process: the controller over the kubelet over :class:`FakeRuntime`,
    passes every 20 ms, the followed logs as ``prefix | line``, ``ttlSecondsAfterFinished`` kept."""

    def __init__(
        self, job: Job, root: Path, *, timeout: float | None = None, max_restarts: int | None = None
    ):
        self.job = job
        self.dir = root / job.name
        self.dir.mkdir(parents=True)
        self.events: list[Event] = []
        self.said: list[str] = []  # notes, as on standard error
        self.lines: list[str] = []  # the followed logs, as on standard output
        self.follower = LogFollower()
        self.first: DesiredState = expand(job, _Loopback())
        self.attempts = Attempts(self.first)
        self.ranks = pod_ranks(job)
        self.kubelet = Kubelet(FakeRuntime(self))
        self.controller: Controller[Pod] = Controller(
            job,
            self.kubelet,
            self.attempts,
            clock=time.monotonic,
            timeout=timeout,
            max_restarts=max_restarts,
            attached=True,
        )
        self.started, self.finished = time.time(), None
        self.stop = threading.Event()

    def follow(self, pod: Pod) -> None:
        short = short_name(self.job.name, pod.name)
        for c in pod.containers:
            name = c.name if c.init or len(pod.mains) > 1 else None
            self.follower.follow(c.log, prefix_for(short, pod.rank, name))

    def run(self) -> JobReport:
        ctl = self.controller
        ctl.begin()
        while not ctl.done():
            if self.stop.is_set() and not ctl.status.phase.final:
                ctl.act(Action.TERMINATE_JOB, None, None, "the job was deleted")
            ctl.tick()
            self.lines += [f"{item.prefix} | {text}" for item, text in self.follower.read()]
            due = ctl.next_due()
            time.sleep(0.02 if due is None else min(0.02, due))
        self.finished = time.time()
        self.follower.seal()
        self.lines += [f"{item.prefix} | {text}" for item, text in self.follower.read()]
        return self.report()

    def report(self) -> JobReport:
        ctl = self.controller
        return job_report(
            self.job, engine="fake", id=self.job.name, location=str(self.dir), status=ctl.status,
            latest=ctl.latest, current=ctl.pods, started=self.started,
            finished=self.finished, events=self.events,
        )  # fmt: skip

    def expired(self) -> bool:
        """Past its ttlSecondsAfterFinished: then the job and its logs are removed."""
        ttl = self.job.spec.ttl_seconds_after_finished
        if ttl is None or self.finished is None or time.time() < self.finished + ttl:
            return False
        shutil.rmtree(self.dir, ignore_errors=True)
        return True

    def kill_all(self) -> None:
        """At the end of a test: nothing of the job outlives it."""
        pods = list(self.controller.pods.values())
        self.kubelet.kill(pods)
        for pod in pods:
            for c in pod.containers:
                if c.handle is not None:
                    c.handle.wait(5)
