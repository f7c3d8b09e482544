"""An SDK Elastic task on several nodes, pointed at its rendezvous the way Kubeflow points it.

The training operator gives every pod of an elastic PyTorchJob ``PET_RDZV_ENDPOINT`` (the first
worker's name and port) and nothing that says which pod hosts the c10d store. Here two
entrypoint processes play two pods on one machine, their endpoint ``localhost:PORT``: torch must
tell the host itself (one of them binds the store, the other joins it).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
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
