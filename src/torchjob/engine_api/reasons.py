"""The reasons a report gives, in Kubernetes' words, the same on every engine that runs pods itself
(local, Slurm): why a container terminated, why a pod was stopped."""

from __future__ import annotations

from torchjob.phases import JobPhase


def exit_reason(code: int | None) -> str:
    """Kubernetes' reason for a terminated container: Error, or the signal that killed it
    ("" for success: the caller says Completed). Every engine reports containers with it."""
    if code is None or code == 0:
        return ""
    if code > 128:
        import signal

        try:
            return f"Error (killed by {signal.Signals(code - 128).name})"
        except ValueError:
            pass
    return "Error"


def stopped_because(phase: JobPhase) -> str:
    """Why a pod the engine stopped was stopped: its job's phase (``job completed``), so that a
    pod CompleteJob stopped does not look failed."""
    if phase in (JobPhase.COMPLETING, JobPhase.COMPLETED):
        return "job completed"
    return f"job {phase.value.lower()}"
