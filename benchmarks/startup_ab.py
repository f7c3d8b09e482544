"""``torchjob run`` start-up, two checkouts side by side: did a change make the local engine slower?

Run from the repository root with the project's virtualenv, after checking out the other version
somewhere (``git worktree add /tmp/old COMMIT``)::

    .venv/bin/python benchmarks/startup_ab.py --old /tmp/old/src --runs 15
    .venv/bin/python benchmarks/startup_ab.py --old /tmp/old/src --new src --runs 21 --json ab.json

Each run is ``torchjob run`` of the same job (1 master + 1 worker whose container only writes the
time it started), with ``PYTHONPATH`` pointing at one checkout's ``src``. The two versions are run
alternately, the order flipping every round, so load from other work on the machine falls on both
alike. Per run it records: launch to the first container process starting, the whole run's wall
time, and its CPU time (user + system of torchjob and everything it waited for: pods, watchdog);
then the CPU time of ``torchjob validate`` of the same file (start-up, imports, loading and checking
the job, no engine), which splits the run's CPU into the common front part and the engine's own.
Both trees are compiled to bytecode first, as an installed wheel is.
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
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TORCHJOB = Path(sys.executable).parent / "torchjob"


PYTORCH = False  # --pytorch: the job has the pytorch plugin (a rendezvous port mapped at its turn)


def job_yaml(
    marks: Path | None = None,
    *,
    command: list[str] | None = None,
    name: str = "ab",
    pytorch: bool | None = None,
) -> str:
    """1 master + 1 worker; each container writes when it started into ``marks`` (``date`` is
    started the same way under both versions), or runs ``command``; ``pytorch``: with the plugin
    (default: --pytorch)."""
    if command is None:
        command = ["sh", "-c", f'date +%s.%N > "{marks}/$TORCHJOB_POD_NAME"']
    tasks = []
    for task in ("master", "worker"):
        tasks += [
            f"    - name: {task}",
            "      replicas: 1",
            "      template:",
            "        spec:",
            "          restartPolicy: Never",
            "          containers:",
            "            - name: main",
            "              image: bench:local",
            f"              command: {json.dumps(command)}",
        ]
    head = [
        "apiVersion: batch.volcano.sh/v1alpha1",
        "kind: Job",
        f"metadata: {{name: {name}}}",
        "spec:",
        "  tasks:",
    ]
    with_plugin = PYTORCH if pytorch is None else pytorch
    if with_plugin:
        head.insert(-1, "  plugins: {pytorch: [--master=master, --worker=worker]}")
    return "\n".join(head + tasks) + "\n"


def run_wrapped(
    wrapper: str, job: Path, env: dict[str, str], preexec_fn: Callable[[], None] | None = None
) -> None:
    """``torchjob run JOB`` through ``wrapper`` (a Python program that times it), to its end."""
    subprocess.run(
        [sys.executable, "-c", wrapper, str(job)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        check=True,
        timeout=60,
        preexec_fn=preexec_fn,
    )


def one_run(src: Path, work: Path) -> dict[str, float]:
    marks = Path(tempfile.mkdtemp(dir=work))
    job = marks / "job.yaml"
    job.write_text(job_yaml(marks))
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHJOB_")}
    env.update(PYTHONPATH=str(src), TORCHJOB_HOME=str(work / "state"))
    launched = time.time()
    started = time.perf_counter()
    proc = subprocess.Popen(
        [str(TORCHJOB), "run", str(job)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"torchjob run with {src} failed: exit code {proc.returncode}")
    firsts = [float(p.read_text()) for p in marks.iterdir() if p.name != "job.yaml"]
    if len(firsts) != 2:
        raise SystemExit(f"expected 2 container marks with {src}, found {len(firsts)}")
    # The same file through `torchjob validate`: interpreter, imports, load and checks, no job;
    # what is left of the run's CPU is the engine's own.
    check = subprocess.Popen([str(TORCHJOB), "validate", str(job)], env=env, stdout=subprocess.DEVNULL)
    _, _, checked = os.wait4(check.pid, 0)
    return {
        "first_start": min(firsts) - launched,
        "wall": wall,
        "cpu": usage.ru_utime + usage.ru_stime,
        "validate_cpu": checked.ru_utime + checked.ru_stime,
    }


def summary(runs: list[dict[str, float]], key: str) -> tuple[float, float, float]:
    values = [r[key] for r in runs]
    return statistics.median(values), statistics.mean(values), min(values)


def two_versions(description: str) -> tuple[argparse.Namespace, dict[str, Path]]:
    """The command line of a side-by-side comparison: the two checkouts' ``src`` and ``--runs``."""
    parser = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--old", type=Path, required=True, help="the other checkout's src directory")
    parser.add_argument("--new", type=Path, default=ROOT / "src", help="this checkout's src (default)")
    parser.add_argument("--runs", type=int, default=15, help="runs of each version (default 15)")
    parser.add_argument("--json", type=Path, help="write every run here")
    parser.add_argument("--pytorch", action="store_true", help="the job has the pytorch plugin (a port)")
    args = parser.parse_args()
    global PYTORCH
    PYTORCH = args.pytorch
    return args, {"old": args.old.resolve(), "new": args.new.resolve()}


def interleaved(
    versions: dict[str, Path], runs: int, one: Callable[[Path, Path], dict[str, float]]
) -> dict[str, list[dict[str, float]]]:
    """``runs`` runs of ``one(src, work)`` per version, alternating, the order flipped every round,
    after compiling both trees and one unrecorded warm-up run each (page cache)."""
    for src in versions.values():
        compileall.compile_dir(str(src), quiet=1)
    found: dict[str, list[dict[str, float]]] = {name: [] for name in versions}
    with tempfile.TemporaryDirectory(prefix="torchjob-ab-") as tmp:
        work = Path(tmp)
        for src in versions.values():
            one(src, work)
        for i in range(runs):
            for name in list(versions) if i % 2 == 0 else list(reversed(versions)):
                found[name].append(one(versions[name], work))
    return found


def main() -> int:
    args, versions = two_versions(__doc__ or "")
    runs = interleaved(versions, args.runs, one_run)
    print(f"{args.runs} runs each, interleaved; seconds: median / mean / min")
    keys = ("first_start", "wall", "cpu", "validate_cpu")
    print(
        f"{'':5} {'launch -> first container':>28} {'whole run (wall)':>24} {'CPU':>24} {'validate CPU':>24}"
    )
    for name in versions:
        cells = [" / ".join(f"{v:.3f}" for v in summary(runs[name], k)) for k in keys]
        print(f"{name:5} {cells[0]:>28} {cells[1]:>24} {cells[2]:>24} {cells[3]:>24}")
    for key in keys:
        old, new = summary(runs["old"], key)[0], summary(runs["new"], key)[0]
        print(f"median {key}: new - old = {new - old:+.4f} s ({(new / old - 1) * 100:+.1f} %)")
    # Each round ran both versions back to back: its difference is the least disturbed by load.
    for key in keys:
        diffs = [n[key] - o[key] for o, n in zip(runs["old"], runs["new"], strict=True)]
        lower = sum(d < 0 for d in diffs)
        print(
            f"paired {key}: median of new - old = {statistics.median(diffs) * 1000:+.2f} ms, "
            f"new lower in {lower} of {len(diffs)} rounds"
        )
    if args.json:
        args.json.write_text(json.dumps({"versions": {k: str(v) for k, v in versions.items()}, "runs": runs}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
