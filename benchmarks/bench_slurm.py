"""How fast a job starts on Slurm through torchjob, next to a bare ``sbatch`` + ``srun python``.

Run as root from the repository root, with Debian's ``slurm-wlm`` and ``munge`` installed (it starts
a private cluster, tools/slurm_cluster.py, and stops it at the end)::

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

Measured from just before ``sbatch`` (``bare``) or the CLI (``torchjob``): every rank running (the
last rank's start), every rank joined the group, and the wall time until the job left the queue.

Slurm's own delay, and why each launch waits a random pause first: Slurm 22.05 (this cluster's
``bf_interval=1``) starts no batch job at submission; its backfill pass starts it on the next tick,
once a second (the cluster's ``ctld.log`` says ``sched/backfill: _start_job: Started JobId=N``). The
delay D from ``sbatch`` to the allocation is therefore spread over [0, 1) s whoever submits, and it
is larger than everything a launcher does itself; a run that happened to submit at the same point
of the tick every time would measure the tick, not the launcher. So each launch first sleeps a
random time in [0, 1) s: its submission lands at a uniformly random point of the tick, and D has
the same distribution for both launches.
``--slurm-defaults`` starts the cluster with Slurm's own SchedulerParameters instead, as it is
installed: its main scheduler then starts batch jobs in passes 3 s apart (``sched: Allocate
JobId=N``), so D spreads over [0, 3) s, and the pause with it.

Each run is then split, from ``ctld.log`` (millisecond times) and an ``sbatch`` on PATH that
writes when it was called before running the real one (used by both launches, so each pays the
same few milliseconds for it):

* ``pre``: from the start to ``sbatch`` being called (torchjob: the CLI's start, its parse and the
  job directory; bare: the benchmark's own process start of ``sbatch``);
* ``delay``: Slurm's D, from ``sbatch`` being called to the job's start in ``ctld.log``
  (``Started JobId=N``, or ``sched: Allocate JobId=N`` for a job started at submission);
* ``inside``: from that start to every rank running (the batch script, for torchjob its controller,
  the steps' ``srun`` and the ranks' Python starts).

``pre + inside`` is the launcher's own cost; D is Slurm's and not the launcher's. The report gives
the raw medians and means of "running", the ratio of the raw means, and the estimate by which the
target is judged: (mean D of both launches pooled + torchjob's mean own cost) / (mean pooled D +
bare's mean own cost). Both ratios converge to the same value (D has one distribution), but the
raw one carries D's whole variance (its standard deviation is 0.29 s for one run, as large as
everything else in "running"), while in the estimate D only enters through the mean of all runs,
both launches', which moves the ratio little; what is left is the launchers' own spread, tens of
milliseconds. A bootstrap of 21 runs of each (benchmarks/README.md, 2026-11-26 22:28) gives the
raw ratio of means a standard deviation of 0.15-0.19 and the estimate 0.014-0.019.
"""

from __future__ import annotations

import argparse
import compileall
import importlib.util
import json
import os
import random
import re
import shlex
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from slurm_cluster import SlurmCluster
    from torchjob.engines.slurm.plan import SlurmPlan

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
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


def steps_script(ranks: int, port: int) -> str:
    """What a person writes for ``sbatch --wait``: each rank an ``srun`` step of its own, its env
    set by hand, the script waiting for all."""
    lines = [
        "#!/bin/sh",
        "MASTER_ADDR=$(hostname -s)",
        f"MASTER_PORT={port}",
        f"WORLD_SIZE={ranks}",
        "export MASTER_ADDR MASTER_PORT WORLD_SIZE",
    ]
    for rank in range(ranks):
        lines.append(
            f"RANK={rank} srun --exact -N1 -n1 --cpus-per-task=1 --kill-on-bad-exit=1 "
            f"{shlex.quote(sys.executable)} {shlex.quote(str(PROGRAM))} &"
        )
    lines += ["wait", ""]
    return "\n".join(lines)


SBATCH_TIMES = "BENCH_SBATCH_TIMES"  # where the sbatch wrapper writes when it was called
MEASURES = ("running", "joined", "wall", "pre", "delay", "inside")


def sbatch_wrapper(folder: Path) -> Path:
    """An ``sbatch`` that writes the time it was called, then runs the real one: put on PATH."""
    real = shutil.which("sbatch")
    if real is None:
        raise SystemExit("bench_slurm: no sbatch on PATH")
    folder.mkdir()
    wrapper = folder / "sbatch"
    wrapper.write_text(f'#!/bin/sh\ndate +%s.%N >> "${SBATCH_TIMES}"\nexec {shlex.quote(real)} "$@"\n')
    wrapper.chmod(0o755)
    return folder


