"""What the API server answered, turned into the one line a user needs (EngineError, exit 2)."""

from __future__ import annotations

import json
from typing import Any

from torchjob.engine_api.base import EngineError


class ApiError(EngineError):
    """A non-2xx answer: ``status`` is the HTTP code, ``body`` the decoded ``Status`` object (or {})."""

    def __init__(
        self, message: str, status: int, body: dict[str, Any], retry_after: float | None = None
    ) -> None:
        super().__init__(message, 2)
        self.status = status
        self.body = body
        self.retry_after = retry_after  # seconds, when the server asked to be asked again later

    @property
    def transient(self) -> bool:
        """Worth trying again: the server is overloaded, restarting, or a proxy timed out."""
        return self.status in (0, 408, 429) or self.status >= 500


class Unreachable(EngineError):
    """No answer at all: refused, reset, timed out. Transient while a control plane restarts."""

    transient = True


class NotJson(EngineError):
    """A 2xx answer that is not a Kubernetes object: something other than the API server answered."""


class BrokenStream(NotJson):
    """A watch the server answered as JSON sent a line that is not: cut short on its way (a proxy,
    a connection reset mid-event). The event is lost, not the watch: transient, list again."""

    transient = True


def status_message(body: dict[str, Any], fallback: str) -> str:
    message = body.get("message")
    return str(message) if message else fallback


def decode_body(raw: bytes | str | None) -> dict[str, Any]:
    if not raw:
        return {}
    try:
        body = json.loads(raw)
    except ValueError:  # not the API server's Status: one line of it, never a page
        text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
        if text.lstrip()[:1] == "<":
            return {"message": "an HTML page, not a Kubernetes API answer: is the kubeconfig's server right?"}
        return {"message": " ".join(text.split())[:200]}
    return body if isinstance(body, dict) else {}


def api_error(status: int, raw: bytes | str | None, doing: str, retry_after: float | None = None) -> ApiError:
    """``doing`` says what torchjob asked for ("create batch.volcano.sh/v1alpha1 Job demo")."""
    body = decode_body(raw)
    message = status_message(body, f"HTTP {status}")
    if status == 401:
        text = f"the cluster did not accept your credentials ({doing}): {message}; check your kubeconfig"
    elif status == 403 and message.startswith("admission webhook"):  # a controller's webhook said no
        text = f"the cluster refused to {doing}: {message}"
    elif status == 403:
        text = f"the cluster refused to {doing} (RBAC): {message}"
    elif status == 422:
        text = f"the cluster rejected {doing.removeprefix('create ')}: {message}"
    elif status == 409:
        text = f"cannot {doing}: {message}"
    elif status == 404:
        text = f"cannot {doing}: not found ({message})"
    else:
        text = f"cannot {doing}: HTTP {status}: {message}"
    return ApiError(text, status, body, retry_after)


def unreachable(host: str, err: BaseException) -> Unreachable:
    reason = str(getattr(err, "reason", "") or err).strip() or type(err).__name__
    return Unreachable(f"cannot reach the Kubernetes API server at {host}: {reason}")


def not_json(host: str, doing: str, content_type: str | None, data: bytes | str | None) -> NotJson:
    """One line for an answer that is not JSON, with the start of what came back."""
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else str(data or "")
    start = " ".join(text.split())[:80] or "an empty body"
    kind = content_type.split(";")[0].strip() if content_type else ""
    what = f"a {kind} body" if kind else "a body"
    return NotJson(
        f"the Kubernetes API server at {host} answered {doing!r} with {what} that is not a "
        f"Kubernetes object: {start!r}; is a proxy or a login page in the way?"
    )


def transient(err: BaseException) -> bool:
    """Whether following a job should try again after ``err`` (for a bounded time) or give up."""
    import http.client

    import urllib3

    if isinstance(err, (ApiError, Unreachable, BrokenStream)):
        return bool(err.transient)
    # A stream that broke: reset, timed out, cut short. Anything else is a bug: not retried.
    return isinstance(err, (urllib3.exceptions.HTTPError, http.client.HTTPException, OSError))
