"""Pod log streams: one ``follow=true`` request per container instance, read in its own thread.

A stream ends by itself when its container exits, so following costs one request per container
start, never a poll, and one read of the pod as the stream ends: a stream an API server ended
cleanly while the container runs (its connection to the kubelet closed) is opened again. A container
instance is a pod (by its uid: a controller may make a pod again under the same name, its restart
count back at 0) and the container's restart count in it, so a restarted container and a pod made
again each get a new stream. Every log is read only as fast as its lines are taken, a line at most
``client.MAX_LINE`` bytes at a time, so an endless log, a line without a newline or a slow reader
cost bounded memory.

A stream cut by a transient error is opened again and what was already passed on is skipped
(``Resume``): by the kubelet's timestamps where the server honours ``timestamps=true``, else by
counting, the log being read again from its start. A stream ended cleanly in the middle of a line
passes that line's beginning on only if no more of it can come (the container ended, or the log
cannot be read again): else the stream opened again passes the line on whole.
"""

from __future__ import annotations

import copy
import queue
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from torchjob.engine_api.base import EngineError, LogLine
from torchjob.engines.kubernetes import watch
from torchjob.engines.kubernetes.client import Cluster, LineReader, interrupt, lines, namespaced_path
from torchjob.engines.kubernetes.errors import ApiError, transient
from torchjob.engines.kubernetes.watch import Backoff, post

# The kubelet's timestamp in front of each line (timestamps=true): RFC 3339, nanoseconds at most.
_STAMP = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d{1,9}))?Z ")


def log_path(namespace: str, pod: str) -> str:
    return namespaced_path("v1", "pods", namespace, pod) + "/log"


def stream_log(
    cluster: Cluster,
    namespace: str,
    pod: str,
    container: str | None,
    *,
    tail: int | None = None,
    previous: bool = False,
) -> Iterator[str]:
    """A container's log as it is now (``tail`` last lines), line by line as it is read; nothing
    when it has none yet."""
    query = {"container": container, "tailLines": tail, "previous": previous or None}
    try:
        response = cluster.open(
            "GET", log_path(namespace, pod), query=query, doing=f"read the log of pod {pod}"
        )
    except EngineError as err:
        if getattr(err, "status", None) in (400, 404):  # not started yet, or gone
            return
        raise
    try:
        yield from lines(response)
    finally:
        response.release_conn()


def read_log(
    cluster: Cluster,
    namespace: str,
    pod: str,
    container: str | None,
    *,
    tail: int,
    previous: bool = False,
) -> list[str]:
    """The last ``tail`` lines of a container's log."""
    return list(deque(stream_log(cluster, namespace, pod, container, tail=tail, previous=previous), tail))


def split_stamp(raw: str) -> tuple[tuple[str, str] | None, str]:
    """A line read with timestamps=true: its timestamp (seconds, nanoseconds as 9 digits), and its
    text; a line (or a piece of a long one) without a timestamp is all text."""
    match = _STAMP.match(raw)
    if match is None:
        return None, raw
    return (match[1], (match[2] or "").ljust(9, "0")), raw[match.end() :]


class Resume:
    """Where a followed log stands, so that a stream opened again passes on only what is new.

    Lines are pieces (a line longer than ``MAX_LINE`` is several); a piece without a timestamp
    continues the stamped one before it. ``stamped`` is decided by the first piece read: a server
    that ignores ``timestamps=true`` sends none, and its text is then never taken for one.
    """

    def __init__(self) -> None:
        self.stamped: bool | None = None
        self.passed = 0  # pieces passed on
        self.last: tuple[str, str] | None = None  # the timestamp of the last stamped piece passed
        self.at_last = 0  # pieces passed under that timestamp
        self._current: tuple[str, str] | None = None  # while reading again: the stamp in force
        self._seen = 0  # ... pieces seen again under ``last``
        self._skip = 0  # ... pieces still to skip, for an unstamped log

    def query(self) -> dict[str, Any]:
        """The request's parameters: from the last second passed on, when the server stamps."""
        query: dict[str, Any] = {"follow": True, "timestamps": True}
        if self.stamped and self.last is not None:
            query["sinceTime"] = f"{self.last[0]}Z"  # the API takes whole seconds
        return query

    def reopened(self) -> None:
        self._current, self._seen, self._skip = None, 0, self.passed

    def peek(self, raw: str) -> str | None:
        """What :meth:`take` would give for ``raw``, nothing counted (a line's beginning, held)."""
        return copy.copy(self).take(raw)

    def take(self, raw: str) -> str | None:
        """The text to pass on for piece ``raw`` of the stream, or None to skip it (passed before)."""
        stamp, text = split_stamp(raw) if self.stamped is not False else (None, raw)
        if self.stamped is None:
            self.stamped = stamp is not None
            if not self.stamped:
                text = raw
        if not self.stamped:
            if self._skip:
                self._skip -= 1
                return None
            self.passed += 1
            return text
        if stamp is not None:
            self._current = stamp
        current = self._current
        if self.last is not None and current is not None:
            if current < self.last:
                return None
            if current == self.last and self._seen < self.at_last:
                self._seen += 1
                return None
        if current is not None and current != self.last:
            self.last, self.at_last, self._seen = current, 0, 0
        self.at_last += 1
        self._seen = self.at_last
        self.passed += 1
        return text


