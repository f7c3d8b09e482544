"""The connection to one cluster: the user's kubeconfig, and raw JSON requests over the official client.

Requests go through the client's ``ApiClient`` (its TLS, auth plugins and token refresh) but take
and return plain JSON: custom resources are dicts anyway, and a 1,000-pod list parsed into typed
models costs seconds. The generated method signatures changed shape in kubernetes 37; the two
request paths below are the only place that knows which client is installed.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

from torchjob.engine_api.base import EngineError
from torchjob.engines.kubernetes.credentials import load_kubeconfig
from torchjob.engines.kubernetes.errors import ApiError, api_error, not_json, unreachable

CONNECT_TIMEOUT = 10.0
READ_TIMEOUT = 60.0
# The server may ask for a request again later (429 Too Many Requests, or a 5xx, with
# Retry-After), as client-go honours it: at most this many tries, waiting at most this long each.
RETRY_TRIES = 5
RETRY_AFTER_MAX = 30.0
READ_CHUNK = 64 * 1024  # bytes read from a stream at a time
MAX_LINE = 64 * 1024  # a longer log line is passed on in pieces of at most this many bytes


def _import_client() -> Any:
    try:
        import kubernetes
    except ImportError:
        raise EngineError(
            "the kubernetes engine needs the kubernetes client: in the torchjob checkout, "
            "pip install -e '.[kubernetes]'"
        ) from None
    return kubernetes


def _config_files(kubeconfig: str | None) -> list[Path]:
    if kubeconfig:
        return [Path(kubeconfig).expanduser()]
    env = os.environ.get("KUBECONFIG", "")
    if env:
        return [Path(p).expanduser() for p in env.split(os.pathsep) if p]
    return [Path("~/.kube/config").expanduser()]


_TOLD_INSECURE: set[str] = set()


def _insecure(host: str) -> None:
    """One line of torchjob's, once a host, instead of urllib3's warning with its source line on
    every request to a server whose certificate is not checked (insecure-skip-tls-verify)."""
    import warnings

    import urllib3

    warnings.filterwarnings("ignore", category=urllib3.exceptions.InsecureRequestWarning)
    if host not in _TOLD_INSECURE:
        _TOLD_INSECURE.add(host)
        print(
            f"torchjob: warning: the certificate of {host} is not verified (insecure-skip-tls-verify)",
            file=sys.stderr,
        )


class Cluster:
    """One context of one kubeconfig: where requests go and the namespace they default to."""

    def __init__(
        self, kubeconfig: str | None = None, context: str | None = None, namespace: str | None = None
    ) -> None:
        kubernetes = _import_client()
        import urllib3

        self._ApiException = kubernetes.client.exceptions.ApiException
        files = _config_files(kubeconfig)
        found = [f for f in files if f.is_file()]
        in_cluster = not kubeconfig and not found and os.environ.get("KUBERNETES_SERVICE_HOST")
        configuration = kubernetes.client.Configuration()
        if in_cluster:
            kubernetes.config.load_incluster_config(client_configuration=configuration)
            self.context = "in-cluster"
            context_namespace = _in_cluster_namespace()
        else:
            if not found:
                where = ", ".join(str(f) for f in files)
                hint = "" if kubeconfig else "; set KUBECONFIG or pass --kubeconfig FILE"
                raise EngineError(f"no kubeconfig: {where} does not exist{hint}")
            config_file = os.pathsep.join(str(f) for f in found)
            try:
                contexts, current = kubernetes.config.list_kube_config_contexts(config_file)
                chosen = next((c for c in contexts if c.get("name") == context), None) if context else current
                if context and chosen is None:
                    names = ", ".join(str(c.get("name")) for c in contexts) or "none"
                    raise EngineError(f"no context {context!r} in {config_file} (contexts: {names})")
            except EngineError:
                raise
            except Exception as err:  # the loader raises ConfigException, ValueError, yaml errors
                raise EngineError(f"cannot use kubeconfig {config_file}: {err}") from None
            load_kubeconfig(kubernetes, config_file, context, configuration)
            self.context = str((chosen or {}).get("name") or "")
            context_namespace = ((chosen or {}).get("context") or {}).get("namespace")
        self.namespace: str = namespace or context_namespace or "default"
        # Shown in messages: without any user:password a server URL may carry (never printed).
        self.host: str = safe_url(configuration.host)
        self._configuration = configuration
        if not configuration.verify_ssl:
            _insecure(self.host)
        # urllib3 would try an unreachable server 4 times, 10 s each: once more only. A Retry-After
        # is honoured by ``open`` alone, so that its bound (RETRY_TRIES) is the whole story.
        configuration.retries = urllib3.util.Retry(total=1, respect_retry_after_header=False)
        # Log streams of big jobs each hold a connection: let the pool keep them.
        configuration.connection_pool_maxsize = max(configuration.connection_pool_maxsize or 0, 64)
        self.api = kubernetes.client.ApiClient(configuration)
        self._new_style = hasattr(self.api, "param_serialize")  # kubernetes >= 37
        # The server's Date header of its last answer, and when it came (this machine's clock).
        self._server_date: tuple[str, float] | None = None

    # ------------------------------------------------------------------ requests

    def open(
        self,
        method: str,
        path: str,
        *,
        query: dict[str, Any] | None = None,
        body: Any = None,
        doing: str,
        read_timeout: float | None = READ_TIMEOUT,
        content_type: str = "application/json",
    ) -> Any:
        """The raw urllib3 response of a 2xx answer (the caller reads or streams it); ApiError else.

        An answer that asks to be retried later (Retry-After on a 429 or 5xx) is retried, a bounded
        number of times; every error's text is cleaned of the credentials this cluster uses.
        """
        tries = 0
        while True:
            tries += 1
            try:
                response = self._open_once(method, path, query, body, doing, read_timeout, content_type)
                date = response.headers.get("Date")
                if date:
                    self._server_date = (date, time.time())
                return response
            except ApiError as err:
                wait = err.retry_after
                if wait is None or tries >= RETRY_TRIES or wait > RETRY_AFTER_MAX:
                    raise self.redacted(err) from None
                time.sleep(wait)
            except EngineError as err:
                raise self.redacted(err) from None

    def _open_once(
        self,
        method: str,
        path: str,
        query: dict[str, Any] | None,
        body: Any,
        doing: str,
        read_timeout: float | None,
        content_type: str,
    ) -> Any:
        params = [(k, _query_value(v)) for k, v in (query or {}).items() if v is not None]
        headers = {"Accept": "application/json", "Content-Type": content_type}
        # Always a (connect, read) pair: the client takes a lone number as the limit of every
        # read too, which would end a log stream whose container is quiet for CONNECT_TIMEOUT.
        timeout = (CONNECT_TIMEOUT, read_timeout)
        try:
            if self._new_style:
                request = self.api.param_serialize(
                    method,
                    path,
                    query_params=params,
                    header_params=headers,
                    body=body,
                    auth_settings=["BearerToken"],
                )
                response = self.api.call_api(*request, _request_timeout=timeout)
                if not 200 <= response.status <= 299:
                    raise api_error(
                        response.status,
                        response.read(),
                        doing,
                        _retry_after(response.status, response.headers),
                    )
                return response.response
            return self.api.call_api(
                path,
                method,
                query_params=params,
                header_params=headers,
                body=body,
                auth_settings=["BearerToken"],
                _preload_content=False,
                _return_http_data_only=True,
                _request_timeout=timeout,
            )
        except self._ApiException as err:
            status = int(err.status or 0)
            raise api_error(status, err.body, doing, _retry_after(status, err.headers)) from None
        except EngineError:
            raise
        except Exception as err:  # urllib3's MaxRetryError, ProtocolError, socket errors
            if _is_connection_error(err):
                raise unreachable(self.host, err) from None
            raise

    def now(self) -> float:
        """The time on the server's clock, as far as its last answer's Date header tells (whole
        seconds, so up to a second early); this machine's clock when no answer carried one.

        The ages of objects are measured against it: their creation times are the server's, and a
        machine whose clock runs ahead of the server's would take a moment-old object for an old one.
        """
        if self._server_date is None:
            return time.time()
        from email.utils import parsedate_to_datetime

        date, received = self._server_date
        try:
            said = parsedate_to_datetime(date).timestamp()
        except (TypeError, ValueError, IndexError, OverflowError):
            return time.time()
        return said + max(0.0, time.time() - received)

    def redacted(self, err: EngineError) -> EngineError:
        """``err`` with every secret of this connection (token, password) blanked out of its text."""
        text = str(err)
        clean = text
        for secret in self._secrets():
            clean = clean.replace(secret, "***")
        if clean == text:
            return err
        err.args = (clean, *err.args[1:])
        return err

    def _secrets(self) -> list[str]:
        config = self._configuration
        found: list[str] = []
        for value in list((getattr(config, "api_key", None) or {}).values()):
            token = str(value).removeprefix("Bearer ").strip()
            found += [str(value), token]
        password = getattr(config, "password", None)
        if password:
            found.append(str(password))
        userinfo = urlsplit(str(config.host or "")).netloc.rpartition("@")[0]
        if userinfo:
            found += [userinfo, *userinfo.split(":", 1)[1:]]
        return sorted({s for s in found if len(s) >= 4}, key=len, reverse=True)

    def json(
        self,
        method: str,
        path: str,
        *,
        query: dict[str, Any] | None = None,
        body: Any = None,
        doing: str,
        content_type: str = "application/json",
    ) -> dict[str, Any]:
        response = self.open(method, path, query=query, body=body, doing=doing, content_type=content_type)
        try:
            data = response.data
        finally:
            response.release_conn()
        try:
            decoded = json.loads(data) if data else {}
        except ValueError:
            decoded = None
        if not isinstance(decoded, dict):  # a proxy's HTML page, a captive portal, a truncated body
            raise self.redacted(not_json(self.host, doing, response.headers.get("Content-Type"), data))
        return decoded

    def close(self) -> None:
        self.api.close()


class LineReader:
    """A streamed body (watch events, logs), line by line as the server sends them.

    Read only as fast as the caller takes lines, holding at most ``max_line`` bytes of a line (and
    one chunk read): a longer line comes in pieces of at most that size, cut where its own bytes
    say (never inside a UTF-8 character), not where reads happened to end, so that a body read
    again is cut alike. What the body ends with after its last newline is no line: it is
    ``rest`` once the lines are read (a line cut short, or a last one without its newline).
    """

    def __init__(self, response: Any, max_line: int = MAX_LINE) -> None:
        self.response, self.max_line = response, max_line
        self.rest = ""

    def __iter__(self) -> Iterator[str]:
        pending = bytearray()
        for chunk in _chunks(self.response):
            start = 0
            while True:
                end = chunk.find(b"\n", start)
                pending += chunk[start : len(chunk) if end < 0 else end]
                while len(pending) > self.max_line:  # more than one piece: the first goes
                    cut = _piece_end(pending, self.max_line)
                    yield pending[:cut].decode("utf-8", "replace")
                    del pending[:cut]
                if end < 0:
                    break
                yield pending.decode("utf-8", "replace")
                pending.clear()
                start = end + 1
        self.rest = pending.decode("utf-8", "replace")


def _piece_end(data: bytearray, most: int) -> int:
    """Where the first piece of ``data`` (over ``most`` bytes) ends: at ``most`` bytes, or before
    the UTF-8 character that would be cut there."""
    for cut in range(most, max(most - 4, 0), -1):
        if data[cut] & 0xC0 != 0x80:  # not a continuation byte: a character starts here
            return cut
    return most  # no UTF-8 there to keep whole


def lines(response: Any, max_line: int = MAX_LINE) -> Iterator[str]:
    """A streamed body's lines (``LineReader``), then what it ended with after its last newline."""
    reader = LineReader(response, max_line)
    yield from reader
    if reader.rest:
        yield reader.rest


