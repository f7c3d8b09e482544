"""Talking to Slurm: submit an allocation, read its state, run each pod attempt as a job step.

Every call runs a Slurm client with an argument list (never a shell) and a timeout; a failure is a
:class:`SlurmError` of one line: the client missing from PATH, Slurm's own refusal (``Invalid
partition name specified``), or a client that did not answer in time.

A pod attempt is one ``srun`` process on the controller's host: ``srun --jobid=J --nodelist=NODE
--ntasks=1 --exact ...`` creates a step of one task on the pod's node inside the allocation,
sized like the pod (``--exact``: a step gets only what it asks for, not every CPU the allocation
has on that node). ``srun`` relays the step's output and exits with its exit code, so polling the
process is polling the step. Terminating asks Slurm to signal the step (``scancel --signal=TERM
J.S``), and after the grace period kills it (``scancel J.S``), then the ``srun`` itself.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from pathlib import Path

from torchjob.records import field, record
from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from torchjob.engines.slurm.plan import Resources

TIMEOUT = 30.0  # seconds a Slurm client may take to answer (a busy controller is slow, not dead)
POLL = 0.1
# Job states after which the allocation is gone (squeue's and scontrol's long names).
FINAL_STATES = frozenset(
    {
        "BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL",
        "OUT_OF_MEMORY", "PREEMPTED", "TIMEOUT", "REVOKED", "SPECIAL_EXIT",
    }
)  # fmt: skip


class SlurmError(Exception):
    """A Slurm client failed; the message is one line for the user."""


def _one_line(text: str) -> str:
    """Slurm's message without the client's ``sbatch: error:`` prefixes, on one line."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    errors = [line for line in lines if "error" in line.lower()] or lines
    message = errors[-1] if errors else ""
    return re.sub(r"^(\w+: )?(error: |fatal: )+", "", message).strip()


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


def client(name: str) -> str:
    """The path of a Slurm client, or a SlurmError saying it is not installed here."""
    found = _which(name)
    if found is None:
        raise SlurmError(
            f"{name} is not on PATH: run torchjob on a Slurm login node (or install Slurm's clients)"
        )
    return found


