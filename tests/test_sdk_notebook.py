"""A notebook executed by a real Jupyter kernel (nbclient + ipykernel) calling a 2-rank task
(issue 23): two calls (the second warm), a rank's exception with its traceback, an interrupt that
stops every rank, rank output in the cell, functions and classes defined in cells."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch", reason="torch is not installed")
nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")
pytestmark = [pytest.mark.torch, pytest.mark.timeout(300)]

CELLS = [
    # 0: a class and a function defined in cells (pickled by value: the ranks cannot import them)
    """
import os, time, psutil
from torchjob import PyTorch, Worker, RemoteError, task

class Scale:
    def __init__(self, k):
        self.k = k

@task(task_config=PyTorch(worker=Worker(replicas=1)))
def allreduce(x, scale):
    import torch, torch.distributed as dist
    dist.init_process_group("gloo")
    t = torch.tensor([float(x) * scale.k])
    dist.all_reduce(t)
    print(f"rank {dist.get_rank()} says {t.item():g}", flush=True)
    return t.item()
""",
    # 1, 2: two calls; the second is timed
    "first = allreduce(1, Scale(10)); print('first', first)",
    "started = time.monotonic(); second = allreduce(2, Scale(10)); took = time.monotonic() - started\n"
    "print('second', second, 'took', round(took, 2))",
    # 3: an exception in rank 1
    """
@task(task_config=PyTorch(worker=Worker(replicas=1)))
def fails():
    if os.environ["RANK"] == "1":
        raise ValueError("rank one is unhappy")
    return 0

fails()
""",
    # 4: interrupted while the ranks sleep
    """
@task(task_config=PyTorch(worker=Worker(replicas=1)))
def sleeps():
    print("sleeping", flush=True)
    time.sleep(120)

sleeps()
""",
    # 5: nothing of the call is left (the pool's server stays, by design)
    """
deadline = time.monotonic() + 15
def ranks():
    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            line = " ".join(p.cmdline())
        except psutil.Error:
            continue
        if "torchjob.sdk.entrypoint" in line and p.status() != psutil.STATUS_ZOMBIE:
            out.append(p.pid)
    return out
while ranks() and time.monotonic() < deadline:
    time.sleep(0.2)
print("left", ranks())
""",
]


def _text(cell: Any) -> str:
    parts = []
    for output in cell.get("outputs", []):
        if output.get("output_type") == "stream":
            parts.append(output.get("text", ""))
        elif output.get("output_type") == "error":
            parts.append(output.get("ename", "") + ": " + output.get("evalue", "") + "\n")
            parts.append("\n".join(output.get("traceback", [])))
    return "".join(parts)


def test_a_notebook_calls_a_task_warm_sees_errors_and_interrupts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TORCHJOB_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("TORCHJOB_WARM", raising=False)
    monkeypatch.setenv(
        "PATH", os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    )
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell(source) for source in CELLS]
    client = nbclient.NotebookClient(
        notebook,
        timeout=240,
        kernel_name="python3",
        allow_errors=True,
        resources={"metadata": {"path": str(tmp_path)}},
    )
    interrupted = threading.Event()

    def interrupt_when_sleeping() -> None:
        # Once the ranks say they sleep, interrupt the kernel as the notebook's stop button does.
        deadline = time.monotonic() + 200
        while time.monotonic() < deadline and not interrupted.is_set():
            cell = notebook.cells[4]
            if "sleeping" in _text(cell) and client.km is not None:
                time.sleep(0.5)
                # What the stop button does for a kernel whose interrupt mode is "signal".
                os.kill(client.km.provisioner.process.pid, signal.SIGINT)
                interrupted.set()
                return
            time.sleep(0.2)

    watcher = threading.Thread(target=interrupt_when_sleeping, daemon=True)
    watcher.start()
    client.execute()
    interrupted.set()
    texts = [_text(cell) for cell in notebook.cells]
    assert "first 20.0" in texts[1], texts[1]
    assert "second 40.0" in texts[2], texts[2]
    # Rank output reaches the cell that made the call, prefixed with its pod as in a terminal.
    assert "master-0 | rank 0 says 40" in texts[2] and "worker-0 | rank 1 says 40" in texts[2], texts[2]
    took = float(texts[2].split("took")[1].split()[0])
    assert took < 1.5, texts[2]  # warm: forked ranks (cold calls take 2-3 s on these machines)
    # A rank's exception: RemoteError naming rank 1, with the rank's traceback.
    assert "RemoteError" in texts[3] and "rank 1 raised ValueError" in texts[3], texts[3]
    assert 'raise ValueError("rank one is unhappy")' in texts[3], texts[3]
    # The interrupt: KeyboardInterrupt in the cell, and every rank stopped.
    assert "KeyboardInterrupt" in texts[4], texts[4]
    assert "left []" in texts[5], texts[5]
