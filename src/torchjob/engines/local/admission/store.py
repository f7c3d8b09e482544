"""The queue's state: one JSON file (``admission.json``) in the queue's directory (:mod:`.place`),
read and written under its lock (:mod:`.lock`).

* **Written in place**, only when a look changed something: a rename over it costs about 3 ms on
  ext4, a third of a job's admission. The room a longer text needs is claimed first, as spaces
  after the old text (JSON allows them), so on a full filesystem the write fails before anything
  is changed and the file keeps its last good state (:class:`StateError`; the job that looked
  waits, or runs on with what it holds). (``posix_fallocate`` would do the same, but on ext4 it
  makes each later shrink of the file cost some 5 ms.) The text, padded with spaces to the file's
  size, is then written in one call, and the file cut: whenever a writer is killed, the file
  holds valid JSON.
* **A damaged file is never read as empty**, which would admit jobs over the capacity. It is kept
  aside (``admission.json.damaged``) and the state is rebuilt: from the last good state this
  process read, then from every live job's supervisor, which registers again at its next look
  (within :data:`CHECK_EVERY`). No job is admitted for :data:`REBUILD` seconds meanwhile, and no
  running job is stopped. A state file that vanished (someone removed it while jobs held
  resources: the lock file says a state existed) is rebuilt the same way.
* **Entries of dead supervisors** (pid and start time) are dropped at every look, so a killed
  supervisor never keeps its share. Another user's process that ``/proc`` hides (``hidepid``) is
  taken as alive when the kernel says the pid exists.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
from collections.abc import Iterator, Mapping

from torchjob.engines.local.admission.amounts import RESOURCES
from torchjob.engines.local.admission.lock import acquire
from torchjob.engines.local.admission.place import Place, QueueDirError, locate, open_dir, open_file
from torchjob.errors import Problem, SpecError
from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from pathlib import Path
    from typing import Any

STATE_FILE = "admission.json"
LOCK_FILE = "admission.lock"
DAMAGED_FILE = "admission.json.damaged"
LOOK_WAIT = 0.5  # how long a supervisor's look waits for the lock before it tries again later
CHECK_EVERY = 2.0  # seconds between a running job's checks that its entry is still there
REBUILD = 2 * CHECK_EVERY + 1.0  # no admission for this long after the state was rebuilt
_MARK = b"a state exists\n"  # written into the lock file once there is a state: see _vanished

_last_good: bytes = b""  # the last state this process read or wrote whole: a rebuild starts from it


class StateError(SpecError):
    """The state file cannot be read or written (a full filesystem, an I/O error); it was left as
    it was."""

    def __init__(self, path: Path, doing: str, err: OSError) -> None:
        super().__init__([Problem("", f"cannot {doing} the queue's state: {err.strerror or err}", str(path))])
        self.errno = err.errno


@contextlib.contextmanager
def locked_state(write: bool = True, wait: float = LOOK_WAIT) -> Iterator[dict[str, Any]]:
    """The state, read and (with ``write``) written back under its lock; :class:`.lock.Busy` when
    the lock stays held for ``wait`` seconds, :class:`StateError` when the state cannot be written
    (then nothing of the look is kept), :class:`.place.QueueDirError` when the directory or a file
    of it is unsafe."""
    where = locate()
    dir_fd = open_dir(where)
    try:
        lock = open_file(dir_fd, LOCK_FILE, where, write=True, create=True)
        assert lock is not None
        try:
            try:
                acquire(lock, where.path / LOCK_FILE, wait)
            except OSError as err:  # ENOLCK: a filesystem without flock
                raise StateError(where.path / LOCK_FILE, "lock", err) from None
            raw = _read(dir_fd, where)
            data = _load(raw, vanished=not raw.strip() and os.fstat(lock).st_size > 0)
            if write and "rebuild" in data and data["rebuild"].get("fresh"):
                _keep_aside(dir_fd, where, raw)
            yield data
            if write:
                data.get("rebuild", {}).pop("fresh", None)
                text = json.dumps(data, separators=(",", ":")).encode()
                if text != raw.rstrip(b" "):
                    _write(dir_fd, where, text)
                    _remember(text)
                    with contextlib.suppress(OSError):  # the state is written: that is what counts
                        if os.fstat(lock).st_size == 0:
                            os.pwrite(lock, _MARK, 0)
        finally:
            os.close(lock)
    finally:
        os.close(dir_fd)


def peek() -> dict[str, Any]:
    """The state as last written, read without the lock (each write leaves it whole): for
    ``torchjob queue`` while another process holds the lock."""
    where = locate()
    dir_fd = open_dir(where)
    try:
        return _load(_read(dir_fd, where), vanished=False)
    finally:
        os.close(dir_fd)


def check_place() -> None:
    """Raise now, before a job is created, when the queue's directory or lock cannot be used;
    without taking the lock (another process may hold it: the job then waits its turn)."""
    where = locate()
    dir_fd = open_dir(where)
    try:
        lock = open_file(dir_fd, LOCK_FILE, where, write=True, create=True)
        if lock is not None:
            os.close(lock)
    finally:
        os.close(dir_fd)


def rebuilding(data: Mapping[str, Any]) -> str:
    """Why no job is admitted now, while the state is rebuilt; '' when it is not."""
    rebuild = data.get("rebuild")
    if not rebuild:
        return ""
    until = float(rebuild.get("until", 0))
    if until <= time.time():
        return ""
    return (
        f"the queue's state was rebuilt ({rebuild.get('why')}): no job is admitted before "
        f"{time.strftime('%H:%M:%S', time.localtime(until))}, while the running jobs register again"
    )


def _load(raw: bytes, vanished: bool) -> dict[str, Any]:
    data, damage = _parse(raw)
    if damage is None and vanished:
        damage = "the state file was removed or emptied while a state existed"
    if damage is None:
        _remember(raw)
        if data.get("rebuild") and float(data["rebuild"].get("until", 0)) <= time.time():
            del data["rebuild"]
        return data
    seed = json.loads(_last_good) if _last_good else {}  # valid: it was checked when remembered
    return {
        "seq": seed.get("seq", 0),
        "admitted": seed.get("admitted", 0),
        "jobs": seed.get("jobs", {}),
        "rebuild": {"until": time.time() + REBUILD, "why": damage, "fresh": True},
    }


def _remember(raw: bytes) -> None:
    global _last_good
    if raw.strip():
        _last_good = bytes(raw)


def _read(dir_fd: int, where: Place) -> bytes:
    fd = open_file(dir_fd, STATE_FILE, where, write=False, create=False)
    if fd is None:
        return b""
    try:
        with os.fdopen(fd, "rb") as handle:
            return handle.read()
    except OSError as err:
        raise StateError(where.path / STATE_FILE, "read", err) from None


def _write(dir_fd: int, where: Place, text: bytes) -> None:
    fd = open_file(dir_fd, STATE_FILE, where, write=True, create=True)
    assert fd is not None
    path = where.path / STATE_FILE
    try:
        old = os.fstat(fd).st_size
        if len(text) > old:
            try:  # the room first, as spaces after the old text (still valid JSON): on a full
                _write_at(fd, b" " * (len(text) - old), old)  # filesystem, nothing has changed
            except OSError as err:
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, old)
                raise StateError(path, "write", err) from None
        _write_at(fd, text + b" " * (old - len(text)), 0)  # within the file's blocks: one call
        if old > len(text):
            os.ftruncate(fd, len(text))
    except OSError as err:
        raise StateError(path, "write", err) from None
    finally:
        os.close(fd)


def _write_at(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written


def _keep_aside(dir_fd: int, where: Place, raw: bytes) -> None:
    """The damaged file's bytes, for whoever wants to know what happened (best effort)."""
    if not raw.strip():
        return
    with contextlib.suppress(OSError, QueueDirError):
        fd = open_file(dir_fd, DAMAGED_FILE, where, write=True, create=True)
        assert fd is not None
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, raw[: 1 << 20], 0)
        finally:
            os.close(fd)


