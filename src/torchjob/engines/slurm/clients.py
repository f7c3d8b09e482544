"""The Slurm clients: submit an allocation, ask what Slurm knows of it, signal and cancel it.

Every call runs a client with an argument list (never a shell) and a timeout; a failure is a
:class:`SlurmError` of one line: the client missing from PATH, Slurm's own refusal (``Invalid
partition name specified``), or a client that did not answer in time.

**Outages.** A client that cannot reach slurmctld retries inside itself for about
``MessageTimeout`` seconds (10 by default, 19 s seen with 20) before it says ``Unable to contact
slurm controller``; ``scontrol ping`` says it at once. Such a failure is a
:class:`SlurmUnreachable`, and for :data:`OUTAGE_MEMORY` seconds after one every call first asks
``scontrol ping`` (a few milliseconds): while slurmctld is down each call fails at once instead of
after its own retries. :func:`retrying` calls again with back-off for the callers that must get
through (stopping a step, starting one).
"""

from __future__ import annotations

import os
import re
import subprocess
import time

from torchjob import logs
from torchjob.records import field, record
from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import TypeVar

    T = TypeVar("T")

TIMEOUT = 30.0  # seconds a Slurm client may take to answer (a busy controller is slow, not dead)
PING_TIMEOUT = 10.0
OUTAGE_MEMORY = 120.0  # seconds after an unreachable slurmctld during which calls ping it first
# Job states after which the allocation is gone (squeue's and scontrol's long names).
FINAL_STATES = frozenset(
    {
        "BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL",
        "OUT_OF_MEMORY", "PREEMPTED", "TIMEOUT", "REVOKED", "SPECIAL_EXIT",
    }
)  # fmt: skip
# What a client says when slurmctld does not answer (compiled on first use).
UNREACHABLE = (
    r"Unable to contact slurm controller|Socket timed out on send/recv|Zero Bytes were transmitted"
    r"|Slurm backup controller in standby mode|Communication connection failure"
)
# Environment variables by which a Slurm client takes options (SBATCH_PARTITION, SLURM_MEM_PER_CPU,
# SRUN_CPUS_PER_TASK, ...): inside an allocation Slurm sets many of them from the allocation's own
# options, so a step started from there would inherit them. Only SLURM_CONF (which cluster) stays.
_INPUT_PREFIXES = ("SLURM_", "SBATCH_", "SALLOC_", "SRUN_", "SQUEUE_", "SCANCEL_", "SCONTROL_")
_KEPT = frozenset({"SLURM_CONF"})

_down_at: list[float] = []  # when slurmctld was last found unreachable (monotonic), at most one


class SlurmError(Exception):
    """A Slurm client failed; the message is one line for the user."""


class SlurmUnreachable(SlurmError):
    """slurmctld did not answer: the call may succeed later; nothing is known of the job."""


def _one_line(text: str) -> str:
    """Slurm's message without the client's ``sbatch: error:`` prefixes, on one line: the last
    error, or the first line of a refusal that says none (``unrecognized option``), never the
    ``Try "sbatch --help"`` hint after it."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    lines = [line for line in lines if not line.startswith("Try ")] or lines
    errors = [line for line in lines if "error" in line.lower() or "fatal" in line.lower()]
    message = errors[-1] if errors else (lines[0] if lines else "")
    return re.sub(r"^(\S*/)?[\w-]+: ((error|fatal): )*", "", message).strip()


def _which(name: str) -> str | None:
    """``shutil.which`` for a command name on POSIX, without importing shutil (and with it bz2 and
    lzma): the controller looks up ``srun`` on the way to its first pod."""
    if os.sep in name:
        return name if os.access(name, os.X_OK) and not os.path.isdir(name) else None
    path = os.environ.get("PATH")
    if path is None:
        path = os.confstr("CS_PATH") or os.defpath
    for folder in path.split(os.pathsep) if path else []:
        found = os.path.join(folder, name)
        if os.access(found, os.X_OK) and not os.path.isdir(found):
            return found
    return None


def installed(name: str) -> bool:
    """Whether a Slurm client is on PATH."""
    return _which(name) is not None


def client(name: str) -> str:
    """The path of a Slurm client, or a SlurmError saying it is not installed here."""
    found = _which(name)
    if found is None:
        raise SlurmError(
            f"{name} is not on PATH: run torchjob on a Slurm login node (or install Slurm's clients)"
        )
    return found


def step_env(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` without the variables a Slurm client reads as its options (but SLURM_CONF): what
    an ``srun`` started from inside an allocation passes on, so that a step gets what its pod asks
    for and nothing of the allocation's own options (its ``--mem-per-cpu``, ``--ntasks``, ...)."""
    return {k: v for k, v in environ.items() if k in _KEPT or not k.startswith(_INPUT_PREFIXES)}


