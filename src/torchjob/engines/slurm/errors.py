"""What cannot be planned on Slurm: a field path and a message (exit code 2, nothing started)."""

from __future__ import annotations


class PlanError(Exception):
    """What cannot be planned, as (field path, message)."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = path
        self.message = message
