"""All-reduce across ranks with the SDK: one task, run three ways.

    python examples/sdk/allreduce.py            # run it (needs torch)
    torchjob render examples/sdk/allreduce.py:allreduce   # the pods a cluster would run
    torchjob run examples/sdk/allreduce.py:allreduce      # the same job on the local engine

The task sums every rank's number with gloo on CPU; rank 0's return value comes back to the caller.
"""

from __future__ import annotations

from torchjob import Elastic, PyTorch, Worker, task


@task(task_config=Elastic(nproc_per_node=2))
def allreduce(scale: float = 1.0) -> dict[str, float]:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    try:
        value = torch.tensor([scale * (dist.get_rank() + 1)])
        dist.all_reduce(value)
        return {"world_size": float(dist.get_world_size()), "sum": value.item()}
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    # One node, two processes under torch's elastic launcher (what torchrun does).
    print("elastic, 1 node x 2 processes:", allreduce(1.0))
    # The same function as a master and two workers: three pods of the local engine.
    pods = allreduce.with_overrides(task_config=PyTorch(worker=Worker(replicas=2)))
    print("PyTorch, master + 2 workers:  ", pods(1.0))
    # Two nodes that meet over a c10d rendezvous, one process each.
    nodes = allreduce.with_overrides(task_config=Elastic(nnodes=2))
    print("elastic, 2 nodes x 1 process: ", nodes(1.0))
