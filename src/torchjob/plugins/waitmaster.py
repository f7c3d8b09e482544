"""The shell script of the ``wait-for-master`` init container.

The script runs as ``sh -c SCRIPT`` in whatever image the user picked, so it is plain POSIX sh
(busybox ash, dash and bash all run it the same way) apart from one deliberate bash-only branch.
It waits until the master's TCP port accepts a connection, not merely until its name resolves,
and it never hangs: every probe is bounded in time, and an image with no way to probe fails at
once with a message saying so.

Volcano's own script (``nc -z HOST PORT || echo > /dev/tcp/HOST/PORT``) never succeeds with
Debian's busybox, whose ``nc`` has no ``-z``, and ash has no ``/dev/tcp``; this one does.

Between polls the script naps ``TORCHJOB_WAIT_INTERVAL`` seconds, and a nudge wakes it: SIGWINCH
sent to its shell (that pid, the container's main process) ends the nap at once and it polls
again, so whoever can see the master's port open (the local engine) may let it poll slowly. The
trap kills the nap's ``sleep`` itself, so a nudge that lands between the nap's last look at the
count and its ``wait`` is not lost; a ``wait`` ended by SIGWINCH is waited again (bash 5 may end
one with an earlier nudge). A nudge that comes during a poll skips the next nap; one that comes
before the trap is set is ignored, as shells ignore SIGWINCH. A nudge never ends the script,
prints nothing, leaves no ``sleep`` behind and moves neither the timeout nor the progress lines.

Every value put into the script is validated first and shell-quoted anyway.
"""

from __future__ import annotations

import re
import shlex

INTERVAL_ENV = "TORCHJOB_WAIT_INTERVAL"
UIDS_ENV = "TORCHJOB_JOB_UIDS"  # the local engine's, on the machine's network: whose listener counts
DEFAULT_INTERVAL = 0.5
PROBE_LIMIT = 2  # seconds one probe may take before it is killed
REPORT_EVERY = 5  # seconds between "not ready yet" lines

_HOST_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_INTERVAL_RANGE = (0.01, 60.0)

