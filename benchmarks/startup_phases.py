"""Where ``torchjob run``'s own CPU goes, phase by phase, in two checkouts side by side.

Run from the repository root with the project's virtualenv::

    .venv/bin/python benchmarks/startup_phases.py --old /tmp/old/src --runs 15

Each run is ``torchjob run`` of the job of ``startup_ab.py`` (1 master + 1 worker that only write
the time), in a Python that wraps the local supervisor's ``start``, ``loop`` and ``shutdown`` to
note the process's CPU time (``time.process_time``) as each begins and ends, and once more in an
exit handler. The versions alternate, the order flipping every round. Only this process's CPU is
counted, not its pods' or its watchdog's (``startup_ab.py`` measures the whole).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

from startup_ab import interleaved, job_yaml, run_wrapped, two_versions

# The wrapper: the program's own entry point (cli.main) with the supervisor's phases timed.
WRAPPER = r"""
import atexit, json, os, sys, time
marks = {"begin": time.process_time()}
import gc
# The threshold the version's main() would set (newer versions): set here, as the supervisor is
# imported below before main() runs. Importing torchjob.cli is what the program does first anyway.
import torchjob.cli
threshold = getattr(torchjob.cli, "PROGRAM_GC_THRESHOLD", None)
if threshold is not None:
    gc.set_threshold(threshold, *gc.get_threshold()[1:])
from torchjob.engines.local import supervisor as where

def timed(owner, name, key):
    inner = getattr(owner, name)
    def wrapper(*args, **kwargs):
        marks[key + ".begin"] = time.process_time()
        try:
            return inner(*args, **kwargs)
        finally:
            marks[key + ".end"] = time.process_time()
    setattr(owner, name, wrapper)

timed(where.Supervisor, "start", "start")
timed(where.Supervisor, "loop", "loop")
if hasattr(where.Supervisor, "shutdown"):  # older versions: a method
    timed(where.Supervisor, "shutdown", "shutdown")
else:
    timed(where, "shutdown", "shutdown")

def report():
    marks["exit"] = time.process_time()
    with open(os.environ["AB_OUT"], "w") as out:
        json.dump(marks, out)

atexit.register(report)
sys.argv = ["torchjob", "run", sys.argv[1]]
from torchjob.cli import main
sys.exit(main())
"""

PHASES = (
    ("begin", "start.begin", "imports, loading and checking the job, its directory"),
    ("start.begin", "start.end", "preparing and starting the pods"),
    ("start.end", "loop.end", "the loop, until the pods end"),
    ("shutdown.begin", "shutdown.end", "shutdown and summary"),
    ("shutdown.end", "exit", "after the shutdown, to the exit handlers"),
    ("begin", "exit", "in all"),
)


def one_run(src: Path, work: Path) -> dict[str, float]:
    marks = Path(tempfile.mkdtemp(dir=work))
    job = marks / "job.yaml"
    job.write_text(job_yaml(marks))
    out = marks / "phases.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHJOB_")}
    env.update(
        PYTHONPATH=str(src),
        TORCHJOB_HOME=str(work / "state"),
        AB_OUT=str(out),
    )
    run_wrapped(WRAPPER, job, env)
    marks_read: dict[str, float] = json.loads(out.read_text())
    return marks_read


def main() -> int:
    args, versions = two_versions(__doc__ or "")
    runs = interleaved(versions, args.runs, one_run)
    print(f"{args.runs} runs each, interleaved; the torchjob process's own CPU, ms, median")
    print(f"{'phase':58} {'old':>7} {'new':>7} {'new - old':>10}")
    for begin, end, label in PHASES:
        old, new = (statistics.median(r[end] - r[begin] for r in runs[n]) * 1000 for n in ("old", "new"))
        print(f"{label:58} {old:7.2f} {new:7.2f} {new - old:+10.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
