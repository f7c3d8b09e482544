"""The process tree: who is whose child, read from /proc, and the orphans this process adopted.

The supervisor is a child subreaper: a container's orphans come to it as their main process
ends. :func:`adopted` tells which of its children are such orphans of a job (in another session,
not started by it, carrying no other job's marker); :func:`descendants_in` walks a tree that
:func:`children_map` read once for the whole machine.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

from torchjob.engines.local.process import LINUX, MARKER
from torchjob.host import procfs

# The sessions of the engine's fork servers in this process (preload.py; a server's pid is its
# session's id). A child of ours in one of them is a server's spare, not yet a container's (which
# starts a session of its own before it runs anything): never a job's orphan.
HELPERS: set[int] = set()


def children_map() -> dict[int, list[int]]:
    """parent pid -> child pids, read once for the whole machine (cheaper than a scan per root)."""
    tree: dict[int, list[int]] = {}
    if LINUX and os.path.isdir("/proc"):  # a third of psutil's time: no object per process
        for pid in procfs.pids():
            try:
                ppid = procfs.ppid(pid)
            except (OSError, ValueError, IndexError):
                continue  # gone meanwhile
            tree.setdefault(ppid, []).append(pid)
        return tree
    import psutil

    try:
        for proc in psutil.process_iter(["ppid"]):
            tree.setdefault(int(proc.info["ppid"] or 0), []).append(proc.pid)
    except psutil.Error:
        pass
    return tree


def adopted(tree: Mapping[int, list[int]], known: Iterable[int], job_id: str) -> list[int]:
    """Processes of the job that this process adopted as subreaper, with their descendants.

    A child this process did not start itself (not in ``known``: container processes, the
    watchdog, the caller's own children from before the job) and that lives in another session
    came from a container: containers run in sessions of their own, and no process can join ours
    from there. One that still carries another job's marker belongs to that job; one in a fork
    server's session (``HELPERS``) is that server's spare.
    """
    ours = os.getsid(0)
    skip = set(known)
    other = f"\0{MARKER}=".encode()
    mine = f"\0{MARKER}={job_id}\0".encode()
    found: list[int] = []
    for pid in tree.get(os.getpid(), []):
        if pid in skip:
            continue
        try:
            session = int(procfs.stat_fields(pid)[3])  # field 3
            if session == ours or session in HELPERS:
                continue
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile
        environ = procfs.environ(pid)
        if other in environ and mine not in environ:
            continue
        found.append(pid)
        found.extend(descendants_in(tree, pid))
    return found


def children_of_self() -> list[int]:
    """This process's children, for the record of what is not the job's."""
    if not has_children():  # the CLI: no scan of the whole process table
        return []
    return children_map().get(os.getpid(), [])


def has_children() -> bool:
    """Whether this process has any child at all, running or ended (one system call)."""
    if not hasattr(os, "waitid"):  # macOS: assume there are
        return True
    try:
        os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return False
    return True


def exited(pid: int) -> bool:
    """Whether our child ``pid`` has ended and waits to be reaped (it is not reaped here)."""
    if not hasattr(os, "waitid"):
        return False
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return False  # not (or no longer) our child: not known to have ended


def descendants_in(tree: Mapping[int, list[int]], root: int) -> list[int]:
    found: list[int] = []
    stack = list(tree.get(root, []))
    while stack:
        pid = stack.pop()
        found.append(pid)
        stack.extend(tree.get(pid, []))
    return found
