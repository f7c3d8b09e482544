"""The reasons a report gives, in Kubernetes' words, the same on every engine that runs pods itself:
why a container terminated, why a pod was stopped, which pod a short name means."""

from __future__ import annotations

from torchjob.phases import JobPhase

CRASH_LOOP = "CrashLoopBackOff"  # Kubernetes' reason for a container waiting to be restarted again


def exit_reason(code: int | None) -> str:
    """Kubernetes' reason for a terminated container: Error, or the signal that killed it
    ("" for success: the caller says Completed)."""
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


def short_name(job_name: str, pod: str) -> str:
    """A pod's name without its job's name in front (``worker-0`` for ``job-worker-0``)."""
    prefix = f"{job_name}-"
    return pod[len(prefix) :] if pod.startswith(prefix) else pod
