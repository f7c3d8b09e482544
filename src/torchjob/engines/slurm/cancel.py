"""Stopping a Slurm job: ``scancel`` and waiting (bounded) until Slurm holds no step of it; in an
allocation that is not the job's (salloc), its controller and steps only. While slurmctld does
not answer, nothing is cancelled and the EngineError says so, with the command that will."""

from __future__ import annotations

import time

from torchjob.engine_api.base import EngineError
from torchjob.engines.slurm import clients
from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from pathlib import Path

    from torchjob.engines.slurm.view import SlurmView

CANCEL_TIMEOUT = 60.0  # seconds until Slurm holds no step of a cancelled job
POLL = 0.3


def cancel(slurm_id: str, timeout: float = CANCEL_TIMEOUT) -> None:
    """scancel the allocation, then wait until Slurm holds no step of it: ``timeout`` seconds in
    all, each client call given no more than what is left of them (a slow slurmctld cannot stretch
    a Ctrl-C's wait by its calls' own timeouts)."""
    deadline = time.monotonic() + timeout

    def left() -> float:
        return min(clients.TIMEOUT, max(deadline - time.monotonic(), POLL))

    try:
        try:
            listed = clients.component_ids(slurm_id, timeout=left())  # the components' steps too
        except clients.SlurmUnreachable:
            raise
        except clients.SlurmError:
            listed = slurm_id
        try:
            clients.cancel(slurm_id, timeout=left())
        except clients.SlurmUnreachable:
            raise
        except clients.SlurmError as err:
            if "Invalid job id" not in str(err) and "already completing" not in str(err):
                raise EngineError(str(err)) from None
    except clients.SlurmUnreachable as err:
        raise EngineError(
            f"{err}: Slurm job {slurm_id} may run on; cancel it with `scancel {slurm_id}` once "
            "slurmctld answers"
        ) from None
    said = ""  # what the last poll's failure said, if it failed
    while time.monotonic() < deadline:
        try:
            if not clients.steps(listed, timeout=left()) and not clients.queue(slurm_id, timeout=left()):
                return
            said = ""
        except clients.SlurmError as err:
            said = str(err)
        time.sleep(POLL)
    if said:
        raise EngineError(f"Slurm job {slurm_id} may still have steps {timeout:g} s after scancel ({said})")
    raise EngineError(f"Slurm job {slurm_id} still has steps {timeout:g} s after scancel")


def left_queue(slurm_id: str, timeout: float = 30.0, completing: float = 3.0) -> None:
    """Wait (bounded) until the ended allocation left Slurm's queue, steps and batch script.
    One that stays COMPLETING longer than ``completing`` seconds waits for Slurm's own
    bookkeeping (after an outage, a step that ended meanwhile is reported ~50 s late): its
    processes are gone, and the run returns."""
    deadline = time.monotonic() + timeout
    since = None
    while time.monotonic() < deadline:
        try:
            rows = clients.queue(slurm_id)
        except clients.SlurmError:
            return
        if not rows:
            return
        if all(state == "COMPLETING" for _, state, _ in rows):
            since = since or time.monotonic()
            if time.monotonic() - since > completing:
                return
        time.sleep(0.1)


def stop(view: SlurmView, job_dir: Path) -> None:
    """Stop what runs of a job to delete: its allocation, or (in an allocation that is not the
    job's) its controller and its steps."""
    slurm = view.slurm(job_dir)
    slurm_id = str(slurm.get("jobId", ""))
    if not slurm_id or slurm.get("state") in clients.FINAL_STATES:
        return
    if not slurm.get("inAllocation"):
        cancel(slurm_id)
        return
    from torchjob.engines.slurm.allocation import stop_controller

    if not stop_controller(int(slurm.get("controller") or 0), slurm.get("controllerStarted")):
        pid = slurm.get("controller")
        raise EngineError(f"the controller of job {job_dir.name} (pid {pid}) did not stop")
