"""Which flytekit releases torchjob serves, and a one-line refusal for the others.

torchjob reads what flytekit serializes for a task (``get_custom``, its resources and image) and
runs flytekit's own local execution around its kfpytorch tasks: that is tested with flytekit and
flytekitplugins-kfpytorch 1.16.31, and the 1.16 series keeps those interfaces.

The versions are read from the installed distributions' metadata, never by importing flytekit:
a file that imports flytekit is refused before torchjob imports it (:func:`check_file`), not
after flytekit and torch loaded (some 2.5 s).
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


def check_file(path: str) -> None:
    """:func:`check` for a file about to be imported, when its source imports flytekit or a
    flytekit plugin; a file that does not is left to the check made once a flytekit object is seen."""
    if not _checked and imports_flytekit(path):
        check(path)


def imports_flytekit(path: str) -> bool:
    """Whether the file's source has an ``import`` of flytekit or of a flytekit plugin (read, not run)."""
    try:
        with open(path, "rb") as handle:
            source = handle.read()
    except OSError:
        return False
    if b"flytekit" not in source:  # the usual file: not parsed
        return False
    import ast

    try:
        tree = ast.parse(source, path)
    except (SyntaxError, ValueError):  # importing it says what is wrong
        return False
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module or ""]
        else:
            continue
        if any(name.split(".")[0] in ("flytekit", "flytekitplugins") for name in names):
            return True
    return False
