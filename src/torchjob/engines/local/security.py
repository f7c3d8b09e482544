"""``securityContext`` on this machine: what can be applied to a local process, and what cannot.

Applied, as a kubelet would (the container's value over the pod's):

* ``runAsUser``/``runAsGroup``, pod ``fsGroup`` and ``supplementalGroups``: when torchjob runs as
  root, the container's process drops to that uid, gid and groups just before the program starts
  (after the job's /etc/hosts is mounted, which needs root). ``runAsGroup`` unset means the uid's
  primary group from the passwd database, else a group with the uid's number. Without root the
  ids cannot change: a different ``runAsUser`` is reported as not applied.
* ``runAsNonRoot: true`` for a process that would run as uid 0 is refused before the job starts.
* ``allowPrivilegeEscalation: false`` sets no_new_privs on the process.

Everything else (capabilities, privileged, readOnlyRootFilesystem, seccomp, SELinux, AppArmor,
sysctls, ...) has no local effect: one warning per field path and job.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable

from torchjob.records import record
from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any

_PR_SET_NO_NEW_PRIVS = 38
_UID_MAX = 2**31 - 1  # Kubernetes' limit for runAsUser, runAsGroup and fsGroup
_APPLIED_POD = ("runAsUser", "runAsGroup", "runAsNonRoot", "fsGroup", "supplementalGroups")
_APPLIED_CONTAINER = ("runAsUser", "runAsGroup", "runAsNonRoot", "allowPrivilegeEscalation")


@record(frozen=True)
class Identity:
    """Who a container's process runs as; ``None`` fields stay as torchjob's own."""

    uid: int | None = None
    gid: int | None = None
    groups: tuple[int, ...] | None = None
    no_new_privs: bool = False

    @property
    def changes(self) -> bool:
        return self.uid is not None or self.gid is not None or self.groups is not None or self.no_new_privs

    def enter(self) -> None:  # pragma: no cover - runs in the forked child before exec
        """Groups first, then the gid, then the uid: after setuid nothing else may be changed."""
        if self.groups is not None:
            os.setgroups(list(self.groups))
        if self.gid is not None:
            os.setgid(self.gid)
        if self.uid is not None:
            os.setuid(self.uid)
        if self.no_new_privs and not _prctl(_PR_SET_NO_NEW_PRIVS, 1):
            raise OSError("cannot set no_new_privs (allowPrivilegeEscalation: false)")


def _prctl(option: int, value: int) -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(option, value, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def _context(data: Any) -> dict[str, Any]:
    return data if isinstance(data, dict) else {}


def _uid(value: Any) -> int | None:
    return (
        value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= _UID_MAX else None
    )


def _primary_gid(uid: int) -> int:
    import pwd

    try:
        return pwd.getpwuid(uid).pw_gid
    except KeyError:
        return uid


def _user_groups(uid: int, gid: int) -> list[int]:
    """The uid's groups from the group database (Kubernetes merges the image's /etc/group)."""
    import pwd

    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:
        return []
    try:
        return [g for g in os.getgrouplist(name, gid) if g != gid]
    except OSError:
        return []


def identity(pod_spec: dict[str, Any], container: dict[str, Any]) -> Identity:
    """What the container's process runs as here (nothing changes when torchjob is not root)."""
    pod, own = _context(pod_spec.get("securityContext")), _context(container.get("securityContext"))
    no_new_privs = own.get("allowPrivilegeEscalation") is False
    if os.geteuid() != 0:
        return Identity(no_new_privs=no_new_privs)
    uid = _uid(own.get("runAsUser", pod.get("runAsUser")))
    gid = _uid(own.get("runAsGroup", pod.get("runAsGroup")))
    fs_group = _uid(pod.get("fsGroup"))
    listed = pod.get("supplementalGroups")
    extra = [g for g in listed if _uid(g) is not None] if isinstance(listed, list) else []
    if uid is None and gid is None and fs_group is None and not extra:
        return Identity(no_new_privs=no_new_privs)
    if gid is None:
        gid = _primary_gid(uid) if uid is not None else os.getegid()
    groups = list(dict.fromkeys([*_user_groups(uid, gid)] if uid is not None else []))
    groups += [g for g in [fs_group, *extra] if g is not None and g not in groups and g != gid]
    return Identity(uid=uid, gid=gid, groups=tuple(groups), no_new_privs=no_new_privs)


