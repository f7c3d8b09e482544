"""What torchjob's rank guard adds to the start of one torchrun rank (``$PYTHON_EXEC``).

Run from the repository root with the project's virtualenv::

    .venv/bin/python benchmarks/bench_rank_guard.py            # 30 starts of each case, interleaved
    .venv/bin/python benchmarks/bench_rank_guard.py --reps 60 --torch

A rank is started as torchrun starts it, ``$PYTHON_EXEC -u SCRIPT``, three ways, taking turns so
that other load on the machine falls on all alike: ``python`` (torchrun's default, no guard),
``runner`` (the rank run through torchjob's runner at once, what the guard's child is) and
``guard`` (the job's ``bin/torchjob-rank``, as the local and Slurm engines set it). The script is
``pass``, or ``import torch`` with ``--torch``. Prints each case's median and spread of wall time
(ms) and the load average; the local and Slurm engines pay the same guard.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from torchjob.pyrunner import pyrun


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--torch", action="store_true", help="the rank imports torch")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "rank.py"
        script.write_text("import torch\n" if args.torch else "pass\n")
        guard = Path(tmp) / pyrun.RANK_SHIM
        guard.write_text(pyrun.guard_shim(sys.executable))
        guard.chmod(0o700)
        runner = [sys.executable, "-c", pyrun.BOOT, pyrun.RUNNER, "rank", "0", "", tmp]
        cases = {
            "python": [sys.executable, "-u", str(script)],
            "runner": [*runner, str(script)],
            "guard": [str(guard), "-u", str(script)],
        }
        times: dict[str, list[float]] = {name: [] for name in cases}
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        load = os.getloadavg()[0]
        for _ in range(args.reps):
            for name, argv in cases.items():
                started = time.perf_counter()
                subprocess.run(argv, env=env, check=True, timeout=120)
                times[name].append((time.perf_counter() - started) * 1000)
        load = (load + os.getloadavg()[0]) / 2
    print(f"{args.reps} starts each, {'import torch' if args.torch else 'pass'}, load {load:.1f}")
    base = statistics.median(times["python"])
    for name, values in times.items():
        median = statistics.median(values)
        q = statistics.quantiles(values, n=4)
        spread = f"(quartiles {q[0]:.1f}-{q[2]:.1f})"
        print(f"  {name:7} median {median:7.1f} ms  {spread}  +{median - base:.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
