"""Whether the state root can hold this user's jobs: a directory, this user's own, readable.

Checked before a command reads or makes anything under it, so that ``TORCHJOB_HOME`` naming a
file, another user's directory or one that cannot be read is one line (exit 2), not a traceback
or, worse, job state written into someone else's tree.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path


def origin(explicit: Path | None) -> str:
    """How the user chose the root, as the message names it."""
    if explicit is not None:
        return f"--state-dir {explicit}"
    home = os.environ.get("TORCHJOB_HOME")
    return f"TORCHJOB_HOME={home}" if home else "~/.torchjob"


def root_problem(root: Path) -> str | None:
    """What is wrong with ``root`` (the directory of job directories), or None when it is usable.

    A root that does not exist yet is fine as long as what exists of its path is directories.
    """
    probe = root
    while True:
        try:
            info = os.stat(probe)
        except (FileNotFoundError, NotADirectoryError):
            if probe.parent == probe:
                return None
            probe = probe.parent
            continue
        except OSError as err:
            return f"{probe} cannot be looked at: {err.strerror or err}"
        break
    if not stat.S_ISDIR(info.st_mode):
        return f"{probe} is not a directory"
    # The root itself, or the directory it would be made in: this user's (or one like /tmp, where
    # everyone makes their own).
    shared = probe != root and info.st_mode & stat.S_ISVTX and info.st_mode & stat.S_IWOTH
    if info.st_uid != os.geteuid() and not shared:
        return (
            f"{probe} belongs to uid {info.st_uid}, not to you (uid {os.geteuid()}): torchjob keeps "
            "job state only in a directory of your own"
        )
    wanted = os.R_OK | os.W_OK | os.X_OK if probe == root else os.W_OK | os.X_OK
    if not os.access(probe, wanted):
        return f"{probe} cannot be read and written by you (mode {stat.S_IMODE(info.st_mode):03o})"
    return None
