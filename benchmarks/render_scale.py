"""How ``torchjob render`` scales with the number of workers: time and memory.

For a job of 1 master + N workers (pytorch with wait-for-master, svc, env) it measures

* in-process: load + validate, expand, and dump to YAML, each timed (best of ``--repeat`` runs),
  and the peak of Python allocations during one full render (tracemalloc, in a separate run
  because tracing slows everything down);
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
from dataclasses import asdict, dataclass
from pathlib import Path

from torchjob.expand import expand
from torchjob.jobs import load_jobs
from torchjob.render import as_list, dump

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


def cli_run(path: str) -> tuple[float, float, float]:
    """Wall seconds, CPU seconds and peak RSS (MiB) of one ``torchjob render`` process."""
    with open(os.devnull, "w") as sink:
        start = time.perf_counter()
        proc = subprocess.Popen(
            [sys.executable, "-m", "torchjob", "render", path], stdout=sink, stderr=subprocess.DEVNULL
        )
        _, status, usage = os.wait4(proc.pid, 0)
        elapsed = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"torchjob render {path} exited with {proc.returncode}")
    cpu = usage.ru_utime + usage.ru_stime  # unlike wall time, not inflated by other busy processes
    return elapsed, cpu, usage.ru_maxrss / 1024  # ru_maxrss is in KiB on Linux


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
        cli_s=cli[0],
        cli_cpu_s=cli[1],
        cli_rss_mb=cli[2],
    )


def print_table(rows: list[Row]) -> None:
    header = (
        f"{'workers':>8} {'output MB':>9} {'load s':>7} {'expand s':>8} {'dump s':>7} {'total s':>7} "
        f"{'peak MB':>8} {'KB/pod':>7} {'CLI s':>6} {'CLI CPU s':>9} {'CLI RSS MB':>10}"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        print(
            f"{r.workers:>8} {r.output_mb:>9.1f} {r.load_s:>7.3f} {r.expand_s:>8.3f} {r.dump_s:>7.3f} "
            f"{r.in_process_s:>7.3f} {r.peak_traced_mb:>8.1f} {r.peak_traced_mb * 1024 / r.pods:>7.1f} "
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
            f"{'PASS' if ok else 'FAIL'}: peak memory per pod varies by x{spread:.2f} across sizes "
            "(linear growth means about x1)"
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
