"""A small process that stops a job's processes if the supervisor dies without doing it.

The supervisor starts one watchdog per job in its own session and keeps the write end of a pipe
to it. A SIGKILLed supervisor cannot clean up, but the kernel closes its pipe: the watchdog reads
end-of-file and kills every process group the supervisor told it about and every process that
carries the job's marker, SIGTERM first, SIGKILL at most 0.75 s later. A supervisor that ends
normally writes ``done`` first and the watchdog just exits.

Run as ``python -m torchjob.engines.local.watchdog JOB_ID``; reads ``pgid N`` / ``done`` lines.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys

GRACE = 0.75  # seconds between SIGTERM and SIGKILL once the supervisor is gone


def main(argv: list[str]) -> int:
    job_id = argv[0]
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # only the pipe decides
    # Imported now, while idle, so that nothing is left to load once the supervisor is gone.
    from torchjob.engines.local.process import kill_now

    pgids: set[int] = set()
    done = False
    stdin = sys.stdin.buffer
    while True:
        line = stdin.readline()
        if not line:
            break
        word, _, value = line.decode(errors="replace").strip().partition(" ")
        if word == "pgid" and value.isdigit():
            pgids.add(int(value))
        elif word == "forget" and value.isdigit():
            pgids.discard(int(value))
        elif word == "done":
            done = True
            break
    if done:
        return 0
    kill_now(job_id, pgids, (), GRACE)
    return 0


class Watchdog:
    """The supervisor's handle on its watchdog process."""

    def __init__(self, job_id: str) -> None:
        env = dict(os.environ)
        env.pop("TORCHJOB_JOB_ID", None)  # the watchdog must never match its own job's marker
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "torchjob.engines.local.watchdog", job_id],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
            close_fds=True,
        )

    def _send(self, text: str) -> None:
        if self.proc.stdin is None:
            return
        with contextlib.suppress(OSError, ValueError):
            self.proc.stdin.write(text.encode() + b"\n")
            self.proc.stdin.flush()

    def watch(self, pgid: int) -> None:
        self._send(f"pgid {pgid}")

    def forget(self, pgid: int) -> None:
        self._send(f"forget {pgid}")

    def close(self) -> None:
        """The supervisor has cleaned up itself: the watchdog has nothing left to do."""
        self.proc.kill()  # quicker than telling it, which would wait for its interpreter to start
        if self.proc.stdin is not None:
            with contextlib.suppress(OSError):
                self.proc.stdin.close()
        self.proc.wait(timeout=5)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
