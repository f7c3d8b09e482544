"""Each pod attempt's containers as job steps: one ``srun`` per step, started on the batch host.

``srun --jobid=J --nodelist=NODE --ntasks=1 --exact ...`` creates a step of one task on the pod's
node inside the allocation, sized like the pod (``--exact``: a step gets only what it asks for,
not every CPU the allocation has on that node). ``srun`` exits with the step's exit code, so
polling the process is polling the step. Terminating asks Slurm to signal the step (``scancel
--signal=TERM J.S``), and after the grace period kills it (``scancel --signal=KILL``), then the
``srun`` itself.

**Outages.** A step is created by slurmctld: an ``srun`` that could not reach it (``Unable to
confirm allocation``/``Unable to create step`` with ``Unable to contact slurm controller``) never
started the program, so the step is started again with back-off (:data:`OUTAGE_PATIENCE` at
most) instead of ending as a failed container. A running step needs no slurmctld and runs on. A
step to stop while slurmctld is down is signalled once it answers again: the ``scancel`` is
retried with back-off, never given up silently; only past :data:`OUTAGE_PATIENCE` is the ``srun``
itself killed.

The Slurm calls themselves are in :mod:`clients` (re-exported here for the controller's runtime).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import threading
import time
from pathlib import Path

from torchjob.engines.slurm import clients
from torchjob.engines.slurm.clients import SlurmError as SlurmError
from torchjob.engines.slurm.clients import SlurmUnreachable
from torchjob.engines.slurm.clients import component_ids_from_env as component_ids_from_env
from torchjob.engines.slurm.clients import hostnames as hostnames
from torchjob.engines.slurm.clients import steps as steps
from torchjob.engines.slurm.limits import STEP_LIMIT
from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from torchjob.engines.slurm.plan import Resources

POLL = 0.1
OUTAGE_PATIENCE = 600.0  # seconds a step start or stop waits for slurmctld to answer again
KILL_WAIT = 10.0  # seconds Slurm has to end a step after scancel --signal=KILL
# srun's line for a task that ended: ``srun: error: node1: task 0: Exited with exit code 3``, or
# the signal's name as strsignal(3) gives it (``Aborted (core dumped)``, ``Segmentation fault``).
# Kept out of the container's log, as the local engine writes nothing of how a process ended: the
# exit code (134: SIGABRT) is the pod's, in status and the job's reason; the line stays in the
# ``.srun`` file beside the log.
_SIGNALLED = "|".join(sorted({re.escape(signal.strsignal(s) or "") for s in signal.valid_signals()} - {""}))
_TASK_ENDED = (
    rf"^srun: error: \S+: tasks? [0-9,-]+: (Exited with exit code \d+|({_SIGNALLED})( \(core dumped\))?)$"
)
# srun's words for a step it could not create because slurmctld did not answer.
_NOT_CREATED = r"Unable to (confirm allocation|create step)"


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


def output_pattern(name: str) -> str | None:
    """A log's file name, in srun's directory, as srun's ``--output`` takes it: a file name
    pattern, where ``%%`` is a ``%`` (``%j`` would be the job id), led by ``./`` since a pattern
    that begins with ``all`` or ``-`` means srun's own output and a number one task's. None where
    no pattern names it: srun drops every backslash of a pattern, a doubled one too."""
    return None if "\\" in name else "./" + name.replace("%", "%%")


def _append(path: Path, text: str) -> None:
    """torchjob's own line in a container's log; lost, not fatal, when the disk is full."""
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        with os.fdopen(fd, "a") as log:
            log.write(text)


class Step:
    """One pod container running as a job step, through its ``srun`` process."""

    def __init__(self, job_id: str, name: str, argv: list[str], env: Mapping[str, str], log: Path) -> None:
        self.job_id = job_id
        self.name = name
        self.argv = argv  # the whole srun command, to start it again
        self.env = dict(env)
        self.log = log
        self.process: subprocess.Popen[bytes] | None = None
        self.step_id: str | None = None
        self.messages_at: tuple[Path, int] | None = None  # srun's own messages: file, offset
        self.listed = job_id  # the job ids under which squeue lists its step (all components')
        self.retries = 0  # starts again after srun could not reach slurmctld
        self.retry_at: float | None = None  # monotonic time of the next start
        self.unreachable_since: float | None = None
        self.stopping = False  # terminate() was called: never started again
        self.code: int | None = None  # its exit code once known for good
        # The controller's loop polls a step while a stopping thread may too: one start at a time.
        self._lock = threading.Lock()

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

        ``env`` is the controller's environment plus the pod's: srun passes it on
        (``--export=ALL``) and reads its own options from it, so the variables by which Slurm's
        clients take options (the allocation's ``SLURM_MEM_PER_CPU``, ``SLURM_NTASKS``, ...: see
        :func:`clients.step_env`) are left out; Slurm sets the step's own in the task.
        """
        srun = [clients.client("srun"), f"--jobid={job_id}"]
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
        # Given always, and from here: srun runs in the log's directory (_launch), which the step
        # must not inherit nor read a relative workingDir from.
        srun.append(f"--chdir={os.path.join(os.getcwd(), working_dir) if working_dir else os.getcwd()}")
        if image:
            srun.append(f"--container-image={image}")
        # The task's output goes to the container's log (srun opens it, a pattern without %t, %n or
        # %N); srun's own messages (``task 0: Exited with exit code 3``) to a file beside it, so the
        # log holds what the program wrote, as locally. The pattern is the log's name alone, from
        # srun's own directory: no backslash of the job root, which no pattern can hold, reaches it.
        pattern = output_pattern(log.name)
        if pattern is not None:
            srun += [f"--output={pattern}", f"--error={pattern}", "--open-mode=append"]
        step = cls(job_id, name, [*srun, "--", *argv], clients.step_env(env), log)
        step.listed = listed or job_id
        step._launch()
        return step

    def _launch(self) -> None:
        log = self.log
        own = log.with_name(log.name + ".srun")
        direct = output_pattern(log.name) is not None
        with open(log, "ab") as out, open(own if direct else log, "ab") as messages:
            offset = messages.tell()
            self.process = subprocess.Popen(
                self.argv,
                env=self.env,
                cwd=log.parent,  # where the --output pattern, the log's name, is found
                stdin=subprocess.DEVNULL,
                stdout=messages if direct else out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a Ctrl-C of the controller's terminal is the controller's to handle
            )
        self.messages_at = (own, offset) if direct else None

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
        """The step's exit code once it ended (128 + N if a signal N ended it), else None. An srun
        that could not reach slurmctld to create the step is started again (with back-off)."""
        with self._lock:
            return self._poll()

    def _poll(self) -> int | None:
        if self.code is not None:
            return self.code
        now = time.monotonic()
        if self.retry_at is not None:
            if self.stopping:
                self.code = 128 + signal.SIGTERM  # stopped before it could start again
                return self.code
            if now < self.retry_at:
                return None
            self.retry_at = None
            self._launch()
        code = self.process.poll() if self.process is not None else None
        if code is None:
            return None
        code = 128 - code if code < 0 else code
        if code != 0 and not self.stopping and self._not_created(now):
            return None
        self.code = code
        return code

    def _not_created(self, now: float) -> bool:
        """srun could not create the step for want of slurmctld: schedule a new start, unless
        slurmctld has been away for longer than OUTAGE_PATIENCE; whether one is scheduled.

        Just after an outage slurmctld may refuse a step for a while: a step that ended during
        the outage holds its resources until its slurmstepd's report gets through (``Memory
        required by task is not available`` was seen for a minute): a refusal then is started
        again too, within the same patience."""
        said = " ".join(self.messages())
        if not re.search(_NOT_CREATED, said) or re.search(STEP_LIMIT, said):
            return False  # a step the limit refused is refused again, outage or not
        if re.search(clients.UNREACHABLE, said):
            clients.note_down()
        elif not clients.down_recently():
            return False
        if self.unreachable_since is None:
            self.unreachable_since = now
        if now - self.unreachable_since > OUTAGE_PATIENCE:
            return False
        delay = min(0.5 * 2**self.retries, 10.0)
        self.retries += 1
        self.retry_at = now + delay
        _append(
            self.log,
            f"--- torchjob: srun could not start step {self.name} without slurmctld; "
            f"starting it again in {delay:.1f}s (try {self.retries + 1}) ---\n",
        )
        return True

    def wait(self, timeout: float) -> int | None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            code = self.poll()
            if code is not None:
                return code
            time.sleep(POLL)
        return self.poll()

    def find_step_id(self, timeout: float = 5.0) -> str | None:
        """The step's id (``J.S``), found by its name; None if it is not (or no longer) running.
        A SlurmUnreachable when slurmctld does not answer."""
        if self.step_id is not None:
            return self.step_id
        deadline = time.monotonic() + timeout
        while True:
            for step, name in clients.steps(self.listed, self.env).items():
                if name == self.name:
                    self.step_id = step
                    return step
            if self.poll() is not None or time.monotonic() >= deadline:
                return None
            time.sleep(POLL)

    def _signal(self, name: str, find_for: float = 5.0) -> bool:
        """Ask Slurm to send signal ``name`` to the step; whether that was done (or is moot: the
        step ended, or srun was still waiting to create it and was stopped itself). False while
        slurmctld does not answer."""
        try:
            step = self.find_step_id(find_for)
            if step is None:
                if self.poll() is None:  # srun waits for the step's resources: srun itself ends it
                    self._signal_srun(signal.SIGTERM if name == "TERM" else signal.SIGKILL)
                return True
            clients.cancel(step, self.env, signal_name=name)
        except SlurmUnreachable:
            return False
        except SlurmError:
            pass  # it ended meanwhile
        return True

    def send(self, signum: int) -> None:
        """A pod's signal to this step, as the kubelet sends it: SIGTERM as ``scancel --signal=TERM``
        (srun's own while it has no step yet); SIGKILL as ``scancel --signal=KILL``, then, if Slurm
        does not end the step within KILL_WAIT, SIGINT twice (srun kills its step) and SIGKILL to
        srun. While slurmctld does not answer the ``scancel`` is asked again with back-off (0.5 s
        doubling to 10 s) until it does or the step ends, OUTAGE_PATIENCE at most: a pod to stop
        during an outage is stopped once slurmctld is back. Blocking: call it from a thread."""
        self.stopping = True
        if self.poll() is not None:
            return
        name = "TERM" if signum == signal.SIGTERM else "KILL"
        deadline = time.monotonic() + OUTAGE_PATIENCE
        delay = 0.5
        while not self._signal(name, 5.0 if name == "TERM" else 1.0):
            if self.wait(delay) is not None or time.monotonic() >= deadline:
                break
            delay = min(delay * 2, 10.0)
        if name == "TERM" or self.wait(KILL_WAIT) is not None:
            return
        self._signal_srun(signal.SIGINT)
        self._signal_srun(signal.SIGINT)
        if self.wait(5.0) is None:
            self._signal_srun(signal.SIGKILL)
            self.wait(5.0)

    def terminate(self, grace: float) -> int | None:
        """SIGTERM the step's task, SIGKILL it after ``grace`` seconds; its exit code (bounded by
        OUTAGE_PATIENCE while slurmctld does not answer)."""
        self.send(signal.SIGTERM)
        code = self.wait(grace)
        if code is None:
            self.send(signal.SIGKILL)
            code = self.poll()
        return code

    def _signal_srun(self, sig: signal.Signals) -> None:
        if self.process is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.process.pid, sig)
