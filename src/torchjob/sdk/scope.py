"""Which workflow, if any, is collecting task calls right now; and the direct-call override guard.

Kept apart from :mod:`torchjob.sdk.workflow` so that :class:`~torchjob.sdk.task.Task` can ask "am
I called inside a workflow?" without importing the workflow machinery (which imports Task).
Standard library only; ``dis`` is imported only for code that mentions ``with_overrides``.
"""

from __future__ import annotations

import contextvars
import functools
import sys
from types import CodeType
from typing import Any, Protocol


class Collector(Protocol):
    """What a task call inside a workflow is handed to (the workflow's scope)."""

    def add(self, task: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any: ...


_CURRENT: contextvars.ContextVar[Collector | None] = contextvars.ContextVar("torchjob_workflow", default=None)

_OVERRIDE = "with_overrides"


def current() -> Collector | None:
    """The workflow scope task calls go to, or None when calls run at once."""
    return _CURRENT.get()


def enter(scope: Collector | None) -> contextvars.Token[Collector | None]:
    return _CURRENT.set(scope)


def leave(token: contextvars.Token[Collector | None]) -> None:
    _CURRENT.reset(token)


@functools.lru_cache(maxsize=1024)
def _overrides_the_value(code: CodeType, offset: int) -> bool:
    """Whether the instruction after the call at ``offset`` looks up ``.with_overrides``."""
    import dis

    for instruction in dis.get_instructions(code):
        if instruction.offset > offset:
            return instruction.opname in ("LOAD_ATTR", "LOAD_METHOD") and instruction.argval == _OVERRIDE
    return False


def refuse_override_of_value(task_name: str) -> None:
    """Raise before running if the caller wrote ``task(...).with_overrides(...)`` outside a workflow.

    Such a call would run the whole task and then fail on its plain return value; checking the
    caller's next instruction stops it before any work is done. Only code that mentions
    ``with_overrides`` at all is inspected, and each call site once.
    """
    try:
        frame = sys._getframe(2)  # 0: here, 1: Task.__call__, 2: the code that called the task
    except ValueError:  # called straight from C, with no Python caller
        return
    code = frame.f_code
    if _OVERRIDE not in code.co_names or not _overrides_the_value(code, frame.f_lasti):
        return
    raise TypeError(
        f"{task_name}(...).with_overrides(...) outside a @workflow: a direct task call runs at once "
        "and returns a plain value, which has no with_overrides. Override the task before calling "
        f"it, {task_name}.with_overrides(task_config=...)(...), or make the calling function a "
        "@torchjob.workflow, where a task call returns a promise that takes per-call overrides."
    )
