"""Helpers of the local queue's tests: jobs whose pods trace when they start and end, with the GPUs
they were given, and the CLI run against the test's own queue (the ``queue_env`` fixture, conftest.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from support import cli, container, make_job, sh, task, write_job

TRACE_POD = (
    'echo "hello from $TORCHJOB_POD_NAME"; '
    'echo "start $(date +%s.%N) $TORCHJOB_POD_NAME [$CUDA_VISIBLE_DEVICES]" >> {trace}; {wait}; '
    'echo "end $(date +%s.%N) $TORCHJOB_POD_NAME [$CUDA_VISIBLE_DEVICES]" >> {trace}'
)


def gpu_job(
    tmp_path: Path,
    name: str,
    *,
    gpus: int = 1,
    replicas: int = 1,
    sleep: float = 0.5,
    gate: bool | str = False,
    cpu: int = 0,
    **spec: Any,
) -> str:
    """A job file: ``replicas`` pods of ``gpus`` GPUs each, tracing their start and end; with
    ``gate``, the pods end only once the file ``open`` (or the one ``gate`` names) exists (see
    :func:`release`)."""
    gate_file = tmp_path / (gate if isinstance(gate, str) else "open")
    wait = f"while [ ! -e {gate_file} ]; do sleep 0.05; done" if gate else f"sleep {sleep}"
    script = TRACE_POD.format(trace=tmp_path / "trace", wait=wait)
    limits: dict[str, Any] = {"resources": {"limits": {"nvidia.com/gpu": gpus}}} if gpus else {}
    if cpu:
        limits = {"resources": {"requests": {"cpu": cpu}}}
    min_available = spec.pop("task_min_available", None)
    extra = {"minAvailable": min_available} if min_available is not None else {}
    job = make_job(
        name, [task("main", [container("main", sh(script), **limits)], replicas=replicas, **extra)], **spec
    )
    return write_job(tmp_path, job, f"{name}.json")


def release(tmp_path: Path, gate: str = "open") -> None:
    """Let the gated pods end (those of the gate named)."""
    (tmp_path / gate).touch()


def submit(tmp_path: Path, path: str, *extra: str) -> str:
    result = cli(tmp_path, "run", "-d", *extra, path)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout.strip()


def status(tmp_path: Path, job_id: str) -> dict[str, Any]:
    result = cli(tmp_path, "status", job_id, "-o", "json")
    assert result.returncode == 0, result.stderr
    data: dict[str, Any] = json.loads(result.stdout)
    return data


def wait_all(tmp_path: Path, ids: list[str], timeout: float = 60) -> None:
    for job_id in ids:
        result = cli(tmp_path, "wait", job_id, "--timeout", str(timeout), timeout=timeout + 10)
        assert result.returncode == 0, (job_id, result.stdout, result.stderr)


def trace(tmp_path: Path) -> list[tuple[str, float, str, str]]:
    """(start|end, time, pod, GPUs) in time order."""
    rows = []
    for line in (tmp_path / "trace").read_text().splitlines():
        what, when, pod, devices = line.split()
        rows.append((what, float(when), pod, devices.strip("[]")))
    return sorted(rows, key=lambda r: (r[1], r[0] == "start"))  # an end before a start at one instant


def intervals(tmp_path: Path) -> dict[str, tuple[float, float, str]]:
    starts = {pod: (t, gpus) for what, t, pod, gpus in trace(tmp_path) if what == "start"}
    ends = {pod: t for what, t, pod, _ in trace(tmp_path) if what == "end"}
    return {pod: (t, ends.get(pod, float("inf")), gpus) for pod, (t, gpus) in starts.items()}  # inf: killed


def check_no_gpu_shared(tmp_path: Path, limit: int) -> int:
    """At no moment do two running pods hold one GPU, nor more than ``limit`` GPUs run; the peak."""
    held: dict[str, str] = {}
    peak = 0
    for what, _, pod, devices in trace(tmp_path):
        if what == "end":
            held.pop(pod)
            continue
        for device in devices.split(","):
            assert device not in held.values(), f"{pod} got GPU {device} that another pod holds: {held}"
        held[pod] = devices
        peak = max(peak, len(held))
        assert sum(len(d.split(",")) for d in held.values()) <= limit
    return peak
