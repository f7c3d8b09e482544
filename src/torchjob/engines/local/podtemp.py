"""Each pod's own temporary directory, gone with the job, as a container's /tmp goes with its pod.

On a cluster a container's temporary files (``tempfile``'s, torchrun's ``torchelastic_*``
folders, flytekit's ``flyte-*`` sandboxes) are written into the container's own file system and
discarded with it. Local processes share the machine's temporary directory, where every run would
leave them behind: a flytekit task of 6 pods left 7 folders in /tmp a run. So each pod attempt gets
a directory of its own as ``TMPDIR`` (a container's own ``TMPDIR`` wins), inside one private
directory per job in the machine's temporary directory (the user's ``TMPDIR`` is honoured), which
the supervisor removes once the job's processes are gone (in a process that reads what the pods
left, an SDK caller, when it exits: ``ThisProcess.reads_pod_files``). A supervisor killed before
that holds its lock no more (``scratch.py``), and the next job's end removes the directory.

Short paths on purpose (``/tmp/torchjob-tmp-XXXXXXXXXX/3``): programs make Unix sockets in their
temporary directory (multiprocessing's ``pymp-*/listener-*``, 32 bytes), and a socket's path may
not pass 107 bytes; where the machine's temporary directory is too long a path to add ours to
(:data:`LONGEST`), the pods keep it. A pod that runs as another user (``runAsUser``, torchjob as
root) gets none: it could not write to a directory of torchjob's user, and keeps the machine's.

What programs keep in the temporary directory to find again next run stays where they find it
(:meth:`PodTemp.keep_caches`): torch.compile's cache, ``<temporary directory>/torchinductor_<user>``
(its kernels, graphs and a 150 MB precompiled header, which torch puts there even when
``TORCHINDUCTOR_CACHE_DIR`` names another place), is a link in each pod's directory to the
machine's; where the machine has none yet, a pod's own becomes it at the job's end (so a job that
never imports torch leaves nothing). Without it every run compiled from nothing: a small function
on CPU took 13 s a run under torchjob, against 13 s once and 1.3 s after for a bare ``python``.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import stat

from torchjob import logs, scratch
from torchjob.engine_api.base import ThisProcess
from torchjob.engines.local import security
from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

PREFIX = "torchjob-tmp-"
CACHES = ("torchinductor_",)  # + the user's name: the folders kept in the machine's (see keep_caches)
ATTEMPTS = 10  # random names tried for the job's directory before giving up
LONGEST = 64  # bytes of a pod's directory: 43 left for what programs make in it


def base_dir() -> str:
    """Where the job's directory is made: ``$TMPDIR`` (or ``$TEMP``, ``$TMP``), else /tmp, as
    ``tempfile`` would pick; its module (with shutil and random, 2-3 ms) is not imported for it."""
    for name in ("TMPDIR", "TEMP", "TMP"):
        value = os.environ.get(name)
        if value and os.path.isabs(value):
            return value
    return "/tmp"


def cache_user(env: Mapping[str, str]) -> str:
    """The user name torch's compile cache is named for in a process with ``env``: that of
    ``getpass.getuser`` (its variables, else the account's), with torch's characters replaced."""
    user = next((env[n] for n in ("LOGNAME", "USER", "LNAME", "USERNAME") if env.get(n)), None)
    if user is None:
        import pwd

        try:
            user = pwd.getpwuid(os.getuid()).pw_name
        except KeyError:
            user = f"uid_{os.getuid()}"
    return "".join("_" if c in '\\/:*?"<>|' else c for c in user)


class PodTemp:
    """The job's temporary directories: one per pod attempt, made as pods are made."""

    def __init__(self) -> None:
        self.root: str | None = None  # made with the first pod's
        self.pods: list[str] = []
        self.why_not = ""  # why the pods keep the machine's temporary directory, once known

    def for_pod(self, pod_spec: dict[str, Any]) -> str | None:
        """A new private directory for one pod attempt; None where the pod keeps the machine's."""
        if self.why_not or (os.geteuid() == 0 and security.other_users([pod_spec])):
            return None
        try:
            if self.root is None:
                self.root = _new_root()
            path = os.path.join(self.root, str(len(self.pods)))
            os.mkdir(path, 0o700)
            os.chmod(path, 0o700)  # (a umask like 0o277 would have taken bits off)
        except OSError as err:
            self.why_not = f"no temporary directory of the job's own: {err.strerror or err}"
            logs.debug("pods keep the machine's temporary directory: %s", self.why_not)
            return None
        self.pods.append(path)
        return path

    def keep_caches(self, path: str, envs: list[dict[str, str]]) -> None:
        """In the pod directory ``path``, a link to the machine's torch compile cache for each of
        the pod's processes (``envs``) whose ``TMPDIR`` it is, where that cache is a folder of this
        user's own; else the pod's cache is its own, and is moved there at the job's end."""
        for env in envs:
            if env.get("TMPDIR") != path:  # the container set its own
                continue
            for prefix in CACHES:
                name = prefix + cache_user(env)
                link, target = os.path.join(path, name), os.path.join(_machines(path), name)
                try:
                    info = os.lstat(target)
                    if os.path.lexists(link) or not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
                        continue  # linked for another container; or not this user's own folder
                    os.symlink(target, link)
                except OSError:  # none yet (or not to be had): the pod's own, kept at the end
                    pass

    def remove(self) -> None:
        """Remove the job's directories (its processes are gone), and those that supervisors
        killed before their job's end left; in a process that reads the pods' files, at its exit."""
        if self.root is not None and ThisProcess.reads_pod_files:
            if os.getpid() not in _at_exit:
                _at_exit[os.getpid()] = []
                atexit.register(_remove_at_exit, os.getpid())
            _at_exit[os.getpid()].append((self.root, self.pods))
        elif self.root is not None:
            _remove(self.root, self.pods)
        self.root = None
        scratch.sweep(PREFIX, base_dir())


# The jobs' directories a process removes as it exits, by its pid (a fork inherits the handler).
_at_exit: dict[int, list[tuple[str, list[str]]]] = {}


def _remove(root: str, pods: list[str]) -> None:
    _settle_caches(pods)
    for path in pods:  # most programs remove what they made: nothing is left
        with contextlib.suppress(OSError):
            os.rmdir(path)
    if not scratch.remove_empty(root):
        scratch.remove(root)


def _machines(pod_dir: str) -> str:
    """The machine's temporary directory, in which the job's directory holds ``pod_dir``."""
    return os.path.dirname(os.path.dirname(pod_dir))


def _settle_caches(pods: list[str]) -> None:
    """The links to the machine's compile cache go (the pods' directories are then empty, and
    removed without shutil's import); a cache a pod made in its own directory (the machine had
    none: see keep_caches) becomes the machine's, unless one appeared there meanwhile."""
    for path in pods:
        try:
            entries = [e for e in os.scandir(path) if e.name.startswith(CACHES)]
        except OSError:
            continue
        for entry in entries:
            target = os.path.join(_machines(path), entry.name)
            with contextlib.suppress(OSError):
                if entry.is_symlink():
                    os.unlink(entry.path)
                elif entry.is_dir(follow_symlinks=False) and not os.path.lexists(target):
                    os.rename(entry.path, target)


def _remove_at_exit(owner: int) -> None:
    if os.getpid() != owner:  # a fork of the process that ends as Python does: not its to remove
        return
    for root, pods in _at_exit.pop(owner, []):
        _remove(root, pods)


def _new_root() -> str:
    """A new private directory of the job's in :func:`base_dir`, locked for this process."""
    base = base_dir()
    if len(os.fsencode(base)) + len(f"/{PREFIX}{'x' * 10}/9999") > LONGEST:
        raise OSError(f"{base}: too long a path to add one for the sockets that programs make there")
    for _ in range(ATTEMPTS):
        path = os.path.join(base, PREFIX + os.urandom(5).hex())
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            continue
        try:
            os.chmod(path, 0o700)
            scratch.hold(path)
        except OSError:
            os.rmdir(path)
            raise
        return path
    raise FileExistsError(f"{ATTEMPTS} names taken in {base}")