def check_config(environ: Mapping[str, str]) -> None:
    """A SlurmError of one line for a configuration no client can read: ``SLURM_CONF`` set but
    empty, or naming no file (every client would retry reading it for a minute first)."""
    if "SLURM_CONF" not in environ:
        return  # /etc/slurm/slurm.conf, or configless: the clients find it, or say so at once
    conf = environ["SLURM_CONF"]
    if not conf.strip():
        raise SlurmError("SLURM_CONF is set but empty: unset it, or set it to the cluster's slurm.conf")
    if not os.path.isfile(conf):
        raise SlurmError(f"SLURM_CONF={conf} names no file: set it to the cluster's slurm.conf")
    if not os.access(conf, os.R_OK):
        raise SlurmError(f"SLURM_CONF={conf} cannot be read by you: set it to a slurm.conf you can read")


def down_recently() -> bool:
    """Whether slurmctld was found unreachable in the last OUTAGE_MEMORY seconds (by this process)."""
    return bool(_down_at) and time.monotonic() - _down_at[0] < OUTAGE_MEMORY


def note_down() -> None:
    """slurmctld was found unreachable (by a call, or by an srun that said so)."""
    _down_at[:] = [time.monotonic()]


def ping(env: Mapping[str, str] | None = None, timeout: float = PING_TIMEOUT) -> str | None:
    """None when slurmctld answers (``scontrol ping``, a few milliseconds either way), else what
    ``scontrol ping`` says of it on one line."""
    try:
        done = subprocess.run(
            [client("scontrol"), "ping"],
            env=None if env is None else dict(env),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # as every client (run): a Ctrl-C at the terminal is torchjob's
        )
    except subprocess.TimeoutExpired:
        note_down()
        return f"scontrol ping did not answer within {timeout:g} s"
    except OSError as err:
        raise SlurmError(f"cannot run scontrol: {err.strerror or err}") from None
    said = [line.strip() for line in done.stdout.splitlines() if line.strip().startswith("Slurmctld")]
    if any(line.endswith(" is UP") for line in said):
        return None
    if not said:  # not a controller's state: a configuration error, said as the client says it
        raise SlurmError(f"scontrol ping failed: {_one_line(done.stderr or done.stdout) or 'no answer'}")
    note_down()
    return "; ".join(said)


def unreachable_message(said: str) -> str:
    return f"Slurm does not answer ({said}): is slurmctld up?"


def run(
    argv: list[str],
    env: Mapping[str, str] | None = None,
    timeout: float = TIMEOUT,
    *,
    controller: bool = True,
) -> str:
    """Run a Slurm client and return its output; a SlurmError of one line if it fails, a
    SlurmUnreachable when slurmctld does not answer. ``controller``: the client asks slurmctld (so,
    soon after an outage, slurmctld is pinged first). ``timeout``: for the whole call, that ping
    included."""
    given = timeout
    if controller and down_recently():
        began = time.monotonic()
        said = ping(env, min(PING_TIMEOUT, timeout))
        if said is not None:
            raise SlurmUnreachable(f"{argv[0]}: {unreachable_message(said)}")
        timeout = max(timeout - (time.monotonic() - began), 0.5)
    return finish(start(argv, env), argv[0], timeout, told=given)


