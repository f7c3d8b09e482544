"""A small Kubernetes API server for tests: real HTTP on 127.0.0.1, answering as kube-apiserver does.

It knows discovery (/api, /apis, /apis/GROUP/VERSION), namespaced create/get/list/delete and
merge-patch for core and custom resources (label and field selectors, limit, delete by collection,
a delete's uid precondition), watch streams (chunked JSON lines with ADDED/MODIFIED/DELETED and
resourceVersions, ended after timeoutSeconds), pod logs (tailLines, limitBytes, previous,
follow, timestamps, sinceTime) and Status bodies for 401/403/404/409/422. What it stores goes
through kubeadmission.py first (the CRD schemas with ``fieldValidation``, names, webhooks, claim
protection, pod priority and QoS); finalizers hold a deleted object until they are removed, and
the owners' deletion takes their dependents (the garbage collector). It runs no controller: tests
play the controller through ``put``/``set_status``/``log``, or run the simulations of
tests/controllers/. Every request is recorded, so tests can count them. A pod's log belongs to
that pod: deleting it ends its streams, and a pod made again under the same name starts an empty
log.

Misbehaviour, each off unless a test asks for it: ``not_json`` (a 2xx page that is not JSON),
``break_for`` (503s, 429s with Retry-After, or connections dropped, for a number of requests or
seconds), ``watch_gone`` (every watch answers 410 Gone), ``watch_seconds_cap = 0`` (watches that
end at once), ``stall_watches`` (watches that send nothing and never end), ``endless_log`` (a log
that never ends, optionally one line without a newline), ``create_delay`` (slow creates),
``watch_lag`` (one resource's watch events sent late: watches of different resources keep no
order between them on a real cluster either), ``list_lag`` (one resource's lists answered late:
a list of many pods takes longer than one of a single job), ``create_lag`` (a create received but made only
later: a client interrupted meanwhile cannot know), ``garble_events`` (watch events that are not
JSON, as a broken proxy may send), ``log_timestamps = False`` (a server that ignores
``timestamps=true`` and ``sinceTime``), ``cut_log`` (a log stream ended cleanly mid-line while
its container runs), refusals of one subresource
(``refuse(..., subresource="log")``: no RBAC for pods/log), and ``hold`` (chosen requests kept
unanswered until the test releases them: a signal sent while one is in flight).
"""

from __future__ import annotations

import contextlib
import copy
import datetime
import itertools
import json
import re
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import kubeadmission
from kubeadmission import Refused

TOKEN = "torchjob-test-token"

CORE_RESOURCES = {
    "Pod": "pods",
    "Service": "services",
    "ConfigMap": "configmaps",
    "Secret": "secrets",
    "Event": "events",
    "PersistentVolumeClaim": "persistentvolumeclaims",
}
GROUP_RESOURCES: dict[str, dict[str, str]] = {
    "batch.volcano.sh/v1alpha1": {"Job": "jobs"},
    "kubeflow.org/v1": {"PyTorchJob": "pytorchjobs"},
    "trainer.kubeflow.org/v1alpha1": {"TrainJob": "trainjobs"},
    "jobset.x-k8s.io/v1alpha2": {"JobSet": "jobsets"},
    "batch/v1": {"Job": "jobs"},  # JobSet's child Jobs
    "networking.k8s.io/v1": {"NetworkPolicy": "networkpolicies"},
    "scheduling.volcano.sh/v1beta1": {"PodGroup": "podgroups"},
}


def now_iso(offset: float = 0.0) -> str:
    moment = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=offset)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def log_stamp(moment: float) -> str:
    """A log line's timestamp as the kubelet writes it (RFC 3339 with nanoseconds, zeros trimmed)."""
    seconds, nanos = divmod(round(moment * 1e9), 10**9)
    whole = datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
    fraction = f"{nanos:09d}".rstrip("0")
    return f"{whole}.{fraction}Z" if fraction else f"{whole}Z"


def parse_stamp(text: str) -> float:
    """``sinceTime``: RFC 3339, seconds or finer."""
    head, _, rest = text.rstrip("Z").partition(".")
    whole = datetime.datetime.strptime(head, "%Y-%m-%dT%H:%M:%S").replace(tzinfo=datetime.timezone.utc)
    return whole.timestamp() + (float(f"0.{rest}") if rest else 0.0)


