"""A real flytekit task through torchjob against the same task as torchjob's own ``@task`` (issue 27).

Run from the repository root with the project's virtualenv (flytekit from the ``flyte`` extra)::

    .venv/bin/python benchmarks/bench_flyte.py                 # 7 pairs of processes, 3 calls each
    .venv/bin/python benchmarks/bench_flyte.py --reps 11 --calls 3 --json out.json

Each process makes ``--calls`` calls of one task, a master and a worker on the local engine that
init gloo, all-reduce 1024 floats and return the sum, the way a notebook does: in the ``flytekit``
process the function is a flytekit ``@task(task_config=PyTorch(worker=Worker(replicas=1)))`` called
with ``torchjob.sdk.flyte.run`` (flytekit's local execution around it: inputs and the output through
its type engine); in the ``torchjob`` process the same function is a ``torchjob.task`` with torchjob's
``PyTorch``, called directly. The processes of a pair run one after the other, in alternating order,
so that other load on the machine hits both alike. The figure of merit is the 2nd call (warm: its
ranks fork from the process's warm pool), target: flytekit within 1.2x of torchjob.
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
TARGET = 1.2

CALLER = textwrap.dedent(
    """
    import json, os, sys, time

    kind, calls = sys.argv[1], int(sys.argv[2])


    def allreduce(n: int) -> float:
        import torch, torch.distributed as dist
        dist.init_process_group("gloo")
        t = torch.ones(n)
        dist.all_reduce(t)
        dist.destroy_process_group()
        return float(t.sum())


    if kind == "flytekit":
        from flytekit import task
        from flytekitplugins.kfpytorch import PyTorch, Worker
        from torchjob.sdk.flyte import run

        flyte_task = task(task_config=PyTorch(worker=Worker(replicas=1)))(allreduce)
        call = lambda: run(flyte_task, n=1024)
    else:
        from torchjob import PyTorch, Worker, task

        torchjob_task = task(task_config=PyTorch(worker=Worker(replicas=1)))(allreduce)
        call = lambda: torchjob_task(1024)

    times, load = [], os.getloadavg()[0]
    for _ in range(calls):
        started = time.perf_counter()
        value = call()
        times.append(time.perf_counter() - started)
        assert value == 2048.0, value
    print("RESULT " + json.dumps({"kind": kind, "times": times, "load": load}), flush=True)
    """
)


def measure(kind: str, calls: int, tmp: Path) -> dict[str, Any]:
    script = tmp / "caller.py"
    script.write_text(CALLER)
    env = dict(os.environ, TORCHJOB_HOME=str(tmp / "home"), PYTHONWARNINGS="ignore")
    done = subprocess.run(
        [sys.executable, str(script), kind, str(calls)],
        cwd=tmp,
        env=env,
        capture_output=True,
        text=True,
        timeout=120 * calls,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        raise SystemExit(f"{kind} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    result: dict[str, Any] = json.loads(lines[-1][len("RESULT ") :])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=7, help="pairs of processes")
    parser.add_argument("--calls", type=int, default=3, help="calls per process (the 2nd is warm)")
    parser.add_argument("--json", metavar="FILE", help="write every measurement there")
    args = parser.parse_args()
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-flyte-") as name:
        tmp = Path(name)
        for rep in range(args.reps):
            order = ("flytekit", "torchjob") if rep % 2 == 0 else ("torchjob", "flytekit")
            pair = {kind: measure(kind, args.calls, tmp) for kind in order}
            results.append(pair)
            flyte, own = pair["flytekit"]["times"], pair["torchjob"]["times"]
            print(
                f"pair {rep + 1}: 2nd call flytekit {flyte[1]:.3f} s, torchjob {own[1]:.3f} s "
                f"({flyte[1] / own[1]:.2f}x); 1st {flyte[0]:.2f} / {own[0]:.2f} s; "
                f"load {pair['torchjob']['load']:.1f}",
                flush=True,
            )
    print()
    print("| call | flytekit (median s) | torchjob (median s) | ratio of medians | median of pair ratios |")
    print("|---|---|---|---|---|")
    for index, label in ((0, "1st (cold)"), (1, "2nd (warm)"), (args.calls - 1, f"call {args.calls} (warm)")):
        flyte = [p["flytekit"]["times"][index] for p in results]
        own = [p["torchjob"]["times"][index] for p in results]
        pairs = statistics.median(f / o for f, o in zip(flyte, own, strict=True))
        print(
            f"| {label} | {statistics.median(flyte):.3f} | {statistics.median(own):.3f} | "
            f"{statistics.median(flyte) / statistics.median(own):.3f} | {pairs:.3f} |"
        )
    warm = statistics.median(p["flytekit"]["times"][1] / p["torchjob"]["times"][1] for p in results)
    print(
        f"\n2nd call, flytekit/torchjob (median of pairs): {warm:.3f} (target <= {TARGET}: "
        f"{'met' if warm <= TARGET else 'MISSED'})"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
