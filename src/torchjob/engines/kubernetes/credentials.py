"""Loading a kubeconfig's credentials, with its exec plugin held to a time limit and its failure an error.

The client runs a user's ``exec`` credential plugin (aws, gcloud, kubelogin, ...) while loading
the kubeconfig, without a time limit, and when the plugin fails it only logs ``ERROR:root:...``
and goes on without credentials. Here a failure is one error naming the plugin, and a plugin
that does not answer within ``EXEC_TIMEOUT`` is killed and is an error too.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

from torchjob.engine_api.base import EngineError
from torchjob.host import procfs

EXEC_TIMEOUT = 60.0  # seconds a credential plugin gets to answer
EXEC_TIMEOUT_INTERACTIVE = 300.0  # ... when it may be asking the user to log in (a terminal)


class _Captured(logging.Filter):
    """Takes the client's own error records (the kubeconfig loader logs to the root logger)."""

    def __init__(self) -> None:
        super().__init__()
        self.messages: list[str] = []

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR and f"{os.sep}kubernetes{os.sep}config{os.sep}" in record.pathname:
            self.messages.append(record.getMessage())
            return False
        return True


def load_kubeconfig(kubernetes: Any, config_file: str, context: str | None, configuration: Any) -> None:
    """``kubernetes.config.load_kube_config`` into ``configuration``; EngineError when it cannot.

    A token the plugin says expires is renewed by the client before a request (its refresh
    hook runs the plugin again): that renewal gets the same time limit and the same one error.
    """
    where = f"cannot use kubeconfig {config_file}"

    def plugin() -> str:
        return _plugin(kubernetes, config_file, context)

    _bounded(
        lambda: kubernetes.config.load_kube_config(
            config_file=config_file, context=context, client_configuration=configuration
        ),
        where,
        plugin,
    )
    refresh = getattr(configuration, "refresh_api_key_hook", None)
    if refresh is None or _user(kubernetes, config_file, context).get("exec") is None:
        return  # a static token: the hook only sets it again
    lock = threading.Lock()  # several watch and log threads may find the token expired at once

    def bounded_refresh(client_configuration: Any) -> None:
        with lock:
            try:
                _bounded(lambda: refresh(client_configuration), f"{where} to renew the token", plugin)
            finally:  # the client's hook sets itself again each time it runs: ours comes first
                client_configuration.refresh_api_key_hook = bounded_refresh

    configuration.refresh_api_key_hook = bounded_refresh


def _bounded(call: Callable[[], Any], where: str, plugin: Callable[[], str]) -> None:
    """Run ``call`` (which may run the credential plugin) with a time limit; what the client only
    logs about the plugin, and what it raises, become one EngineError starting with ``where``."""
    root = logging.getLogger()
    captured = _Captured()
    quiet = logging.NullHandler()  # a handler on root: logging.error() will not add a stderr one
    root.addFilter(captured)
    root.addHandler(quiet)
    outcome: list[BaseException | None] = []
    since = _ticks_now()

    def run() -> None:
        try:
            call()
            outcome.append(None)
        except BaseException as err:  # handed to the caller's thread
            outcome.append(err)

    try:
        interactive = hasattr(sys.stdout, "isatty") and sys.stdout.isatty()
        limit = EXEC_TIMEOUT_INTERACTIVE if interactive else EXEC_TIMEOUT
        loader = threading.Thread(target=run, name="torchjob-credentials", daemon=True)
        loader.start()
        loader.join(limit)
        if loader.is_alive():
            for pid in _children_since(since):  # the plugin: a child started by this call
                with contextlib.suppress(OSError):  # it ended meanwhile
                    os.kill(pid, signal.SIGKILL)
            loader.join(5.0)
            raise EngineError(f"{where}: its credential plugin ({plugin()}) did not answer within {limit:g}s")
    finally:
        root.removeFilter(captured)
        root.removeHandler(quiet)
    err = outcome[0] if outcome else None
    if err is not None and not isinstance(err, Exception):
        raise err  # KeyboardInterrupt, SystemExit
    if captured.messages:
        message = "; ".join(m.strip() for m in captured.messages if m.strip()) or "no reason given"
        raise EngineError(f"{where}: its credential plugin ({plugin()}) failed: {message}")
    if err is not None:  # the loader raises ConfigException, ValueError, yaml errors
        raise EngineError(f"{where}: {err}") from None


def _user(kubernetes: Any, config_file: str, context: str | None) -> dict[str, Any]:
    """The ``user`` entry of the context's user ({} when it cannot be read)."""
    try:
        contexts, current = kubernetes.config.list_kube_config_contexts(config_file)
        chosen = next((c for c in contexts if c.get("name") == context), None) if context else current
        name = ((chosen or {}).get("context") or {}).get("user")
        merged = kubernetes.config.kube_config.KubeConfigMerger(config_file).config
        user = merged["users"].get_with_name(name)["user"].value
        return user if isinstance(user, dict) else {}
    except Exception:  # the kubeconfig was read once already: this is for messages and choices
        return {}


def _plugin(kubernetes: Any, config_file: str, context: str | None) -> str:
    """The exec command of the context's user, for messages."""
    return str((_user(kubernetes, config_file, context).get("exec") or {}).get("command") or "exec")


def _ticks_now() -> int:
    """Now, in the clock ticks since boot that a process's start time is given in."""
    try:
        return procfs.ticks_now()
    except (OSError, ValueError):
        return 1 << 62  # no /proc: nothing is killed


def _children_since(ticks: int) -> set[int]:
    """This process's children started at ``ticks`` or later (Linux /proc; none elsewhere)."""
    me = str(os.getpid()).encode()
    found: set[int] = set()
    try:
        pids = procfs.pids()
    except OSError:
        return found
    for pid in pids:
        try:
            fields = procfs.stat_fields(pid)
        except (OSError, ValueError):
            continue
        if len(fields) > 19 and fields[1] == me and int(fields[19]) >= ticks - 1:  # ppid, start
            found.add(pid)
    return found