def status_body(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


def matches_labels(obj: dict[str, Any], selector: str) -> bool:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if "!=" in term:
            key, value = term.split("!=", 1)
            if labels.get(key) == value:
                return False
        elif "=" in term:
            key, value = term.replace("==", "=").split("=", 1)
            if labels.get(key) != value:
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


def matches_fields(obj: dict[str, Any], selector: str) -> bool:
    for term in filter(None, selector.split(",")):
        key, _, value = term.partition("=")
        if key == "metadata.name" and obj["metadata"]["name"] != value:
            return False
        if key == "metadata.namespace" and obj["metadata"].get("namespace") != value:
            return False
    return True


class Refusal:
    def __init__(
        self,
        method: str,
        plural: str,
        code: int,
        message: str,
        name: str | None = None,
        subresource: str | None = None,
    ) -> None:
        self.method, self.plural, self.code, self.message, self.name = method, plural, code, message, name
        self.subresource = subresource


class Trouble:
    """Requests answered badly: ``mode`` is "503", "429" or "drop" (the connection closed unanswered)."""

    def __init__(
        self, mode: str, requests: int | None, seconds: float | None, retry_after: int | None
    ) -> None:
        self.mode, self.left, self.retry_after = mode, requests, retry_after
        self.until = None if seconds is None else time.monotonic() + seconds

    def take(self) -> bool:
        """Whether this request is one of the bad ones (counts it)."""
        if self.until is not None and time.monotonic() >= self.until:
            return False
        if self.left is not None:
            if self.left <= 0:
                return False
            self.left -= 1
        return True


HOLD_LIMIT = 300.0  # seconds a held request waits for its release at most (a test that forgot it)


class Hold:
    """Requests (``method``, a path matched by ``path_regex``) kept unanswered until ``release``,
    after the first ``skip`` of them; ``arrived`` is set when the first is held. A context manager
    that releases them at its end; the server's stop releases them too."""

    def __init__(self, method: str, path_regex: str, skip: int = 0) -> None:
        self.method, self.pattern, self.skip = method, re.compile(path_regex), skip
        self.arrived = threading.Event()
        self.released = threading.Event()
        self.held = 0  # how many requests were held

    def takes(self, method: str, path: str) -> bool:
        """Whether this request is held (the server's lock held: counts it)."""
        if self.released.is_set() or method != self.method or not self.pattern.search(path):
            return False
        if self.skip > 0:
            self.skip -= 1
            return False
        self.held += 1
        return True

    def wait_arrived(self, timeout: float) -> bool:
        return self.arrived.wait(timeout)

    def release(self) -> None:
        self.released.set()

    def __enter__(self) -> Hold:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class LogBuffer:
    """One run of one container, as the kubelet keeps its log: the lines, when each was written,
    and whether the container has exited (its stream then ends)."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.times: list[float] = []
        self.closed = False
        self.cuts = 0  # how many times its open streams were ended cleanly, the container running
        self.partial = ""  # what the last cut sent of a line not yet written whole
        self.partial_time: float | None = None  # that line's time: the next line written has it
        self.cut_time = 0.0  # the same, kept for the streams that send the cut
        self.cut_at = 0  # how many lines the log had at the last cut (its streams send those)


class _Server(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that closed its connection (a kept-alive one its pool let go while the server
        waited for its next request) is no error, as for an API server: socketserver's default
        prints a traceback to stderr, which a test reading the command's stderr then sees."""
        if isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            return
        super().handle_error(request, client_address)


class FakeKubeAPI:
    """The server's state and its helpers for tests (all thread-safe)."""

    def __init__(self, groups: tuple[str, ...] = tuple(GROUP_RESOURCES)) -> None:
        self.groups = set(groups)
        self.lock = threading.Condition()
        self.objects: dict[tuple[str, str, str, str], dict[str, Any]] = {}
        self.events: list[tuple[int, tuple[str, str, str, str], str, dict[str, Any]]] = []
        self.version = itertools.count(100)
        self.current = 100
        self.logs: dict[tuple[str, str], LogBuffer] = {}  # (pod, container): its current run
        self.previous_logs: dict[tuple[str, str], LogBuffer] = {}  # ... and the run before
        self.requests: list[tuple[str, str, dict[str, list[str]]]] = []
        self.posted: list[bytes] = []  # every POST's body as the client sent it, in order
        self.refusals: list[Refusal] = []
        self.on_create: Callable[[dict[str, Any]], None] | None = None
        self.on_request: Callable[[str, str], None] | None = None  # (method, path) as each comes
        self.watch_seconds_cap: float | None = None  # end watches sooner than asked (tests of resume)
        self.stopping = False
        self.compacted = 0  # watches from an older resourceVersion get 410 Gone
        # Misbehaviour knobs (module docstring), all off by default.
        self.not_json: Callable[[str, str, dict[str, list[str]]], bool] | None = None
        self.trouble: Trouble | None = None
        self.watch_gone = False
        self.stall_watches = False
        self.endless: dict[tuple[str, str], bytes] = {}
        self.log_bytes_sent = 0
        self.create_delay = 0.0
        self.watch_lag: dict[str, float] = {}  # plural -> seconds each batch of its events waits
        self.list_lag: dict[str, float] = {}  # plural -> seconds each list of it takes
        # Seconds the server's clock runs ahead of this machine's (negative: behind): its creation
        # and deletion times and the Date header of every answer follow it.
        self.clock_skew = 0.0
        self.create_lag = 0.0  # seconds between receiving a create and making the object
        self.garble_events = 0  # the next watch events sent as a line that is not JSON
        self.log_timestamps = True  # False: timestamps=true and sinceTime are ignored
        # Admission (kubeadmission.py): CRD schemas by (apiVersion, kind), the shipped ones unless
        # replaced here (an older controller's CRD); webhooks by kind; the cluster's PriorityClasses.
        self.schemas: dict[tuple[str, str], dict[str, Any]] = {}
        self.schemas_shipped = True
        self.webhooks: dict[tuple[str, str], list[Callable[[dict[str, Any]], str | None]]] = {}
        self.priority_classes: dict[str, int] = {}
        self.warnings_sent: list[str] = []
        self.refused: list[str] = []  # what controllers could not create (their Events)
        self.holds: list[Hold] = []
        self.server = _Server(("127.0.0.1", 0), _handler(self))
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    # ------------------------------------------------------------------ lifecycle

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> FakeKubeAPI:
        self.thread.start()
        return self

    def stop(self) -> None:
        with self.lock:
            self.stopping = True
            self.lock.notify_all()
            for held in self.holds:
                held.release()
        self.server.shutdown()
        self.server.server_close()

    def kubeconfig(self, path: Path, namespace: str | None = None, token: str = TOKEN) -> Path:
        context: dict[str, Any] = {"cluster": "fake", "user": "tester"}
        if namespace:
            context["namespace"] = namespace
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
            "users": [{"name": "tester", "user": {"token": token}}],
            "contexts": [{"name": "fake-context", "context": context}],
            "current-context": "fake-context",
        }
        path.write_text(json.dumps(config))
        path.chmod(0o600)
        return path

    # ------------------------------------------------------------------ state for tests

    def _bump(self) -> str:
        self.current = next(self.version)
        return str(self.current)

    def _record(self, key: tuple[str, str, str, str], kind: str, obj: dict[str, Any]) -> None:
        self.events.append((self.current, key, kind, copy.deepcopy(obj)))
        self.lock.notify_all()

    def put(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Create or replace an object as a controller would: ADDED or MODIFIED. A new object goes
        through admission (names, webhooks, claim protection, pod priority and QoS) and may be
        Refused; an object being deleted whose last finalizer is removed goes (DELETED)."""
        obj = copy.deepcopy(obj)
        api_version, kind = obj["apiVersion"], obj["kind"]
        plural = self.plural(api_version, kind)
        meta = obj.setdefault("metadata", {})
        meta.setdefault("namespace", "default")
        key = (api_version, plural, meta["namespace"], meta["name"])
        with self.lock:
            old = self.objects.get(key)
            if old is None:
                obj, _ = kubeadmission.admit(self, obj, None, client=False)
                meta = obj["metadata"]
            meta.setdefault("uid", (old or {}).get("metadata", {}).get("uid") or str(uuid.uuid4()))
            meta.setdefault("creationTimestamp", now_iso(self.clock_skew))
            meta["resourceVersion"] = self._bump()
            self.objects[key] = obj
            self._record(key, "MODIFIED" if old else "ADDED", obj)
            if meta.get("deletionTimestamp") and not meta.get("finalizers"):
                self._remove(key)
        return obj

    def create(
        self, obj: dict[str, Any], namespace: str = "default", validation: str | None = None
    ) -> tuple[dict[str, Any], list[str]]:
        """A client's create: every admission step, the schema with ``fieldValidation`` included;
        the stored object and the warnings sent back. Refused (409 for a name taken) otherwise."""
        obj = copy.deepcopy(obj)
        api_version, kind = obj["apiVersion"], obj["kind"]
        plural = self.plural(api_version, kind)
        name = obj["metadata"]["name"]
        key = (api_version, plural, namespace, name)
        with self.lock:
            if key in self.objects:
                group = api_version.split("/")[0] if "/" in api_version else ""
                resource = f"{plural}.{group}" if group else plural
                raise Refused(409, "AlreadyExists", f'{resource} "{name}" already exists')
            obj, warnings = kubeadmission.admit(self, obj, validation, client=True)
            meta = obj["metadata"]
            meta["namespace"] = namespace
            meta["uid"] = str(uuid.uuid4())
            meta["creationTimestamp"] = now_iso(self.clock_skew)
            meta["resourceVersion"] = self._bump()
            self.objects[key] = obj
            self._record(key, "ADDED", obj)
            self.warnings_sent += warnings
        return copy.deepcopy(obj), warnings

    def get(
        self, api_version: str, kind: str, name: str, namespace: str = "default"
    ) -> dict[str, Any] | None:
        with self.lock:
            obj = self.objects.get((api_version, self.plural(api_version, kind), namespace, name))
            return copy.deepcopy(obj) if obj else None

    def set_status(
        self, api_version: str, kind: str, name: str, status: dict[str, Any], namespace: str = "default"
    ) -> None:
        obj = self.get(api_version, kind, name, namespace)
        assert obj is not None, f"no {kind} {name}"
        obj["status"] = status
        self.put(obj)

    def delete(
        self, api_version: str, kind: str, name: str, namespace: str = "default", *, foreground: bool = False
    ) -> bool:
        """Delete as a controller would, its dependents with it (``foreground``: they go first, as
        with ``propagationPolicy: Foreground``); False when it was not there."""
        key = (api_version, self.plural(api_version, kind), namespace, name)
        with self.lock:
            obj = self.objects.get(key)
            if obj is None:
                return False
            if foreground:
                obj["metadata"]["deletionTimestamp"] = now_iso(self.clock_skew)
                obj["metadata"]["resourceVersion"] = self._bump()
                self._record(key, "MODIFIED", obj)
                self._delete_dependents(obj["metadata"]["uid"], namespace)
            self._remove(key)
        return True

    def _remove(self, key: tuple[str, str, str, str]) -> bool:
        """Delete one object (lock held): with finalizers it is only marked (deletionTimestamp) and
        stays until they are removed; once gone, its dependents are deleted as the garbage
        collector deletes them, and a pod's logs end. True when it is gone."""
        obj = self.objects.get(key)
        if obj is None:
            return True
        meta = obj["metadata"]
        if meta.get("finalizers"):
            if not meta.get("deletionTimestamp"):
                meta["deletionTimestamp"] = now_iso(self.clock_skew)
                meta["resourceVersion"] = self._bump()
                self._record(key, "MODIFIED", obj)
            return False
        del self.objects[key]
        meta["resourceVersion"] = self._bump()
        self._record(key, "DELETED", obj)
        if key[1] == "pods":
            self._forget_logs(key[3])
        self._delete_dependents(meta["uid"], key[2])
        return True

    def _delete_dependents(self, uid: str, namespace: str) -> None:
        """The garbage collector: objects owned by ``uid`` and by no other object still there."""
        alive = {o["metadata"]["uid"] for o in self.objects.values()}
        for key, obj in list(self.objects.items()):
            owners = {o.get("uid") for o in obj["metadata"].get("ownerReferences") or []}
            if key[2] == namespace and uid in owners and not owners & alive and key in self.objects:
                self._remove(key)

    def events_after(self, position: int, timeout: float) -> tuple[int, list[tuple[str, dict[str, Any]]]]:
        """What an informer sees: (event type, object) recorded after ``position``, waiting up to
        ``timeout`` for one; and the position to read from next."""
        with self.lock:
            if position >= len(self.events) and not self.stopping:
                self.lock.wait(timeout)
            new = [(kind, copy.deepcopy(obj)) for _, _, kind, obj in self.events[position:]]
            return len(self.events), new

    def put_many(self, objs: list[dict[str, Any]]) -> None:
        for obj in objs:
            self.put(obj)

    def log(self, pod: str, container: str, *lines: str) -> None:
        with self.lock:
            buffer = self.logs.setdefault((pod, container), LogBuffer())
            for line in lines:  # the kubelet's timestamps, distinct and in order
                when = max(time.time(), buffer.times[-1] + 1e-6 if buffer.times else 0.0)
                if buffer.partial_time is not None:  # the line a cut sent the beginning of
                    when, buffer.partial_time = buffer.partial_time, None
                buffer.times.append(when)
                buffer.lines.append(line)
            self.lock.notify_all()

    def end_log(self, pod: str, container: str) -> None:
        with self.lock:
            self.logs.setdefault((pod, container), LogBuffer()).closed = True
            self.lock.notify_all()

    def cut_log(self, pod: str, container: str, partial: str = "") -> None:
        """End the open streams of a running container's log cleanly (the last chunk sent, as an
        API server does when its connection to the kubelet ends), ``partial`` sent last without a
        newline: the part of a line the kubelet had written so far. The log itself goes on."""
        with self.lock:
            buffer = self.logs.setdefault((pod, container), LogBuffer())
            buffer.partial, buffer.cut_at = partial, len(buffer.lines)
            if partial:  # the beginning of the next line: stamped as that line will be
                last = buffer.times[-1] + 1e-6 if buffer.times else 0.0
                buffer.partial_time = buffer.cut_time = max(time.time(), last)
            buffer.cuts += 1
            self.lock.notify_all()

    def restart_log(self, pod: str, container: str) -> None:
        """The container starts again in its pod: its log so far becomes the previous one."""
        with self.lock:
            old = self.logs.get((pod, container))
            if old is not None:
                old.closed = True
                self.previous_logs[(pod, container)] = old
            self.logs[(pod, container)] = LogBuffer()
            self.lock.notify_all()

    def _forget_logs(self, pod: str) -> None:
        """A deleted pod's logs go with it (lock held): its streams end, a new pod of that name
        starts with none."""
        for store in (self.logs, self.previous_logs):
            for key in [k for k in store if k[0] == pod]:
                store.pop(key).closed = True
        self.lock.notify_all()

    def compact(self) -> None:
        """What etcd compaction does to watchers: versions up to now can no longer be watched from."""
        with self.lock:
            self.compacted = self.current + 1

    def refuse(
        self,
        method: str,
        plural: str,
        code: int,
        message: str,
        name: str | None = None,
        subresource: str | None = None,
    ) -> None:
        """Answer ``code`` to these requests; with ``subresource`` ("log") only to that subresource."""
        self.refusals.append(Refusal(method, plural, code, message, name, subresource))

    def hold(self, method: str, path_regex: str, *, skip: int = 0) -> Hold:
        """Keep the requests ``method`` to a path ``path_regex`` matches (re.search) unanswered
        until the Hold is released, letting the first ``skip`` of them through."""
        held = Hold(method, path_regex, skip)
        with self.lock:
            self.holds.append(held)
        return held

    def break_for(
        self,
        mode: str,
        *,
        requests: int | None = None,
        seconds: float | None = None,
        retry_after: int | None = None,
    ) -> None:
        """The next ``requests`` requests (or all for ``seconds``) get ``mode``: "503", "429", "drop"."""
        with self.lock:
            self.trouble = Trouble(mode, requests, seconds, retry_after)
            self.lock.notify_all()  # open watches and log streams see it too

    def endless_log(self, pod: str, container: str, line: bytes = b"x" * 99 + b"\n") -> None:
        """The log of ``pod``/``container`` never ends: ``line`` sent again and again, as fast as read."""
        with self.lock:
            self.endless[(pod, container)] = line
            self.logs.setdefault((pod, container), LogBuffer())

    def plural(self, api_version: str, kind: str) -> str:
        if api_version == "v1":
            return CORE_RESOURCES[kind]
        return GROUP_RESOURCES[api_version][kind]

    def kind_of(self, api_version: str, plural: str) -> str | None:
        table = CORE_RESOURCES if api_version == "v1" else GROUP_RESOURCES.get(api_version, {})
        return next((k for k, p in table.items() if p == plural), None)

    def count(self, method: str | None = None, contains: str = "") -> int:
        with self.lock:
            return sum(
                1 for m, path, _ in self.requests if (method is None or m == method) and contains in path
            )

    def objects_of(self, api_version: str, kind: str, namespace: str = "default") -> list[dict[str, Any]]:
        plural = self.plural(api_version, kind)
        with self.lock:
            return [
                copy.deepcopy(o)
                for (v, p, ns, _), o in self.objects.items()
                if (v, p, ns) == (api_version, plural, namespace)
            ]


def _handler(api: FakeKubeAPI) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        cuts_at_arrival: dict[tuple[str, str], int]  # each log's cuts as the request came (_route)

        def log_message(self, format: str, *args: Any) -> None:  # quiet
            pass

        def date_time_string(self, timestamp: float | None = None) -> str:  # the Date header
            moment = time.time() if timestamp is None else timestamp
            return super().date_time_string(moment + api.clock_skew)

        # -------------------------------------------------------------- plumbing

        def _send_json(self, code: int, body: dict[str, Any], warnings: list[str] = ()) -> None:  # type: ignore[assignment]
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            for warning in warnings:  # as kube-apiserver sends them: one header each
                self.send_header("Warning", f"299 - {json.dumps(warning)}")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _status(self, code: int, reason: str, message: str) -> None:
            self._send_json(code, status_body(code, reason, message))

        def _start_chunks(self, content_type: str) -> None:
            self.send_response(200)
            self.send_header("Content-Type", content_type)
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()

        def _chunk(self, data: bytes) -> None:
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

        def _end_chunks(self) -> None:
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()

        def _body(self) -> Any:
            return json.loads(self.payload) if self.payload else None

        def _route(self, method: str) -> None:
            # The body is read whatever the answer, or it would be taken for the next request.
            self.payload = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            parts = urlsplit(self.path)
            query = parse_qs(parts.query)
            with api.lock:
                api.requests.append((method, parts.path, query))
                # A log stream is open once asked for: a cut from now on ends it (see _pod_log).
                self.cuts_at_arrival = {key: log.cuts for key, log in api.logs.items()}
                if method == "POST":
                    api.posted.append(self.payload)
                trouble = api.trouble is not None and api.trouble.take()
                holding = [h for h in api.holds if h.takes(method, parts.path)]
            if api.on_request is not None:
                api.on_request(method, parts.path)
            for held in holding:  # received, then unanswered until the test releases it
                held.arrived.set()
                held.released.wait(HOLD_LIMIT)
            if trouble:
                self._misbehave()
                return
            if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                self._status(401, "Unauthorized", "Unauthorized")
                return
            segments = [s for s in parts.path.split("/") if s]
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # the client hung up
                self._dispatch(method, segments, query)

        def _misbehave(self) -> None:
            assert api.trouble is not None
            if api.trouble.mode == "drop":
                self.close_connection = True
                with contextlib.suppress(OSError):
                    self.connection.shutdown(socket.SHUT_RDWR)
                return
            code = int(api.trouble.mode)
            body = json.dumps(status_body(code, "TooManyRequests" if code == 429 else "", "try again later"))
            data = body.encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            if api.trouble.retry_after is not None:
                self.send_header("Retry-After", str(api.trouble.retry_after))
            self.end_headers()
            self.wfile.write(data)

        def _troubled(self) -> bool:
            """A stream already open ends, cut off, while the server is in trouble (lock held)."""
            trouble = api.trouble
            if trouble is None or (trouble.until is not None and time.monotonic() >= trouble.until):
                return False
            return trouble.until is not None or (trouble.left or 0) > 0

        def do_GET(self) -> None:
            self._route("GET")

        def do_POST(self) -> None:
            self._route("POST")

        def do_DELETE(self) -> None:
            self._route("DELETE")

        def do_PATCH(self) -> None:
            self._route("PATCH")

        # -------------------------------------------------------------- routes

        def _dispatch(self, method: str, seg: list[str], query: dict[str, list[str]]) -> None:
            if api.not_json is not None and api.not_json(method, "/" + "/".join(seg), query):
                page = b"<html><head><title>Sign in</title></head>\n<body>Please sign in</body></html>"
                self.send_response(200)
                self.send_header("Content-Type", "text/html; charset=utf-8")
                self.send_header("Content-Length", str(len(page)))
                self.end_headers()
                self.wfile.write(page)
                return
            if seg == ["api"]:
                self._send_json(200, {"kind": "APIVersions", "versions": ["v1"]})
                return
            if seg == ["apis"]:
                groups = {}
                for gv in sorted(api.groups):
                    group, version = gv.split("/")
                    groups.setdefault(group, []).append({"groupVersion": gv, "version": version})
                items = [{"name": g, "versions": vs, "preferredVersion": vs[0]} for g, vs in groups.items()]
                self._send_json(200, {"kind": "APIGroupList", "apiVersion": "v1", "groups": items})
                return
            if seg == ["api", "v1"]:
                self._discovery("v1", CORE_RESOURCES)
                return
            if len(seg) == 3 and seg[0] == "apis":
                gv = f"{seg[1]}/{seg[2]}"
                if gv not in api.groups:
                    self._status(404, "NotFound", "the server could not find the requested resource")
                    return
                self._discovery(gv, GROUP_RESOURCES[gv])
                return
            if seg[:2] == ["api", "v1"] and len(seg) >= 5 and seg[2] == "namespaces":
                api_version, rest = "v1", seg[3:]
            elif seg[:1] == ["apis"] and len(seg) >= 6 and seg[3] == "namespaces":
                api_version, rest = f"{seg[1]}/{seg[2]}", seg[4:]
            else:
                self._status(404, "NotFound", "the server could not find the requested resource")
                return
            if api_version != "v1" and api_version not in api.groups:
                self._status(404, "NotFound", "the server could not find the requested resource")
                return
            namespace, plural, name = rest[0], rest[1], rest[2] if len(rest) > 2 else None
            kind = api.kind_of(api_version, plural)
            if kind is None:
                self._status(404, "NotFound", "the server could not find the requested resource")
                return
            subresource = rest[3] if len(rest) > 3 else None
            for refusal in api.refusals:
                if refusal.subresource not in (None, subresource):
                    continue
                if refusal.method == method and refusal.plural == plural and refusal.name in (None, name):
                    verb = {"GET": "get", "POST": "create", "DELETE": "delete", "PATCH": "patch"}[method]
                    reason = {403: "Forbidden", 422: "Invalid"}.get(refusal.code, "BadRequest")
                    self._status(refusal.code, reason, refusal.message.format(verb=verb))
                    return
            if len(rest) == 4 and rest[3] == "log" and plural == "pods" and method == "GET":
                self._pod_log(namespace, rest[2], query)
            elif method == "POST" and name is None:
                self._create(api_version, plural, kind, namespace, query)
            elif method == "GET" and name is None:
                if query.get("watch", ["false"])[0] in ("true", "1", "True"):
                    self._watch(api_version, plural, namespace, query)
                else:
                    self._list(api_version, plural, kind, namespace, query)
            elif method == "GET":
                obj = api.objects.get((api_version, plural, namespace, name))
                if obj is None:
                    self._status(404, "NotFound", f'{plural} "{name}" not found')
                else:
                    self._send_json(200, obj)
            elif method == "PATCH" and name is not None:
                self._patch(api_version, plural, namespace, name)
            elif method == "DELETE" and name is not None:
                self._delete(api_version, plural, namespace, name)
            elif method == "DELETE":
                self._delete_collection(api_version, plural, kind, namespace, query)
            else:
                self._status(405, "MethodNotAllowed", "method not allowed")

        def _discovery(self, gv: str, table: dict[str, str]) -> None:
            resources = [
                {
                    "name": plural,
                    "singularName": "",
                    "namespaced": True,
                    "kind": kind,
                    "verbs": ["create", "get", "list", "watch", "delete", "patch"],
                }
                for kind, plural in table.items()
            ]
            if gv == "v1":
                resources.append({"name": "pods/log", "namespaced": True, "kind": "Pod", "verbs": ["get"]})
            self._send_json(200, {"kind": "APIResourceList", "groupVersion": gv, "resources": resources})

        def _create(
            self, api_version: str, plural: str, kind: str, namespace: str, query: dict[str, list[str]]
        ) -> None:
            obj = self._body()
            meta = obj.setdefault("metadata", {})
            if obj.get("apiVersion") != api_version or obj.get("kind") != kind:
                self._status(400, "BadRequest", f"the object is a {obj.get('apiVersion')} {obj.get('kind')}")
                return
            if meta.get("namespace", namespace) != namespace:
                self._status(
                    400,
                    "BadRequest",
                    "the namespace of the object does not match the namespace on the request",
                )
                return
            if api.create_lag:  # received, not yet made: the client may give up meanwhile
                time.sleep(api.create_lag)
            try:
                obj, warnings = api.create(obj, namespace, query.get("fieldValidation", [None])[0])
            except Refused as refused:
                self._status(refused.code, refused.reason, refused.message)
                return
            if api.create_delay:  # made, but the answer is slow: a client interrupted now never hears of it
                time.sleep(api.create_delay)
            self._send_json(201, obj, warnings)
            if api.on_create is not None:
                api.on_create(copy.deepcopy(obj))

        def _patch(self, api_version: str, plural: str, namespace: str, name: str) -> None:
            """A JSON merge patch (RFC 7386), the only kind torchjob sends."""
            if "merge-patch" not in (self.headers.get("Content-Type") or ""):
                self._status(415, "UnsupportedMediaType", "only application/merge-patch+json is served here")
                return
            key = (api_version, plural, namespace, name)
            with api.lock:
                obj = api.objects.get(key)
                if obj is None:
                    self._status(404, "NotFound", f'{plural} "{name}" not found')
                    return
                merged = _merge(copy.deepcopy(obj), self._body())
                merged["metadata"]["uid"] = obj["metadata"]["uid"]
                merged["metadata"]["resourceVersion"] = api._bump()
                api.objects[key] = merged
                api._record(key, "MODIFIED", merged)
            self._send_json(200, merged)

        def _select(
            self, api_version: str, plural: str, namespace: str, query: dict[str, list[str]]
        ) -> list[dict[str, Any]]:
            labels = query.get("labelSelector", [""])[0]
            fields = query.get("fieldSelector", [""])[0]
            return [
                o
                for (v, p, ns, _), o in api.objects.items()
                if (v, p, ns) == (api_version, plural, namespace)
                and matches_labels(o, labels)
                and matches_fields(o, fields)
            ]

        def _list(
            self, api_version: str, plural: str, kind: str, namespace: str, query: dict[str, list[str]]
        ) -> None:
            time.sleep(api.list_lag.get(plural, 0.0))  # a large list is slow to answer
            with api.lock:
                items = self._select(api_version, plural, namespace, query)
                version = str(api.current)
                limit = int(query.get("limit", ["0"])[0])
                meta: dict[str, Any] = {"resourceVersion": version}
                if limit and len(items) > limit:
                    items, meta["continue"] = items[:limit], "more"
                body = {"kind": f"{kind}List", "apiVersion": api_version, "metadata": meta, "items": items}
                data = json.dumps(body)
            payload = data.encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def _watch(self, api_version: str, plural: str, namespace: str, query: dict[str, list[str]]) -> None:
            since = int(query.get("resourceVersion", ["0"])[0] or 0)
            seconds = float(query.get("timeoutSeconds", ["1800"])[0])
            if api.watch_seconds_cap is not None:
                seconds = min(seconds, api.watch_seconds_cap)
            labels = query.get("labelSelector", [""])[0]
            fields = query.get("fieldSelector", [""])[0]
            end = time.monotonic() + seconds
            self._start_chunks("application/json")
            position = 0
            with api.lock:
                while api.stall_watches and not api.stopping:  # headers sent, then nothing
                    api.lock.wait(0.5)
                if since < api.compacted or api.watch_gone:
                    gone = status_body(410, "Expired", "too old resource version")
                    self._chunk(json.dumps({"type": "ERROR", "object": gone}).encode() + b"\n")
                    self._end_chunks()
                    return
            while True:
                batch: list[bytes] = []
                with api.lock:
                    while position < len(api.events) and not api.stopping:
                        version, key, kind, obj = api.events[position]
                        position += 1
                        if version <= since or key[:3] != (api_version, plural, namespace):
                            continue
                        if matches_labels(obj, labels) and matches_fields(obj, fields):
                            line = json.dumps({"type": kind, "object": obj}).encode()
                            if api.garble_events > 0:  # cut short, as a broken proxy may send it
                                api.garble_events -= 1
                                line = line[: len(line) // 2]
                            batch.append(line + b"\n")
                    if self._troubled():  # cut off, as a restarting server does
                        self.close_connection = True
                        return
                    remaining = end - time.monotonic()
                    if not batch and remaining > 0 and not api.stopping:
                        api.lock.wait(min(remaining, 0.5))
                        continue
                if batch:
                    time.sleep(api.watch_lag.get(plural, 0.0))
                    self._chunk(b"".join(batch))
                if time.monotonic() >= end or api.stopping:
                    self._end_chunks()
                    return

        def _pod_log(self, namespace: str, pod: str, query: dict[str, list[str]]) -> None:
            obj = api.objects.get(("v1", "pods", namespace, pod))
            if obj is None:
                self._status(404, "NotFound", f'pods "{pod}" not found')
                return
            containers = [c["name"] for c in obj["spec"]["containers"]]
            container = query.get("container", [containers[0]])[0]
            key = (pod, container)
            previous = query.get("previous", ["false"])[0] == "true"
            with api.lock:
                buffer = (api.previous_logs if previous else api.logs).get(key)
                if buffer is None:
                    self._status(
                        400,
                        "BadRequest",
                        f'container "{container}" in pod "{pod}" is waiting to start: ContainerCreating',
                    )
                    return
            follow = query.get("follow", ["false"])[0] == "true"
            tail = int(query.get("tailLines", ["-1"])[0])
            stamped = query.get("timestamps", ["false"])[0] == "true" and api.log_timestamps
            since = query.get("sinceTime", [None])[0] if api.log_timestamps else None
            self._start_chunks("text/plain")

            def text(position: int) -> str:
                line = buffer.lines[position]
                return f"{log_stamp(buffer.times[position])} {line}" if stamped else line

            with api.lock:  # what is there now, and where following goes on: read at once, so
                # that a line written while the first chunk is sent is followed, not skipped
                position, cuts = len(buffer.lines), self.cuts_at_arrival.get(key, buffer.cuts)
                if buffer.cuts != cuts:  # cut since it was asked for: it ends at the cut
                    position = min(position, buffer.cut_at)
                lines = [
                    text(i) for i in range(position) if since is None or buffer.times[i] >= parse_stamp(since)
                ]
            if tail >= 0:
                lines = lines[len(lines) - tail :] if tail else []
            body = "".join(f"{line}\n" for line in lines).encode()
            limit = int(query.get("limitBytes", ["0"])[0])
            if limit > 0:  # as the kubelet: the tail's first bytes, the output ended there
                if body[:limit]:
                    self._chunk(body[:limit])
                self._end_chunks()
                return
            if body:
                self._chunk(body)
            endless = api.endless.get(key)
            if endless is not None and not previous:  # with or without follow, it never ends
                block = endless * max(1, 65536 // len(endless))
                while not api.stopping:
                    self._chunk(block)  # blocks while the reader does not read: TCP back-pressure
                    with api.lock:
                        api.log_bytes_sent += len(block)
                return
            while follow and not previous:
                with api.lock:
                    while (
                        position == len(buffer.lines)
                        and not buffer.closed
                        and not api.stopping
                        and buffer.cuts == cuts
                    ):
                        if self._troubled():
                            self.close_connection = True
                            return
                        api.lock.wait(0.5)
                    cut = buffer.partial if buffer.cuts != cuts else None
                    upto = buffer.cut_at if cut is not None else len(buffer.lines)
                    new = [text(i) for i in range(position, upto)]
                    position = upto
                    closed = buffer.closed or api.stopping
                    if cut and stamped:
                        cut = f"{log_stamp(buffer.cut_time)} {cut}"
                if new:
                    self._chunk("".join(f"{line}\n" for line in new).encode())
                if cut is not None:  # ended cleanly mid-run, a line's beginning sent last
                    if cut:
                        self._chunk(cut.encode())
                    break
                if closed and position == len(buffer.lines):
                    break
            self._end_chunks()

        def _delete(self, api_version: str, plural: str, namespace: str, name: str) -> None:
            key = (api_version, plural, namespace, name)
            with api.lock:
                obj = api.objects.get(key)
                if obj is None:
                    self._status(404, "NotFound", f'{plural} "{name}" not found')
                    return
                uid = ((self._body() or {}).get("preconditions") or {}).get("uid")
                if uid is not None and uid != obj["metadata"]["uid"]:  # DeleteOptions.preconditions
                    message = f"Precondition failed: UID in precondition: {uid}, UID in object meta: "
                    self._status(409, "Conflict", message + obj["metadata"]["uid"])
                    return
                gone = api._remove(key)
                body = status_body(200, "", "") | {"status": "Success"} if gone else copy.deepcopy(obj)
            self._send_json(200, body)

        def _delete_collection(
            self, api_version: str, plural: str, kind: str, namespace: str, query: dict[str, list[str]]
        ) -> None:
            with api.lock:
                for obj in self._select(api_version, plural, namespace, query):
                    api._remove((api_version, plural, namespace, obj["metadata"]["name"]))
            self._send_json(
                200, {"kind": f"{kind}List", "apiVersion": api_version, "metadata": {}, "items": []}
            )

    return Handler


def _merge(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge key by key, null deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = _merge(out.get(key), value)
    return out


@contextlib.contextmanager
def running(groups: tuple[str, ...] = tuple(GROUP_RESOURCES)) -> Iterator[FakeKubeAPI]:
    api = FakeKubeAPI(groups).start()
    try:
        yield api
    finally:
        api.stop()
