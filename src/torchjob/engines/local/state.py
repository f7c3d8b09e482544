"""The job directory: everything a local job leaves on disk, and how commands find it again.

Layout of ``<root>/<job-id>/`` (root: ``RunOptions.state_dir``, else ``$TORCHJOB_HOME/jobs``, else
``~/.torchjob/jobs``)::

    job.yaml                         the job as submitted (a Volcano Job)
    pods.yaml                        the pods and objects as expanded with local addressing
    status.json                      phase, reason, ports, pods; rewritten on every change
    supervisor.pid                   pid of the process running the job
    supervisor.log                   the supervisor's own output when run with --detach
    hosts                            the containers' /etc/hosts: the machine's, then a line per pod
    bin/                             python/python3 shims, first on every container's PATH
    volumes/<configmap>/<key>        ConfigMap volumes, e.g. the svc plugin's host files
    pods/<pod>/attempt-<n>/volumes/  emptyDir volumes of one pod attempt
    logs/<pod>/attempt-<n>/<container>.log   output of every container, every attempt
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from torchjob.engines.local import procfs
from torchjob.records import record
from torchjob.spec.model import Job, Policy

STATUS_RESERVE = 8192  # bytes status.json keeps on disk at least (see JobDir.write_status)


def state_root(explicit: Path | None = None) -> Path:
    if explicit is not None:
        return Path(explicit)
    home = os.environ.get("TORCHJOB_HOME")
    return (Path(home) if home else Path.home() / ".torchjob") / "jobs"


def _policy(policy: Policy) -> dict[str, Any]:
    out: dict[str, Any] = {"action": policy.action}
    if policy.events:
        out["events"] = list(policy.events)
    if policy.exit_code is not None:
        out["exitCode"] = policy.exit_code
    if policy.timeout is not None:
        out["timeout"] = policy.timeout
    return out


def job_manifest(job: Job) -> dict[str, Any]:
    """The job as a Volcano Job manifest (defaults applied), for the record."""
    spec = job.spec
    body: dict[str, Any] = {"minAvailable": spec.min_available, "maxRetry": spec.max_retry}
    if spec.min_success is not None:
        body["minSuccess"] = spec.min_success
    for key, value in (
        ("queue", spec.queue),
        ("schedulerName", spec.scheduler_name),
        ("priorityClassName", spec.priority_class_name),
    ):
        if value:
            body[key] = value
    if spec.ttl_seconds_after_finished is not None:
        body["ttlSecondsAfterFinished"] = spec.ttl_seconds_after_finished
    if spec.policies:
        body["policies"] = [_policy(p) for p in spec.policies]
    if spec.plugins:
        body["plugins"] = {k: list(v) for k, v in spec.plugins.items()}
    body.update(spec.extra)
    tasks = []
    for task in spec.tasks:
        entry: dict[str, Any] = {"name": task.name, "replicas": task.replicas}
        if task.min_available is not None:
            entry["minAvailable"] = task.min_available
        entry["maxRetry"] = task.max_retry
        if task.policies:
            entry["policies"] = [_policy(p) for p in task.policies]
        if task.depends_on is not None:
            entry["dependsOn"] = {"name": list(task.depends_on.names), "iteration": task.depends_on.iteration}
        entry.update(task.extra)
        entry["template"] = task.template.raw
        tasks.append(entry)
    body["tasks"] = tasks
    meta: dict[str, Any] = {"name": job.name, "namespace": job.metadata.namespace}
    if job.metadata.labels:
        meta["labels"] = dict(job.metadata.labels)
    if job.metadata.annotations:
        meta["annotations"] = dict(job.metadata.annotations)
    return {"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "metadata": meta, "spec": body}


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)  # a full disk leaves no half-written file behind
        raise


def _overwrite(path: Path, text: str) -> None:
    """Rewrite an existing file in place: on a full disk it may still fit the blocks it has
    (padded with spaces to its old size, so that none of them is given up)."""
    fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW)
    try:
        data = text.encode()
        data += b" " * (os.fstat(fd).st_size - len(data))
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.ftruncate(fd, len(data))
    finally:
        os.close(fd)


def _linux_stat(pid: int) -> tuple[str, float] | None:
    """``(state letter, start time)`` of ``pid`` read from /proc, or None where that cannot be done."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        fields = procfs.stat_fields(pid)
        ticks = int(fields[19])  # start time, in clock ticks since boot
        return fields[0].decode(), ticks / os.sysconf("SC_CLK_TCK") + procfs.boot_time()
    except FileNotFoundError:
        return ("", 0.0)  # no such process
    except (OSError, ValueError, IndexError):
        return None


def start_time(pid: int) -> float:
    """When ``pid`` started, in seconds since the epoch: psutil's ``create_time``.

    Read from /proc on Linux, so that starting a job does not wait for psutil to import.
    """
    found = _linux_stat(pid)
    if found is not None and found[0]:
        return found[1]
    import psutil

    return float(psutil.Process(pid).create_time())


