"""How ``torchjob render`` scales with the number of workers: time and memory.

For a job of 1 master + N workers (pytorch with wait-for-master, svc, env) it measures

* in-process, the whole state (what the local engine holds): load + validate, expand, and dump
  to YAML, each timed (best of ``--repeat`` runs), and the peak of Python allocations during one
  full render (tracemalloc, in a separate run because tracing slows everything down);
* in-process, streamed (what ``torchjob render`` does): each pod built and written at once, its
  time and peak allocations;
* end to end: ``python -m torchjob render FILE`` in a subprocess writing to /dev/null, wall time
  and the child's peak RSS (from ``wait4``).

Run: ``.venv/bin/python benchmarks/render_scale.py`` (or ``make bench``);
``--workers 1000 20000`` to pick other sizes, ``--json`` for machine-readable output.
The target is a 10,000-worker render under 2 s, with memory growing linearly in N.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from torchjob.expand import Expansion, expand
from torchjob.jobs import load_jobs
from torchjob.render import as_list, dump, write_list

TARGET_WORKERS = 10_000
TARGET_SECONDS = 2.0

JOB = """\
apiVersion: batch.volcano.sh/v1alpha1
kind: Job
metadata:
  name: bench
spec:
  plugins:
    pytorch: ["--master=master", "--worker=worker", "--port=23456", "--wait-master-enabled=true"]
    env: []
  tasks:
    - name: master
      replicas: 1
      template:
        spec:
          restartPolicy: OnFailure
          containers:
            - name: main
              image: python:3.11
              command: ["python", "-m", "train"]
              resources: {{limits: {{cpu: "1", memory: 2Gi}}}}
    - name: worker
      replicas: {workers}
      template:
        spec:
          restartPolicy: OnFailure
          containers:
            - name: main
              image: python:3.11
              command: ["python", "-m", "train"]
              resources: {{limits: {{cpu: "1", memory: 2Gi}}}}
"""


@dataclass
class Row:
    workers: int
    pods: int
    output_mb: float
    load_s: float
    expand_s: float
    dump_s: float
    in_process_s: float
    peak_traced_mb: float
    stream_s: float
    stream_peak_mb: float
    cli_s: float
    cli_cpu_s: float
    cli_rss_mb: float


def render_once(path: str) -> tuple[float, float, float, int]:
    start = time.perf_counter()
    loaded = load_jobs(path)
    loaded_at = time.perf_counter()
    states = [expand(item.job) for item in loaded]
    expanded_at = time.perf_counter()
    text = dump(as_list(states), "yaml")
    dumped_at = time.perf_counter()
    return loaded_at - start, expanded_at - loaded_at, dumped_at - expanded_at, len(text.encode())


def _items(path: str) -> Iterator[dict[str, Any]]:
    for item in load_jobs(path):
        expansion = Expansion(item.job)
        yield from expansion.objects()
        for pod in expansion.pods():
            yield pod.manifest


def _discard(text: str) -> None:
    pass


def stream_once(path: str) -> float:
    """What ``torchjob render`` does: build each pod and write it at once (here to nowhere)."""
    start = time.perf_counter()
    write_list(_items(path), "yaml", _discard)
    return time.perf_counter() - start


def stream_peak(path: str) -> float:
    gc.collect()
    tracemalloc.start()
    try:
        write_list(_items(path), "yaml", _discard)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak / 2**20


def peak_traced(path: str) -> float:
    gc.collect()
    tracemalloc.start()
    try:
        states = [expand(item.job) for item in load_jobs(path)]
        dump(as_list(states), "yaml")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return peak / 2**20


# Runs one ``torchjob render`` and reports its usage. It runs in a small, fresh Python: a child
# forked straight from this (large) benchmark process would count the parent's pages in its peak RSS.
_CLI_PROBE = """
import json, os, subprocess, sys, time
with open(os.devnull, "w") as sink:
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "torchjob", "render", sys.argv[1]],
                            stdout=sink, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
print(json.dumps({"code": os.waitstatus_to_exitcode(status), "wall": wall,
                  "cpu": usage.ru_utime + usage.ru_stime, "rss_kib": usage.ru_maxrss}))
