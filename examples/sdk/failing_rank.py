"""An exception in one rank comes back to the caller with the rank and the remote traceback.

python examples/sdk/failing_rank.py
"""

from __future__ import annotations

import os

from torchjob import Elastic, RemoteError, task


@task(task_config=Elastic(nproc_per_node=3))
def check_shard() -> int:
    rank = int(os.environ["RANK"])
    if rank == 2:
        raise ValueError(f"shard {rank} is corrupt")
    return rank


if __name__ == "__main__":
    try:
        check_shard()
    except RemoteError as err:
        print(f"rank {err.rank} failed with {err.exc_type}: {err.message}")
        print(err.remote_traceback)
