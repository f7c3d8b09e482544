"""The shell script of the ``wait-for-master`` init container.

It must work in the images users really pick: busybox (``sh`` is ash, ``nc`` has no ``-z``), an
image with only ``bash`` (``/dev/tcp``), and it must fail fast and clearly where neither exists,
never hang. It probes the master's TCP port, not only its DNS name, and polls every
``TORCHJOB_WAIT_INTERVAL`` seconds (0.5 by default; the local engine sets it lower).

Every value put into the script is validated first and shell-quoted anyway.
"""

from __future__ import annotations

import shlex

DEFAULT_INTERVAL = "0.5"

_TEMPLATE = r"""host={host}
port={port}
timeout={timeout}
interval="${{TORCHJOB_WAIT_INTERVAL:-{interval}}}"
if command -v nc >/dev/null 2>&1; then
  method=nc
elif [ -n "${{BASH_VERSION:-}}" ]; then
  method=devtcp
elif command -v bash >/dev/null 2>&1; then
  method=bash
else
  echo "wait-for-master: cannot probe $host:$port: this image has neither nc nor bash" >&2
  exit 1
fi
if command -v timeout >/dev/null 2>&1; then limit="timeout 2"; else limit=""; fi
probe() {{
  case "$method" in
    nc) nc -z -w 1 "$host" "$port" </dev/null >/dev/null 2>&1 || nc -w 1 "$host" "$port" </dev/null >/dev/null 2>&1 ;;
    devtcp) (exec 3<>"/dev/tcp/$host/$port") >/dev/null 2>&1 ;;
    bash) $limit bash -c 'exec 3<>"/dev/tcp/$0/$1"' "$host" "$port" >/dev/null 2>&1 ;;
  esac
}}
echo "wait-for-master: waiting for $host:$port to accept connections (timeout ${{timeout}}s, probe: $method)"
start=$(date +%s)
tries=0
until probe; do
  elapsed=$(( $(date +%s) - start ))
  if [ "$elapsed" -ge "$timeout" ]; then
    echo "wait-for-master: timed out after ${{elapsed}}s: nothing accepts connections on $host:$port" >&2
    exit 1
  fi
  tries=$((tries + 1))
  if [ $((tries % 20)) -eq 1 ]; then
    echo "wait-for-master: $host:$port not ready yet (${{elapsed}}s of ${{timeout}}s)"
  fi
  sleep "$interval" 2>/dev/null || sleep 1
done
echo "wait-for-master: $host:$port is ready"
"""


def wait_for_master_script(host: str, port: int, timeout: int, interval: str = DEFAULT_INTERVAL) -> str:
    """The init container script that waits until ``host:port`` accepts a TCP connection."""
    if not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535:
        raise ValueError(f"port must be an integer from 1 to 65535, got {port!r}")
    if not isinstance(timeout, int) or isinstance(timeout, bool) or timeout < 0:
        raise ValueError(f"timeout must be an integer >= 0, got {timeout!r}")
    return _TEMPLATE.format(
        host=shlex.quote(host), port=port, timeout=timeout, interval=shlex.quote(interval).strip("'")
    )
