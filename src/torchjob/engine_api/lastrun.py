"""Where each job was last started from this account: its engine and the flags that find it.

``torchjob status NAME`` looks on one engine, in one place (the local engine's state directory, a
Slurm job root, a cluster's namespace). A job started elsewhere, with ``--engine slurm`` or by an
SDK call (whose local jobs have a directory of their own), was then "not found" without a word
of where it is. Every start (``run``, ``submit``, an SDK call) notes the job's name and id here,
with the engine and the flags ``status`` needs to find it; a command that does not find a job
reads the note and says the command that would (:func:`hint`).

A private file, ``$TORCHJOB_HOME/last-started.json`` (default ``~/.torchjob``; 0600, never read
through a symlink or from another user), of the last :data:`KEEP` names and ids. It is only a
hint: a start that cannot write it goes on, two starts at once may keep one of the two, and a
damaged file is read as empty.
"""

from __future__ import annotations

import os
from pathlib import Path

from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterable

FILE = "last-started.json"
KEEP = 500  # names and ids noted; the oldest go first
MAX_BYTES = 1 << 20  # a file larger than this is not this module's: read as empty


def home() -> Path:
    """torchjob's directory of this user: ``$TORCHJOB_HOME``, else ``~/.torchjob``."""
    found = os.environ.get("TORCHJOB_HOME")
    return Path(found) if found else Path.home() / ".torchjob"


def calls_root() -> Path:
    """Where the local jobs of SDK calls live, apart from those ``torchjob run`` starts."""
    return home() / "calls"


def _read(path: Path) -> dict[str, dict[str, object]]:
    import json

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return {}
    try:
        info = os.fstat(fd)
        if info.st_uid != os.geteuid() or info.st_size > MAX_BYTES:
            return {}
        data = json.loads(os.read(fd, MAX_BYTES))
    except (OSError, ValueError):
        return {}
    finally:
        os.close(fd)
    if not isinstance(data, dict):
        return {}
    return {k: v for k, v in data.items() if isinstance(k, str) and isinstance(v, dict)}


def remember(refs: Iterable[str], engine: str, flags: list[str], by: str) -> None:
    """Note that the job known by ``refs`` (its name, its id) was started on ``engine``, found
    with ``flags`` (``["--job-root", "/abs/dir"]``), ``by`` whom (``torchjob run``, ``a Python
    call``). Never fails the caller."""
    import json
    import time

    from torchjob.files import write_atomic

    folder = home()
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
        if os.stat(folder).st_uid != os.geteuid():
            return  # not this user's: nothing is written there
        notes = _read(folder / FILE)
        for ref in refs:
            if ref:
                notes.pop(ref, None)  # re-inserted last: the newest
                notes[ref] = {"engine": engine, "flags": [str(f) for f in flags], "by": by, "at": time.time()}
        kept = dict(list(notes.items())[-KEEP:])
        write_atomic(folder / FILE, json.dumps(kept, separators=(",", ":")) + "\n")
    except OSError:
        return


def recall(ref: str) -> tuple[str, list[str], str] | None:
    """(engine, flags, by whom) of the job last started as ``ref``, or None."""
    note = _read(home() / FILE).get(ref)
    if note is None:
        return None
    engine, flags, by = note.get("engine"), note.get("flags"), note.get("by")
    if not (isinstance(engine, str) and isinstance(flags, list) and all(isinstance(f, str) for f in flags)):
        return None
    return engine, flags, by if isinstance(by, str) else "torchjob"


def hint(command: str, ref: str, engine: str, flags: list[str]) -> str:
    """For a ``command`` that found no job ``ref`` on ``engine`` with ``flags``: where the job last
    started as ``ref`` is, as the command that finds it; "" when it was looked for there."""
    found = recall(ref)
    if found is None or found[:2] == (engine, flags):
        return ""
    import shlex

    from torchjob.engine_api.registry import DEFAULT_ENGINE

    where_engine, where_flags, by = found
    words = ["torchjob", command, ref]
    words += ["--engine", where_engine] if where_engine != DEFAULT_ENGINE else []
    words += where_flags
    kind = f"{where_engine} job" if where_engine != engine else "job"
    return f"; a {kind} {ref!r} was last started by {by}: {shlex.join(words)}"
