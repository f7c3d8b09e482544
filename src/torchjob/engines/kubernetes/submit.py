"""Creating a rendered job on the cluster: every object, in order, or none of them.

Each object is created with ``fieldValidation=Strict``: a field the cluster's CRD lacks (a
controller older than the one the object is rendered for) is refused instead of silently dropped,
and ``refused_field`` says which field and which version has it. Each create runs in a thread of
its own while the caller waits, so that Ctrl-C (or SIGTERM) during a create still learns how that
request ended: what it made is deleted with the rest.
"""

from __future__ import annotations

import functools
import re
import threading
from collections.abc import Callable
from typing import Any

from torchjob.engine_api.base import EngineError
from torchjob.engines.kubernetes.client import CONNECT_TIMEOUT, READ_TIMEOUT, Cluster, namespaced_path
from torchjob.engines.kubernetes.errors import ApiError
from torchjob.engines.kubernetes.kinds import JOB_LABEL, Discovery

_UNKNOWN_FIELD = re.compile(r'unknown field "([^"]+)"')
_HANDLED_AS = re.compile(r"cannot be handled as an? (\w+)")
_INDEX = re.compile(r"\[\d+\]")
POLL = 0.1  # how often a wait for a request under way looks for Ctrl-C


def object_path(discovery: Discovery, obj: dict[str, Any], namespace: str, name: str | None = None) -> str:
    api_version, kind = str(obj.get("apiVersion", "")), str(obj.get("kind", ""))
    plural = discovery.plural(api_version, kind, f"{kind} {obj.get('metadata', {}).get('name', '')}")
    return namespaced_path(api_version, plural, namespace, name)