def _chunks(response: Any) -> Iterator[bytes]:
    """The body as it arrives, at most READ_CHUNK bytes at a time."""
    if getattr(response, "chunked", False) or not hasattr(response, "read1"):
        yield from response.stream(amt=READ_CHUNK, decode_content=True)
        return
    while data := response.read1(READ_CHUNK):  # what has arrived, without waiting for more
        yield data


def interrupt(response: Any) -> None:
    """Unblock a thread reading ``response`` (a watch or a log stream) from another thread."""
    import socket

    try:
        if hasattr(response, "shutdown"):  # urllib3 >= 2.3
            response.shutdown()
            return
        sock = getattr(getattr(response, "connection", None), "sock", None)
        if sock is not None:
            sock.shutdown(socket.SHUT_RDWR)
    except (OSError, ValueError, RuntimeError):  # already closed, or back in the pool
        pass


def safe_url(url: str) -> str:
    """``url`` without a ``user:password@`` part."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))


def _retry_after(status: int, headers: Any) -> float | None:
    """Seconds the server asked us to wait before trying again, when it asked (429 or 5xx)."""
    if status != 429 and status < 500:
        return None
    value = (headers or {}).get("Retry-After") if hasattr(headers, "get") else None
    if value is None:
        return None
    try:
        return max(0.0, float(str(value).strip()))
    except ValueError:  # an HTTP date: not what the API server sends; a second will do
        return 1.0


def _query_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _is_connection_error(err: BaseException) -> bool:
    import urllib3

    return isinstance(err, (urllib3.exceptions.HTTPError, OSError))


def _in_cluster_namespace() -> str | None:
    path = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


def list_labelled(
    cluster: Cluster, path: str, selector: str, doing: str | None = None, limit: int | None = None
) -> list[dict[str, Any]]:
    """The objects at collection ``path`` whose labels match ``selector`` (the first ``limit``)."""
    query = {"labelSelector": selector, "limit": limit}
    listing = cluster.json("GET", path, query=query, doing=doing or f"list {path}")
    return list(listing.get("items") or [])


def namespaced_path(api_version: str, plural: str, namespace: str, name: str | None = None) -> str:
    """``/api/v1/namespaces/NS/pods[/NAME]`` or ``/apis/GROUP/VERSION/namespaces/NS/PLURAL[/NAME]``."""
    root = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    path = f"{root}/namespaces/{quote(namespace, safe='')}/{plural}"
    return f"{path}/{quote(name, safe='')}" if name else path
