"""How fast each verb refuses a job too large to run, for every kind and field that multiplies pods.

For each case (a JobSet of 100,000 and of 2**31-1 replicas, a TrainJob's ``numNodes`` and
``numProcPerNode``, a PyTorchJob's ``replicas`` and ``nprocPerNode``, a Volcano Job's
``replicas``; and, for the local engine, jobs a cluster takes but this machine cannot start) it
runs ``python -m torchjob VERB FILE`` for ``validate``, ``render``, ``run --dry-run`` and ``run``
and reports the best wall time of ``--repeat`` and the exit code. Every refusal must answer in
under a second (``TARGET_SECONDS``), exit 2 and print one line on stderr (a dry run too: it
refuses what ``run`` refuses, after its plan); the script prints PASS/FAIL per row and exits 1 on a
FAIL.

Run: ``.venv/bin/python benchmarks/refuse_sizes.py`` (``--repeat 3``, ``--json``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET_SECONDS = 1.0
VERBS = (("validate",), ("render",), ("run", "--dry-run"), ("run",))
# A job a cluster takes is the local engine's to refuse: validate --local, and a dry run as the run.
LOCAL_VERBS = (("validate", "--local"), ("run", "--dry-run"), ("run",))
C = "{name: pytorch, image: x, command: [python, x.py]}"


def jobset(replicas: int, pods: int = 1) -> str:
    return (
        "apiVersion: jobset.x-k8s.io/v1alpha2\nkind: JobSet\nmetadata: {name: js}\nspec:\n  replicatedJobs:\n"
        f"    - name: w\n      replicas: {replicas}\n      template:\n        spec:\n"
        f"          parallelism: {pods}\n          completions: {pods}\n"
        f"          template: {{spec: {{containers: [{C}]}}}}\n"
    )


def trainjob(nodes: int, nproc: int = 1) -> str:
    return (
        "apiVersion: trainer.kubeflow.org/v1alpha1\nkind: TrainJob\nmetadata: {name: tj}\nspec:\n"
        "  runtimeRef: {name: torch-distributed}\n"
        f"  trainer: {{numNodes: {nodes}, numProcPerNode: {nproc}, image: x, command: [torchrun, x.py]}}\n"
    )


def pytorchjob(workers: int, nproc: str = "") -> str:
    given = f'\n  nprocPerNode: "{nproc}"' if nproc else ""
    replica = f"template: {{spec: {{containers: [{C}]}}}}"
    return (
        f"apiVersion: kubeflow.org/v1\nkind: PyTorchJob\nmetadata: {{name: ptj}}\nspec:{given}\n"
        f"  pytorchReplicaSpecs:\n    Master:\n      replicas: 1\n      {replica}\n"
        f"    Worker:\n      replicas: {workers}\n      {replica}\n"
    )


def volcano(replicas: int) -> str:
    return (
        "apiVersion: batch.volcano.sh/v1alpha1\nkind: Job\nmetadata: {name: vj}\nspec:\n  tasks:\n"
        f"    - name: worker\n      replicas: {replicas}\n      template: {{spec: {{containers: [{C}]}}}}\n"
    )


CASES = {
    "jobset replicas 100,000 x 2 pods": jobset(100_000, 2),
    "jobset replicas 2**31-1": jobset(2**31 - 1),
    "trainjob numNodes 10**9": trainjob(10**9),
    "trainjob numProcPerNode 10**6": trainjob(2, 10**6),
    "pytorchjob replicas 10**6": pytorchjob(10**6),
    "pytorchjob nprocPerNode 100000": pytorchjob(2, "100000"),
    "volcano replicas 10**6": volcano(10**6),
    # a cluster takes these; the local engine refuses them
    "pytorchjob replicas 139,999 (local)": pytorchjob(139_999),
    "trainjob 20,000 nodes x 4 (local)": trainjob(20_000, 4),
}


def measure(folder: Path, name: str, verb: tuple[str, ...], repeat: int) -> tuple[float, int, int]:
    env = {**os.environ, "TORCHJOB_HOME": str(folder / "home")}
    best, code, lines = float("inf"), 0, 0
    for _ in range(repeat):
        start = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-m", "torchjob", *verb, name],
            cwd=folder,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        best = min(best, time.perf_counter() - start)
        code, lines = done.returncode, done.stderr.count("\n")
    return best, code, lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="torchjob-sizes-") as tmp:
        folder = Path(tmp)
        for i, (case, text) in enumerate(CASES.items()):
            name = f"case{i}.yaml"
            (folder / name).write_text(text)
            local = "(local)" in case
            for verb in LOCAL_VERBS if local else VERBS:
                seconds, code, lines = measure(folder, name, verb, args.repeat)
                ok = seconds < TARGET_SECONDS and code == 2 and lines == 1
                rows.append(
                    {"case": case, "verb": " ".join(verb), "s": round(seconds, 3), "exit": code, "ok": ok}
                )
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        print(f"{'case':40} {'verb':14} {'s':>6} exit verdict")
        for row in rows:
            verdict = "PASS" if row["ok"] else "FAIL"
            print(f"{row['case']:40} {row['verb']:14} {row['s']:6.3f} {row['exit']:4} {verdict}")
    return 0 if all(row["ok"] for row in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
