"""A workflow that picks single-node or multi-node training per call, with ``with_overrides``.

    python examples/sdk/adaptive_training.py        # both branches (needs torch)
    torchjob run examples/sdk/adaptive_training.py:adaptive_training -- --use-single-node true
    torchjob render examples/sdk/adaptive_training.py:adaptive_training -- --use-single-node false
    TORCHJOB_LOG=debug python examples/sdk/adaptive_training.py   # see the decisions

The task trains a logistic regression on two Gaussian blobs with DistributedDataParallel (gloo, CPU).
By default it runs as 2 nodes x 2 processes (local-engine pods); overridden to one node and one
process it is called directly in this process, with no launcher and a process group of one.
"""

from __future__ import annotations

import os

from torchjob import Elastic, task, workflow


@task(task_config=Elastic(nnodes=2, nproc_per_node=2))
def train_model(epochs: int, batch_size: int) -> float:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel

    if "WORLD_SIZE" in os.environ:  # started by a launcher: join the other ranks
        dist.init_process_group("gloo")
    else:  # called directly (one node, one process): a group of one
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
        dist.all_reduce(counts)  # accuracy over every rank's share
        accuracy = (counts[0] / counts[1]).item()
        print(f"rank {rank}/{world} pid {os.getpid()}: accuracy {accuracy:.3f}", flush=True)
        return accuracy
    finally:
        dist.destroy_process_group()


@workflow
def adaptive_training(use_single_node: bool) -> float:
    if use_single_node:
        # This call only: one node, one process, so no launcher and no rendezvous.
        result = train_model(epochs=10, batch_size=32).with_overrides(
            task_config=Elastic(nnodes=1, nproc_per_node=1)
        )
    else:
        # The task's own config: 2 nodes x 2 processes.
        result = train_model(epochs=10, batch_size=32)
    return result


if __name__ == "__main__":
    print("single node:", adaptive_training(use_single_node=True))
    print("2 nodes x 2 processes:", adaptive_training(use_single_node=False))