_STARTED = re.compile(r"^\[([^\]]+)\] .*?(?:_start_job: Started|sched: Allocate) JobId=(\d+)\b")


def slurm_started(log: Path, job_id: str) -> float:
    """When slurmctld started ``job_id``: its first ``Started`` or ``Allocate`` line in ``ctld.log``
    (local time, milliseconds, as ``time.time()`` counts)."""
    for line in log.read_text(errors="replace").splitlines():
        found = _STARTED.match(line)
        if found and found.group(2) == job_id:
            return datetime.fromisoformat(found.group(1)).timestamp()
    raise SystemExit(f"bench_slurm: no start of job {job_id} in {log}")


def one_run(cluster: SlurmCluster, mode: str, ranks: int, base: Path, tick: float = 1.0) -> dict[str, float]:
    from slurm_cluster import free_port
    from torchjob.engines.slurm import clients

    job_dir = Path(tempfile.mkdtemp(dir=base, prefix=f"{mode}-{ranks}-"))
    marks = job_dir / "marks"
    marks.mkdir()
    port = free_port()
    times = job_dir / "sbatch-called"
    env = {**cluster.env, "TORCHJOB_BENCH_MARKS": str(marks), SBATCH_TIMES: str(times)}
    script = job_dir / "batch.sh"
    if mode == "plan":
        (job_dir / "job.yaml").write_text(job_yaml(ranks, port, marks))
        controller = [sys.executable, str(Path(__file__).resolve()), "--launch", str(job_dir)]
        plan = load_plan(job_dir, controller)
        script.write_text(plan.script)
        args = plan.sbatch_args
    else:
        script.write_text(steps_script(ranks, port) if mode == "sbatch-wait" else bare_script(ranks, port))
        args = ["--job-name=bare", f"--output={job_dir}/slurm-%j.out", f"--chdir={job_dir}"]
        args += [f"--ntasks={ranks}", "--cpus-per-task=1"]
    # A random point of Slurm's scheduling tick (see the module's docstring).
    time.sleep(random.random() * tick)
    if mode == "torchjob":
        (job_dir / "job.yaml").write_text(job_yaml(ranks, port, marks))
        root = job_dir / "root"
        env["TORCHJOB_SLURM_JOB_ROOT"] = str(root)
        argv = [sys.executable, "-m", "torchjob", "run", str(job_dir / "job.yaml"), "--engine", "slurm", "-q"]
        started = time.time()
        done = subprocess.run(
            argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=600, check=False
        )
        ended = time.time()
        if done.returncode != 0:
            raise SystemExit(f"torchjob {ranks} ranks: exit {done.returncode}: {done.stderr.strip()[-500:]}")
        (slurm_json,) = root.glob("*/slurm.json")
        job_id = str(json.loads(slurm_json.read_text())["jobId"])
    elif mode == "sbatch-wait":
        started = time.time()
        done = subprocess.run(
            ["sbatch", "--parsable", "--wait", *args, str(script)],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        ended = time.time()
        if done.returncode != 0:
            raise SystemExit(f"sbatch --wait {ranks} ranks: exit {done.returncode}: {done.stderr.strip()}")
        job_id = done.stdout.strip().split(";")[0]
    else:
        started = time.time()
        job_id = clients.submit(args, script, env)
        while clients.queue(job_id, cluster.env):
            time.sleep(0.05)
        ended = time.time()
    result = _marks(marks, mode, ranks, job_dir, started, ended)
    called = float(times.read_text().split()[0])
    slurm_start = slurm_started(cluster.dir / "ctld.log", job_id)
    result["pre"] = called - started
    result["delay"] = slurm_start - called
    result["inside"] = result["running"] - (slurm_start - started)
    return result


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


def allocation_run(mode: str, ranks: int, base: Path) -> dict[str, float]:
    """Inside the allocation (salloc's child): ``alloc-torchjob``, the engine running the job as
    steps of this allocation; ``alloc-srun``, bare ``srun -n RANKS`` of the same program."""
    from slurm_cluster import free_port

    job_dir = Path(tempfile.mkdtemp(dir=base, prefix=f"{mode}-{ranks}-"))
    marks = job_dir / "marks"
    marks.mkdir()
    port = free_port()
    env = {**os.environ, "TORCHJOB_BENCH_MARKS": str(marks)}
    if mode == "alloc-torchjob":
        (job_dir / "job.yaml").write_text(job_yaml(ranks, port, marks))
        env["TORCHJOB_SLURM_JOB_ROOT"] = str(job_dir / "root")
        argv = [sys.executable, "-m", "torchjob", "run", str(job_dir / "job.yaml"), "--engine", "slurm", "-q"]
    else:
        env.update(
            MASTER_ADDR=socket.gethostname().split(".")[0], MASTER_PORT=str(port), WORLD_SIZE=str(ranks)
        )
        rank_then_run = 'RANK=$SLURM_PROCID; export RANK; exec "$0" "$@"'
        argv = [
            "srun",
            f"-n{ranks}",
            "--kill-on-bad-exit=1",
            "sh",
            "-c",
            rank_then_run,
            sys.executable,
            str(PROGRAM),
        ]
    started = time.time()
    done = subprocess.run(
        argv, env=env, cwd=job_dir, capture_output=True, text=True, timeout=600, check=False
    )
    ended = time.time()
    if done.returncode != 0:
        raise SystemExit(f"{mode} {ranks} ranks: exit {done.returncode}: {done.stderr.strip()[-500:]}")
    return _marks(marks, mode, ranks, job_dir, started, ended)


def in_allocation(out: Path, ranks: int, reps: int) -> int:
    """salloc's child: the paired runs inside its allocation, written to ``out``."""
    results: dict[str, list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-alloc-", dir=out.parent) as tmp:
        modes = ["alloc-torchjob", "alloc-srun"]
        for rep in range(reps):
            for mode in modes if rep % 2 == 0 else modes[::-1]:
                results.setdefault(f"{mode} {ranks}", []).append(allocation_run(mode, ranks, Path(tmp)))
    out.write_text(json.dumps(results))
    return 0


def allocation_runs(
    cluster: SlurmCluster, ranks: int, reps: int, base: Path
) -> dict[str, list[dict[str, float]]]:
    """The paired runs inside one allocation of RANKS tasks (``salloc -n RANKS``)."""
    out = base / f"alloc-{ranks}.json"
    argv = [sys.executable, str(Path(__file__).resolve()), "--in-allocation", str(out)]
    argv += ["--ranks", str(ranks), "--reps", str(reps)]
    salloc = ["salloc", f"-n{ranks}", "--cpus-per-task=1", "--"]
    done = subprocess.run(
        [*salloc, *argv], env=cluster.env, capture_output=True, text=True, timeout=1800, check=False
    )
    if done.returncode != 0:
        raise SystemExit(f"bench_slurm: inside salloc: exit {done.returncode}: {done.stderr.strip()[-800:]}")
    data: dict[str, list[dict[str, float]]] = json.loads(out.read_text())
    return data


def start_ratios(launcher: list[dict[str, float]], bare: list[dict[str, float]]) -> dict[str, float]:
    """Every rank running, launcher against bare: the ratio of the raw medians and of the raw means,
    and the estimate that takes Slurm's delay out of the comparison. D has one distribution for
    both (the random pause), so the ratio of the raw means converges to (E[D] + own) / (E[D] +
    bare's own); the estimate puts the mean of every run's D (both launches pooled) for E[D], and
    so keeps only the launchers' own spread, not D's."""
    own = statistics.mean(r["pre"] + r["inside"] for r in launcher)
    bare_own = statistics.mean(r["pre"] + r["inside"] for r in bare)
    pooled = statistics.mean(r["delay"] for r in [*launcher, *bare])
    return {
        "medians": statistics.median(r["running"] for r in launcher)
        / statistics.median(r["running"] for r in bare),
        "means": statistics.mean(r["running"] for r in launcher)
        / statistics.mean(r["running"] for r in bare),
        "pooled_delay": pooled,
        "own": own,
        "bare_own": bare_own,
        "estimate": (pooled + own) / (pooled + bare_own),
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument(
        "--modes",
        nargs="+",
        choices=("plan", "torchjob", "bare", "sbatch-wait"),
        default=["torchjob", "sbatch-wait"],
        help="bare: one srun of every rank, polled until it left the queue; sbatch-wait: a script "
        "of one srun step per rank with the env set by hand, under sbatch --wait",
    )
    parser.add_argument(
        "--allocation",
        action="store_true",
        help="also inside one allocation (salloc -n RANKS): torchjob run against bare srun -n RANKS",
    )
    parser.add_argument("--in-allocation", help=argparse.SUPPRESS)  # salloc's child: write results here
    parser.add_argument(
        "--slurm-defaults",
        action="store_true",
        help="the cluster with Slurm's own SchedulerParameters (batch jobs start on a 3 s tick) "
        "instead of the test cluster's 1 s backfill",
    )
    parser.add_argument("--json", help="write the raw numbers here")
    parser.add_argument("--launch", help=argparse.SUPPRESS)  # inside the allocation: the stand-in controller
    args = parser.parse_args()
    if args.launch:
        return launch(Path(args.launch))
    if args.in_allocation:
        return in_allocation(Path(args.in_allocation), args.ranks[0], args.reps)
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
        scheduler = None if args.slurm_defaults else "bf_interval=1"
        tick = 3.0 if args.slurm_defaults else 1.0  # the passes' spacing measured in ctld.log
        cluster = slurm_cluster.SlurmCluster(base / "cluster", scheduler=scheduler)
        # Both launches find the timing sbatch first: torchjob's CLI through the env it is given,
        # bare's steps.submit through this process's PATH.
        path = f"{sbatch_wrapper(base / 'wrap')}{os.pathsep}{os.environ.get('PATH', '')}"
        os.environ["PATH"] = cluster.env["PATH"] = path
        try:
            cluster.start()
            for rep in range(args.reps):
                for ranks in args.ranks:
                    for mode in args.modes if rep % 2 == 0 else args.modes[::-1]:
                        run = one_run(cluster, mode, ranks, base, tick)
                        results.setdefault(f"{mode} {ranks}", []).append(run)
            if args.allocation:
                for ranks in args.ranks:
                    results.update(allocation_runs(cluster, ranks, args.reps, base))
        finally:
            cluster.stop()
    load = os.getloadavg()
    print(
        f"{os.cpu_count()} CPUs, load average {load_before[0]:.1f} before, "
        f"{load[0]:.1f} {load[1]:.1f} {load[2]:.1f} after; median of {args.reps}"
    )
    print(f"{'launch':<16} {'ranks running s':>16} {'joined s':>9} {'wall s':>7}")
    for key, runs in results.items():
        row = [statistics.median(r[m] for r in runs) for m in ("running", "joined", "wall")]
        print(f"{key:<16} {row[0]:>16.2f} {row[1]:>9.2f} {row[2]:>7.2f}")
    print(
        "every rank running, split (means, s): pre = to sbatch, delay = Slurm's, "
        "inside = from Slurm's start to all running"
    )
    print(f"{'launch':<16} {'median':>7} {'mean':>7} {'pre':>7} {'delay':>7} {'inside':>7} {'own':>7}")
    for key, runs in results.items():
        if "delay" not in runs[0]:
            continue  # inside an allocation: no sbatch, no Slurm delay
        mean = {m: statistics.mean(r[m] for r in runs) for m in MEASURES}
        running = statistics.median(r["running"] for r in runs)
        own = mean["pre"] + mean["inside"]
        print(
            f"{key:<16} {running:>7.3f} {mean['running']:>7.3f} {mean['pre']:>7.3f} {mean['delay']:>7.3f} "
            f"{mean['inside']:>7.3f} {own:>7.3f}"
        )
    summary: dict[str, dict[str, float]] = {}
    pairs_of = (
        ("torchjob", "sbatch-wait"),
        ("torchjob", "bare"),
        ("plan", "bare"),
        ("alloc-torchjob", "alloc-srun"),
    )
    for ranks in args.ranks:
        for mode, against in pairs_of:
            mine, theirs = results.get(f"{mode} {ranks}"), results.get(f"{against} {ranks}")
            if not mine or not theirs:
                continue
            for measure in ("running", "wall"):
                pairs = [a[measure] / b[measure] for a, b in zip(mine, theirs, strict=True)]
                ratio = statistics.mean(r[measure] for r in mine) / statistics.mean(
                    r[measure] for r in theirs
                )
                summary.setdefault(f"{mode}/{against} {ranks}", {})[measure] = ratio
                print(
                    f"{ranks} ranks: {mode} / {against} {measure}: ratio of means {ratio:.3f}, median of "
                    f"pairs {statistics.median(pairs):.2f} (pairs {min(pairs):.2f}-{max(pairs):.2f})"
                )
            if "delay" in mine[0]:
                ratios = start_ratios(mine, theirs)
                summary[f"{mode}/{against} {ranks}"].update(ratios)
                print(
                    f"{ranks} ranks: {mode} / {against} every rank running, Slurm's delay pooled: "
                    f"(D {ratios['pooled_delay']:.3f} s + own {ratios['own']:.3f} s) / (D + "
                    f"{ratios['bare_own']:.3f} s) = {ratios['estimate']:.3f}"
                )
    if args.json:
        data = {"load_before": load_before, "load": load, "results": results, "start_ratios": summary}
        Path(args.json).write_text(json.dumps(data, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