def start(argv: list[str], env: Mapping[str, str] | None = None) -> subprocess.Popen[str]:
    """A Slurm client started (its output for :func:`finish`); a SlurmError when it cannot be."""
    logs.debug("slurm: %s", " ".join(argv))
    try:
        return subprocess.Popen(
            [client(argv[0]), *argv[1:]],
            env=None if env is None else dict(env),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            # A session of its own: a Ctrl-C at the terminal (which signals the whole foreground
            # process group) must not end an sbatch half-way or the scancel a first Ctrl-C started.
            start_new_session=True,
        )
    except OSError as err:
        raise SlurmError(f"cannot run {argv[0]}: {err.strerror or err}") from None


def finish(proc: subprocess.Popen[str], name: str, timeout: float, told: float | None = None) -> str:
    """The output of a client :func:`start` started, within ``timeout`` (``told``: the time said
    when it is over); else it is killed and a SlurmUnreachable raised."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        note_down()
        said = timeout if told is None else told
        raise SlurmUnreachable(f"{name} did not answer within {said:g} s (is slurmctld up?)") from None
    except BaseException:  # a Ctrl-C: the client goes with the call, as subprocess.run has it
        proc.kill()
        proc.wait()
        raise
    return checked(name, proc.returncode, out, err)


def checked(name: str, code: int, out: str, err: str) -> str:
    """A client's output, or the SlurmError (SlurmUnreachable) its exit says (:func:`run`'s)."""
    if code != 0:
        message = _one_line(err or out) or f"exit code {code}"
        if re.search(UNREACHABLE, message):
            note_down()
            raise SlurmUnreachable(f"{name} failed: {message}")
        if "Could not establish a configuration source" in message:
            raise SlurmError(
                f"{name} found no Slurm configuration: set SLURM_CONF to the cluster's slurm.conf "
                "(or run torchjob on a node of the cluster)"
            )
        raise SlurmError(f"{name} failed: {message}")
    return out


def retrying(call: Callable[[], T], patience: float, on_retry: Callable[[str], None] | None = None) -> T:
    """``call()``, again with back-off (0.5 s doubling, at most 10 s apart) while slurmctld does not
    answer, for up to ``patience`` seconds; then its SlurmUnreachable."""
    deadline = time.monotonic() + patience
    delay = 0.5
    while True:
        try:
            return call()
        except SlurmUnreachable as err:
            if time.monotonic() + delay > deadline:
                raise
            if on_retry is not None:
                on_retry(str(err))
            time.sleep(delay)
            delay = min(delay * 2, 10.0)


def submit(args: list[str], script: str | os.PathLike[str], env: Mapping[str, str] | None = None) -> str:
    """``sbatch ARGS SCRIPT``; the job id (of the leader, for a heterogeneous job)."""
    parsable = args if "--parsable" in args else ["--parsable", *args]
    out = run(["sbatch", *parsable, os.fspath(script)], env)
    job_id = out.strip().split(";")[0]
    if not job_id.isdigit():
        raise SlurmError(f"sbatch printed no job id: {out.strip()[:200]!r}")
    return job_id


@record
class JobState:
    """Slurm's view of one job (each component, for a heterogeneous job)."""

    job_id: str
    state: str  # PENDING, RUNNING, COMPLETED, TIMEOUT, ...
    reason: str  # why pending (Resources, Priority, ...) or why it ended; "None" when none
    exit_code: int | None = None
    signal: int | None = None
    nodes: list[str] = field(default_factory=list)
    fields: dict[str, str] = field(default_factory=dict)

    @property
    def final(self) -> bool:
        return self.state in FINAL_STATES


# Patterns are compiled (and cached by re) on first use: not on the controller's way to its first pod.
_KEY = r"(?:^|\s)([A-Za-z][A-Za-z0-9_/:]*)="