# Doubled braces are literal braces for str.format; {host} and friends are filled in.
_TEMPLATE = r"""# A nudge (SIGWINCH, ignored until now) wakes the nap between polls: the trap counts it and
# ends the nap's sleep, if one runs (nap_pid), so the nap ends wherever the nudge lands: before its
# `wait` starts, in it, or after it. nap() compares the count, so one that comes during a probe
# still ends the next nap. (nap_pid is set here first: a value from the environment is no pid.)
nudges=0 heard=0 nap_pid=
trap 'nudges=$((nudges + 1)); [ -z "$nap_pid" ] || kill "$nap_pid" 2>/dev/null' WINCH
# Command substitutions are written with backquotes: bash 5.2 parses a $(...) again each time it
# expands it, and a trap that runs meanwhile fails to parse ("unexpected EOF") and says so on stderr.
host={host}
port={port}
timeout={timeout}
interval="${{{interval_env}:-{interval}}}"
limit={limit}
say() {{ echo "wait-for-master: $*"; }}
fail() {{ echo "wait-for-master: $*" >&2; exit 1; }}

# Pick a probe once. nc comes first: the busybox image has it and no bash. Without nc, bash's
# /dev/tcp connects by itself; $BASH names the running bash even when it was started as "sh".
if command -v nc >/dev/null 2>&1; then
  method=nc
elif [ -n "${{BASH_VERSION:-}}" ] && [ -x "${{BASH:-}}" ]; then
  method=bash bash_bin=$BASH
elif command -v bash >/dev/null 2>&1; then
  method=bash bash_bin=`command -v bash`
else
  fail "cannot probe $host:$port: the image has neither nc nor bash (busybox has nc; pick such an image)"
fi
# Without these the loop would spin or never see the deadline, so refuse to start instead.
for tool in sleep date; do
  command -v "$tool" >/dev/null 2>&1 || fail "cannot wait for $host:$port: the image has no '$tool' command"
done

# Where the engine names the job's uids (the local engine: every job shares this machine's ports),
# a listener on the port counts only if it is one of the job's: another user who listens there
# first is not the master. /proc/net/tcp and tcp6 give each listening socket's uid (field 8).
uids="${{{uids_env}:-}}"
hexport={hexport}
# A shell's `read` takes a file one byte at a time, and each byte of /proc/net/tcp is a system call
# that walks the kernel's socket table: tens of ms a pass on a busy machine, CPU taken from the
# master while it starts (bash's `read` is worse: it reads ahead and seeks back after each line, so
# the kernel walks the table again for every row, half a second for 400 rows). With a cat, one read
# takes both tables, and only rows naming the port are split (by the shell, without `read`);
# without one, bash reads each table whole itself (`< FILE` in a command substitution: bash only).
command -v cat >/dev/null 2>&1 && cat=cat || cat=
row() {{  # one row of a table: sl laddr raddr st queues timer retr uid ...
  [ "$4" = 0A ] || return 0
  case $2 in *:"$hexport") ;; *) return 0 ;; esac
  case " $uids " in
  *" $8 "*) [ "$state" = 2 ] || state=0 ;;
  *) state=2 foreign=$8 ;;
  esac
}}
owner() {{
  [ -n "$uids" ] || return 0
  state=1 tables=
  for table in /proc/net/tcp /proc/net/tcp6; do
    [ -r "$table" ] && tables="$tables $table"
  done
  [ -n "$tables" ] || return 0  # no /proc to read (not Linux, or hidden): cannot tell
  if [ -n "$cat" ]; then
    rows=`"$cat" $tables 2>/dev/null` || return 1
  elif [ -n "${{BASH_VERSION:-}}" ]; then
    rows=
    for table in $tables; do
      part=`< $table` && rows="$rows
$part"
    done
  else
    for table in $tables; do
      while read -r sl laddr raddr st queues timer retr uid rest; do
        row "$sl" "$laddr" "$raddr" "$st" "$queues" "$timer" "$retr" "$uid"
      done <"$table"
    done
    return "$state"
  fi
  case $rows in *:"$hexport "*) ;; *) return 1 ;; esac  # nothing on the port: the usual poll
  set -f
  IFS='
'
  for line in $rows; do
    case $line in *:"$hexport "*) IFS=' ' && row $line ;; esac
  done
  unset IFS
  set +f
  return "$state"
}}

# Whole seconds of a clock that only moves forward: the seconds since boot where /proc/uptime can
# be read (no process per poll), else date.
if read -r now _ 2>/dev/null </proc/uptime && [ -n "${{now%%.*}}" ]; then
  clock() {{
    read -r now _ </proc/uptime || fail "cannot read the clock (/proc/uptime)"
    now=${{now%%.*}}
  }}
else
  clock() {{ now=`date +%s`; }}
fi

# Wait until child $1 has ended; its own status in $reaped. A nudge ends a `wait` early with
# 128 + SIGWINCH's number, and so may one that came just after an earlier `wait` returned (bash 5
# keeps it and ends the next `wait` with it, though its trap has run): the child runs on, so wait
# again. No process ends by SIGWINCH (it is ignored unless caught), so that status is never its own.
reap() {{
  while :; do
    wait "$1"
    reaped=$?
    [ "$reaped" -gt 128 ] || return 0
    case `kill -l "$reaped" 2>/dev/null` in
    WINCH | SIGWINCH) ;;
    *) return 0 ;;
    esac
  done
}}

# Run "$@" for at most $limit seconds. `timeout` does it where it works (some old busybox builds
# want `timeout -t N`, so try it once); otherwise a background watchdog kills the probe. Stopped,
# the watchdog ends its own sleep: by its trap, or, when TERM came before the sleep's pid was
# known, once it is (a shell runs a trap between commands).
if timeout "$limit" true >/dev/null 2>&1; then
  bounded() {{ timeout "$limit" "$@"; }}
else
  bounded() {{
    "$@" &
    probe_pid=$!
    (
      stop= dog_nap=
      trap 'stop=1; [ -z "$dog_nap" ] || kill "$dog_nap"' TERM
      sleep "$limit" &
      dog_nap=$!
      [ -z "$stop" ] || kill "$dog_nap"
      wait "$dog_nap" && [ -z "$stop" ] && kill "$probe_pid"
    ) >/dev/null 2>&1 &
    dog_pid=$!
    reap "$probe_pid"
    kill "$dog_pid" 2>/dev/null
    return "$reaped"
  }}
fi

probe() {{
  case $method in
  nc)
    # -z (connect, send nothing, exit) is understood by OpenBSD nc, ncat and busybox's full nc.
    # Debian's busybox nc has no -z, and with stdin at EOF it stays connected until the server
    # hangs up; "-e true" makes it exit 0 the moment the connection is made.
    bounded nc -z -w 1 "$host" "$port" </dev/null >/dev/null 2>&1 ||
      bounded nc -w 1 "$host" "$port" -e true </dev/null >/dev/null 2>&1
    ;;
  bash)
    # bash opens /dev/tcp/HOST/PORT as a TCP connection; connect has no timeout of its own.
    bounded "$bash_bin" -c 'exec 3<>"/dev/tcp/$0/$1"' "$host" "$port" </dev/null >/dev/null 2>&1
    ;;
  esac
}}

# Sleep $1 seconds, or less: a nudge ends the nap at once (its trap kills the sleep), and one
# heard since the last nap means no nap at all. A `sleep` in the foreground would hold the trap
# until it ended; `wait` returns as soon as a trapped signal arrives. Status: the sleep's, 0 when
# nudged.
nap() {{
  [ "$nudges" = "$heard" ] || {{ heard=$nudges; return 0; }}
  sleep "$1" &
  nap_pid=$!
  [ "$nudges" = "$heard" ] || kill "$nap_pid" 2>/dev/null  # its trap ran before nap_pid was set
  reap "$nap_pid"
  nap_pid=
  [ "$nudges" = "$heard" ] || {{ heard=$nudges; return 0; }}
  return "$reaped"
}}

ready() {{
  owner
  owned=$?
  [ "$owned" = 0 ] && probe
}}

say "waiting up to ${{timeout}}s for $host:$port to accept TCP connections (probe: $method)"
clock
start=$now
next_report=$start
until ready; do
  clock
  # Whole seconds only: giving up once more than $timeout have passed waits at least $timeout.
  if [ "$timeout" -eq 0 ] || [ $((now - start)) -gt "$timeout" ]; then
    [ "$owned" != 2 ] || fail "timed out: port $port is held by a process of uid $foreign," \
      "not by this job (uids $uids), so it is not the master; the master cannot listen there either"
    fail "timed out: nothing accepted a TCP connection on $host:$port within ${{timeout}}s (probe: $method)"
  fi
  if [ "$owned" = 2 ] && [ -z "${{told:-}}" ]; then
    next_report=$now told=1  # said at once, the first time
  fi
  if [ "$now" -ge "$next_report" ]; then
    if [ "$owned" = 2 ]; then
      say "port $port is held by a process of uid $foreign, not by this job (uids $uids):" \
        "not the master, not connecting ($((now - start))s of ${{timeout}}s)"
    else
      say "$host:$port not ready yet ($((now - start))s of ${{timeout}}s)"
    fi
    next_report=$((now + {report_every}))
  fi
  # A sleep without fractions (or a bad interval) still polls every second.
  nap "$interval" 2>/dev/null || nap 1 2>/dev/null
done
clock
say "$host:$port is ready after $((now - start))s"
"""


