"""The job directory: everything a local job leaves on disk, and how commands find it again.

Layout of ``<root>/<job-id>/`` (the root, and which directories in it are jobs: :mod:`.roots`)::

    job.yaml                         the job as submitted (a Volcano Job)
    pods.yaml                        the pods and objects as expanded with local addressing
    status.json                      phase, reason, ports, pods; rewritten on every change
    supervisor.pid                   pid of the process running the job
    supervisor.log                   the supervisor's own output when run with --detach
    hosts                            the job's hosts file: the machine's, then a line per pod
    pods/<pod>/attempt-<n>/hosts     that pod's /etc/hosts: the job's, then its hostAliases
    bin/                             python/python3 shims, first on every container's PATH
    volumes/<configmap>/<key>        ConfigMap volumes, e.g. the svc plugin's host files
    pods/<pod>/attempt-<n>/volumes/  emptyDir volumes of one pod attempt
    logs/<pod>/attempt-<n>/<container>.log   output of every container, every attempt

The root and every directory below it are 0700, every file 0600, whatever the umask: the job's
env (``--env`` tokens) and output are its owner's alone.
"""

from __future__ import annotations

import functools
import json
import os
import sys
from pathlib import Path

from torchjob.files import write_atomic
from torchjob.host import procfs
from torchjob.phases import UNKNOWN
from torchjob.records import record
from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from torchjob.engine_api.base import JobReport

STATUS_RESERVE = 8192  # bytes status.json keeps on disk at least (see JobDir.write_status)


# Job state holds whatever the job was given (tokens passed with --env, passwords in its env):
# directories 0700 and files 0600 whatever the umask, so other local users cannot read any of it.
DIR_MODE = 0o700
FILE_MODE = 0o600


def make_private_dirs(path: Path) -> Path:
    """``mkdir -p`` where every directory made is 0700 (``Path.mkdir`` gives parents the umask's)."""
    missing: list[Path] = []
    current = path
    while not current.exists() and current != current.parent:
        missing.append(current)
        current = current.parent
    for directory in reversed(missing):
        try:
            os.mkdir(directory, DIR_MODE)
        except FileExistsError:
            continue  # made meanwhile by another process of the job
        os.chmod(directory, DIR_MODE)  # a umask like 0o277 would have taken bits off
    return path


def open_private(path: Path, flags: int = os.O_WRONLY | os.O_CREAT | os.O_APPEND) -> int:
    """A file descriptor for ``path``, a new file being 0600; never through a symlink."""
    return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, FILE_MODE)


def _overwrite(path: Path, text: str, err: OSError) -> None:
    """Rewrite an existing file in place: on a full disk it may still fit the blocks it has
    (padded with spaces to its old size, so that none of them is given up). A text longer than
    the file is refused (``err`` raised) before anything is written: its tail could not be
    written, and the file would hold neither the old text nor the new."""
    fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW)
    try:
        data = text.encode()
        size = os.fstat(fd).st_size
        if len(data) > size:
            raise err
        data += b" " * (size - len(data))
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.ftruncate(fd, len(data))
    finally:
        os.close(fd)


