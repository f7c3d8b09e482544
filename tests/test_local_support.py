"""Helpers for the local engine tests (this module holds no tests)."""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil

from torchjob.engines.local import RunOptions, RunResult, run_job
from torchjob.engines.local.process import marked_processes
from torchjob.jobs import load_jobs_from_text
from torchjob.spec.manifest import job_manifest
from torchjob.spec.model import Job


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


def make_job(name: str, tasks: list[dict[str, Any]], **spec: Any) -> Job:
    doc = {
        "apiVersion": "batch.volcano.sh/v1alpha1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {**spec, "tasks": tasks},
    }
    return load_jobs_from_text(json.dumps(doc), f"{name}.json")[0].job


def sh(script: str) -> list[str]:
    return ["sh", "-c", script]


def run(job: Job, tmp_path: Path, *, timeout: float = 30, **options: Any) -> RunResult:
    return run_job(job, RunOptions(state_dir=tmp_path / "jobs", quiet=True, timeout=timeout, **options))


def log_text(result: RunResult, pod: str, container: str, attempt: int | None = None) -> str:
    pods = [p for p in result.pods if p.name.endswith(pod)]
    assert pods, f"no pod {pod} in {[p.name for p in result.pods]}"
    log_dir = pods[0].log_dir
    if attempt is not None:
        log_dir = log_dir.parent / f"attempt-{attempt}"
    return (log_dir / f"{container}.log").read_text()


def status_of(result: RunResult) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((result.job_dir / "status.json").read_text())
    return data


def wait_until(predicate: Any, timeout: float, interval: float = 0.02) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return bool(predicate())


def leftovers(job_id: str) -> list[psutil.Process]:
    """Live (non-zombie) processes that still carry the job's marker."""
    alive = []
    for proc in marked_processes(job_id):
        try:
            if proc.status() != psutil.STATUS_ZOMBIE:
                alive.append(proc)
        except psutil.Error:
            continue
    return alive


def cli(tmp_path: Path, *args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    """``torchjob ARGS`` as a user runs it, with its state under ``tmp_path/home``, colors allowed."""
    env = {**os.environ, "TORCHJOB_HOME": str(tmp_path / "home")}
    env.pop("NO_COLOR", None)
    return subprocess.run(
        [sys.executable, "-m", "torchjob", *args], env=env, capture_output=True, text=True, timeout=timeout
    )


def write_job(tmp_path: Path, job: Job, name: str = "job.json") -> str:
    """``job`` written back as its manifest (JSON) in ``tmp_path``; the file's path."""
    path = tmp_path / name
    path.write_text(json.dumps(job_manifest(job)))
    return str(path)


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
