"""A training loop whose one rank crashes on the job's first attempt, to show ``RestartJob``.

The attempt comes from ``JOB_RETRY_COUNT``, which the job maps from the pod annotation
``volcano.sh/job-retry-count`` with the downward API (``fieldRef``), on a cluster and locally
alike. On retry count 0 rank ``CRASH_RANK`` (default: the last rank) dies with exit code 3 after
the first all-reduce, as a worker lost mid-training would; the other ranks then fail on the next
collective. After the job restarts every rank runs to the end and checks every sum.
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

STEPS = 5
CRASH_EXIT_CODE = 3


def main() -> int:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    retry = os.environ.get("JOB_RETRY_COUNT", "")
    if not retry.isdigit():
        print(f"crash-once: JOB_RETRY_COUNT must be the job's retry count, got {retry!r}", flush=True)
        return 2
    attempt = int(retry) + 1
    crash_rank = int(os.environ.get("CRASH_RANK", str(world - 1)))
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=60))
    print(f"crash-once: rank {rank} of {world} started, attempt {attempt} (retry count {retry})", flush=True)
    want = world * (world + 1) / 2  # the sum of rank+1 over every rank
    for step in range(STEPS):
        total = torch.tensor([rank + 1.0])
        dist.all_reduce(total)
        if float(total.item()) != want:
            print(f"crash-once: rank {rank} step {step}: sum {total.item()} != {want}", flush=True)
            return 1
        if attempt == 1 and rank == crash_rank:
            print(f"crash-once: rank {rank} crashing on purpose at step {step} of attempt 1", flush=True)
            os._exit(CRASH_EXIT_CODE)  # no clean shutdown, like a killed process
    dist.barrier()
    dist.destroy_process_group()
    print(f"crash-once: rank {rank} completed {STEPS} all-reduce steps on attempt {attempt}", flush=True)
    return 0


if __name__ == "__main__":
    exit_now(main())