def parse_show(line: str) -> dict[str, str]:
    """One ``scontrol show -o`` record: ``Key=value`` pairs (a value may contain spaces)."""
    matches = list(re.finditer(_KEY, line))
    result = {}
    for i, match in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(line)
        result[match.group(1)] = line[match.end() : end].strip()
    return result


def show_job(job_id: str, env: Mapping[str, str] | None = None) -> list[JobState] | None:
    """``scontrol show job``: one state per component; None once slurmctld forgot the job."""
    try:
        out = run(["scontrol", "show", "job", "-o", job_id], env)
    except SlurmError as err:
        if "Invalid job id" in str(err):
            return None
        raise
    states = []
    for line in out.splitlines():
        if not line.strip():
            continue
        record_ = parse_show(line)
        code, _, sig = record_.get("ExitCode", "").partition(":")
        states.append(
            JobState(
                job_id=record_.get("JobId", job_id),
                state=record_.get("JobState", "UNKNOWN"),
                reason=record_.get("Reason", "None"),
                exit_code=int(code) if code.isdigit() else None,
                signal=int(sig) if sig.isdigit() else None,
                nodes=[] if record_.get("NodeList", "(null)") == "(null)" else [record_["NodeList"]],
                fields=record_,
            )
        )
    return states


def partition(name: str | None, env: Mapping[str, str] | None = None) -> dict[str, str] | None:
    """``scontrol show partition``: a partition's fields (the default partition's without a name);
    None when Slurm does not say (no such partition: sbatch then says so in its own words)."""
    try:
        out = run(["scontrol", "show", "partition", "-o", *([name] if name else [])], env)
    except SlurmUnreachable:
        raise
    except SlurmError:
        return None
    for line in out.splitlines():
        fields = parse_show(line.strip())
        if (name and fields.get("PartitionName") == name) or (not name and fields.get("Default") == "YES"):
            return fields
    return None


def partition_nodes(name: str | None, env: Mapping[str, str] | None = None) -> int | None:
    """How many nodes a partition has (the default partition's without a name), or None."""
    fields = partition(name, env)
    total = (fields or {}).get("TotalNodes", "")
    return int(total) if total.isdigit() else None


def _forgotten_is_empty(argv: list[str], env: Mapping[str, str] | None, timeout: float = TIMEOUT) -> str:
    """squeue's output; nothing for a job slurmctld no longer knows (it refuses the id)."""
    try:
        return run(argv, env, timeout)
    except SlurmError as err:
        if "Invalid job id" in str(err):
            return ""
        raise


def queue(
    job_id: str, env: Mapping[str, str] | None = None, timeout: float = TIMEOUT
) -> list[tuple[str, str, str]]:
    """``squeue`` for one job: (job id, state, reason) per component; empty once it left the queue."""
    out = _forgotten_is_empty(["squeue", "-h", "-j", job_id, "-o", "%i|%T|%r"], env, timeout)
    rows = []
    for line in out.splitlines():
        parts = line.strip().split("|")
        if len(parts) == 3:
            rows.append((parts[0], parts[1], parts[2]))
    return rows


def steps(job_id: str, env: Mapping[str, str] | None = None, timeout: float = TIMEOUT) -> dict[str, str]:
    """The job's running steps: step id (``12.3``) -> step name (batch and extern included).

    ``job_id`` may list several ids (``12,13``): squeue shows a heterogeneous job's steps under
    each component's own job id, so asking for the leader alone misses the other components'.
    """
    out = _forgotten_is_empty(["squeue", "-h", "-s", "-j", job_id, "-o", "%i|%j"], env, timeout)
    found = {}
    for line in out.splitlines():
        step, _, name = line.strip().partition("|")
        if step:
            found[step] = name
    return found


