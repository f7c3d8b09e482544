"""The kfpytorch plugin README's PyTorch examples, as valid flytekit (docs/flyte.md).

    torchjob render examples/flyte/kfpytorch_readme.py:pytorch_job --target kubeflow
    torchjob run examples/flyte/kfpytorch_readme.py:pytorch_job         # 1 master + 5 workers here
    torchjob run examples/flyte/kfpytorch_readme.py:pytorch_job --engine slurm

The README writes ``image=`` (flytekit's keyword is ``container_image``), leaves out the comma
after ``task_config=...`` and spells the v0 config ``Pytorch``; the rest is as it shows. Each task
checks that it really runs distributed: every rank joins one gloo group and the ranks add up.
"""

from __future__ import annotations

from flytekit import Resources, task
from flytekitplugins.kfpytorch import CleanPodPolicy, PyTorch, RestartPolicy, RunPolicy, Worker


def _world() -> int:
    """The world size, checked with an all-reduce of every rank's 1 (master and workers alike)."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")  # MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK: the PyTorchJob's env
    try:
        ones = torch.ones(1)
        dist.all_reduce(ones)
        assert int(ones.item()) == dist.get_world_size()
        return dist.get_world_size()
    finally:
        dist.destroy_process_group()


@task(
    task_config=PyTorch(worker=Worker(replicas=5)),
    container_image="test_image",
    resources=Resources(cpu="1", mem="1Gi"),
)
def pytorch_job() -> int:
    return _world()


@task(
    task_config=PyTorch(
        worker=Worker(replicas=5, restart_policy=RestartPolicy.FAILURE),
        run_policy=RunPolicy(clean_pod_policy=CleanPodPolicy.ALL),
    ),
    container_image="test_image",
    resources=Resources(cpu="1", mem="1Gi"),
)
def pytorch_job_with_policies() -> int:
    return _world()


@task(task_config=PyTorch(num_workers=10))  # v0: deprecated, still served
def pytorch_job_v0() -> int:
    return _world()


@task(task_config=PyTorch(worker=Worker(replicas=10)))  # v1
def pytorch_job_v1() -> int:
    return _world()
