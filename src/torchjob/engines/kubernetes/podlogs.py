"""Pod log streams: one ``follow=true`` request per container instance, read in its own thread.

A stream ends by itself when its container exits, so following costs one request per container
start, never a poll; a restarted container (a new restartCount) gets a new stream. Every log is
read only as fast as its lines are taken, a line at most ``client.MAX_LINE`` bytes at a time, so
an endless log, a line without a newline or a slow reader cost bounded memory.
"""

from __future__ import annotations

import queue
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from torchjob.engine_api.base import EngineError, LogLine
from torchjob.engines.kubernetes import watch
from torchjob.engines.kubernetes.client import Cluster, interrupt, lines, namespaced_path
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
        self.started: set[tuple[str, str, int]] = set()
        self.open: set[tuple[str, str, int]] = set()
        self._responses: dict[tuple[str, str, int], Any] = {}
        self._lock = threading.Lock()
        self._stopped = False
        self._stop = threading.Event()  # set with _stopped: ends a wait to post to a full queue

    def add(self, pod: str, container: str, restarts: int, prefix: str, ordinal: int) -> None:
        key = (pod, container, restarts)
        if key in self.started or self._stopped:
            return
        self.started.add(key)
        self.open.add(key)
        thread = threading.Thread(
            target=self._run, args=(key, prefix, ordinal), name=f"torchjob-log-{pod}", daemon=True
        )
        thread.start()

    def _run(self, key: tuple[str, str, int], prefix: str, ordinal: int) -> None:
        """Follow one container's log until it ends; a stream cut by a transient error is opened
        again from the last line's timestamp (lines up to it are skipped), for up to PATIENCE."""
        pod, container, _ = key
        last: tuple[str, str] | None = None  # the timestamp of the last line passed on, parsed
        backoff = Backoff()
        trouble_since: float | None = None
        try:
            while not self._stop.is_set():
                query: dict[str, Any] = {"container": container, "follow": True, "timestamps": True}
                if last is not None:
                    query["sinceTime"] = f"{last[0]}Z"  # the API takes whole seconds
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
                        skipping = last is not None  # what was passed on before the stream broke
                        for raw in lines(response):
                            stamp, text = split_stamp(raw)
                            if stamp is not None:
                                if skipping and last is not None and stamp <= last:
                                    continue
                                skipping, last = False, stamp
                            line = LogLine(prefix=prefix, text=text, pod_ordinal=ordinal)
                            if not post(self.out, line, self._stop):
                                return
                            trouble_since = None
                    finally:
                        with self._lock:
                            self._responses.pop(key, None)
                        response.release_conn()
                    return  # the stream ended: the container exited
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
            post(self.out, ("log-end", key, None), self._stop)

    def ended(self, key: tuple[str, str, int]) -> None:
        self.open.discard(key)

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            self._stop.set()
            responses = list(self._responses.values())
        for response in responses:
            interrupt(response)
