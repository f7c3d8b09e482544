"""A small DistributedDataParallel training on synthetic data.

Every rank draws its own shard of a noisy linear-regression problem (``y = X w + b + noise``) and
trains a tiny MLP on it with DDP over gloo. Rank 0 prints the loss as it falls; at the end every
rank checks that DDP kept the replicas identical, and the program fails unless the final loss is
well below the first one.
"""

from __future__ import annotations

import os
import warnings
from datetime import timedelta

# torch warns at import when numpy is absent; the program does not use numpy.
warnings.filterwarnings("ignore", message="Failed to initialize NumPy")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from rank_exit import exit_now  # noqa: E402  (this folder is on sys.path when run as a script)
from torch import nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

FEATURES = 8
SAMPLES_PER_RANK = 256
BATCH = 32
STEPS = int(os.environ.get("DDP_STEPS", "40"))
# The final loss must be below this fraction of the first one.
REQUIRED_DROP = 0.2


def shard(rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's data; the true weights are shared (seed 0), the samples differ per rank."""
    truth = torch.Generator().manual_seed(0)
    weight = torch.randn(FEATURES, 1, generator=truth)
    gen = torch.Generator().manual_seed(1000 + rank)
    x = torch.randn(SAMPLES_PER_RANK, FEATURES, generator=gen)
    y = x @ weight + 0.5 + 0.01 * torch.randn(SAMPLES_PER_RANK, 1, generator=gen)
    return x, y


def mean_over_ranks(value: float) -> float:
    t = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(t)
    return float(t.item()) / dist.get_world_size()


def replicas_identical(model: nn.Module) -> bool:
    """True when every rank holds the same parameters (DDP's promise): compare max and min."""
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).to(torch.float64)
    high, low = flat.clone(), flat.clone()
    dist.all_reduce(high, op=dist.ReduceOp.MAX)
    dist.all_reduce(low, op=dist.ReduceOp.MIN)
    return torch.equal(high, low)


def main() -> int:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=60))
    torch.manual_seed(42)  # DDP broadcasts rank 0's weights anyway; this keeps runs repeatable
    model = DistributedDataParallel(nn.Sequential(nn.Linear(FEATURES, 16), nn.Tanh(), nn.Linear(16, 1)))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    loss_fn = nn.MSELoss()
    x, y = shard(rank)
    if rank == 0:
        print(f"ddp: training on {world} ranks, {STEPS} steps, batch {BATCH} per rank", flush=True)
    first = last = 0.0
    for step in range(STEPS):
        start = (step * BATCH) % SAMPLES_PER_RANK
        xb, yb = x[start : start + BATCH], y[start : start + BATCH]
        optimizer.zero_grad()
        loss = loss_fn(model(xb), yb)
        loss.backward()  # DDP all-reduces the gradients here
        optimizer.step()
        last = mean_over_ranks(float(loss.item()))
        if step == 0:
            first = last
        if rank == 0 and (step % 5 == 0 or step == STEPS - 1):
            print(f"ddp: step {step:3d} loss {last:.4f}", flush=True)
    same = replicas_identical(model.module)
    dist.barrier()
    dist.destroy_process_group()
    if not same:
        print(f"ddp: rank {rank} FAILED: model replicas differ between ranks", flush=True)
        return 1
    if not last < REQUIRED_DROP * first:
        print(f"ddp: rank {rank} FAILED: loss {first:.4f} -> {last:.4f} did not fall enough", flush=True)
        return 1
    print(f"ddp: rank {rank} OK: replicas identical, loss {first:.4f} -> {last:.4f}", flush=True)
    return 0


if __name__ == "__main__":
    exit_now(main())