def _linux_stat(pid: int) -> tuple[str, float] | None:
    """``(state letter, start time)`` of ``pid`` read from /proc, or None where that cannot be done."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        fields = procfs.stat_fields(pid)
        ticks = int(fields[19])  # start time, in clock ticks since boot
        return fields[0].decode(), ticks / os.sysconf("SC_CLK_TCK") + procfs.boot_time()
    except FileNotFoundError:
        return ("", 0.0)  # no such process
    except (OSError, ValueError, IndexError):
        return None


def start_time(pid: int) -> float:
    """When ``pid`` started, in seconds since the epoch: psutil's ``create_time``.

    Read from /proc on Linux, so that starting a job does not wait for psutil to import.
    """
    found = _linux_stat(pid)
    if found is not None and found[0]:
        return found[1]
    import psutil

    return float(psutil.Process(pid).create_time())


def process_alive(pid: int, created: float | None) -> bool:
    """``pid`` runs (not a zombie) and, if ``created`` is given, is the process that started then."""
    found = _linux_stat(pid)  # /proc on Linux: psutil's import would delay the job's first pod
    if found is not None:
        state, started = found
        if state in ("", "Z", "X"):  # gone, a zombie, or dead
            return False
        return created is None or abs(started - created) <= 1.0  # else the pid was reused
    import psutil

    try:
        proc = psutil.Process(pid)
        if created is not None and abs(proc.create_time() - created) > 1.0:
            return False  # the pid was reused
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


@record
class JobDir:
    path: Path

    @property
    def id(self) -> str:
        return self.path.name

    @property
    def status_file(self) -> Path:
        return self.path / "status.json"

    @property
    def supervisor_log(self) -> Path:
        return self.path / "supervisor.log"

    @property
    def logs(self) -> Path:
        return self.path / "logs"

    @property
    def volumes(self) -> Path:
        return self.path / "volumes"

    @property
    def bin(self) -> Path:
        return self.path / "bin"

    def log_dir(self, pod: str, attempt: int) -> Path:
        return self.inside(self.logs / pod / f"attempt-{attempt}", f"the logs of pod {pod!r}")

    def pod_dir(self, pod: str, attempt: int) -> Path:
        return self.inside(self.path / "pods" / pod / f"attempt-{attempt}", f"the directory of pod {pod!r}")

    def write_status(self, report: JobReport) -> None:
        # Padded with spaces (JSON allows them) to hold its disk blocks for a full disk, where the
        # new file of an atomic write cannot be made but the old one can be rewritten in place.
        text = json.dumps(report.to_dict(), indent=2) + "\n"
        text += " " * (STATUS_RESERVE - len(text))
        try:
            write_atomic(self.status_file, text)
        except OSError as err:
            if not self.status_file.exists():
                raise
            _overwrite(self.status_file, text, err)  # not atomic: a reader may see it half-written

    def read_status(self) -> JobReport:
        """The stored report; a missing or damaged status.json is phase Unknown with the reason."""
        return self.read_status_checked()[0]

    def read_status_checked(self) -> tuple[JobReport, str | None]:
        """The stored report and, when status.json cannot be read or is damaged, one line saying
        so with its path (the report is then phase Unknown, with no pods)."""
        from torchjob.engine_api.base import JobReport, ReportError

        try:
            return JobReport.from_dict(json.loads(self.status_file.read_text())), None
        except OSError as err:
            reason = f"cannot read status.json: {err.strerror or err}"
            problem = f"cannot read {self.status_file}: {err.strerror or err}"
        except ValueError as err:  # not JSON (json.JSONDecodeError), or not the report's shape
            what = "the report's shape" if isinstance(err, ReportError) else "JSON"
            reason = f"status.json is damaged (not {what}: {err})"
            problem = f"{self.status_file} is damaged (not {what}: {err})"
        name = self.id.rsplit("-", 1)[0]
        report = JobReport(
            engine="local", id=self.id, name=name, phase=UNKNOWN, reason=reason, location=str(self.path)
        )
        return report, problem

    def remove(self, timeout: float | None = None) -> Path | None:
        """Remove the directory and everything in it, checked: None once it is gone, else where
        what is left of it is (renamed aside first; ``timeout``: jobdirs.REMOVE_TIMEOUT)."""
        from torchjob.engine_api import jobdirs  # off a supervisor's way to its pods

        return jobdirs.remove(self.path, jobdirs.REMOVE_TIMEOUT if timeout is None else timeout)

    @property
    def expiry_file(self) -> Path:
        return self.path / "expires"

    def write_expiry(self, at: float) -> None:
        """The job may be removed from ``at`` (seconds since the epoch): its ttlSecondsAfterFinished."""
        write_atomic(self.expiry_file, f"{at!r}\n")

    def expired(self, now: float) -> bool:
        """Whether the job's ttlSecondsAfterFinished has passed and its supervisor is gone."""
        try:
            at = float(self.expiry_file.read_text())
        except (OSError, ValueError):
            return False  # no TTL (or a damaged file): kept until deleted
        return at <= now and not self.supervisor_alive()

    def identity(self) -> tuple[int, int] | None:
        """The directory's device and inode (one made again at its path is another); None once gone."""
        try:
            info = os.stat(self.path)
        except OSError:
            return None
        return (info.st_dev, info.st_ino)

    def write_pid(self) -> int:
        """Name this process as the job's supervisor; a descriptor of the pid file that it keeps open
        as long as it supervises (closed by its caller at the end): what shows that the pid written
        there is really this job's supervisor, not any live process the file may come to name."""
        pid = os.getpid()
        path = self.path / "supervisor.pid"
        write_atomic(path, json.dumps({"pid": pid, "created": start_time(pid)}))
        return os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)

    def supervisor(self) -> tuple[int, float | None] | None:
        try:
            data = json.loads((self.path / "supervisor.pid").read_text())
            return int(data["pid"]), float(data["created"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def supervisor_alive(self) -> bool:
        """Whether the process supervisor.pid names runs and is this job's supervisor: started then,
        this user's, and holding this very pid file open (see write_pid). A pid file that names an
        unrelated process (forged, or copied from another job) names no supervisor."""
        found = self.supervisor()
        return found is not None and process_alive(*found) and _holds(found[0], self.path / "supervisor.pid")

    def write_shims(self, python: str, extra: dict[str, str] | None = None) -> None:
        """``python`` and ``python3`` on PATH run torchjob's interpreter, also inside shell scripts;
        ``extra``: more scripts by name (the rank guard of pyrunner/pyrun.guard_shim)."""
        make_private_dirs(self.bin)
        scripts = {name: f'#!/bin/sh\nexec "{python}" "$@"\n' for name in ("python", "python3")}
        for name, text in {**scripts, **(extra or {})}.items():
            shim = self.bin / name
            write_atomic(shim, text)
            shim.chmod(0o700)

    def write_configmaps(self, configmaps: dict[str, dict[str, str]]) -> None:
        for name, data in configmaps.items():
            target = self.inside(self.volumes / name, f"ConfigMap {name!r}", self.volumes)
            make_private_dirs(target)
            for key, value in data.items():
                write_atomic(self.inside(target / key, f"key {key!r} of ConfigMap {name!r}", target), value)

    def inside(self, path: Path, what: str, base: Path | None = None) -> Path:
        """``path`` if, once resolved, it lies inside ``base`` (the job directory); else ValueError.

        Names from the job (ConfigMaps and their keys, pods) become paths here: none may lead out.
        """
        root = _real(base or self.path)
        resolved = path.resolve()
        if resolved == root or not resolved.is_relative_to(root):
            raise ValueError(f"{what} would be written at {path}, outside {base or self.path}")
        return path


def _holds(pid: int, path: Path) -> bool:
    """Whether ``pid`` is this user's and has ``path`` open (Linux; elsewhere this cannot be told)."""
    if not sys.platform.startswith("linux"):
        return True
    try:
        wanted = os.stat(path)
        if procfs.uid(pid) != os.getuid():
            return False
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            info = os.stat(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue  # closed meanwhile, or a socket of another namespace
        if info.st_ino == wanted.st_ino and info.st_dev == wanted.st_dev:
            return True
    return False


@functools.lru_cache(maxsize=64)
def _real(path: Path) -> Path:
    """``path`` resolved, once per job directory: it is private to this user and stays put."""
    return path.resolve()
