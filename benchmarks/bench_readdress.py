"""What a local job's turn costs: the planned pods readdressed, against the job expanded again.

A ``torchjob run`` expands its job once, in the plan (addresses only, ports as declared). When the
job's turn comes (after the local queue) it gets its host ports, and maybe pod names that resolve;
until issue 20 the job was then expanded a second time with them, now the planned pods are
readdressed (``torchjob.expand.readdress``: the plugins rewrite what they took from the addressing,
the job-level objects are made anew). For a job of 1 master + N workers (pytorch with
wait-for-master, svc, env) this times both ways for both outcomes of the turn (host ports only;
host ports and names), in interleaved pairs (the order flipped every round), each on a fresh plan,
and prints the medians and the median of the paired differences.

Run: ``.venv/bin/python benchmarks/bench_readdress.py [--workers 1000 5000] [--rounds 9]``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from torchjob.engines.local.addressing import LocalAddressing
from torchjob.expand import expand, readdress
from torchjob.jobs import load_jobs_from_text
from torchjob.spec.model import Job

JOB = """\
apiVersion: batch.volcano.sh/v1alpha1
kind: Job
metadata: {{name: bench}}
spec:
  plugins:
    pytorch: ["--master=master", "--worker=worker", "--port=23456", "--wait-master-enabled=true"]
    svc: []
    env: []
  tasks:
    - name: master
      replicas: 1
      template:
        spec:
          restartPolicy: OnFailure
          containers: [{{name: main, image: python:3.11, command: [python, -m, train]}}]
    - name: worker
      replicas: {workers}
      template:
        spec:
          restartPolicy: OnFailure
          containers: [{{name: main, image: python:3.11, command: [python, -m, train]}}]
"""


def timed_again(job: Job, now: LocalAddressing) -> float:
    expand(job, LocalAddressing(job))  # the plan, as before: then a second expansion
    start = time.perf_counter()
    expand(job, now)
    return time.perf_counter() - start


def timed_readdress(job: Job, now: LocalAddressing) -> float:
    state = expand(job, LocalAddressing(job))  # the plan
    start = time.perf_counter()
    if not readdress(state, now):
        raise SystemExit("readdress refused the job")
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workers", type=int, nargs="+", default=[1000, 5000])
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    print(
        f"{args.rounds} interleaved rounds; ms: median again / median readdress / "
        "paired median (readdress - again)"
    )
    for workers in args.workers:
        [loaded] = load_jobs_from_text(JOB.format(workers=workers), "bench.yaml")
        job = loaded.job
        for names in (False, True):
            now = LocalAddressing(job, {23456: 41234}, names=names)
            again: list[float] = []
            fast: list[float] = []
            for i in range(args.rounds):
                pair = (timed_again, timed_readdress) if i % 2 == 0 else (timed_readdress, timed_again)
                for one in pair:
                    (again if one is timed_again else fast).append(one(job, now))
            diffs = [f - a for f, a in zip(fast, again, strict=True)]
            print(
                f"{workers + 1:>6} pods, {'ports and names' if names else 'ports only':<15}: "
                f"{statistics.median(again) * 1000:8.1f} / {statistics.median(fast) * 1000:8.1f} / "
                f"{statistics.median(diffs) * 1000:+8.1f}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
