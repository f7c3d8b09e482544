"""The ``torchjob`` command line; its commands are in ``app.py``.

``main`` is the program's entry point. It lives apart from the commands so that the program sets
its garbage collector up before importing them.
"""

from __future__ import annotations

import gc

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

# Starting a job (imports, loading the job, starting its pods) makes about 25,000 objects that
# live as long as the program and almost no garbage; with Python's threshold of 700 new objects
# the collector ran about 40 times on the way, 3.7 ms of a 57 ms `torchjob run`
# (benchmarks/README.md). Past this many new objects it still runs, so a supervisor that lives
# for days frees its reference cycles as usual.
PROGRAM_GC_THRESHOLD = 50_000


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``torchjob`` with ``argv`` (the program's arguments when None); give its exit code."""
    if argv is None:  # the torchjob program itself, not a caller in Python
        gc.set_threshold(PROGRAM_GC_THRESHOLD, *gc.get_threshold()[1:])
    from torchjob.cli.app import dispatch

    return dispatch(argv)