def other_users(pod_specs: list[dict[str, Any]]) -> bool:
    """Whether a process of these pods will run with other ids than torchjob's."""
    return any(
        identity(spec, c).uid not in (None, os.geteuid())
        for spec in pod_specs
        for c in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]
        if isinstance(c, dict)
    )


def volume_owner(pod_spec: dict[str, Any]) -> tuple[int, int, int] | None:
    """(uid, gid, mode) for the pod's emptyDir directories when it runs as someone else, else None.

    Like the kubelet's fsGroup handling: with ``fsGroup`` the directories belong to that group,
    group-writable and setgid so that new files inherit it.
    """
    if os.geteuid() != 0:
        return None
    pod = _context(pod_spec.get("securityContext"))
    containers = [c for c in pod_spec.get("containers") or [] if isinstance(c, dict)]
    uids = {
        _uid(_context(c.get("securityContext")).get("runAsUser", pod.get("runAsUser"))) for c in containers
    }
    uid = uids.pop() if len(uids) == 1 else None
    fs_group = _uid(pod.get("fsGroup"))
    if fs_group is not None:
        return (uid if uid is not None else 0, fs_group, 0o2770)
    if uid is None:
        return None
    return (uid, _uid(pod.get("runAsGroup")) or _primary_gid(uid), 0o700)


def problems(pod_spec: dict[str, Any], container: dict[str, Any]) -> list[tuple[bool, str, str]]:
    """(at pod level, field, message) for what stops the container from starting here."""
    found: list[tuple[bool, str, str]] = []
    pod, own = _context(pod_spec.get("securityContext")), _context(container.get("securityContext"))
    for where, at_pod in ((pod, True), (own, False)):
        for key in ("runAsUser", "runAsGroup", *(("fsGroup",) if at_pod else ())):
            if key in where and _uid(where[key]) is None:
                found.append((at_pod, key, f"expected an id from 0 to {_UID_MAX}, got {where[key]!r}"))
    if found:
        return found
    non_root = own.get("runAsNonRoot", pod.get("runAsNonRoot"))
    if non_root is True:
        uid = identity(pod_spec, container).uid
        if (uid if uid is not None else os.geteuid()) == 0:
            found.append(
                (
                    "runAsNonRoot" not in own,
                    "runAsNonRoot",
                    f"container {container.get('name')!r} would run as root (uid 0): set runAsUser to a "
                    "non-zero uid, or run torchjob as another user",
                )
            )
    return found


def unapplied(pod_spec: dict[str, Any], container: dict[str, Any]) -> list[tuple[bool, str, str]]:
    """(at pod level, field, message) for every securityContext field without local effect."""
    found: list[tuple[bool, str, str]] = []
    pod, own = _context(pod_spec.get("securityContext")), _context(container.get("securityContext"))
    root = os.geteuid() == 0
    for where, at_pod, applied in ((pod, True, _APPLIED_POD), (own, False, _APPLIED_CONTAINER)):
        for key in where:
            if key not in applied:
                found.append((at_pod, key, "has no effect on local processes: it is not enforced here"))
            elif not root and key in ("runAsUser", "runAsGroup", "fsGroup", "supplementalGroups"):
                mine = os.geteuid() if key == "runAsUser" else os.getegid()
                if key in ("runAsUser", "runAsGroup") and where[key] == mine:
                    continue
                found.append(
                    (
                        at_pod,
                        key,
                        "is not applied: only a torchjob running as root can change a process's ids",
                    )
                )
    return found


def then(first: Callable[[], None], second: Callable[[], None] | None) -> Callable[[], None]:
    """Both hooks in the child, in order (the job's /etc/hosts needs root, so it comes first)."""
    if second is None:
        return first

    def both() -> None:  # pragma: no cover - runs in the forked child
        first()
        second()

    return both
