"""What the Python SDK costs: call overhead of a single-process task, and all-reduce wall times.

Run from the repository root with the project's virtualenv::

    .venv/bin/python benchmarks/bench_sdk.py                 # 3 repetitions of everything
    .venv/bin/python benchmarks/bench_sdk.py --reps 5 --calls 20000 --json out.json

Part 1 times ``Elastic(nnodes=1, nproc_per_node=1)`` tasks against calling the plain function,
in this process: the first call (which imports the launch module) and the mean of many calls.

Part 2 runs one all-reduce program (init gloo, all-reduce 1024 floats, check the sum) for 2 and 4
ranks, each run a fresh Python process timed from start to exit, interleaved so that other load
on the machine hits every method alike:

* ``torchrun``: ``torchrun --standalone --nproc-per-node=N`` running the program as a script;
* ``sdk-elastic``: ``Elastic(nproc_per_node=N)``, torch's elastic launcher inside the caller;
* ``sdk-pytorch``: ``PyTorch(worker=Worker(replicas=N-1))``, N pods of the local engine;
* ``sdk-nodes``: ``Elastic(nnodes=N)``, N local-engine pods meeting over a c10d rendezvous, each
  with its own elastic agent (so twice the processes, and twice the torch imports, of the others).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
TIMEOUT = 300.0

PROGRAM = textwrap.dedent(
    """
    import os, warnings
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy")


    def allreduce():
        import torch
        import torch.distributed as dist

        dist.init_process_group("gloo")
        world = dist.get_world_size()
        value = torch.full((1024,), float(dist.get_rank() + 1))
        dist.all_reduce(value)
        assert bool(torch.all(value == world * (world + 1) / 2)), "wrong sum"
        dist.destroy_process_group()
        return world


    if __name__ == "__main__":
        allreduce()
    """
)

CALLER = textwrap.dedent(
    """
    import sys, warnings
    warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
    from torchjob import Elastic, PyTorch, Worker, task
    from program import allreduce

    method, ranks = sys.argv[1], int(sys.argv[2])
    config = {{
        "sdk-elastic": lambda: Elastic(nproc_per_node=ranks),
        "sdk-pytorch": lambda: PyTorch(worker=Worker(replicas=ranks - 1)),
        "sdk-nodes": lambda: Elastic(nnodes=ranks),
    }}[method]()
    world = task(task_config=config)(allreduce)()
    assert world == ranks, world
    """
)


def call_overhead(calls: int) -> dict[str, float]:
    """Seconds per call: plain function vs single-process Elastic task (first call and mean)."""
    from torchjob import Elastic, task

    def work(x: int) -> int:
        return x + 1

    wrapped = task(task_config=Elastic(nnodes=1, nproc_per_node=1))(work)
    started = time.perf_counter()
    wrapped(1)  # the first call imports the launch module
    first = time.perf_counter() - started

    def timed(fn: Any) -> float:
        started = time.perf_counter()
        for i in range(calls):
            fn(i)
        return (time.perf_counter() - started) / calls

    direct = min(timed(work) for _ in range(3))
    sdk = min(timed(wrapped) for _ in range(3))
    return {"direct": direct, "task": sdk, "overhead": sdk - direct, "first_call": first}


def argv_for(method: str, ranks: int, work: Path) -> list[str]:
    if method == "torchrun":
        return [str(BIN / "torchrun"), "--standalone", f"--nproc-per-node={ranks}", str(work / "program.py")]
    return [sys.executable, str(work / "caller.py"), method, str(ranks)]


def run_once(method: str, ranks: int, work: Path) -> float:
    env = dict(os.environ, TORCHJOB_HOME=str(work / "home"), PYTHONPATH=str(work), OMP_NUM_THREADS="1")
    started = time.perf_counter()
    out = subprocess.run(
        argv_for(method, ranks, work), cwd=work, env=env, capture_output=True, text=True, timeout=TIMEOUT
    )
    wall = time.perf_counter() - started
    if out.returncode != 0:
        raise SystemExit(f"{method} with {ranks} ranks failed ({out.returncode}):\n{out.stderr[-3000:]}")
    return wall


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--calls", type=int, default=10000)
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument(
        "--methods", nargs="+", default=["torchrun", "sdk-elastic", "sdk-pytorch", "sdk-nodes"]
    )
    parser.add_argument("--json", type=Path, help="also write the raw numbers here")
    args = parser.parse_args()

    overhead = call_overhead(args.calls)
    print(
        f"call overhead, Elastic(nnodes=1, nproc_per_node=1): {overhead['overhead'] * 1e6:.2f} us per call "
        f"(direct {overhead['direct'] * 1e6:.3f} us, task {overhead['task'] * 1e6:.2f} us; "
        f"first call {overhead['first_call'] * 1e3:.2f} ms)"
    )
    walls: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-sdk-") as tmp:
        work = Path(tmp)
        (work / "program.py").write_text(PROGRAM)
        (work / "caller.py").write_text(CALLER.format())
        for rep in range(args.reps):
            for ranks in args.ranks:
                for method in args.methods:
                    wall = run_once(method, ranks, work)
                    walls.setdefault(f"{method} {ranks}", []).append(wall)
                    print(f"rep {rep + 1}: {method:12s} {ranks} ranks {wall:6.2f} s", flush=True)
    print()
    print("| method | ranks | median wall (s) | min | max |")
    print("|---|---|---|---|---|")
    for key, values in walls.items():
        method, ranks = key.split()
        low, mid, high = min(values), statistics.median(values), max(values)
        print(f"| {method} | {ranks} | {mid:.2f} | {low:.2f} | {high:.2f} |")
    if args.json:
        info = {"python": platform.python_version(), "cpus": os.cpu_count(), "reps": args.reps}
        args.json.write_text(json.dumps({"info": info, "overhead": overhead, "walls": walls}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
