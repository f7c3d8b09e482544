"""``TYPE_CHECKING`` without importing :mod:`typing`.

Importing ``typing`` costs every ``torchjob`` command 1.6 ms of CPU, and nothing else a command
loads needs it (benchmarks/README.md). The modules a command loads import typing's names under
``if TYPE_CHECKING:`` with this constant, which mypy reads as typing's own; a test checks that
starting a job never imports typing.
"""

TYPE_CHECKING = False
