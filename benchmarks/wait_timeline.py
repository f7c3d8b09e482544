"""Where the seed job's 2-rank start goes: a timeline of ``torchjob+wait`` beside the shell floor.

Run from the repository root with the project's virtualenv::

    .venv/bin/python benchmarks/wait_timeline.py               # 2 ranks, 7 repetitions
    .venv/bin/python benchmarks/wait_timeline.py --reps 15 --json out.json

The job is ``bench_local_run.py``'s ``torchjob+wait`` (1 master + N-1 workers, wait-for-master,
the workers pre-warmed) running ``examples/programs/allreduce.py``; ``shell`` is the same program
started bare. Runs alternate, so load from other work falls on both alike. For each run, seconds
from the launch:

* ``master start``: rank 0's program begins (before its ``import torch``);
* ``master bind``: the master's port is listening (``/proc/net/tcp``, polled every millisecond
  from here; the port comes from ``torchjob run``'s first line);
* ``probe pass``: the wait-for-master init container wrote its last line ("is ready"), its
  log file's modification time;
* ``worker start``: the last rank's program begins (a pre-warmed worker: after its release);
* ``joined``: every rank has joined the gloo group; ``end``: every rank has finished;
  ``exit``: the launcher has exited.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_local_run as bench

EVENTS = ("master start", "master bind", "probe pass", "worker start", "joined", "end", "exit")
_PORTS = re.compile(rb"ports (\d+)->(\d+)")


def _listening(ports: set[int], tables: tuple[str, ...] = ("/proc/net/tcp", "/proc/net/tcp6")) -> bool:
    hexports = tuple(f":{port:04X} " for port in ports)
    for table in tables:
        try:
            with open(table, "rb") as handle:
                text = handle.read().decode()
        except OSError:
            continue
        for line in text.splitlines()[1:]:
            fields = line.split()
            if len(fields) > 3 and fields[3] == "0A" and (fields[1] + " ").endswith(hexports):
                return True
    return False


def _children(parent: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as handle:
                    if int(handle.read().rsplit(b")", 1)[1].split()[1]) == parent:
                        found.append(int(entry))
            except (OSError, ValueError, IndexError):
                continue
    return found


def _one_per_network(pids: list[int]) -> list[int]:
    by_network: dict[int, int] = {}
    for pid in pids:
        try:
            by_network.setdefault(os.stat(f"/proc/{pid}/ns/net").st_ino, pid)
        except OSError:
            continue
    return list(by_network.values())


class BindWatch:
    """Polls until one of ``ports`` (set later, once known) is listening; records when. With
    ``launcher`` set (torchjob's pid), the tables are those its children see: a local job's pods
    have a network namespace of their own, whose sockets the machine's /proc/net/tcp does not list."""

    def __init__(self) -> None:
        self.ports: set[int] = set()
        self.launcher: int | None = None
        self.bound: float | None = None
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        polls = 0
        while not self.stop.is_set():
            if self.ports:
                if self.launcher is None:
                    tables: tuple[str, ...] = ("/proc/net/tcp", "/proc/net/tcp6")
                elif polls % 20 == 0 or not tables:  # the children, looked up every 20 ms
                    # One child per network: a job's pods share theirs, and reading every
                    # child's copy each millisecond took CPU from the ranks being timed.
                    tables = tuple(
                        f"/proc/{pid}/net/{name}"
                        for pid in _one_per_network(_children(self.launcher))
                        for name in ("tcp", "tcp6")
                    )
                polls += 1
                if tables and _listening(self.ports, tables):
                    self.bound = time.time()
                    return
            time.sleep(0.001)


def run_once(method: str, ranks: int, work: Path, against: Path | None = None) -> dict[str, float]:
    """One run; a method ending in ``@old`` runs torchjob from ``against``'s ``src``."""
    marks = Path(tempfile.mkdtemp(dir=work, prefix="marks-"))
    argv = bench.METHODS[method.removesuffix("@old")](work, ranks)
    env = bench.bench_env(marks, work / "state")
    if method.endswith("@old") and against is not None:
        env["PYTHONPATH"] = str(against / "src")
    watch = BindWatch()
    if method.startswith("shell"):
        found = re.search(r"MASTER_PORT=(\d+)", argv[-1])
        assert found is not None
        watch.ports = {int(found.group(1))}
    launched = time.time()
    proc = subprocess.Popen(argv, env=env, cwd=bench.ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert proc.stdout is not None
    output = b""
    for line in proc.stdout:
        output += line
        ports = _PORTS.search(line)
        if ports and not watch.ports:
            watch.launcher = proc.pid  # the declared port inside the job's network, the mapped one outside
            watch.ports = {int(ports.group(1)), int(ports.group(2))}
    code = proc.wait(bench.RUN_TIMEOUT)
    exited = time.time()
    watch.stop.set()
    watch.thread.join(1)
    found_marks = bench.read_marks(marks)
    starts = {rank: t for name, rank, t in found_marks if name == "start"}
    joins = [t for name, _, t in found_marks if name == "joined"]
    ends = [t for name, _, t in found_marks if name == "end"]
    if code != 0 or len(starts) != ranks or len(ends) != ranks:
        raise RuntimeError(f"{method} failed (exit {code}):\n{output.decode(errors='replace')[-3000:]}")
    probe = None
    folder = re.search(rb"job directory (\S+)", output)
    if folder:
        logs = sorted(Path(folder.group(1).decode()).glob("logs/*/attempt-0/wait-for-master.log"))
        if logs:
            probe = max(log.stat().st_mtime for log in logs)
    times = {
        "master start": starts[0],
        "master bind": watch.bound,
        "probe pass": probe,
        "worker start": max(starts.values()),
        "joined": max(joins),
        "end": max(ends),
        "exit": exited,
    }
    return {k: v - launched for k, v in times.items() if v is not None}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument(
        "--methods", nargs="+", default=["torchjob+wait", "shell"], choices=list(bench.METHODS)
    )
    parser.add_argument("--json", type=Path, help="also write every run as JSON here")
    parser.add_argument(
        "--against", type=Path, help="another checkout: its torchjob+wait runs too, as torchjob+wait@old"
    )
    args = parser.parse_args(argv)
    bench.compile_bytecode()
    if args.against is not None:
        import compileall

        compileall.compile_dir(str(args.against / "src" / "torchjob"), quiet=1)
        args.methods.append("torchjob+wait@old")
    load_start = os.getloadavg()
    runs: dict[str, list[dict[str, float]]] = {m: [] for m in args.methods}
    with tempfile.TemporaryDirectory(prefix="torchjob-timeline-") as tmp:
        for rep in range(args.reps):
            order = args.methods[rep % len(args.methods) :] + args.methods[: rep % len(args.methods)]
            for method in order:
                runs[method].append(run_once(method, args.ranks, Path(tmp), args.against))
                print(f"  rep {rep + 1}: {method:14s} {runs[method][-1]['exit']:.2f} s", file=sys.stderr)
    load_end = os.getloadavg()
    print(
        f"{args.ranks} ranks, median of {args.reps}; "
        f"load average (1 min) {load_start[0]:.2f} -> {load_end[0]:.2f}\n"
    )
    print("| method | " + " | ".join(EVENTS) + " |")
    print("|---|" + "---:|" * len(EVENTS))
    for method, found in runs.items():
        cells = []
        for event in EVENTS:
            values = [r[event] for r in found if event in r]
            cells.append(f"{statistics.median(values):.3f}" if values else "")
        print(f"| {method} | " + " | ".join(cells) + " |")
    if len(args.methods) >= 2 and "shell" in runs:
        for method in args.methods:
            if method.startswith("shell"):
                continue
            pairs = [a["exit"] / b["exit"] for a, b in zip(runs[method], runs["shell"], strict=False)]
            medians = statistics.median(r["exit"] for r in runs[method]) / statistics.median(
                r["exit"] for r in runs["shell"]
            )
            print(
                f"\n{method}/shell: {medians:.3f} (medians), {statistics.median(pairs):.3f} (median of pairs)"
            )
    if args.json:
        args.json.write_text(json.dumps({"load": [load_start, load_end], "runs": runs}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
