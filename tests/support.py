"""What the tests share (this module holds no tests): the CLI run as a user runs it, job documents
and files, the local engine driven through the engine interface, bounded waits, leftovers.

In-process helpers that need pytest's fixtures (the CLI's ``main`` with captured output, a
module's ``JOB`` written to a file) are fixtures in ``conftest.py``.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, NamedTuple

import yaml

from torchjob.engine_api.base import JobReport, PodReport, StartOptions
from torchjob.engine_api.registry import get_engine
from torchjob.jobs import load_jobs_from_text
from torchjob.spec.manifest import job_manifest
from torchjob.spec.model import Job

if TYPE_CHECKING:
    from torchjob.engine_api.base import Engine

REPO = Path(__file__).resolve().parent.parent
TESTS = REPO / "tests"

# ---------------------------------------------------------------------- the CLI


class Ran(NamedTuple):
    """What one command said in this process (conftest's ``run_main``), named as a finished
    process's (``subprocess.CompletedProcess``) are, so a check reads either alike."""

    returncode: int
    stdout: str
    stderr: str


def torchjob(
    *args: str,
    home: Path | None = None,
    env: Mapping[str, str] | None = None,
    cwd: Path | str = REPO,
    input: str | None = None,
    timeout: float = 60,
    preexec_fn: Callable[[], object] | None = None,
) -> subprocess.CompletedProcess[str]:
    """``torchjob ARGS`` in a process of its own (``python -m torchjob``), as a user runs it.

    ``env`` is its whole environment (this one's when None); ``home`` sets ``TORCHJOB_HOME``, where
    it keeps its state. Relative paths are read from ``cwd``, the repository unless told.
    ``preexec_fn`` runs in the child before torchjob starts (a umask, capabilities dropped)."""
    environ = dict(os.environ if env is None else env)
    if home is not None:
        environ["TORCHJOB_HOME"] = str(home)
    return subprocess.run(
        [sys.executable, "-m", "torchjob", *args],
        input=input,
        env=environ,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        preexec_fn=preexec_fn,
    )


def cli(
    tmp_path: Path, *args: str, timeout: float = 60, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """``torchjob ARGS`` as a user runs it in ``tmp_path`` (or ``cwd``), with its state under
    ``tmp_path/home`` and colours allowed (``NO_COLOR`` unset)."""
    env = {k: v for k, v in os.environ.items() if k != "NO_COLOR"}
    return torchjob(*args, home=tmp_path / "home", env=env, cwd=cwd or tmp_path, timeout=timeout)


def as_user(user: pwd.struct_passwd, script: str, **extra: Any) -> subprocess.CompletedProcess[str]:
    """``sh -c SCRIPT`` as ``user`` (no supplementary groups), in /, its output captured."""
    return subprocess.run(
        ["sh", "-c", script],
        user=user.pw_uid,
        group=user.pw_gid,
        extra_groups=[],
        capture_output=True,
        text=True,
        timeout=30,
        cwd="/",
        **extra,
    )


# ---------------------------------------------------------------------- jobs


def container(name: str, command: list[str], **extra: Any) -> dict[str, Any]:
    return {"name": name, "image": "busybox:1.36", "command": command, **extra}


def task(
    name: str,
    containers: list[dict[str, Any]],
    *,
    replicas: int = 1,
    restart: str = "Never",
    init: list[dict[str, Any]] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    spec: dict[str, Any] = {"restartPolicy": restart, "containers": containers}
    if init:
        spec["initContainers"] = init
    spec["terminationGracePeriodSeconds"] = 2
    return {"name": name, "replicas": replicas, "template": {"spec": spec}, **extra}


def sh(script: str) -> list[str]:
    return ["sh", "-c", script]


def job_document(name: str, tasks: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    """A Volcano Job with these tasks and more of ``spec``."""
    return {
        "apiVersion": "batch.volcano.sh/v1alpha1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {**spec, "tasks": tasks},
    }


def make_job(name: str, tasks: list[dict[str, Any]], **spec: Any) -> Job:
    """The job loaded and checked as the CLI loads a file."""
    return load_jobs_from_text(json.dumps(job_document(name, tasks, **spec)), f"{name}.json")[0].job


def job_file(directory: Path, job: str | dict[str, Any] | Job, name: str = "job.yaml") -> Path:
    """``job`` written to ``directory/name``: text as it is, a document as YAML (JSON for a
    ``.json`` name), a loaded Job as its manifest; the file's path."""
    path = directory / name
    if isinstance(job, Job):
        job = job_manifest(job)
    if isinstance(job, dict):
        job = json.dumps(job) if name.endswith(".json") else yaml.safe_dump(job, sort_keys=False)
    path.write_text(job)
    return path


def write_job(tmp_path: Path, job: Job, name: str = "job.json") -> str:
    """``job`` written back as its manifest (JSON) in ``tmp_path``; the file's path as a string."""
    return str(job_file(tmp_path, job, name))


# ---------------------------------------------------------------------- the local engine, in-process

# What a test may give run(): StartOptions' own fields; anything else is a local engine setting.
_OPTIONS = ("quiet", "timeout", "extra_env", "detach", "follow", "on_start", "remove", "sink")


def plan_and_start(engine: Engine, job: Job, options: StartOptions) -> JobReport:
    """``job`` started through the engine interface as the CLI starts it: planned, then that plan
    started."""
    return engine.start(engine.plan(job, options))


def start(engine_name: str, job: Job, engine_settings: Mapping[str, Any], **options: Any) -> JobReport:
    """``job`` planned and started by the engine ``engine_name`` made with ``engine_settings``."""
    return plan_and_start(get_engine(engine_name, **engine_settings), job, StartOptions(**options))


def run(job: Job, tmp_path: Path, *, timeout: float = 30, **options: Any) -> JobReport:
    """``job`` run by the local engine to its end (``detach``: started), quiet, its job directory
    under ``tmp_path/jobs``: its report. Options are StartOptions' or the engine's settings."""
    given = {"quiet": True, "timeout": timeout, **{k: v for k, v in options.items() if k in _OPTIONS}}
    settings = {k: v for k, v in options.items() if k not in _OPTIONS}
    return start("local", job, {"state_dir": tmp_path / "jobs"}, settings=settings, **given)


def job_dir(report: JobReport) -> Path:
    """Where the local engine keeps the job (its report's location)."""
    return Path(report.location)


def pod_of(report: JobReport, pod: str) -> PodReport:
    """The pod whose full or short name ends with ``pod``."""
    pods = [p for p in report.pods if p.name.endswith(pod)]
    assert pods, f"no pod {pod} in {[p.name for p in report.pods]}"
    return pods[0]


def log_dir(report: JobReport, pod: str | PodReport, attempt: int | None = None) -> Path:
    """The directory of one attempt's container logs (the pod's latest when ``attempt`` is None)."""
    from torchjob.engines.local.state import JobDir

    found = pod_of(report, pod) if isinstance(pod, str) else pod
    return JobDir(job_dir(report)).log_dir(found.name, found.attempt if attempt is None else attempt)


def log_text(report: JobReport, pod: str, container: str, attempt: int | None = None) -> str:
    """One container's log file as written, whole."""
    return (log_dir(report, pod, attempt) / f"{container}.log").read_text()


def status_of(report: JobReport) -> dict[str, Any]:
    """The job's status.json as stored."""
    data: dict[str, Any] = json.loads((job_dir(report) / "status.json").read_text())
    return data


def leftovers(job_id: str) -> list[Any]:
    """Live (non-zombie) processes that still carry the job's marker."""
    import psutil

    from torchjob.engines.local.process import marked_processes

    alive = []
    for proc in marked_processes(job_id):
        try:
            if proc.status() != psutil.STATUS_ZOMBIE:
                alive.append(proc)
        except psutil.Error:
            continue
    return alive


# ---------------------------------------------------------------------- waiting


def wait_until(predicate: Callable[[], object], timeout: float, interval: float = 0.02) -> bool:
    """Whether ``predicate`` became true within ``timeout`` seconds (asked once more at the end)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return bool(predicate())


def read_until(stream: IO[Any], wanted: str, timeout: float) -> str:
    """What a process wrote on ``stream`` (its stdout pipe) until ``wanted`` is in it, the
    stream's end, or ``timeout`` seconds. Read with os.read: ``readline()`` would take every line
    the pipe holds into its buffer, and select() then waits on the pipe for more while the wanted
    line sits in that buffer (seen: a queue test waited its 30 s for a line printed at once)."""
    import select

    seen = ""
    deadline = time.monotonic() + timeout
    while wanted not in seen:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([stream], [], [], left)[0]:
            break
        data = os.read(stream.fileno(), 65536)
        if not data:
            break
        seen += data.decode(errors="replace")
    return seen


def private_slurm(factory: Any, **options: Any) -> Iterator[Any]:
    """For a fixture to yield from: a private Slurm cluster (tools/slurm_cluster.py) of
    ``options`` (nodes, GPUs, features, ...), stopped by pid afterwards, or by its watcher should
    this process die first; the test skips where such a cluster cannot be made here."""
    import pytest

    from slurm_cluster import SlurmCluster, Unsupported, why_not

    reason = why_not()
    if reason is not None:
        pytest.skip(reason)
    try:
        cluster = SlurmCluster(factory.mktemp("slurm") / "cluster", tied=True, **options)
    except Unsupported as err:
        pytest.skip(str(err))
    try:
        try:
            cluster.start()
        except Unsupported as err:
            pytest.skip(str(err))
        yield cluster
    finally:
        cluster.stop()


def kept_by_design() -> set[int]:
    """Processes that outlive an SDK call by design: the warm pools' servers (the local engine's,
    Python's fork server for warm Elastic calls), the idle spares a server forks for the next
    call's ranks (children of this process waiting in that server's session), and the process's
    shared watchdog (test_sdk_warm.py). What a call's ranks leave is none of these."""
    import multiprocessing.forkserver

    import psutil

    from torchjob.engines.local import pool, watchdog

    kept = [s for _, s in pool._pools.values()] + list(pool._spares.values())
    servers = {s.proc.pid for s in kept if s.proc is not None} | {w.pid for w in watchdog._SHARED}
    python_server = getattr(multiprocessing.forkserver._forkserver, "_forkserver_pid", None)
    if python_server:
        servers.add(python_server)
    spares = set()
    for child in psutil.Process().children():
        try:
            if os.getsid(child.pid) in servers:
                spares.add(child.pid)
        except OSError:
            continue
    return servers | spares


@contextlib.contextmanager
def unremovable(job_dir: Path) -> Iterator[Path]:
    """A part of ``job_dir`` that no rmtree removes, as a job may leave one: as root (whom no file
    mode stops) a directory mounted on itself, else a read-only directory holding a file. Undone on
    the way out, wherever the job directory was moved meanwhile (renamed aside in its root)."""
    import pytest

    stuck = job_dir / "logs" / "stuck"
    stuck.mkdir(parents=True)
    as_root = os.geteuid() == 0
    if as_root:
        mounted = subprocess.run(["mount", "--bind", str(stuck), str(stuck)], capture_output=True, text=True)
        if mounted.returncode != 0:
            pytest.skip(f"root cannot mount here: {mounted.stderr.strip()}")
    else:
        (stuck / "kept").write_text("a file in a directory its owner made read-only\n")
        stuck.chmod(0o500)
    try:
        yield stuck
    finally:
        for found in [stuck, *job_dir.parent.glob(f".{job_dir.name}.removed-*/logs/stuck")]:
            if as_root and found.is_dir():  # (os.path.ismount misses a mount of the same file system)
                subprocess.run(["umount", str(found)], capture_output=True, check=False, timeout=30)
            elif not as_root and found.is_dir():
                found.chmod(0o700)
