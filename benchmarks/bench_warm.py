"""Calls of an SDK task from Python: the first call of a process, and the warm calls after it.

Run from the repository root with the project's virtualenv::

    .venv/bin/python benchmarks/bench_warm.py               # the goals: 2 and 4 ranks, 7 processes each
    .venv/bin/python benchmarks/bench_warm.py --ranks 2 --reps 9 --calls 8 --json out.json
    .venv/bin/python benchmarks/bench_warm.py --cold        # cold calls interleaved (TORCHJOB_WARM=0)
    .venv/bin/python benchmarks/bench_warm.py --ranks --elastic 2x2  # Elastic(nnodes=2, nproc_per_node=2)
    git worktree add /tmp/old HEAD~3 && .venv/bin/python benchmarks/bench_warm.py --against /tmp/old/src

Each repetition is a fresh Python process that imports ``torchjob`` (before the clock starts), then
calls a ``PyTorch`` task (a master and N-1 workers on the local engine: init gloo, all-reduce 1024
floats, return the sum) ``--calls`` times, the way a notebook does. Its 1st call starts the warm
pool (the fork server imports torch once); the later calls fork their ranks from it. Processes of
the cases take turns, so that other load on the machine falls on all of them alike; ``--cold``
adds a cold call (``TORCHJOB_WARM=0``: every rank a new interpreter) after each warm one, for
comparison. ``--elastic 2x2`` runs an ``Elastic(nnodes=2, nproc_per_node=2)`` task the same way.
``--against SRC`` runs every case with another checkout's code as well (``PYTHONPATH=SRC``, the
same virtualenv), its processes taking turns with this one's: the rows marked ``@against``.

Goals (issue 32, on a quiet machine): the first call of a process within 1.5 s (2 ranks); a warm
call within 0.10 s at 2 ranks and 0.15 s at 4 (the median of every call after the first, over all
processes). The machine's load average is printed beside every figure: the script prints met or
MISSED for each goal and exits 1 when one is missed.
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

from background_load import busy_loops

FIRST_GOAL = 1.5  # seconds, the first call of a process (2 ranks)
WARM_GOAL = {2: 0.10, 4: 0.15}  # seconds, a warm call

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

    ranks, calls, cold = int(sys.argv[1]), int(sys.argv[2]), sys.argv[4] == "cold"
    times = {"warm": [], "cold": []}
    loads = [os.getloadavg()[0]]
    for k in range(calls):
        for mode in ("warm", "cold") if cold else ("warm",):
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


def measure(ranks: int, calls: int, elastic: str = "", cold: bool = False, src: str = "") -> dict[str, Any]:
    """One fresh process making ``calls`` calls (and as many cold ones with ``cold``), with the code
    of ``src`` when given."""
    with tempfile.TemporaryDirectory(prefix="bench-warm-") as tmp:
        script = Path(tmp) / "caller.py"
        script.write_text(CALLER)
        env = dict(os.environ, TORCHJOB_HOME=str(Path(tmp) / "home"))
        env.pop("TORCHJOB_WARM", None)
        if src:
            env["PYTHONPATH"] = src
        done = subprocess.run(
            [sys.executable, str(script), str(ranks), str(calls), elastic, "cold" if cold else ""],
            cwd=tmp,
            env=env,
            capture_output=True,
            text=True,
            timeout=60 * calls * (2 if cold else 1),
        )
    if done.returncode != 0:
        raise SystemExit(f"{ranks} ranks: the caller failed:\n{done.stderr[-2000:]}")
    line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
    result: dict[str, Any] = json.loads(line[len("RESULT ") :])
    return result


def summary(case: str, runs: list[dict[str, Any]], mode: str) -> dict[str, Any]:
    firsts = [r["times"][mode][0] for r in runs]
    later = [t for r in runs for t in r["times"][mode][1:]]
    return {
        "case": case,
        "mode": mode,
        "ranks": runs[0]["ranks"],
        "first": statistics.median(firsts),
        "first_range": (min(firsts), max(firsts)),
        "later": statistics.median(later) if later else float("nan"),
        "later_range": (min(later), max(later)) if later else (float("nan"), float("nan")),
        "n_later": len(later),
        "load": (min(r["load"][0] for r in runs), max(r["load"][1] for r in runs)),
    }


def verdicts(rows: list[dict[str, Any]]) -> list[str]:
    lines = []
    for row in rows:
        if row["mode"] != "warm" or row["case"] != f"{row['ranks']} ranks":
            continue
        load = "load average {:.1f}-{:.1f}".format(*row["load"])
        if row["ranks"] == 2:
            verdict = "met" if row["first"] <= FIRST_GOAL else "MISSED"
            lines.append(
                f"- first call of a process, 2 ranks: {row['first']:.2f} s (median of "
                f"{len(row['runs'])} processes) (target ≤ {FIRST_GOAL:.1f} s: {verdict}; {load})"
            )
        goal = WARM_GOAL.get(row["ranks"])
        if goal is not None:
            verdict = "met" if row["later"] <= goal else "MISSED"
            lines.append(
                f"- warm call, {row['ranks']} ranks: {row['later']:.3f} s (median of {row['n_later']} "
                f"calls) (target ≤ {goal:.2f} s: {verdict}; {load})"
            )
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--calls", type=int, default=6, help="calls per process (the first one cold-starts the pool)"
    )
    parser.add_argument("--reps", type=int, default=7, help="processes per case")
    parser.add_argument("--ranks", type=int, nargs="*", default=[2, 4])
    parser.add_argument("--elastic", nargs="*", default=[], metavar="NODESxPROCS")
    parser.add_argument("--cold", action="store_true", help="a cold call after each warm one")
    parser.add_argument("--against", metavar="SRC", help="also run another checkout's src, interleaved")
    parser.add_argument("--json", type=Path)
    parser.add_argument(
        "--load", type=int, default=0, metavar="N", help="N busy loops beside it, each in its own session"
    )
    args = parser.parse_args()
    with busy_loops(args.load):
        return _main(args)


def _main(args: argparse.Namespace) -> int:
    cases = [(r, "") for r in args.ranks]
    for case in args.elastic:
        nodes, _, procs = case.partition("x")
        cases.append((int(nodes) * int(procs), case))
    versions = [""] + ([args.against] if args.against else [])
    runs: dict[str, list[dict[str, Any]]] = {}
    for rep in range(args.reps):
        turns = [(ranks, elastic, src) for ranks, elastic in cases for src in versions]
        for ranks, elastic, src in turns if rep % 2 == 0 else turns[::-1]:
            result = measure(ranks, args.calls, elastic, args.cold, src)
            if src:
                result["case"] += "@against"
            runs.setdefault(result["case"], []).append(result)
            times = " ".join(f"{t:.3f}" for t in result["times"]["warm"])
            print(f"  rep {rep + 1}: {result['case']}: {times}", file=sys.stderr)
    rows = []
    for case, found in runs.items():
        for mode in ("warm", "cold") if args.cold else ("warm",):
            rows.append({**summary(case, found, mode), "runs": found})
    head = f"{'case':>8}  {'mode':<4}  {'1st call (median, range)':>24}  {'later calls (median, range)':>27}"
    print(head + "  load 1m")
    for row in rows:
        first = "{:.2f} s ({:.2f}-{:.2f})".format(row["first"], *row["first_range"])
        later = "{:.3f} s ({:.3f}-{:.3f})".format(row["later"], *row["later_range"])
        load = "{:.1f}-{:.1f}".format(*row["load"])
        print(f"{row['case']:>8}  {row['mode']:<4}  {first:>24}  {later:>27}  {load}")
    results = verdicts(rows)
    print("\n".join(results))
    if args.json:
        args.json.write_text(json.dumps([r for found in runs.values() for r in found], indent=2))
    return 1 if any("MISSED" in line for line in results) else 0


if __name__ == "__main__":
    sys.exit(main())