def run(argv: list[str], env: Mapping[str, str] | None = None, timeout: float = TIMEOUT) -> str:
    """Run a Slurm client and return its output; a SlurmError of one line if it fails."""
    command = [client(argv[0]), *argv[1:]]
    try:
        done = subprocess.run(
            command,
            env=None if env is None else dict(env),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        raise SlurmError(f"{argv[0]} did not answer within {timeout:g} s (is slurmctld up?)") from None
    except OSError as err:
        raise SlurmError(f"cannot run {argv[0]}: {err.strerror or err}") from None
    if done.returncode != 0:
        message = _one_line(done.stderr or done.stdout) or f"exit code {done.returncode}"
        raise SlurmError(f"{argv[0]} failed: {message}")
    return done.stdout


def submit(args: list[str], script: Path, env: Mapping[str, str] | None = None) -> str:
    """``sbatch ARGS SCRIPT``; the job id (of the leader, for a heterogeneous job)."""
    parsable = args if "--parsable" in args else ["--parsable", *args]
    out = run(["sbatch", *parsable, str(script)], env)
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


def partition_nodes(name: str | None, env: Mapping[str, str] | None = None) -> int | None:
    """How many nodes a partition has (the default partition's without a name); None when Slurm
    does not say (no such partition: sbatch then says so in its own words)."""
    try:
        out = run(["scontrol", "show", "partition", "-o", *([name] if name else [])], env)
    except SlurmError:
        return None
    for line in out.splitlines():
        fields = parse_show(line.strip())
        if (name and fields.get("PartitionName") == name) or (not name and fields.get("Default") == "YES"):
            total = fields.get("TotalNodes", "")
            return int(total) if total.isdigit() else None
    return None


def _forgotten_is_empty(argv: list[str], env: Mapping[str, str] | None) -> str:
    """squeue's output; nothing for a job slurmctld no longer knows (it refuses the id)."""
    try:
        return run(argv, env)
    except SlurmError as err:
        if "Invalid job id" in str(err):
            return ""
        raise


def queue(job_id: str, env: Mapping[str, str] | None = None) -> list[tuple[str, str, str]]:
    """``squeue`` for one job: (job id, state, reason) per component; empty once it left the queue."""
    out = _forgotten_is_empty(["squeue", "-h", "-j", job_id, "-o", "%i|%T|%r"], env)
    rows = []
    for line in out.splitlines():
        parts = line.strip().split("|")
        if len(parts) == 3:
            rows.append((parts[0], parts[1], parts[2]))
    return rows


def steps(job_id: str, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The job's running steps: step id (``12.3``) -> step name (batch and extern included).

    ``job_id`` may list several ids (``12,13``): squeue shows a heterogeneous job's steps under
    each component's own job id, so asking for the leader alone misses the other components'.
    """
    out = _forgotten_is_empty(["squeue", "-h", "-s", "-j", job_id, "-o", "%i|%j"], env)
    found = {}
    for line in out.splitlines():
        step, _, name = line.strip().partition("|")
        if step:
            found[step] = name
    return found


def component_ids(job_id: str, env: Mapping[str, str] | None = None) -> str:
    """Every job id of a job's components (``12,13``; just ``12`` unless heterogeneous), from
    squeue; the id itself once the job left the queue."""
    rows = _forgotten_is_empty(["squeue", "-h", "-j", job_id, "-o", "%A"], env).split()
    return ",".join(dict.fromkeys([job_id, *rows]))


def component_ids_from_env(environ: Mapping[str, str]) -> str:
    """Inside the allocation: every component's job id, as Slurm tells the batch script."""
    size = int(environ.get("SLURM_HET_SIZE", "0") or 0)
    ids = [environ.get(f"SLURM_JOB_ID_HET_GROUP_{k}", "") for k in range(size)]
    return ",".join(dict.fromkeys(i for i in [environ["SLURM_JOB_ID"], *ids] if i))


def cancel(job_id: str, env: Mapping[str, str] | None = None, *, signal_name: str | None = None) -> None:
    """``scancel`` a job or a step (``12.3``); with ``signal_name``, only signal it."""
    argv = ["scancel"]
    if signal_name is not None:
        argv.append(f"--signal={signal_name}")
        if "." not in job_id:
            argv.append("--full")  # the batch step's processes too, not only the other steps
    run([*argv, job_id], env)


def hostnames(nodelist: str, env: Mapping[str, str] | None = None) -> list[str]:
    """A Slurm node list (``node[1-3,7]``) as host names.

    A list without ranges (``node1,node2``) is split here: the controller asks this before its
    first pod starts, and ``scontrol`` would cost a process start on that path.
    """
    if "[" not in nodelist:
        return [name for name in nodelist.split(",") if name]
    return run(["scontrol", "show", "hostnames", nodelist], env).split()


def layout_from_env(
    environ: Mapping[str, str], expand_nodes: Callable[[str], list[str]]
) -> dict[int, list[tuple[str, int]]]:
    """Each component's nodes and tasks per node, as Slurm tells the batch script."""
    from torchjob.engines.slurm.plan import tasks_per_node

    size = int(environ.get("SLURM_HET_SIZE", "0") or 0)
    suffixes = [f"_HET_GROUP_{k}" for k in range(size)] if size else [""]
    layouts = {}
    for k, suffix in enumerate(suffixes):
        nodelist = environ.get(f"SLURM_JOB_NODELIST{suffix}") or environ.get(f"SLURM_NODELIST{suffix}")
        counts = environ.get(f"SLURM_TASKS_PER_NODE{suffix}")
        if not nodelist or not counts:
            raise SlurmError(f"Slurm did not say where component {k} runs (SLURM_JOB_NODELIST{suffix})")
        hosts = expand_nodes(nodelist)
        per_node = tasks_per_node(counts)
        if len(hosts) != len(per_node):
            raise SlurmError(f"component {k}: {len(hosts)} nodes but tasks for {len(per_node)}")
        layouts[k] = list(zip(hosts, per_node, strict=True))
    return layouts


# srun's line for a task that ended (``srun: error: node1: task 0: Exited with exit code 3``).
_TASK_ENDED = r"^srun: error: \S+: tasks? [0-9,-]+: (Exited with exit code \d+|Terminated|Killed)$"


class Step:
    """One pod container running as a job step, through its ``srun`` process."""

    def __init__(
        self, job_id: str, name: str, process: subprocess.Popen[bytes], env: Mapping[str, str]
    ) -> None:
        self.job_id = job_id
        self.name = name
        self.process = process
        self.env = dict(env)
        self.step_id: str | None = None
        self.messages_at: tuple[Path, int] | None = None  # srun's own messages: file, offset
        self.listed = job_id  # the job ids under which squeue lists its step (all components')

    @classmethod
    def start(
        cls,
        job_id: str,
        name: str,
        argv: list[str],
        *,
        host: str,
        resources: Resources,
        env: Mapping[str, str],
        log: Path,
        component: int | None = None,
        working_dir: str | None = None,
        image: str | None = None,
        listed: str | None = None,
    ) -> Step:
        """Start ``argv`` as a step of one task on ``host``; its output goes to ``log``.

        ``env`` is the step's whole environment: srun passes it on (``--export=ALL``), and reads
        its own settings from it too, so it should be the controller's environment plus the pod's.
        """
        srun = [client("srun"), f"--jobid={job_id}"]
        if component is not None:
            srun.append(f"--het-group={component}")
        srun += [
            f"--job-name={name}",
            f"--nodelist={host}",
            "--nodes=1",
            "--ntasks=1",
            "--exact",
            *resources.step_args(),
            "--kill-on-bad-exit=1",
            "--quiet",
        ]
        if working_dir:
            srun.append(f"--chdir={working_dir}")
        if image:
            srun.append(f"--container-image={image}")
        # The task's output goes to the container's log from its node (slurmstepd appends to it);
        # srun's own messages (``task 0: Exited with exit code 3``) to a file beside it, so the log
        # holds what the program wrote, as locally. A path with % (srun's patterns) is relayed.
        own = log.with_name(log.name + ".srun")
        direct = "%" not in str(log)
        if direct:
            srun += [f"--output={log}", f"--error={log}", "--open-mode=append"]
        with open(log, "ab") as out, open(own if direct else log, "ab") as messages:
            offset = messages.tell()
            process = subprocess.Popen(
                [*srun, "--", *argv],
                env=dict(env),
                stdin=subprocess.DEVNULL,
                stdout=messages if direct else out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a Ctrl-C of the controller's terminal is the controller's to handle
            )
        step = cls(job_id, name, process, env)
        step.messages_at = (own, offset) if direct else None
        step.listed = listed or job_id
        return step

    def messages(self) -> list[str]:
        """What srun itself said about the step (not the program's output), once it ended:
        lines other than those that only restate how the task ended (its exit code is told anyway)."""
        if self.messages_at is None:
            return []
        path, offset = self.messages_at
        try:
            with open(path, "rb") as handle:
                handle.seek(offset)
                text = handle.read(64 * 1024).decode("utf-8", "replace")
        except OSError:
            return []
        return [line for line in text.splitlines() if line.strip() and not re.search(_TASK_ENDED, line)]

    def poll(self) -> int | None:
        """The step's exit code once it ended (128 + N if a signal N ended it), else None."""
        code = self.process.poll()
        if code is None:
            return None
        return 128 - code if code < 0 else code

    def wait(self, timeout: float) -> int | None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            code = self.poll()
            if code is not None:
                return code
            time.sleep(POLL)
        return self.poll()

    def find_step_id(self, timeout: float = 5.0) -> str | None:
        """The step's id (``J.S``), found by its name; None if it is not (or no longer) running."""
        if self.step_id is not None:
            return self.step_id
        deadline = time.monotonic() + timeout
        while True:
            for step, name in steps(self.listed, self.env).items():
                if name == self.name:
                    self.step_id = step
                    return step
            if self.poll() is not None or time.monotonic() >= deadline:
                return None
            time.sleep(POLL)

    def terminate(self, grace: float) -> int | None:
        """SIGTERM the step's task, SIGKILL it after ``grace`` seconds; its exit code (bounded)."""
        if self.poll() is not None:
            return self.poll()
        step = self.find_step_id()
        if step is not None:
            with contextlib.suppress(SlurmError):  # it ended meanwhile
                cancel(step, self.env, signal_name="TERM")
        else:
            self._signal_srun(signal.SIGTERM)
        code = self.wait(grace)
        if code is not None:
            return code
        if step is not None:
            with contextlib.suppress(SlurmError):
                cancel(step, self.env, signal_name="KILL")
        code = self.wait(10.0)
        if code is None:  # slurmctld does not answer: end srun itself (twice SIGINT kills the step)
            self._signal_srun(signal.SIGINT)
            self._signal_srun(signal.SIGINT)
            code = self.wait(5.0)
        if code is None:
            self._signal_srun(signal.SIGKILL)
            code = self.wait(5.0)
        return code

    def _signal_srun(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.process.pid, sig)


def jobcomp_state(job_id: str, env: Mapping[str, str] | None = None) -> str | None:
    """A finished job's state from the cluster's job completion file (``JobCompType=jobcomp/filetxt``),
    where slurmctld has forgotten the job and no accounting answers; None when it has no such file
    or the job is not in it."""
    config = {}
    for line in run(["scontrol", "show", "config"], env).splitlines():  # "Key   = value" lines
        key, sep, value = line.partition("=")
        if sep:
            config[key.strip()] = value.strip()
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
    except SlurmError:
        pass  # no accounting on this cluster (or no sacct): the completion file may know
    return jobcomp_state(job_id, env)
