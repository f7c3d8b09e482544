"""What the API server answered, turned into the one line a user needs (EngineError, exit 2)."""

from __future__ import annotations

import json
from typing import Any

from torchjob.engines.base import EngineError


class ApiError(EngineError):
    """A non-2xx answer: ``status`` is the HTTP code, ``body`` the decoded ``Status`` object (or {})."""

    def __init__(self, message: str, status: int, body: dict[str, Any]) -> None:
        super().__init__(message, 2)
        self.status = status
        self.body = body


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


def api_error(status: int, raw: bytes | str | None, doing: str) -> ApiError:
    """``doing`` says what torchjob asked for ("create batch.volcano.sh/v1alpha1 Job demo")."""
    body = decode_body(raw)
    message = status_message(body, f"HTTP {status}")
    if status == 401:
        text = f"the cluster did not accept your credentials ({doing}): {message}; check your kubeconfig"
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
    return ApiError(text, status, body)


def unreachable(host: str, err: BaseException) -> EngineError:
    reason = str(getattr(err, "reason", "") or err).strip() or type(err).__name__
    return EngineError(f"cannot reach the Kubernetes API server at {host}: {reason}")
