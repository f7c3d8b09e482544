"""Warm calls (issue 23): the 1st, 2nd and 10th call of an all-reduce task, warm against cold.

Run from the repository root with the project's virtualenv::

    .venv/bin/python benchmarks/bench_warm.py               # 2 and 4 ranks, 2x2 elastic, 10 calls each
    .venv/bin/python benchmarks/bench_warm.py --calls 10 --ranks 2 --elastic --json out.json

One fresh Python process per case makes the calls of a ``PyTorch`` task (a master and N-1 workers
on the local engine: init gloo, all-reduce 1024 floats, return the sum) the way a notebook does;
``--elastic 2x2`` runs an ``Elastic(nnodes=2, nproc_per_node=2)`` task the same way (one local pod
per node, each node's agent starting its 2 ranks). Call k warm (forked from the process's warm
pool) and call k cold (``TORCHJOB_WARM=0``) run one after the other for k = 1..N, so that other
load on the machine hits both alike. The warm series' 1st call starts the pool. The machine's load
average is printed beside the figures: on a shared 2-core machine the cold figures move with it
much more than the warm ones.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

CALLER = textwrap.dedent(
    """
    import json, os, sys, time
    from torchjob import Elastic, PyTorch, Worker, task

    nodes, _, procs = sys.argv[3].partition("x")
    config = Elastic(nnodes=int(nodes), nproc_per_node=int(procs)) if procs else None
    config = config or PyTorch(worker=Worker(replicas=int(sys.argv[1]) - 1))

    @task(task_config=config)
    def allreduce(n):
        import torch, torch.distributed as dist
        dist.init_process_group("gloo")
        t = torch.ones(n)
        dist.all_reduce(t)
        dist.destroy_process_group()
        return float(t.sum())

    ranks, calls = int(sys.argv[1]), int(sys.argv[2])
    times = {"warm": [], "cold": []}
    loads = [os.getloadavg()[0]]
    for k in range(calls):
        for mode in ("warm", "cold"):
            os.environ["TORCHJOB_WARM"] = "1" if mode == "warm" else "0"
            started = time.perf_counter()
            value = allreduce(1024)
            times[mode].append(time.perf_counter() - started)
            assert value == 1024 * ranks, value
    loads.append(os.getloadavg()[0])
    result = {"ranks": ranks, "case": sys.argv[3] or f"{ranks} ranks", "times": times, "load": loads}
    print("RESULT " + json.dumps(result), flush=True)
    """
)


def measure(ranks: int, calls: int, elastic: str = "") -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-warm-") as tmp:
        script = Path(tmp) / "caller.py"
        script.write_text(CALLER)
        env = dict(os.environ, TORCHJOB_HOME=str(Path(tmp) / "home"))
        done = subprocess.run(
            [sys.executable, str(script), str(ranks), str(calls), elastic],
            cwd=tmp,
            env=env,
            capture_output=True,
            text=True,
            timeout=60 * calls,
        )
    if done.returncode != 0:
        raise SystemExit(f"{ranks} ranks: the caller failed:\n{done.stderr[-2000:]}")
    line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
    result: dict[str, Any] = json.loads(line[len("RESULT ") :])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--ranks", type=int, nargs="*", default=[2, 4])
    parser.add_argument("--elastic", nargs="*", default=["2x2"], metavar="NODESxPROCS")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    results = [measure(r, args.calls) for r in args.ranks]
    for case in args.elastic:
        nodes, _, procs = case.partition("x")
        results.append(measure(int(nodes) * int(procs), args.calls, case))
    picks = [i for i in (0, 1, args.calls - 1) if i < args.calls]
    header = "  ".join(f"call {i + 1:>2}" for i in picks)
    print(f"{'case':>8}  {'mode':<4}  {header}  median 2+  load 1m")
    for result in results:
        load = "{:.1f}-{:.1f}".format(*result["load"])
        for mode in ("warm", "cold"):
            times = result["times"][mode]
            cells = "  ".join(f"{times[i]:6.2f} s" for i in picks)
            later = statistics.median(times[1:]) if len(times) > 1 else times[0]
            print(f"{result['case']:>8}  {mode:<4}  {cells}  {later:7.2f} s  {load}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
