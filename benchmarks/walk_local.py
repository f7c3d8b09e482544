"""How far a reader walks from the local engine's ``start`` to what a job does, in one or two checkouts.

Run from the repository root with the project's virtualenv::

    .venv/bin/python benchmarks/walk_local.py                     # this checkout
    .venv/bin/python benchmarks/walk_local.py --old /tmp/old/src  # and another one beside it

A plain job (a master and a worker, each ``sh -c true``) runs through
``get_engine("local").plan(...)`` and ``start(...)``, attached and quiet, under a profiler. Each
time the job acts on the machine (a container's process is started, a process is reaped, a
signal is sent, a file is put in place by a rename: status.json, the job's records), the
torchjob frames on the stack below ``start`` are noted (a lambda or a comprehension counts as
the function it is written in). Their union is the walk: the functions (stops) and files a
reader passes through to see how a job's containers start, end and are stopped and how its
status is written. ``to the first container`` is the one chain from ``start`` to the first
container's process (started by the kubelet); ``entered`` counts, for comparison, every function
of the local engine that ran at all (side branches included: console, signals, tracking, ports).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

PROBE = r"""
import json, os, sys, threading
from pathlib import Path
from torchjob.engine_api.base import StartOptions
from torchjob.engine_api.registry import get_engine
from torchjob.jobs import load_jobs

EFFECTS = {
    "fork_exec", "fork", "posix_spawn", "posix_spawnp",  # a process started
    "waitpid", "waitid", "wait4",  # a process reaped
    "kill", "killpg", "pidfd_send_signal",  # a signal sent
    "replace", "rename",  # a file put in place (status.json, the job's records)
}
MODULES = {"posix", "_posixsubprocess", "signal", "os"}
ROOT = os.path.dirname(__import__("torchjob").__file__)
walk = set()  # (file, function) on the stack below start at an effect
entered = set()  # every local engine function that ran below start
first_spawn = []  # the stack from start to the first container started (the kubelet's)

def where(code):
    return os.path.relpath(code.co_filename, ROOT), code.co_qualname

def inside_start(frame):
    frames = []
    while frame is not None:
        # A lambda or comprehension is read with the function it is written in: not a stop.
        if frame.f_code.co_filename.startswith(ROOT) and "<" not in frame.f_code.co_qualname:
            frames.append(frame.f_code)
            if frame.f_code.co_qualname == "LocalEngine.start":
                return frames
        frame = frame.f_back
    return None

def profile(frame, event, arg):
    if event == "call":
        code = frame.f_code
        local = code.co_filename.startswith(ROOT + "/engines/local/") and "<" not in code.co_qualname
        if local and inside_start(frame):
            entered.add(where(code))
    elif event == "c_call":
        name = getattr(arg, "__name__", "")
        module = getattr(arg, "__module__", None) or getattr(getattr(arg, "__self__", None), "__name__", "")
        if name in EFFECTS and module in MODULES:
            frames = inside_start(frame)
            if frames:
                walk.update(where(code) for code in frames)
                spawn = name in ("fork_exec", "fork", "posix_spawn", "posix_spawnp")
                kubelet = any(code.co_filename.endswith("/controller/kubelet.py") for code in frames)
                if spawn and kubelet and not first_spawn:
                    first_spawn.extend(where(code) for code in reversed(frames))

job_file, state = sys.argv[1], sys.argv[2]
(loaded,) = load_jobs(job_file)
job = loaded.job if hasattr(loaded, "job") else loaded
engine = get_engine("local", state_dir=state)
options = StartOptions(quiet=True)
plan = engine.plan(job, options)
threading.setprofile(profile)
sys.setprofile(profile)
try:
    import inspect
    if len(inspect.signature(engine.start).parameters) == 1:  # start(plan)
        report = engine.start(plan)
    else:  # start(job, options)
        report = engine.start(job, options)
finally:
    sys.setprofile(None)
    threading.setprofile(None)
print(json.dumps({
    "phase": str(report.phase),
    "walk": sorted(walk),
    "entered": sorted(entered),
    "first_spawn": first_spawn,
}))
"""

JOB = """\
apiVersion: batch.volcano.sh/v1alpha1
kind: Job
metadata: {name: walk}
spec:
  tasks:
    - name: master
      replicas: 1
      template:
        spec:
          restartPolicy: Never
          containers: [{name: main, image: x, command: [sh, -c, 'true']}]
    - name: worker
      replicas: 1
      template:
        spec:
          restartPolicy: Never
          containers: [{name: main, image: x, command: [sh, -c, 'true']}]
"""


def measure(src: Path | None) -> dict[str, object]:
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = str(src)
    with tempfile.TemporaryDirectory() as tmp:
        job = Path(tmp) / "walk.yaml"
        job.write_text(JOB)
        state = Path(tmp) / "state"
        done = subprocess.run(
            [sys.executable, "-c", PROBE, str(job), str(state)],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
        )
    if done.returncode != 0:
        raise SystemExit(f"the probe failed:\n{done.stdout}{done.stderr}")
    found: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


def summary(label: str, found: dict[str, object], verbose: bool) -> None:
    walk = [tuple(item) for item in found["walk"]]  # type: ignore[attr-defined]
    entered = [tuple(item) for item in found["entered"]]  # type: ignore[attr-defined]
    files = sorted({f for f, _ in walk})
    local_files = [f for f in files if f.startswith("engines/local/")]
    print(f"{label}: job {found['phase']}")
    print(f"  walk: {len(walk)} stops in {len(files)} files ({len(local_files)} of the local engine)")
    entered_files = sorted({f for f, _ in entered})
    print(f"  entered: {len(entered)} local engine functions in {len(entered_files)} files")
    chain = [tuple(item) for item in found["first_spawn"]]  # type: ignore[attr-defined]
    print(f"  to the first container: {len(chain)} stops in {len({f for f, _ in chain})} files")
    if verbose:
        print("    " + " -> ".join(n for _, n in chain))
        for file in files:
            names = sorted(n for f, n in walk if f == file)
            print(f"    {file}: {', '.join(names)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", type=Path, help="the src directory of another checkout, measured first")
    parser.add_argument("-v", "--verbose", action="store_true", help="list the walk's stops by file")
    args = parser.parse_args()
    if args.old is not None:
        summary(f"old ({args.old})", measure(args.old), args.verbose)
    summary("this checkout", measure(None), args.verbose)


if __name__ == "__main__":
    main()