def process_alive(pid: int, created: float | None) -> bool:
    """``pid`` runs (not a zombie) and, if ``created`` is given, is the process that started then."""
    found = _linux_stat(pid)  # /proc on Linux: psutil's import would delay the job's first pod
    if found is not None:
        state, started = found
        if state in ("", "Z", "X"):  # gone, a zombie, or dead
            return False
        return created is None or abs(started - created) <= 1.0  # else the pid was reused
    import psutil

    try:
        proc = psutil.Process(pid)
        if created is not None and abs(proc.create_time() - created) > 1.0:
            return False  # the pid was reused
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


@record
class JobDir:
    path: Path

    @property
    def id(self) -> str:
        return self.path.name

    @property
    def status_file(self) -> Path:
        return self.path / "status.json"

    @property
    def logs(self) -> Path:
        return self.path / "logs"

    @property
    def volumes(self) -> Path:
        return self.path / "volumes"

    @property
    def bin(self) -> Path:
        return self.path / "bin"

    def log_dir(self, pod: str, attempt: int) -> Path:
        return self.logs / pod / f"attempt-{attempt}"

    def pod_dir(self, pod: str, attempt: int) -> Path:
        return self.path / "pods" / pod / f"attempt-{attempt}"

    def write_status(self, status: dict[str, Any]) -> None:
        # Padded with spaces (JSON allows them) to hold its disk blocks for a full disk, where the
        # new file of an atomic write cannot be made but the old one can be rewritten in place.
        text = json.dumps(status, indent=2) + "\n"
        text += " " * (STATUS_RESERVE - len(text))
        try:
            write_atomic(self.status_file, text)
        except OSError:
            if not self.status_file.exists():
                raise
            _overwrite(self.status_file, text)  # not atomic: a reader may see it half-written

    def read_status(self) -> dict[str, Any]:
        try:
            data = json.loads(self.status_file.read_text())
        except (OSError, ValueError):
            return {"id": self.id, "phase": "Unknown", "reason": "no readable status.json", "pods": []}
        return data if isinstance(data, dict) else {}

    def write_pid(self) -> None:
        pid = os.getpid()
        write_atomic(self.path / "supervisor.pid", json.dumps({"pid": pid, "created": start_time(pid)}))

    def supervisor(self) -> tuple[int, float | None] | None:
        try:
            data = json.loads((self.path / "supervisor.pid").read_text())
            return int(data["pid"]), float(data["created"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def supervisor_alive(self) -> bool:
        found = self.supervisor()
        return found is not None and process_alive(*found)

    def write_shims(self, python: str) -> None:
        """``python`` and ``python3`` on PATH run torchjob's interpreter, also inside shell scripts."""
        self.bin.mkdir(exist_ok=True)
        for name in ("python", "python3"):
            shim = self.bin / name
            shim.write_text(f'#!/bin/sh\nexec "{python}" "$@"\n')
            shim.chmod(0o755)

    def write_configmaps(self, configmaps: dict[str, dict[str, str]]) -> None:
        for name, data in configmaps.items():
            target = self.volumes / name
            target.mkdir(parents=True, exist_ok=True)
            for key, value in data.items():
                (target / key).write_text(value)


def new_job_dir(root: Path, job_name: str) -> JobDir:
    """A fresh, uniquely named directory ``<job-name>-<6 hex>``."""
    root.mkdir(parents=True, exist_ok=True)
    for _ in range(100):
        path = root / f"{job_name}-{os.urandom(3).hex()}"  # secrets.token_hex, without hmac/OpenSSL
        try:
            path.mkdir()
        except FileExistsError:
            continue
        return JobDir(path)
    raise OSError(f"cannot create a job directory in {root}")


def list_jobs(root: Path) -> list[JobDir]:
    """Job directories, oldest first."""
    if not root.is_dir():
        return []
    dirs = [JobDir(p) for p in root.iterdir() if p.is_dir() and (p / "status.json").exists()]
    return sorted(dirs, key=lambda d: (d.status_file.stat().st_mtime if d.status_file.exists() else 0, d.id))


def find_job(root: Path, ref: str) -> JobDir:
    """A job by id, by unique id prefix, or by name (the newest job of that name)."""
    jobs = list_jobs(root)
    exact = [j for j in jobs if j.id == ref]
    if exact:
        return exact[0]
    named = [j for j in jobs if j.read_status().get("name") == ref]
    if named:
        return max(named, key=lambda j: float(j.read_status().get("startedAt") or 0))
    prefixed = [j for j in jobs if j.id.startswith(ref)]
    if len(prefixed) == 1:
        return prefixed[0]
    if prefixed:
        raise LookupError(f"job {ref!r} is ambiguous: {', '.join(j.id for j in prefixed)}")
    raise LookupError(f"no local job {ref!r} in {root}")