def refused(err: BaseException) -> bool:
    """The cluster does not let this user read logs (no RBAC for pods/log)."""
    return isinstance(err, ApiError) and err.status in (401, 403)


def streamable(status: dict[str, Any]) -> bool:
    """A container has a log to follow once it ran: running, or terminated."""
    state = status.get("state") or {}
    return "running" in state or "terminated" in state


class LogStreams:
    """Follows containers' logs into ``out``: LogLine items, then ("log-end", key, None) as each ends."""

    def __init__(
        self,
        cluster: Cluster,
        namespace: str,
        out: queue.Queue[Any],
        on_refused: Callable[[EngineError], None] | None = None,
    ) -> None:
        self.cluster = cluster
        self.namespace = namespace
        self.out = out
        self.on_refused = on_refused
        # A container instance: (pod uid, container, restart count); the pod's name says where it is.
        self.started: set[tuple[str, str, int]] = set()
        self.open: set[tuple[str, str, int]] = set()
        self._responses: dict[tuple[str, str, int], Any] = {}
        self._lock = threading.Lock()
        self._stopped = False
        self._stop = threading.Event()  # set with _stopped: ends a wait to post to a full queue

    def add(self, pod: str, uid: str, container: str, restarts: int, prefix: str, ordinal: int) -> None:
        key = (uid, container, restarts)
        if key in self.started or self._stopped:
            return
        self.started.add(key)
        self.open.add(key)
        thread = threading.Thread(
            target=self._run, args=(pod, key, prefix, ordinal), name=f"torchjob-log-{pod}", daemon=True
        )
        thread.start()

    def _run(self, pod: str, key: tuple[str, str, int], prefix: str, ordinal: int) -> None:
        """Follow one container's log until it ends; a stream cut by a transient error is opened
        again, what was passed on skipped (``Resume``), for up to PATIENCE."""
        _, container, _ = key
        resume = Resume()
        backoff = Backoff()
        trouble_since: float | None = None
        held: str | None = None  # a line's beginning a clean end cut off, not passed on (yet)
        try:
            while not self._stop.is_set():
                query: dict[str, Any] = {"container": container, **resume.query()}
                try:
                    response = self.cluster.open(
                        "GET",
                        log_path(self.namespace, pod),
                        query=query,
                        doing=f"follow the log of pod {pod}",
                        read_timeout=None,  # a quiet training step is not a dead stream
                    )
                    with self._lock:
                        self._responses[key] = response
                        if self._stopped:
                            return
                    try:
                        resume.reopened()
                        reader = LineReader(response)
                        for raw in reader:
                            text = resume.take(raw)
                            if text is None:  # passed on before the stream broke
                                continue
                            held = None  # read again up to the line held: it comes whole now
                            line = LogLine(prefix=prefix, text=text, pod_ordinal=ordinal)
                            if not post(self.out, line, self._stop):
                                return
                            trouble_since = None
                        # Counted as passed only once it comes whole (or no more of it can come).
                        beginning = resume.peek(reader.rest) if reader.rest else None
                        held = held if beginning is None else beginning
                    finally:
                        with self._lock:
                            self._responses.pop(key, None)
                        response.release_conn()
                    if self._stop.is_set() or not self._still_running(pod, key):
                        return  # the stream ended: the container exited
                    # Ended cleanly while the container runs (the API server's connection to the
                    # kubelet closed): opened again after a pause, what was passed on skipped.
                except Exception as err:
                    if self._stop.is_set():
                        return
                    if refused(err) and self.on_refused is not None:
                        assert isinstance(err, EngineError)
                        self.on_refused(err)
                    gone = isinstance(err, ApiError) and err.status in (400, 404)  # not running, deleted
                    if gone or not transient(err):
                        return
                    now = time.monotonic()
                    trouble_since = now if trouble_since is None else trouble_since
                    if now - trouble_since >= watch.PATIENCE:
                        return
                self._stop.wait(backoff.next())
        finally:
            if held is not None and not self._stop.is_set():  # the rest of its line will not come
                post(self.out, LogLine(prefix=prefix, text=held, pod_ordinal=ordinal), self._stop)
            post(self.out, ("log-end", key, None), self._stop)

    def _still_running(self, pod: str, key: tuple[str, str, int]) -> bool:
        """Whether the container instance ``key`` of ``pod`` still runs, by one read of the pod: a
        stream that ends while it does was cut, not finished. An answer that cannot be had counts
        as running: the stream opened again then says (a 404 for a pod that is gone)."""
        uid, container, restarts = key
        path = namespaced_path("v1", "pods", self.namespace, pod)
        try:
            found = self.cluster.json("GET", path, doing=f"read pod {pod}")
        except ApiError as err:
            return err.status not in (400, 404)
        except Exception:  # (the client's own errors come as EngineError)
            return True
        if (found.get("metadata") or {}).get("uid") != uid:
            return False  # made again under that name: its containers are other instances
        status = found.get("status") or {}
        for item in (status.get("initContainerStatuses") or []) + (status.get("containerStatuses") or []):
            if isinstance(item, dict) and item.get("name") == container:
                return item.get("restartCount", 0) == restarts and "running" in (item.get("state") or {})
        return False

    def ended(self, key: tuple[str, str, int]) -> None:
        self.open.discard(key)

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            self._stop.set()
            responses = list(self._responses.values())
        for response in responses:
            interrupt(response)
