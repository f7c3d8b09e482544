"""What the local queue (engines/local/admission/) adds to a job's start when capacity is free.

Run from the repository root with the project's virtualenv::

    .venv/bin/python benchmarks/bench_admission.py              # 200 repetitions, 0/10/50 jobs held
    .venv/bin/python benchmarks/bench_admission.py --reps 50 --held 0 100

Part 1, in-process: for a job of one pod asking one GPU (``TORCHJOB_CAPACITY`` gives 1,000 fake
GPUs, so there is always room), the steps the engine adds: the plan (requests, settings file,
capacity, checks), the first look at the state file (which registers the job and admits it), and
the release at its end; with 0, 10 or 50 other jobs holding GPUs in the state (their entries carry
this process's pid, so they count as alive). Also the import of the modules a queued job loads
(the plan and the ticket, with what they import; compiled first, as an installed package's are).

Part 2, end to end: ``torchjob run`` of that job, queued and with ``--no-queue``, interleaved,
median wall time; the difference is the whole cost as a user sees it (noisy on a shared machine).

Target: under 10 ms added when capacity is free. Prints PASS or FAIL; exits 1 on FAIL.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TARGET_MS = 10.0

JOB = {
    "apiVersion": "batch.volcano.sh/v1alpha1",
    "kind": "Job",
    "metadata": {"name": "bench"},
    "spec": {
        "tasks": [
            {
                "name": "main",
                "replicas": 1,
                "template": {
                    "spec": {
                        "restartPolicy": "Never",
                        "containers": [
                            {
                                "name": "main",
                                "image": "x",
                                "command": ["true"],
                                "resources": {"limits": {"nvidia.com/gpu": 1}, "requests": {"cpu": "100m"}},
                            }
                        ],
                    }
                },
            }
        ]
    },
}


def in_process(reps: int, held: int) -> dict[str, float]:
    from torchjob.engines.local import admission
    from torchjob.engines.local.state import start_time
    from torchjob.jobs import load_jobs_from_text

    job = load_jobs_from_text(json.dumps(JOB), "bench.json")[0].job
    with admission.locked_state() as data:  # other jobs holding GPUs, alive (this process)
        jobs = admission.live_jobs(data)
        jobs.clear()
        for i in range(held):
            jobs[f"other-{i}"] = {
                "job": f"other-{i}",
                "name": "other",
                "pid": os.getpid(),
                "created": start_time(os.getpid()),
                "at": time.time(),
                "seq": i,
                "queue": "default",
                "priority": 0,
                "pods": {"main/0": {"nvidia.com/gpu": 1.0}},
                "gang": ["main/0"],
                "granted": {"main/0": [str(i)]},
                "passed": 0,
            }
    steps: dict[str, list[float]] = {"plan": [], "admit": [], "release": [], "total": []}
    for i in range(reps):
        t0 = time.perf_counter()
        plan = admission.plan_for(job)
        t1 = time.perf_counter()
        assert plan is not None
        ticket = admission.Ticket(plan, f"bench-{i:06x}", "bench")
        assert ticket.poll(), ticket.reason  # the first look registers the job and admits it
        t2 = time.perf_counter()
        ticket.release()
        t3 = time.perf_counter()
        for name, value in zip(steps, (t1 - t0, t2 - t1, t3 - t2, t3 - t0), strict=True):
            steps[name].append(value * 1000)
    return {name: statistics.median(values) for name, values in steps.items()}


def import_ms() -> float:
    compileall.compile_dir(str(REPO / "src/torchjob/engines/local/admission"), quiet=1)
    code = (
        "import time, torchjob.engines.local.gpus, torchjob.errors, contextlib, fcntl, json, stat\n"
        "t = time.perf_counter()\n"
        "import torchjob.engines.local.admission.plan, torchjob.engines.local.admission.ticket\n"
        "print((time.perf_counter() - t) * 1000)"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    runs = [float(subprocess.check_output([sys.executable, "-c", code], env=env)) for _ in range(5)]
    return min(runs)


def end_to_end(reps: int, root: Path) -> dict[str, float]:
    path = root / "bench.json"
    path.write_text(json.dumps(JOB))
    walls: dict[str, list[float]] = {"queued": [], "--no-queue": []}
    # Compiled modules, as an installed torchjob has (PYTHONDONTWRITEBYTECODE would compile each time).
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["TORCHJOB_HOME"] = str(root)
    compileall.compile_dir(str(REPO / "src" / "torchjob"), quiet=1)
    for _ in range(reps):
        for mode in walls:
            extra = ["--no-queue"] if mode == "--no-queue" else []
            start = time.perf_counter()
            cmd = [sys.executable, "-m", "torchjob", "run", "-q", "--rm", *extra, str(path)]
            subprocess.run(
                cmd, check=True, capture_output=True, env={**os.environ, "TORCHJOB_HOME": str(root)}
            )
            walls[mode].append((time.perf_counter() - start) * 1000)
    return {mode: statistics.median(values) for mode, values in walls.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=200)
    parser.add_argument("--held", type=int, nargs="+", default=[0, 10, 50])
    parser.add_argument("--cli-reps", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "runtime").mkdir(mode=0o700)
        os.environ["TORCHJOB_RUNTIME_DIR"] = str(root / "runtime")
        os.environ["TORCHJOB_QUEUE_DIR"] = str(root / "runtime")  # not the machine's shared queue
        os.environ["TORCHJOB_CAPACITY"] = "cpu=64,memory=256Gi,nvidia.com/gpu=1000"
        os.environ["TORCHJOB_CONFIG"] = str(root / "queues.yaml")  # none: the defaults
        print(f"in-process, median of {args.reps} (ms): plan, admitting look, release, total")
        worst = 0.0
        for held in args.held:
            got = in_process(args.reps, held)
            worst = max(worst, got["total"])
            cells = "  ".join(f"{name} {value:6.3f}" for name, value in got.items())
            print(f"  {held:3d} jobs held: {cells}")
        imported = import_ms()
        print(f"import of admission's plan and ticket (compiled): {imported:.2f} ms")
        walls = end_to_end(args.cli_reps, root)
        diff = walls["queued"] - walls["--no-queue"]
        print(
            f"torchjob run, median of {args.cli_reps}: queued {walls['queued']:.0f} ms, "
            f"--no-queue {walls['--no-queue']:.0f} ms (difference {diff:+.0f} ms, noisy)"
        )
    added = worst + imported
    verdict = "PASS" if added < TARGET_MS else "FAIL"
    print(
        f"{verdict}: admission adds {added:.2f} ms (worst total + import) when capacity is free; "
        f"target < {TARGET_MS:g} ms"
    )
    return 0 if verdict == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