def valid_host(host: str) -> bool:
    """An IP address, or a DNS name made of RFC 1123 labels (what the addressing layer yields)."""
    if not isinstance(host, str) or not host:
        return False
    import ipaddress  # here: only jobs that wait for their master need it (1 ms at start-up)

    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        pass
    labels = host.lower().split(".")
    return len(host) <= 253 and all(len(label) <= 63 and _HOST_LABEL.fullmatch(label) for label in labels)


def wait_for_master_script(
    host: str, port: int, timeout: int, interval: float = DEFAULT_INTERVAL, probe_limit: int = PROBE_LIMIT
) -> str:
    """The init container script that waits until ``host:port`` accepts a TCP connection.

    It gives up with exit code 1 once more than ``timeout`` seconds have passed (``0``: after one
    probe). Where ``TORCHJOB_JOB_UIDS`` is set (the local engine, on the machine's network) and
    /proc can be read, only a listener owned by one of those uids counts: it does not connect to
    anyone else's. It polls every ``interval`` seconds unless the environment variable
    ``TORCHJOB_WAIT_INTERVAL`` says otherwise (the local engine sets it lower). A probe still
    running after ``probe_limit`` seconds is killed and counts as failed.
    """
    if not valid_host(host):
        raise ValueError(f"host must be a DNS name or an IP address, got {host!r}")
    if not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535:
        raise ValueError(f"port must be an integer from 1 to 65535, got {port!r}")
    if not isinstance(timeout, int) or isinstance(timeout, bool) or timeout < 0:
        raise ValueError(f"timeout must be an integer >= 0, got {timeout!r}")
    low, high = _INTERVAL_RANGE
    if isinstance(interval, bool) or not isinstance(interval, (int, float)) or not low <= interval <= high:
        raise ValueError(f"interval must be a number of seconds from {low} to {high}, got {interval!r}")
    if not isinstance(probe_limit, int) or isinstance(probe_limit, bool) or probe_limit < 1:
        raise ValueError(f"probe_limit must be an integer >= 1, got {probe_limit!r}")
    return _TEMPLATE.format(
        host=shlex.quote(host),
        port=port,
        timeout=timeout,
        interval_env=INTERVAL_ENV,
        uids_env=UIDS_ENV,
        hexport=f"{port:04X}",  # as /proc/net/tcp writes a local port
        interval=f"{interval:.2f}".rstrip("0").rstrip("."),  # digits and a dot only
        limit=probe_limit,
        report_every=REPORT_EVERY,
    )
