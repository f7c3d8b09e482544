"""How fast a job starts on Slurm through torchjob, next to a bare ``sbatch`` + ``srun python``.

Run as root from the repository root, with Debian's ``slurm-wlm`` and ``munge`` installed (it starts
a private cluster, tests/slurm_cluster.py, and stops it at the end)::

    .venv/bin/python benchmarks/bench_slurm.py                      # 2 and 4 ranks, 3 repetitions
    .venv/bin/python benchmarks/bench_slurm.py --ranks 2 --reps 5 --json out.json
    .venv/bin/python benchmarks/bench_slurm.py --modes plan torchjob bare

The program is ``examples/programs/allreduce.py`` (init gloo, one all-reduce, check the sum), which
writes when each rank started, joined the group and ended. The launches (``torchjob`` and ``bare``
unless ``--modes`` says otherwise) run one after the other for each repetition and rank count,
their order reversed every other repetition, so each ``torchjob`` run has a ``bare`` run of the
same size next to it, under the same load: the ratios are taken per pair, then their median.

* ``plan``: torchjob's Slurm plan: ``sbatch`` with the plan's arguments and batch script, whose
  controller (a stand-in until the engine-neutral controller exists: this script with
  ``--launch``) reads the allocation, places the pods and starts each as a job step
  (``steps.Step``) with the plan's env, then waits for them;
* ``torchjob``: ``torchjob run job.yaml --engine slurm -q``, the whole engine: the job directory,
  ``sbatch``, the controller on the batch host (the engine-neutral controller over Slurm steps),
  the CLI waiting until the job ended (its wall time is until the CLI returned);
* ``bare``: ``sbatch`` of a script that runs ``srun python allreduce.py`` once for all ranks, RANK
  from ``SLURM_PROCID``: what people write by hand.

Measured from just before ``sbatch``: every rank running (the last rank's start), every rank joined
the group, and the wall time until the job left the queue.
"""

from __future__ import annotations

import argparse
import compileall
import importlib.util
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from slurm_cluster import SlurmCluster
    from torchjob.engines.slurm.plan import SlurmPlan

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
PROGRAM = ROOT / "examples" / "programs" / "allreduce.py"


def job_yaml(ranks: int, port: int, marks: Path) -> str:
    import yaml

    container = {
        "name": "main",
        "image": "python:3.11",
        "command": [sys.executable, str(PROGRAM)],
        "env": [{"name": "TORCHJOB_BENCH_MARKS", "value": str(marks)}],
        "resources": {"limits": {"cpu": "1"}},
    }
    spec = {"restartPolicy": "Never", "containers": [container]}
    doc = {
        "apiVersion": "batch.volcano.sh/v1alpha1",
        "kind": "Job",
        "metadata": {"name": "bench"},
        "spec": {
            "plugins": {"pytorch": ["--master=master", "--worker=worker", f"--port={port}"]},
            "tasks": [
                {"name": "master", "replicas": 1, "template": {"spec": spec}},
                {"name": "worker", "replicas": ranks - 1, "template": {"spec": spec}},
            ],
        },
    }
    return str(yaml.safe_dump(doc))


def load_plan(job_dir: Path, controller: list[str]) -> SlurmPlan:
    from torchjob.engines.slurm.plan import plan_job
    from torchjob.engines.slurm.settings import SlurmSettings
    from torchjob.jobs import load_jobs_from_text

    job = load_jobs_from_text((job_dir / "job.yaml").read_text())[0].job
    assert job is not None
    return plan_job(job, SlurmSettings(), str(job_dir), controller)


def launch(job_dir: Path) -> int:
    """Inside the allocation: place the pods, start each as a step, wait for all (the stand-in controller)."""
    from torchjob.engines.slurm import steps
    from torchjob.engines.slurm.plan import launches, place

    job_id = os.environ["SLURM_JOB_ID"]
    plan = load_plan(job_dir, ["true"])
    layout = steps.layout_from_env(os.environ, steps.hostnames)
    running = []
    for pod in launches(plan, place(plan, layout)):
        component = plan.components[pod.placement.component]
        running.append(
            steps.Step.start(
                job_id,
                pod.pod,
                pod.argv,
                host=pod.placement.host,
                resources=component.resources,
                env={**os.environ, **pod.env},
                log=job_dir / f"{pod.pod}.log",
                working_dir=str(job_dir),
            )
        )
    codes = [step.wait(300) for step in running]
    return max((1 if code is None else code) for code in codes)


def compile_bytecode() -> None:
    """Write torchjob's ``.pyc`` files first, as installing a wheel does: with
    ``PYTHONDONTWRITEBYTECODE`` set (as on the machine these numbers come from), an editable
    checkout would compile its modules from source in the CLI and again in the controller on
    every start (a quarter of a second each, measured under load), which no installed copy pays."""
    spec = importlib.util.find_spec("torchjob")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        compileall.compile_dir(folder, quiet=1)


def bare_script(ranks: int, port: int) -> str:
    rank_then_run = 'RANK=$SLURM_PROCID; export RANK; exec "$0" "$@"'
    return "\n".join(
        [
            "#!/bin/sh",
            "MASTER_ADDR=$(hostname -s)",
            f"MASTER_PORT={port}",
            f"WORLD_SIZE={ranks}",
            "export MASTER_ADDR MASTER_PORT WORLD_SIZE",
            f"exec srun --kill-on-bad-exit=1 sh -c {shlex.quote(rank_then_run)} "
            f"{shlex.quote(sys.executable)} {shlex.quote(str(PROGRAM))}",
            "",
        ]
    )


