"""The kfpytorch README's "dynamic execution modes" example, as valid flytekit (docs/flyte.md).

    torchjob run examples/flyte/adaptive_training.py:train_model --epochs 10 --batch_size 32
    torchjob run examples/flyte/adaptive_training.py:adaptive_training --use_single_node
    torchjob run examples/flyte/adaptive_training.py:adaptive_training_dynamic --no-use-single-node
    torchjob render examples/flyte/adaptive_training.py:adaptive_training --target kubeflow

The README branches with ``if use_single_node:`` on a workflow input, which flytekit's
``@workflow`` refuses (an input is a promise there), and switches nodes with
``with_overrides(task_config=Elastic(nnodes=1, ...))``, which flytekit applies to the task
itself, for every node, and which cannot change the node count fixed when the task was defined.
So: one training function, two tasks (2 nodes x 2 processes, and one process), chosen with
``conditional`` in a ``@workflow`` or with a plain ``if`` in a ``@dynamic`` task. On a cluster
the 2-node task is a PyTorchJob of 2 workers and the other a plain pod; torchjob runs the first
as 2 local pods of 2 processes each (or as Slurm job steps) and calls the second directly.
"""

from __future__ import annotations

import os

from flytekit import conditional, dynamic, task, workflow
from flytekitplugins.kfpytorch import Elastic


def _train(epochs: int, batch_size: int) -> float:
    """A logistic regression on two Gaussian blobs with DistributedDataParallel (gloo, CPU); the
    accuracy over every rank's share of the data."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel

    if "WORLD_SIZE" in os.environ:  # started by torch's elastic agent: join the other ranks
        dist.init_process_group("gloo")
    else:  # one node, one process: called directly, a group of one
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        rank, world = dist.get_rank(), dist.get_world_size()
        torch.manual_seed(0)  # every rank builds the same data set and keeps its own share
        half = 256
        features = torch.cat([torch.randn(half, 2) + 2.0, torch.randn(half, 2) - 2.0])
        labels = torch.cat([torch.ones(half), torch.zeros(half)])
        features, labels = features[rank::world], labels[rank::world]
        model = DistributedDataParallel(torch.nn.Linear(2, 1))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(epochs):
            for start in range(0, len(labels), batch_size):
                optimizer.zero_grad()
                logits = model(features[start : start + batch_size]).squeeze(1)
                F.binary_cross_entropy_with_logits(logits, labels[start : start + batch_size]).backward()
                optimizer.step()
        with torch.no_grad():
            correct = ((model(features).squeeze(1) > 0).float() == labels).sum()
        counts = torch.tensor([float(correct), float(len(labels))])
        dist.all_reduce(counts)
        accuracy = (counts[0] / counts[1]).item()
        print(f"rank {rank}/{world}: accuracy {accuracy:.3f}", flush=True)
        return accuracy
    finally:
        dist.destroy_process_group()


@task(task_config=Elastic(nnodes=2, nproc_per_node=2))
def train_model(epochs: int, batch_size: int) -> float:
    return _train(epochs, batch_size)


@task(task_config=Elastic(nnodes=1, nproc_per_node=1))
def train_model_single_node(epochs: int, batch_size: int) -> float:
    return _train(epochs, batch_size)


@workflow
def adaptive_training(use_single_node: bool) -> float:
    return (
        conditional("nodes")
        .if_(use_single_node.is_true())
        .then(train_model_single_node(epochs=10, batch_size=32))
        .else_()
        .then(train_model(epochs=10, batch_size=32))
    )


@dynamic
def adaptive_training_dynamic(use_single_node: bool) -> float:
    if use_single_node:  # a plain bool here: a @dynamic task runs its body with real values
        return train_model_single_node(epochs=10, batch_size=32)
    return train_model(epochs=10, batch_size=32)
