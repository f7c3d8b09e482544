"""Point-to-point check between every rank of a job: a ring of send/recv, then master <-> worker.

It reads the rendezvous the way any torch program does (``MASTER_ADDR``, ``MASTER_PORT``, ``RANK``,
``WORLD_SIZE``), uses gloo on CPU, checks every value it receives and exits 1 on a mismatch. Each
verified step prints one ``sendrecv:`` line, so a test can read the logs and see what was proven.
"""

from __future__ import annotations

import os
import sys
import warnings
from datetime import timedelta

# torch warns at import when numpy is absent; the program does not use numpy.
warnings.filterwarnings("ignore", message="Failed to initialize NumPy")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from rank_exit import exit_now  # noqa: E402  (this folder is on sys.path when run as a script)

SIZE = 1024  # elements per message: big enough to span several socket reads
# For tests of the check itself: this rank sends wrong values in the ring, so its neighbour must fail.
CORRUPT_RANK = int(os.environ.get("SENDRECV_CORRUPT_RANK", "-1"))


def payload(sender: int, receiver: int, step: int) -> torch.Tensor:
    """A tensor whose every element says who sent it to whom, so a misrouted message is caught."""
    base = float(sender * 1_000_000 + receiver * 1_000 + step)
    return torch.arange(SIZE, dtype=torch.float64) + base


def check(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    if not torch.equal(got, want):
        bad = int((got != want).sum())
        print(f"sendrecv: MISMATCH in {what}: {bad} of {SIZE} values differ", flush=True)
        sys.exit(1)


def ring(rank: int, world: int, steps: int) -> None:
    """Each step every rank sends to rank+1 and receives from rank-1, both at once."""
    right, left = (rank + 1) % world, (rank - 1) % world
    for step in range(steps):
        got = torch.empty(SIZE, dtype=torch.float64)
        outgoing = payload(rank, right, step) + (1 if rank == CORRUPT_RANK else 0)
        send = dist.isend(outgoing, dst=right)
        recv = dist.irecv(got, src=left)
        send.wait()
        recv.wait()
        check(got, payload(left, rank, step), f"ring step {step} from rank {left}")
    print(f"sendrecv: rank {rank} ring of {world}: {steps} messages from rank {left} verified", flush=True)


def star(rank: int, world: int) -> None:
    """The master sends each worker a tensor; the worker sends back twice the value."""
    if rank == 0:
        for worker in range(1, world):
            dist.send(payload(0, worker, 99), dst=worker)
            back = torch.empty(SIZE, dtype=torch.float64)
            dist.recv(back, src=worker)
            check(back, payload(0, worker, 99) * 2, f"reply from rank {worker}")
        print(f"sendrecv: rank 0 got correct replies from {world - 1} workers", flush=True)
    else:
        got = torch.empty(SIZE, dtype=torch.float64)
        dist.recv(got, src=0)
        check(got, payload(0, rank, 99), "message from rank 0")
        dist.send(got * 2, dst=0)
        print(f"sendrecv: rank {rank} verified the master's message and replied", flush=True)


def main() -> int:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    where = f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
    timeout = timedelta(seconds=float(os.environ.get("SENDRECV_TIMEOUT", "60")))
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timeout)
    print(f"sendrecv: rank {rank} of {world} joined the group at {where}", flush=True)
    if world > 1:
        ring(rank, world, steps=3)
        star(rank, world)
    # Every rank reports before the last barrier: with TaskCompleted -> CompleteJob the job ends as
    # soon as the master exits, and a worker still printing then would lose its line.
    print(f"sendrecv: rank {rank} OK", flush=True)
    dist.barrier()
    if rank == 0:
        print(f"sendrecv: all {world} ranks verified", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    exit_now(main())