"""


def cli_run(path: str) -> tuple[float, float, float]:
    """Wall seconds, CPU seconds (not inflated by other busy processes) and peak RSS (MiB) of one
    ``torchjob render`` process."""
    result = subprocess.run(
        [sys.executable, "-c", _CLI_PROBE, path], capture_output=True, text=True, check=True
    )
    report = json.loads(result.stdout)
    if report["code"] != 0:
        raise SystemExit(f"torchjob render {path} exited with {report['code']}")
    return report["wall"], report["cpu"], report["rss_kib"] / 1024  # ru_maxrss is in KiB on Linux


def measure(workers: int, repeat: int, folder: Path) -> Row:
    path = folder / f"job-{workers}.yaml"
    path.write_text(JOB.format(workers=workers))
    runs = [render_once(str(path)) for _ in range(repeat)]
    load_s, expand_s, dump_s, size = min(runs, key=lambda r: r[0] + r[1] + r[2])
    cli = min((cli_run(str(path)) for _ in range(repeat)), key=lambda r: r[0])
    return Row(
        workers=workers,
        pods=workers + 1,
        output_mb=size / 2**20,
        load_s=load_s,
        expand_s=expand_s,
        dump_s=dump_s,
        in_process_s=load_s + expand_s + dump_s,
        peak_traced_mb=peak_traced(str(path)),
        stream_s=min(stream_once(str(path)) for _ in range(repeat)),
        stream_peak_mb=stream_peak(str(path)),
        cli_s=cli[0],
        cli_cpu_s=cli[1],
        cli_rss_mb=cli[2],
    )


def print_table(rows: list[Row]) -> None:
    header = (
        f"{'workers':>8} {'output MB':>9} {'load s':>7} {'expand s':>8} {'dump s':>7} {'total s':>7} "
        f"{'peak MB':>8} {'KB/pod':>7} {'stream s':>8} {'stream MB':>9} "
        f"{'CLI s':>6} {'CLI CPU s':>9} {'CLI RSS MB':>10}"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        print(
            f"{r.workers:>8} {r.output_mb:>9.1f} {r.load_s:>7.3f} {r.expand_s:>8.3f} {r.dump_s:>7.3f} "
            f"{r.in_process_s:>7.3f} {r.peak_traced_mb:>8.1f} {r.peak_traced_mb * 1024 / r.pods:>7.1f} "
            f"{r.stream_s:>8.3f} {r.stream_peak_mb:>9.1f} "
            f"{r.cli_s:>6.2f} {r.cli_cpu_s:>9.2f} {r.cli_rss_mb:>10.1f}"
        )


def verdict(rows: list[Row]) -> list[str]:
    notes = []
    target = [r for r in rows if r.workers == TARGET_WORKERS]
    if target:
        ok = target[0].cli_s < TARGET_SECONDS
        notes.append(
            f"{'PASS' if ok else 'FAIL'}: {TARGET_WORKERS} workers render end to end in "
            f"{target[0].cli_s:.2f} s wall, {target[0].cli_cpu_s:.2f} s CPU (target < {TARGET_SECONDS} s)"
        )
    if len(rows) >= 2:
        per_pod = [r.peak_traced_mb / r.pods for r in rows]
        spread = max(per_pod) / min(per_pod)
        ok = spread < 1.5
        notes.append(
            f"{'PASS' if ok else 'FAIL'}: whole-state peak memory per pod varies by x{spread:.2f} across "
            "sizes (linear growth means about x1)"
        )
        growth = rows[-1].stream_peak_mb / rows[0].stream_peak_mb
        pods = rows[-1].pods / rows[0].pods
        ok = growth <= pods * 1.2
        notes.append(
            f"{'PASS' if ok else 'FAIL'}: streamed render peak memory grows x{growth:.1f} for "
            f"x{pods:.0f} pods (at most linear)"
        )
    return notes


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workers", type=int, nargs="+", default=[1000, 5000, 10000])
    parser.add_argument("--repeat", type=int, default=3, help="runs per size; the best is reported")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rows = [measure(n, args.repeat, Path(tmp)) for n in sorted(args.workers)]
    if args.json:
        print(json.dumps([asdict(r) for r in rows], indent=2))
        return 0
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(
        f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load average {load}, best of {args.repeat}"
    )
    print_table(rows)
    notes = verdict(rows)
    for note in notes:
        print(note)
    return 1 if any(n.startswith("FAIL") for n in notes) else 0


if __name__ == "__main__":
    sys.exit(main())
