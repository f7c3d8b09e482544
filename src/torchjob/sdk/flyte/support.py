"""Which flytekit releases torchjob serves, and a one-line refusal for the others.

torchjob reads what flytekit serializes for a task (``get_custom``, its resources and image) and
runs flytekit's own local execution around its kfpytorch tasks: that is tested with flytekit and
flytekitplugins-kfpytorch 1.16.31, and the 1.16 series keeps those interfaces.
"""

from __future__ import annotations

import re

from torchjob.errors import Problem, SpecError

TESTED = "1.16.31"
SERIES = (1, 16)
SERVED = f"flytekit and flytekitplugins-kfpytorch {SERIES[0]}.{SERIES[1]}.x (tested with {TESTED})"
PACKAGES = ("flytekit", "flytekitplugins-kfpytorch")
INSTALL = f"pip install {' '.join(f'{name}=={TESTED}' for name in PACKAGES)}"  # the `flyte` extra's pins

_checked: bool = False


def _series(version: str) -> tuple[int, int] | None:
    found = re.match(r"(\d+)\.(\d+)(?:\.|$)", version)
    return (int(found[1]), int(found[2])) if found else None


def refusal(versions: dict[str, str | None]) -> str | None:
    """Why these installed versions cannot be served (None when they can); a package that is not
    installed is fine (a module of plain flytekit tasks needs no kfpytorch)."""
    wrong = [
        f"{name} {version}"
        for name, version in versions.items()
        if version is not None and _series(version) != SERIES
    ]
    if not wrong:
        return None
    return f"{' and '.join(wrong)} installed; torchjob serves {SERVED}: {INSTALL}"


def installed() -> dict[str, str | None]:
    from importlib.metadata import PackageNotFoundError, version

    found: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = None
    return found


def check(where: str = "<flytekit>") -> None:
    """Raise SpecError (one line, naming ``where``) unless the installed flytekit can be served."""
    global _checked
    if _checked:
        return
    reason = refusal(installed())
    if reason is not None:
        raise SpecError([Problem("", reason, where)])
    _checked = True