def component_ids(job_id: str, env: Mapping[str, str] | None = None, timeout: float = TIMEOUT) -> str:
    """Every job id of a job's components (``12,13``; just ``12`` unless heterogeneous), from
    squeue; the id itself once the job left the queue."""
    rows = _forgotten_is_empty(["squeue", "-h", "-j", job_id, "-o", "%A"], env, timeout).split()
    return ",".join(dict.fromkeys([job_id, *rows]))


def component_ids_from_env(environ: Mapping[str, str]) -> str:
    """Inside the allocation: every component's job id, as Slurm tells the batch script."""
    size = int(environ.get("SLURM_HET_SIZE", "0") or 0)
    ids = [environ.get(f"SLURM_JOB_ID_HET_GROUP_{k}", "") for k in range(size)]
    return ",".join(dict.fromkeys(i for i in [environ["SLURM_JOB_ID"], *ids] if i))


def cancel(
    job_id: str,
    env: Mapping[str, str] | None = None,
    *,
    signal_name: str | None = None,
    timeout: float = TIMEOUT,
) -> None:
    """``scancel`` a job or a step (``12.3``); with ``signal_name``, only signal it."""
    argv = ["scancel"]
    if signal_name is not None:
        argv.append(f"--signal={signal_name}")
        if "." not in job_id:
            argv.append("--full")  # the batch step's processes too, not only the other steps
    run([*argv, job_id], env, timeout)


def hostnames(nodelist: str, env: Mapping[str, str] | None = None) -> list[str]:
    """A Slurm node list (``node[1-3,7]``) as host names.

    A list without ranges (``node1,node2``) is split here: the controller asks this before its
    first pod starts, and ``scontrol`` would cost a process start on that path.
    """
    if "[" not in nodelist:
        return [name for name in nodelist.split(",") if name]
    return run(["scontrol", "show", "hostnames", nodelist], env, controller=False).split()


def parse_config(text: str) -> dict[str, str]:
    """``scontrol show config``'s ``Key = value`` lines as a mapping. Lines that are no such pair
    (its heading ``Configuration data as of ...``, a section's title, the closing ``Slurmctld(primary)
    at HOST is UP``) are skipped; a value keeps any ``=`` of its own (``bf_interval=1``); a key
    met twice (a plugin's section repeating one) keeps its first value."""
    config: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        key = key.strip()
        if sep and key and not any(c.isspace() for c in key):
            config.setdefault(key, value.strip())
    return config


def show_config(env: Mapping[str, str] | None = None, timeout: float = TIMEOUT) -> dict[str, str]:
    """The running cluster's configuration as slurmctld has it (``scontrol show config``)."""
    return parse_config(run(["scontrol", "show", "config"], env, timeout))


def jobcomp_state(job_id: str, env: Mapping[str, str] | None = None) -> str | None:
    """A finished job's state from the cluster's job completion file (``JobCompType=jobcomp/filetxt``),
    where slurmctld has forgotten the job and no accounting answers; None when it has no such file
    or the job is not in it."""
    config = show_config(env)
    location = config.get("JobCompLoc", "")
    if "filetxt" not in config.get("JobCompType", "") or not location.startswith("/"):
        return None
    state = None
    try:
        with open(location, encoding="utf-8", errors="replace") as handle:
            for line in handle:
                if f"JobId={job_id} " in line:
                    state = parse_show(line.strip()).get("JobState") or state
    except OSError:
        return None
    return state


def final_state(job_id: str, env: Mapping[str, str] | None = None) -> str | None:
    """How a job ended, once it left the queue: ``scontrol show job``, else ``sacct``, else the job
    completion file; None when none of them knows (the reason is then unknown, not guessed)."""
    shown = show_job(job_id, env)
    if shown:
        return shown[0].state
    try:
        out = run(["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State"], env)
        words = out.split()
        if words:
            return words[0]
    except SlurmUnreachable:
        raise
    except SlurmError:
        pass  # no accounting on this cluster (or no sacct): the completion file may know
    return jobcomp_state(job_id, env)