def one_run(cluster: SlurmCluster, mode: str, ranks: int, base: Path) -> dict[str, float]:
    from slurm_cluster import free_port
    from torchjob.engines.slurm import steps

    job_dir = Path(tempfile.mkdtemp(dir=base, prefix=f"{mode}-{ranks}-"))
    marks = job_dir / "marks"
    marks.mkdir()
    port = free_port()
    env = {**cluster.env, "TORCHJOB_BENCH_MARKS": str(marks)}
    script = job_dir / "batch.sh"
    if mode == "plan":
        (job_dir / "job.yaml").write_text(job_yaml(ranks, port, marks))
        controller = [sys.executable, str(Path(__file__).resolve()), "--launch", str(job_dir)]
        plan = load_plan(job_dir, controller)
        script.write_text(plan.script)
        args = plan.sbatch_args
    else:
        script.write_text(bare_script(ranks, port))
        args = ["--job-name=bare", f"--output={job_dir}/slurm-%j.out", f"--chdir={job_dir}"]
        args += [f"--ntasks={ranks}", "--cpus-per-task=1"]
    if mode == "torchjob":
        (job_dir / "job.yaml").write_text(job_yaml(ranks, port, marks))
        env["TORCHJOB_SLURM_JOB_ROOT"] = str(job_dir / "root")
        argv = [sys.executable, "-m", "torchjob", "run", str(job_dir / "job.yaml"), "--engine", "slurm", "-q"]
        started = time.time()
        done = subprocess.run(
            argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=600, check=False
        )
        ended = time.time()
        if done.returncode != 0:
            raise SystemExit(f"torchjob {ranks} ranks: exit {done.returncode}: {done.stderr.strip()[-500:]}")
        return _marks(marks, mode, ranks, job_dir, started, ended)
    started = time.time()
    job_id = steps.submit(args, script, env)
    while steps.queue(job_id, cluster.env):
        time.sleep(0.05)
    ended = time.time()
    return _marks(marks, mode, ranks, job_dir, started, ended)


def _marks(
    marks: Path, mode: str, ranks: int, job_dir: Path, started: float, ended: float
) -> dict[str, float]:
    rows = [line.split() for line in (marks / "marks.txt").read_text().splitlines()]
    by_name: dict[str, list[float]] = {}
    for name, _rank, _pid, when in rows:
        by_name.setdefault(name, []).append(float(when))
    if len(by_name.get("end", [])) != ranks:
        raise SystemExit(f"{mode} {ranks} ranks: not every rank ended; see {job_dir}")
    return {
        "running": max(by_name["start"]) - started,
        "joined": max(by_name["joined"]) - started,
        "wall": ended - started,
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument(
        "--modes", nargs="+", choices=("plan", "torchjob", "bare"), default=["torchjob", "bare"]
    )
    parser.add_argument("--json", help="write the raw numbers here")
    parser.add_argument("--launch", help=argparse.SUPPRESS)  # inside the allocation: the stand-in controller
    args = parser.parse_args()
    if args.launch:
        return launch(Path(args.launch))
    import slurm_cluster

    reason = slurm_cluster.why_not()
    if reason:
        print(f"bench_slurm: {reason}", file=sys.stderr)
        return 2
    compile_bytecode()
    results: dict[str, list[dict[str, float]]] = {}
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench-slurm-") as tmp:
        base = Path(tmp)
        cluster = slurm_cluster.SlurmCluster(base / "cluster")
        try:
            cluster.start()
            for rep in range(args.reps):
                for ranks in args.ranks:
                    for mode in args.modes if rep % 2 == 0 else args.modes[::-1]:
                        results.setdefault(f"{mode} {ranks}", []).append(one_run(cluster, mode, ranks, base))
        finally:
            cluster.stop()
    load = os.getloadavg()
    print(
        f"{os.cpu_count()} CPUs, load average {load_before[0]:.1f} before, "
        f"{load[0]:.1f} {load[1]:.1f} {load[2]:.1f} after; median of {args.reps}"
    )
    print(f"{'launch':<12} {'ranks running s':>16} {'joined s':>9} {'wall s':>7}")
    for key, runs in results.items():
        row = [statistics.median(r[m] for r in runs) for m in ("running", "joined", "wall")]
        print(f"{key:<12} {row[0]:>16.2f} {row[1]:>9.2f} {row[2]:>7.2f}")
    for ranks in args.ranks:
        bare = results.get(f"bare {ranks}")
        for mode in (m for m in args.modes if m != "bare" and bare is not None):
            for measure in ("running", "wall"):
                runs = zip(results[f"{mode} {ranks}"], bare or [], strict=True)
                pairs = [a[measure] / b[measure] for a, b in runs]
                print(
                    f"{ranks} ranks: {mode} / bare {measure}: median of pairs {statistics.median(pairs):.2f} "
                    f"(pairs {min(pairs):.2f}-{max(pairs):.2f})"
                )
    if args.json:
        data = {"load_before": load_before, "load": load, "results": results}
        Path(args.json).write_text(json.dumps(data, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
