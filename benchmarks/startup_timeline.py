"""Where ``torchjob run``'s wall time and CPU go, phase by phase, from the launch to the exit.

Run from the repository root with the project's virtualenv::

    .venv/bin/python benchmarks/startup_timeline.py --runs 11
    .venv/bin/python benchmarks/startup_timeline.py --runs 11 --rt     # as root: see below

Each run is ``torchjob run`` of a job of 2 pods (the pytorch plugin, 1 master + 1 worker) whose
containers sleep 0.3 s, in a Python that wraps the functions of each phase (the command line's
dispatch, the job's load and plan, the supervisor's preparation, each pod's spawn, the loop, the
shutdown) and notes the wall time since the launch and this process's CPU time as each begins and
ends. The table gives the median of each mark over the runs. Where ``startup_phases.py`` compares
the CPU of two checkouts, this shows one checkout's whole path, waits included: where wall time
runs ahead of CPU time the command waits (for a child, the disk, the scheduler).

``--rt`` runs each ``torchjob run`` (and every process it starts) under SCHED_FIFO, so that other
work on a shared machine does not stretch the timeline; it needs root or CAP_SYS_NICE. With it,
the pods' processes also run first, which a real job's would not: read the start-up part (to the
second spawn) and the tail, not the loop. The job file's read by a forked child
(``spec/prefetch.py``) only happens when a core is idle as the command starts, so on a busy
machine the load phase includes PyYAML's import and parse.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from startup_ab import job_yaml, run_wrapped

ROOT = Path(__file__).resolve().parent.parent

# The phases: "module:qualified.name" of what is timed; each call's start and end are marked.
TIMED = (
    "torchjob.cli.app:dispatch",
    "torchjob.cli.run_command:run_run",
    "torchjob.cli.run_command:_load",
    "torchjob.engines.local.engine:LocalEngine.plan",
    "torchjob.engines.local.supervisor:Supervisor.run",
    "torchjob.engines.local.creation:PodFactory.prepare",
    "torchjob.engines.local.network:JobNetwork.finish",
    "torchjob.engines.local.ports:reserve",
    "torchjob.engines.local.cleanup:JobProcesses.start",
    "torchjob.controller.driver:Controller.begin",
    "torchjob.engines.local.process:spawn",
    "torchjob.engines.local.creation:PodFactory.write_records",
    "torchjob.engines.local.supervisor:Supervisor.loop",
    "torchjob.engines.local.supervisor:Supervisor.shutdown",
)

# The wrapper: the program's entry point (cli.main) with each timed function marking its call.
WRAPPER = r"""
import importlib, json, os, sys, time
launched = float(os.environ["TIMELINE_LAUNCHED"])
marks = [["interpreter started", time.time(), time.process_time()]]
import torchjob.cli as cli
def timed(spec):
    module, _, name = spec.partition(":")
    owner = importlib.import_module(module)
    *path, last = name.split(".")
    for part in path:
        owner = getattr(owner, part)
    inner = getattr(owner, last)
    def wrapper(*args, **kwargs):
        marks.append([name + " <", time.time(), time.process_time()])
        try:
            return inner(*args, **kwargs)
        finally:
            marks.append([name + " >", time.time(), time.process_time()])
    setattr(owner, last, wrapper)
for spec in json.loads(os.environ["TIMELINE_TIMED"]):
    timed(spec)
marks.append(["the run's modules imported", time.time(), time.process_time()])
leave = cli._leave
def at_exit(code):
    marks.append(["exit", time.time(), time.process_time()])
    with open(os.environ["TIMELINE_OUT"], "w") as out:
        json.dump([[m, (w - launched) * 1000, c * 1000] for m, w, c in marks], out)
    leave(code)
cli._leave = at_exit
sys.argv = ["torchjob", "run", sys.argv[1]]
cli.main()
"""


def _realtime() -> None:  # runs in the child before exec
    os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(10))


def one_run(work: Path, index: int, rt: bool) -> list[tuple[str, float, float]]:
    job = work / f"job-{index}.yaml"
    job.write_text(job_yaml(command=["sleep", "0.3"], name=f"timeline-{index}", pytorch=True))
    out = work / f"marks-{index}.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHJOB_")}
    env.update(
        TORCHJOB_HOME=str(work / "home"),
        TIMELINE_OUT=str(out),
        TIMELINE_TIMED=json.dumps(TIMED),
        TIMELINE_LAUNCHED=repr(time.time()),
    )
    run_wrapped(WRAPPER, job, env, _realtime if rt else None)
    return [(str(m), float(w), float(c)) for m, w, c in json.loads(out.read_text())]


def numbered(marks: list[tuple[str, float, float]]) -> list[tuple[str, float, float]]:
    """Marks of a function called more than once (spawn) get their call's number."""
    seen: dict[str, int] = {}
    out = []
    for name, wall, cpu in marks:
        seen[name] = seen.get(name, 0) + 1
        out.append((name if seen[name] == 1 else f"{name} #{seen[name]}", wall, cpu))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=11, help="runs (default 11); the medians are printed")
    parser.add_argument("--rt", action="store_true", help="run each torchjob under SCHED_FIFO (root)")
    args = parser.parse_args()
    if args.rt:
        try:
            _realtime()
        except PermissionError:
            print("--rt needs root or CAP_SYS_NICE", file=sys.stderr)
            return 2
        os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
    with tempfile.TemporaryDirectory(prefix="torchjob-timeline-") as folder:
        work = Path(folder)
        (work / "home").mkdir(mode=0o700)
        runs = [numbered(one_run(work, i, args.rt)) for i in range(args.runs)]
    names = [name for name, _, _ in runs[0]]
    by_run = [{name: (wall, cpu) for name, wall, cpu in run} for run in runs]
    load = os.getloadavg()[0]
    print(f"{args.runs} runs{' under SCHED_FIFO' if args.rt else ''}, load {load:.1f}; ms since the launch")
    print(f"{'mark':46} {'wall':>8} {'cpu':>8}")
    for name in names:
        found = [run[name] for run in by_run if name in run]
        wall = statistics.median(w for w, _ in found)
        cpu = statistics.median(c for _, c in found)
        print(f"{name:46} {wall:8.1f} {cpu:8.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
