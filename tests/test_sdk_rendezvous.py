"""An SDK Elastic task on several nodes, pointed at its rendezvous the way Kubeflow points it.

The training operator gives every pod of an elastic PyTorchJob ``PET_RDZV_ENDPOINT`` (the first
worker's name and port) and nothing that says which pod hosts the c10d store. Here two
entrypoint processes play two pods on one machine, their endpoint ``localhost:PORT``: torch must
tell the host itself (one of them binds the store, the other joins it).

And what the store holds is never unpickled by torchjob: anyone who reaches its port may have
written it (issue 33).
"""

from __future__ import annotations

import base64
import os
import pickle
import socket
import subprocess
import sys
import textwrap
import time
from datetime import timedelta
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytestmark = [pytest.mark.torch, pytest.mark.slow, pytest.mark.timeout(240)]

TASK = textwrap.dedent(
    """
    from torchjob import Elastic, task

    @task(task_config=Elastic(nnodes=2))
    def total():
        import torch
        import torch.distributed as dist

        dist.init_process_group("gloo")
        try:
            value = torch.tensor([float(dist.get_rank() + 1)])
            dist.all_reduce(value)
            return (dist.get_world_size(), value.item())
        finally:
            dist.destroy_process_group()
    """
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_two_nodes_meet_at_the_endpoint_kubeflow_gives(tmp_path: Path) -> None:
    (tmp_path / "elastic_task.py").write_text(TASK)
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT", "RANK")}
    env["PET_RDZV_ENDPOINT"] = f"localhost:{free_port()}"
    argv = [sys.executable, "-m", "torchjob.sdk.entrypoint", "--task", "elastic_task.py:total", "--elastic"]
    argv += ["--nnodes", "2", "--run-id", "kubeflow-like", "--rdzv-configs", '{"read_timeout": 20}']
    pods = [
        subprocess.Popen(
            argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    outputs = []
    try:
        for pod in pods:
            outputs.append(pod.communicate(timeout=180))
    finally:
        for pod in pods:
            if pod.poll() is None:
                pod.kill()
                pod.wait()
    assert [pod.returncode for pod in pods] == [0, 0], [err[-2000:] for _, err in outputs]
    returned = [out.strip() for out, _ in outputs if out.strip()]
    assert returned == ["torchjob: rank 0 returned (2, 3.0)"]


class Planted:
    """What another user could write into a store it reaches: unpickling it runs code, which here
    only writes down who unpickled it (the stack) and then gives torch a valid, empty state."""

    def __init__(self, mark: Path) -> None:
        self.mark = mark

    def __reduce__(self) -> tuple[object, tuple[str]]:
        state = "__import__('torch.distributed.elastic.rendezvous.dynamic_rendezvous', fromlist=['x'])"
        stack = f"__import__('traceback').print_stack(file=open({str(self.mark)!r}, 'a'))"
        code = f"{stack} or {state}._RendezvousState()"
        return (eval, (code,))


def test_a_pickle_planted_in_the_store_is_never_loaded_by_torchjob(tmp_path: Path) -> None:
    """The rendezvous host's progress watcher (the ``2/4 nodes joined`` lines) read torch's
    pickled rendezvous state from the store; a state planted there ran its code in the watcher.
    torch itself unpickles that key too (its own design: the store must be out of others' reach,
    as a job's own network keeps it), so the planted code runs, but never in torchjob's frames."""
    from torch.distributed import TCPStore

    (tmp_path / "elastic_task.py").write_text(TASK)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("PET_RDZV_ENDPOINT", "TORCHELASTIC_RUN_ID")}
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0")  # this node hosts the store
    argv = [sys.executable, "-m", "torchjob.sdk.entrypoint", "--task", "elastic_task.py:total", "--elastic"]
    argv += ["--nnodes", "2", "--run-id", "planted", "--results", str(tmp_path / "results")]
    node = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    mark = tmp_path / "unpickled-by"
    try:
        deadline = time.monotonic() + 120
        store = None
        while store is None and time.monotonic() < deadline:  # the node's agent opens the store
            assert node.poll() is None, node.stderr.read().decode() if node.stderr else ""
            try:
                store = TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=2))
            except Exception:
                time.sleep(0.2)
        assert store is not None, "the store never listened"
        # The second node never comes: the rendezvous waits, its host watching the progress.
        store.set("torch.rendezvous.planted", base64.b64encode(pickle.dumps(Planted(mark))))
        deadline = time.monotonic() + 60
        while not mark.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert mark.exists(), "nothing read the planted state"  # torch's own rendezvous did
        time.sleep(2)  # ten looks of the progress watcher
    finally:
        node.kill()
        node.wait()
    stacks = mark.read_text()
    assert "dynamic_rendezvous.py" in stacks  # torch's own handler (called from torchjob's launch)
    # The watcher's frames, when it unpickled the state it read (torchjob/sdk/elastic.py).
    assert "in watch_rendezvous" not in stacks and "in rendezvous_state" not in stacks, stacks