# ------------------------------------------------------------------ what a sound state looks like


def _parse(raw: bytes) -> tuple[dict[str, Any], str | None]:
    """The state, and what is wrong with it (None when it is sound; empty is sound: no state)."""
    if not raw.strip():
        return {}, None
    try:
        data = json.loads(raw)
    except ValueError as err:  # UnicodeDecodeError too
        return {}, f"not valid JSON: {str(err)[:80]}"
    if not isinstance(data, dict):
        return {}, "not a JSON object"
    for key in ("seq", "admitted"):
        if key in data and not _whole(data[key]):
            return {}, f"{key} is not a whole number"
    rebuild = data.get("rebuild")
    if rebuild is not None and not (isinstance(rebuild, dict) and _number(rebuild.get("until"))):
        return {}, "rebuild is not {until: TIME}"
    jobs = data.get("jobs", {})
    if not isinstance(jobs, dict):
        return {}, "jobs is not a mapping"
    for key, entry in jobs.items():
        why = _entry_damage(entry)
        if why:
            return {}, f"jobs[{json.dumps(key)[:40]}]: {why}"
    return data, None


def _entry_damage(entry: object) -> str:
    if not isinstance(entry, dict):
        return "not a mapping"
    for key in ("pid", "seq", "priority"):
        if not _whole(entry.get(key)):
            return f"{key} is not a whole number"
    for key in ("passed", "order", "uid"):
        if key in entry and not _whole(entry[key]):
            return f"{key} is not a whole number"
    for key in ("created", "at", "admitted"):
        if (key == "created" or key in entry) and not _number(entry.get(key)):
            return f"{key} is not a number"
    if not isinstance(entry.get("queue"), str):
        return "queue is not a string"
    pods = entry.get("pods")
    if not isinstance(pods, dict):
        return "pods is not a mapping"
    for amounts in pods.values():
        if not isinstance(amounts, dict):
            return "pods is not a mapping of pods to amounts"
        for name, amount in amounts.items():
            if name not in RESOURCES or not _number(amount) or amount < 0:
                return f"pods: {str(name)[:40]!r} is not a resource with an amount"
    gang = entry.get("gang")
    if (
        not isinstance(gang, list)
        or any(k not in pods for k in gang if isinstance(k, str))
        or not all(isinstance(k, str) for k in gang)
    ):
        return "gang is not a list of its pods"
    granted = entry.get("granted", {})
    if not isinstance(granted, dict):
        return "granted is not a mapping"
    for key, ids in granted.items():
        if key not in pods or not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
            return "granted is not a mapping of its pods to GPU lists"
    return ""


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


# ------------------------------------------------------------------ live entries


def live_jobs(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The state's jobs, those of dead supervisors dropped (in place)."""
    jobs = data.get("jobs")
    if not isinstance(jobs, dict):
        jobs = data["jobs"] = {}
    for key in [k for k, v in jobs.items() if not alive(v)]:
        del jobs[key]
    return jobs


def alive(entry: Mapping[str, Any]) -> bool:
    from torchjob.engines.local.state import process_alive

    try:
        pid, created = int(entry["pid"]), float(entry["created"])
    except (KeyError, ValueError, TypeError):
        return False
    if process_alive(pid, created):
        return True
    if entry.get("uid", os.getuid()) == os.getuid() or os.path.exists(f"/proc/{pid}"):
        return False  # /proc shows it: gone, or another process by now
    try:  # another user's, which /proc hides from this one (hidepid): does the pid exist?
        os.kill(pid, 0)
    except PermissionError:
        return True
    except OSError:
        return False
    return False
