"""Creating a rendered job on the cluster: every object, in order, or none of them.

Each object is created with ``fieldValidation=Strict``: a field the cluster's CRD lacks (a
controller older than the one the object is rendered for) is refused instead of silently dropped,
and ``refused_field`` says which field and which version has it. Each create runs in a thread of
its own while the caller waits, so that Ctrl-C (or SIGTERM) during a create still learns how that
request ended: what it made is deleted with the rest. That clean-up is bounded as a whole
(``bounded.CLEANUP_TIMEOUT``): a server that does not answer gets the note of what may be left.
"""

from __future__ import annotations

import functools
import re
import time
from collections.abc import Callable
from typing import Any

from torchjob.engine_api.base import EngineError
from torchjob.engines.kubernetes import bounded
from torchjob.engines.kubernetes.bounded import Background
from torchjob.engines.kubernetes.client import Cluster, namespaced_path
from torchjob.engines.kubernetes.errors import ApiError
from torchjob.engines.kubernetes.kinds import JOB_LABEL, Discovery

_UNKNOWN_FIELD = re.compile(r'unknown field "([^"]+)"')
_HANDLED_AS = re.compile(r"cannot be handled as an? (\w+)")
_INDEX = re.compile(r"\[\d+\]")


def object_path(discovery: Discovery, obj: dict[str, Any], namespace: str, name: str | None = None) -> str:
    api_version, kind = str(obj.get("apiVersion", "")), str(obj.get("kind", ""))
    plural = discovery.plural(api_version, kind, f"{kind} {obj.get('metadata', {}).get('name', '')}")
    return namespaced_path(api_version, plural, namespace, name)


def create_all(
    cluster: Cluster,
    discovery: Discovery,
    objects: list[dict[str, Any]],
    namespace: str,
    say: Callable[[str], None] | None = None,
    made: list[dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """Create ``objects`` in order and return them as the server made them (also in ``made``, as
    they are made). When one is refused, or Ctrl-C/SIGTERM comes (KeyboardInterrupt) before the
    last is made, delete the ones already made, within CLEANUP_TIMEOUT as a whole, and raise;
    ``say`` tells what was left behind. An interrupt once every object is made deletes nothing: the
    job is there, and the caller says so (``len(made) == len(objects)``)."""
    paths = [object_path(discovery, obj, namespace) for obj in objects]  # every kind known first
    made = [] if made is None else made
    under_way: tuple[str, Background[dict[str, Any]]] | None = None
    try:
        for obj, path in zip(objects, paths, strict=True):
            name = str(obj["metadata"]["name"])
            what = f"create {obj.get('apiVersion')} {obj.get('kind')} {name}"
            request = Background(
                functools.partial(
                    cluster.json, "POST", path, body=obj, query={"fieldValidation": "Strict"}, doing=what
                ),
                name="torchjob-create",
            )
            under_way = (f"{path}/{name}", request)
            request.wait()
            made.append(request.outcome())  # one step: what is made is known at any interrupt
            under_way = None
    except BaseException as err:
        if len(made) == len(objects):
            raise  # every object is made: the job runs
        deadline = time.monotonic() + bounded.CLEANUP_TIMEOUT
        interrupted = not isinstance(err, Exception)
        count = len(made)
        created = [
            f"{path}/{obj['metadata']['name']}"
            for path, obj in zip(paths[:count], objects[:count], strict=True)
        ]
        unsure: list[str] = []
        if under_way is not None and under_way[0] not in created:
            if interrupted:  # Ctrl-C or SIGTERM while a create was under way
                # its answer waited for SETTLE_TIMEOUT at most: the deletes get the rest of the bound
                settle_by = min(deadline, time.monotonic() + bounded.SETTLE_TIMEOUT)
                unsure = _settle(under_way, created, say, settle_by)
            elif not (isinstance(err, ApiError) and 400 <= err.status < 500):
                created.append(under_way[0])  # no answer, or 5xx: it may have been made (404 if not)
        left, timed_out = _undo(cluster, created, deadline)
        left += unsure
        if say is not None and (interrupted or left):
            say(_left_note(objects, namespace, left, interrupted, timed_out))
        raise
    return made


def _left_note(
    objects: list[dict[str, Any]], namespace: str, left: list[str], interrupted: bool, timed_out: bool
) -> str:
    """What an interrupted or refused creation left on the cluster, and how to remove it."""
    start = "interrupted while creating the job's objects" if interrupted else "the job was not created"
    if not left:
        return f"{start}; those already created were deleted"
    meta = objects[0].get("metadata") or {}
    job = str((meta.get("labels") or {}).get(JOB_LABEL) or meta.get("name"))
    within = f" within {bounded.CLEANUP_TIMEOUT:g}s" if timed_out else ""
    return (
        f"{start}; not deleted{within} (each carries the label {JOB_LABEL}={job}): {', '.join(left)}; "
        f"remove them with: {bounded.remove_command(f'{namespace}/{job}')}"
    )


def _settle(
    under_way: tuple[str, Background[dict[str, Any]]],
    created: list[str],
    say: Callable[[str], None] | None,
    deadline: float,
) -> list[str]:
    """Ctrl-C came while a create was under way: wait for its answer until ``deadline`` (a second
    Ctrl-C stops waiting), so that what it made is deleted too. What may remain."""
    path, request = under_way
    try:
        if say is not None and not request.done:
            say(
                "interrupted; waiting for the request under way to be answered (Ctrl-C again to stop waiting)"
            )
        if not request.wait(bounded.left_of(deadline)):
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


def _undo(cluster: Cluster, paths: list[str], deadline: float) -> tuple[list[str], bool]:
    """Delete ``paths``, newest first, until ``deadline``: those that may remain (a delete failed,
    had no answer in time, or a second Ctrl-C came), and whether the deadline was hit."""
    order = list(reversed(paths))
    gone: dict[str, bool] = {}  # path -> deleted (or already gone); written by the worker only

    def work() -> None:
        for path in order:
            try:
                delete_object(cluster, path, path)
                gone[path] = True
            except EngineError:
                gone[path] = False

    worker: Background[None] = Background(work, name="torchjob-cleanup")
    try:
        timed_out = not worker.wait(bounded.left_of(deadline))
    except KeyboardInterrupt:  # again: stop cleaning up
        timed_out = False
    return [path for path in order if not gone.get(path)], timed_out


def delete_object(cluster: Cluster, path: str, what: str, uid: str | None = None) -> bool:
    """Delete one object (its children in the background); False when it was already gone. With
    ``uid``, only that very object: one made again under its name is refused (ApiError 409)."""
    body = None if uid is None else {"preconditions": {"uid": uid}}
    try:
        cluster.json(
            "DELETE", path, query={"propagationPolicy": "Background"}, body=body, doing=f"delete {what}"
        )
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