class _Request:
    """One request in a thread of its own: the caller may stop waiting (Ctrl-C) and still learn,
    later, how it ended."""

    def __init__(self, call: Callable[[], dict[str, Any]]) -> None:
        self.result: dict[str, Any] | None = None
        self.error: BaseException | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(call,), name="torchjob-create", daemon=True)
        self._thread.start()

    def _run(self, call: Callable[[], dict[str, Any]]) -> None:
        try:
            self.result = call()
        except BaseException as err:  # handed to the waiting thread
            self.error = err
        finally:
            self._done.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the end (a Ctrl-C interrupts the wait, not the request); whether it ended."""
        left = timeout
        while not self._done.wait(POLL if left is None else min(POLL, max(left, 0.0))):
            if left is not None:
                left -= POLL
                if left <= 0:
                    return False
        return True

    def outcome(self) -> dict[str, Any]:
        if self.error is not None:
            raise self.error
        assert self.result is not None
        return self.result


def create_all(
    cluster: Cluster,
    discovery: Discovery,
    objects: list[dict[str, Any]],
    namespace: str,
    say: Callable[[str], None] | None = None,
) -> list[dict[str, Any]]:
    """Create ``objects`` in order and return them as the server made them; when one is refused,
    or Ctrl-C/SIGTERM comes (KeyboardInterrupt), delete the ones already made and raise. ``say``
    tells of an interrupt what it left behind."""
    paths = [object_path(discovery, obj, namespace) for obj in objects]  # every kind known first
    created: list[str] = []
    made: list[dict[str, Any]] = []
    under_way: tuple[str, _Request] | None = None
    try:
        for obj, path in zip(objects, paths, strict=True):
            name = str(obj["metadata"]["name"])
            what = f"create {obj.get('apiVersion')} {obj.get('kind')} {name}"
            request = _Request(
                functools.partial(
                    cluster.json, "POST", path, body=obj, query={"fieldValidation": "Strict"}, doing=what
                )
            )
            under_way = (f"{path}/{name}", request)
            request.wait()
            under_way = None
            made.append(request.outcome())
            created.append(f"{path}/{name}")
    except BaseException as err:
        unsure: list[str] = []
        if under_way is not None and not isinstance(err, Exception):  # Ctrl-C or SIGTERM meanwhile
            unsure = _settle(under_way, created, say)
        elif under_way is not None and not (isinstance(err, ApiError) and 400 <= err.status < 500):
            created.append(under_way[0])  # no answer, or 5xx: it may have been made (404 if not)
        left = _undo(cluster, created) + unsure
        if say is not None and not isinstance(err, Exception):
            if left:
                say(
                    "interrupted while creating the job's objects; not deleted (each carries the label "
                    f"{JOB_LABEL}): {', '.join(left)}"
                )
            else:
                say("interrupted while creating the job's objects; those already created were deleted")
        raise
    return made


def _settle(
    under_way: tuple[str, _Request], created: list[str], say: Callable[[str], None] | None
) -> list[str]:
    """Ctrl-C came while a create was under way: wait for its answer (its client timeouts bound the
    wait; a second Ctrl-C stops it), so that what it made is deleted too. What may remain."""
    path, request = under_way
    try:
        if say is not None:
            say(
                "interrupted; waiting for the request under way to be answered (Ctrl-C again to stop waiting)"
            )
        if not request.wait(CONNECT_TIMEOUT + READ_TIMEOUT):
            return [f"{path} (its create was still under way)"]
    except KeyboardInterrupt:
        return [f"{path} (its create was still under way)"]
    try:
        request.outcome()
    except ApiError as err:
        if 400 <= err.status < 500:
            return []  # refused: nothing made
        return [f"{path} (its create ended with an error)"]
    except BaseException:
        return [f"{path} (its create ended with an error)"]
    created.append(path)
    return []


def _undo(cluster: Cluster, paths: list[str]) -> list[str]:
    """Delete ``paths``, newest first: those that may remain (a delete failed, or a second Ctrl-C)."""
    todo = list(reversed(paths))
    left: list[str] = []
    try:
        while todo:
            path = todo[0]
            try:
                delete_object(cluster, path, path)
            except EngineError:
                left.append(path)
            todo.pop(0)
    except KeyboardInterrupt:  # again: stop cleaning up
        left += todo
    return left


def delete_object(cluster: Cluster, path: str, what: str) -> bool:
    """Delete one object (its children in the background); False when it was already gone."""
    try:
        cluster.json("DELETE", path, query={"propagationPolicy": "Background"}, doing=f"delete {what}")
    except ApiError as err:
        if err.status == 404:
            return False
        raise
    return True


def unknown_fields(err: BaseException) -> list[str]:
    """The fields a strict create was refused for (``spec.tasks[0].foo``), from the server's
    ``strict decoding error: unknown field "..."``; none for any other refusal."""
    if not isinstance(err, ApiError) or err.status != 400:
        return []
    return _UNKNOWN_FIELD.findall(str(err.body.get("message") or err))


def refused_field(err: ApiError, target: str) -> EngineError | None:
    """A strict create refused for a field the cluster lacks, as one line: the field, and the
    version of the target's controller that has it (``TopKind.versions``: field path -> that
    version, without list indexes; the longest path that leads to the field is taken)."""
    from torchjob.targets import get_target

    fields = unknown_fields(err)
    if not fields:
        return None
    top = get_target(target).top
    kind = _HANDLED_AS.search(str(err.body.get("message") or err))
    refused = kind.group(1) if kind else "object"
    mine = top is not None and refused == top.kind
    controller = top.controller if top is not None and mine else "Kubernetes"
    versions = top.versions if top is not None and mine else ()
    field = fields[0]
    bare = _INDEX.sub("", field)
    known = [(path, v) for path, v in versions if bare == path or bare.startswith(path + ".")]
    if known:
        version = max(known, key=lambda item: len(item[0]))[1]
        needs = f"--target {target} needs {version} or newer for it"
    else:
        needs = f"the cluster's {controller} is older than the one --target {target} renders for"
    return EngineError(
        f"the cluster's {refused} has no field {field}: {needs}; upgrade {controller} on the cluster, "
        "or use another --target"
    )
