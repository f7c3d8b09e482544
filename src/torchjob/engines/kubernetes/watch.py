"""List, then watch, one resource type, as client-go's reflector does, against a server that may misbehave.

A watch the server ends after ``WATCH_SECONDS`` is resumed from the last version seen. Anything
else lists again after a pause that doubles, with jitter, up to ``BACKOFF_MAX`` (so a server
that answers 410 Gone or ends every watch at once costs a few requests a minute, not dozens a
second): 410 Gone, a watch that ends at once having sent nothing, an error, a stream that
stays silent past ``WATCH_SECONDS + STALL_SLACK`` (a stalled proxy or a dead connection; the
list shows what the stall hid), and an event that is not JSON in a JSON stream (cut short on its
way: the list shows what it said). Transient errors (no answer, 429, 5xx) are retried this way for
``PATIENCE`` seconds without one good answer; then, or at once for an error that will not pass
(401, 403, 404, a page that is not JSON), the watch posts ``FAILED``.
"""

from __future__ import annotations

import json
import queue
import random
import threading
import time
from collections.abc import Callable
from typing import Any

from torchjob.engine_api.base import EngineError
from torchjob.engines.kubernetes.client import Cluster, interrupt, lines
from torchjob.engines.kubernetes.errors import ApiError, BrokenStream, api_error, not_json, transient

WATCH_SECONDS = 20  # the server ends each watch after this (timeoutSeconds); it is resumed
STALL_SLACK = 5.0  # silence past WATCH_SECONDS means the stream stalled: list again
SHORT_WATCH = 1.0  # a watch that ends sooner having sent nothing is not a healthy one
PATIENCE = 300.0  # seconds of transient trouble, without a good answer, before following gives up
BACKOFF_FIRST = 0.8  # client-go's reflector: 800 ms doubling to 30 s, with jitter
BACKOFF_MAX = 30.0
MAX_EVENT = 16 * 1024 * 1024  # bytes of one watch event (etcd keeps objects under 1.5 MiB)
POST_WAIT = 0.5  # how often a thread blocked on a full queue checks that it was not stopped


class LostContact(EngineError):
    """Following gave up after ``PATIENCE`` seconds of transient trouble: the job's fate is unknown."""


class Backoff:
    """Pauses that double from ``first`` up to ``cap``, each between half and one and a half of that."""

    def __init__(
        self, first: float | None = None, cap: float | None = None, rng: Callable[[], float] = random.random
    ) -> None:
        self.first = BACKOFF_FIRST if first is None else first
        self.cap = BACKOFF_MAX if cap is None else cap
        self.rng = rng
        self.tries = 0

    def reset(self) -> None:
        self.tries = 0

    def next(self) -> float:
        base = min(self.cap, self.first * 2.0 ** min(self.tries, 30))
        self.tries += 1
        return base * (0.5 + self.rng())


class _Gone(Exception):
    """The version to watch from is too old (410 Gone): list again."""


def post(out: queue.Queue[Any], item: Any, stopped: threading.Event) -> bool:
    """Put ``item`` on ``out``, waiting while it is full (a slow reader), unless stopped meanwhile."""
    while not stopped.is_set():
        try:
            out.put(item, timeout=POST_WAIT)
            return True
        except queue.Full:
            continue
    return False


class ResourceWatch:
    """List, then watch, one resource type with a selector, posting (key, type, object) to ``out``.

    Types: "SYNC" (a list: every object), "ADDED"/"MODIFIED"/"DELETED", "FAILED" (an EngineError).
    """

    def __init__(
        self, cluster: Cluster, key: str, path: str, selector: dict[str, str], out: queue.Queue[Any]
    ) -> None:
        self.cluster, self.key, self.path, self.selector, self.out = cluster, key, path, selector, out
        self._stopped = threading.Event()
        self._response: Any = None
        self._thread = threading.Thread(target=self._run, name=f"torchjob-watch-{key}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        if self._response is not None:
            interrupt(self._response)

    def _post(self, kind: str, obj: Any) -> None:
        post(self.out, (self.key, kind, obj), self._stopped)

    def _run(self) -> None:
        version: str | None = None
        backoff = Backoff()
        trouble_since: float | None = None  # the first of the failures in a row
        while not self._stopped.is_set():
            try:
                if version is None:
                    version = self._list()
                    trouble_since = None  # the server answers: whatever the watch does, we follow
                began = time.monotonic()
                version, seen = self._watch(version)
                if seen or time.monotonic() - began >= SHORT_WATCH:
                    backoff.reset()
                    continue  # the server ended it in time: resume from the last version
                version = None  # ended at once having sent nothing: list again, after a pause
            except _Gone:
                version = None
            except Exception as err:  # an error answer, or the stream broke, timed out, stalled
                if self._stopped.is_set():
                    return
                if isinstance(err, ApiError) and err.status == 410:
                    version = None
                elif not transient(err):
                    self._post("FAILED", err)
                    return
                else:
                    now = time.monotonic()
                    trouble_since = now if trouble_since is None else trouble_since
                    if now - trouble_since >= PATIENCE:
                        self._post("FAILED", self._lost(err, now - trouble_since))
                        return
                    version = None
            self._stopped.wait(backoff.next())

    def _lost(self, err: BaseException, seconds: float) -> LostContact:
        reason = str(err) if isinstance(err, EngineError) else f"{type(err).__name__}: {err}"
        return LostContact(
            f"lost contact with the Kubernetes API server at {self.cluster.host} "
            f"for {seconds:.0f}s (last: {reason})"
        )

    def _list(self) -> str:
        listing = self.cluster.json("GET", self.path, query=self.selector, doing=f"list {self.key}")
        self._post("SYNC", listing.get("items") or [])
        return str((listing.get("metadata") or {}).get("resourceVersion") or "")

    def _watch(self, version: str) -> tuple[str, bool]:
        """Watch from ``version`` until the server ends the watch: the last version seen, and
        whether anything came (a bookmark counts)."""
        query = {
            **self.selector,
            "watch": True,
            "resourceVersion": version,
            "allowWatchBookmarks": True,
            "timeoutSeconds": WATCH_SECONDS,
        }
        doing = f"watch {self.key}"
        response = self.cluster.open(
            "GET", self.path, query=query, doing=doing, read_timeout=WATCH_SECONDS + STALL_SLACK
        )
        self._response = response
        seen = False
        try:
            for line in lines(response, MAX_EVENT):
                if self._stopped.is_set():
                    return version, seen
                if not line.strip():
                    continue
                try:
                    event = json.loads(line)
                except ValueError:
                    event = None
                if not isinstance(event, dict):
                    content_type = response.headers.get("Content-Type")
                    problem = not_json(self.cluster.host, doing, content_type, line)
                    if "json" in str(content_type or ""):  # the server's stream, one event broken
                        problem = BrokenStream(str(problem))
                    raise self.cluster.redacted(problem)
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    if obj.get("code") == 410:  # our version is too old: list again
                        raise _Gone()
                    raise self.cluster.redacted(
                        api_error(int(obj.get("code") or 500), json.dumps(obj), doing)
                    )
                seen = True
                version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
                if kind != "BOOKMARK":
                    self._post(str(kind), obj)
        finally:
            self._response = None
            response.release_conn()
        return version, seen
