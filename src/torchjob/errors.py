"""Problems found in user input, with the field path they belong to.

The checks (validation, plugins, targets, engines) return :class:`Issue` records: a field path,
a message and a severity. Where the file is known an issue becomes a :class:`Problem`, which adds
the file and line; a :class:`SpecError` carries all problems found at once so the CLI can print
them as ``FILE:LINE: field.path: message`` and exit 2.
"""

from __future__ import annotations

from collections.abc import Iterable

from torchjob.records import record
from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Literal

    Severity = Literal["error", "warning"]

# The exit codes of torchjob's programs (the CLI and the in-pod SDK runner).
EXIT_OK = 0
EXIT_FAILED = 1  # the job (or the task) failed
EXIT_BAD_INPUT = 2  # a user mistake: nothing was started
EXIT_INTERRUPTED = 130  # Ctrl-C


@record(frozen=True)
class Issue:
    """One finding of a check: where (a field path), what, and whether it stops the job."""

    path: str
    message: str
    severity: Severity = "error"

    @property
    def is_error(self) -> bool:
        return self.severity == "error"


def warning(path: str, message: str) -> Issue:
    return Issue(path, message, "warning")


@record(frozen=True)
class Problem:
    """One thing wrong with the input: where (a field path) and what was expected."""

    path: str
    message: str
    file: str = ""
    line: int | None = None

    def format(self) -> str:
        where = self.file or "<input>"
        if self.line is not None:
            where = f"{where}:{self.line}"
        field = f" {self.path}:" if self.path else ""
        # One line per problem, whatever the message holds.
        message = " ".join(self.message.split())
        return f"{where}:{field} {message}"

    @classmethod
    def of(cls, issue: Issue, file: str = "", line: int | None = None) -> Problem:
        """The problem an issue is once its file (and line) are known."""
        return cls(issue.path, issue.message, file, line)


class SpecError(Exception):
    """Raised when input is invalid; holds every problem found."""

    def __init__(self, problems: Iterable[Problem]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(p.format() for p in self.problems))
