"""How long rendering a 10,000-replica job takes for each target, and what ``render`` imports.

For a job of 1 master + N workers (the same job as ``render_scale.py``) and each target it measures

* in-process, best of ``--repeat``: ``render_target`` (the objects an engine would create) and
  writing them as YAML to nowhere;
* end to end, best of ``--repeat``: ``python -m torchjob render FILE --target T > /dev/null`` in a
  subprocess, wall time, and whether the ``kubernetes`` or ``torch`` package got imported
  (``-X importtime``).

Run: ``.venv/bin/python benchmarks/render_targets.py`` (``--workers 1000 10000``, ``--json``).
The target is every target under 3 s end to end for 10,000 workers, with no kubernetes import.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from render_scale import JOB

from torchjob.jobs import load_jobs
from torchjob.render import write_list
from torchjob.targets import render_target, target_names

TARGET_SECONDS = 3.0


def in_process(path: str, target: str, repeat: int) -> tuple[float, float]:
    best_render = best_dump = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        job = load_jobs(path)[0].job
        rendered = render_target(job, target)
        middle = time.perf_counter()
        write_list(rendered.objects, "yaml", lambda _text: None)
        end = time.perf_counter()
        best_render, best_dump = min(best_render, middle - start), min(best_dump, end - middle)
    return best_render, best_dump


def cli(path: str, target: str, repeat: int) -> tuple[float, list[str]]:
    best = float("inf")
    heavy: set[str] = set()
    for _ in range(repeat):
        start = time.perf_counter()
        result = subprocess.run(
            [sys.executable, "-X", "importtime", "-m", "torchjob", "render", path, "--target", target],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
            check=True,
        )
        best = min(best, time.perf_counter() - start)
        for line in result.stderr.splitlines():
            if line.startswith("import time:") and "|" in line:
                name = line.rsplit("|", 1)[1].strip().split(".")[0]
                if name in ("kubernetes", "torch"):
                    heavy.add(name)
    return best, sorted(heavy)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[10_000])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = []
    failed = False
    with tempfile.TemporaryDirectory() as folder:
        for workers in args.workers:
            path = Path(folder) / f"bench-{workers}.yaml"
            path.write_text(JOB.format(workers=workers))
            for target in target_names():
                render_s, dump_s = in_process(str(path), target, args.repeat)
                wall, heavy = cli(str(path), target, args.repeat)
                ok = wall < TARGET_SECONDS and not heavy
                failed |= not ok
                rows.append(
                    {"workers": workers, "target": target, "render_s": round(render_s, 3),
                     "dump_s": round(dump_s, 3), "cli_wall_s": round(wall, 3), "heavy_imports": heavy,
                     "verdict": "PASS" if ok else "FAIL"}
                )  # fmt: skip
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print("| workers | target | render_target s | dump s | CLI wall s | heavy imports | verdict |")
        print("|--------:|--------|----------------:|-------:|-----------:|---------------|---------|")
        for r in rows:
            heavy = ", ".join(r["heavy_imports"]) or "none"
            print(
                f"| {r['workers']:,} | {r['target']} | {r['render_s']:.3f} | {r['dump_s']:.3f} | "
                f"{r['cli_wall_s']:.2f} | {heavy} | {r['verdict']} |"
            )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
