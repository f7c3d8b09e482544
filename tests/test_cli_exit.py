"""The torchjob program ends without the interpreter's teardown only when nothing needs it.

`cli.main` (the program, not a caller in Python) runs the exit handlers, flushes its output and
leaves; it keeps the usual exit while another thread runs or when the SDK loaded user code.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(120)

JOB = {
    "apiVersion": "batch.volcano.sh/v1alpha1",
    "kind": "Job",
    "metadata": {"name": "tiny"},
    "spec": {
        "tasks": [
            {
                "name": "main",
                "replicas": 1,
                "template": {"spec": {"containers": [{"name": "main", "image": "x", "command": ["true"]}]}},
            }
        ]
    },
}


# The program as its console script runs it, with an exit handler, a buffered write and, if asked,
# a thread that writes after main() returns.
PROGRAM = """
import atexit, sys, threading, time
from torchjob.cli import main
atexit.register(lambda: print("exit handler ran", flush=False))
sys.stdout.write("buffered before main; ")
if sys.argv[1] == "thread":
    threading.Thread(target=lambda: (time.sleep(0.3), print("thread finished"))).start()
sys.argv = ["torchjob", "validate", *sys.argv[2:]]
sys.exit(main())
"""


def program(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", PROGRAM, *args], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )


def test_exit_handlers_run_and_output_is_flushed_with_the_commands_exit_code(tmp_path: Path) -> None:
    (tmp_path / "job.json").write_text(json.dumps(JOB))
    ok = program(tmp_path, "plain", "job.json")
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.startswith("buffered before main; job.json: job tiny: valid")
    assert ok.stdout.endswith("exit handler ran\n")
    bad = program(tmp_path, "plain", "missing.json")
    assert bad.returncode == 2
    assert bad.stderr.strip() == "missing.json: cannot read file: No such file or directory"
    assert bad.stdout == "buffered before main; exit handler ran\n"


def test_a_thread_still_running_keeps_the_usual_exit(tmp_path: Path) -> None:
    (tmp_path / "job.json").write_text(json.dumps(JOB))
    result = program(tmp_path, "thread", "job.json")
    assert result.returncode == 0, result.stderr
    assert "thread finished" in result.stdout  # the exit waited for it
    assert result.stdout.endswith("exit handler ran\n")
