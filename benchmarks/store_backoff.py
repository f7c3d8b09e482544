"""What a rank pays when it reaches torch's rendezvous store before the master has opened it.

Run with the project's virtualenv (torch needed)::

    .venv/bin/python benchmarks/store_backoff.py            # 5 tries per delay

A rank's ``init_process_group`` connects to the master's TCPStore at MASTER_ADDR:MASTER_PORT. When
nothing listens there yet, torch's client waits before it tries again (an exponential backoff with
jitter in c10d's socket code), so a rank that arrives even a millisecond early waits about half a
second to a second more. In a bare 2-rank launch the ranks import torch side by side and whichever
finishes first is a coin toss: about half of the runs pay it, which is most of the spread of
``bench_local_run.py``'s floor. torchjob's wait-for-master (the pytorch plugin's
``--wait-master-enabled``, which the seed jobs set) starts a pre-warmed worker's program only once
the master listens, so its runs never pay it.

Here one process holds both ends: a client started in a thread, the store opened ``delay`` later.
"""

from __future__ import annotations

import argparse
import socket
import statistics
import threading
import time
from datetime import timedelta


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def connect_time(delay: float) -> float:
    """Seconds from a client's start to its connection, the store opened ``delay`` seconds after it."""
    import torch.distributed as dist

    port = free_port()
    took: list[float] = []
    clients: list[object] = []

    def client() -> None:
        start = time.monotonic()
        clients.append(dist.TCPStore("127.0.0.1", port, 2, False, timedelta(seconds=30)))
        took.append(time.monotonic() - start)

    thread = threading.Thread(target=client)
    thread.start()
    time.sleep(delay)
    server = dist.TCPStore("127.0.0.1", port, 2, True, timedelta(seconds=30), wait_for_workers=False)
    thread.join(60)
    del server
    clients.clear()
    return took[0]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tries", type=int, default=5)
    args = parser.parse_args()
    print("| the store opened after | client connected after (median, range) | waited beyond the store |")
    print("|---:|---:|---:|")
    for delay in (0.0, 0.001, 0.01, 0.05, 0.2):
        times = [connect_time(delay) for _ in range(args.tries)]
        median, low, high = (round(x * 1000) for x in (statistics.median(times), min(times), max(times)))
        print(f"| {delay * 1000:.0f} ms | {median} ms ({low}-{high}) | {median - delay * 1000:.0f} ms |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
