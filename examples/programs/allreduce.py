"""The smallest real collective: every rank all-reduces a tensor and checks the sum.

The speed benchmark (``benchmarks/bench_local_run.py``) runs this same program under
``torchjob run``, ``torchrun`` and a bare shell loop. With ``TORCHJOB_BENCH_MARKS=DIR`` each rank
also writes when its process started, had imported torch, joined the group and ended, so a
launcher's start-up and tear-down time can be told apart from the program's own (and a run whose
worker waited out torch's connect backoff from one that did not).
"""

from __future__ import annotations

import os
import time

_STARTED = time.time()  # before the slow torch import

import warnings  # noqa: E402
from datetime import timedelta  # noqa: E402

# torch warns at import when numpy is absent; the program does not use numpy.
warnings.filterwarnings("ignore", message="Failed to initialize NumPy")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from rank_exit import exit_now  # noqa: E402  (this folder is on sys.path when run as a script)

_IMPORTED = time.time()


def mark(name: str, when: float) -> None:
    """Append ``name rank when`` to the marks file, if the benchmark asked for one."""
    folder = os.environ.get("TORCHJOB_BENCH_MARKS")
    if folder:
        with open(os.path.join(folder, "marks.txt"), "a") as out:
            out.write(f"{name} {os.environ.get('RANK', '?')} {os.getpid()} {when:.6f}\n")


def main() -> int:
    mark("start", _STARTED)
    mark("imported", _IMPORTED)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=60))
    mark("joined", time.time())
    value = torch.full((1024,), float(rank + 1))
    dist.all_reduce(value)
    want = world * (world + 1) / 2
    ok = bool(torch.all(value == want))
    dist.barrier()
    dist.destroy_process_group()
    print(f"allreduce: rank {rank} of {world} sum {value[0].item():g} {'OK' if ok else 'WRONG'}", flush=True)
    mark("end", time.time())
    return 0 if ok else 1


if __name__ == "__main__":
    exit_now(main())
