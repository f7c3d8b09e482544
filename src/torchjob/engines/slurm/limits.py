"""The per-job limits of the cluster a job goes to, as its slurm.conf sets them.

Every pod container a job runs is a job step, and slurmctld refuses to create a job's step once
the job has created ``MaxStepCount`` of them (Slurm's default is 40,000; a site may set more or
fewer). The engine reads the running cluster's value once per command (:func:`read_step_limit`:
``scontrol show config`` beside ``scontrol ping``, a few milliseconds, each with a timeout) and
refuses a job that needs more steps at its field, saying the number and where it came from. When
it cannot be read (no ``scontrol``, a configuration no client reads, a slurmctld that does not
answer, a configuration without the key) Slurm's default stands, marked as assumed, with why.

The other limits of slurm.conf are left to Slurm: ``MaxTasksPerNode`` bounds a step's tasks per
node (each of torchjob's steps is one task) and the allocation's, which ``sbatch`` refuses in its
own words; ``MaxArraySize`` concerns arrays (refused in ``--sbatch-args``); ``MaxJobCount`` is the
cluster's, not one job's.

Pure but for :func:`read_step_limit`, which imports the clients only when called.
"""

from __future__ import annotations

from torchjob.records import record
from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Mapping

# Slurm's default MaxStepCount (slurm.conf): the steps one job may create over its life.
MAX_STEP_COUNT = 40_000
KEY = "MaxStepCount"
READ_TIMEOUT = 10.0  # seconds scontrol show config may take (it answers in milliseconds when up)
# slurmctld's refusal of a step once the job created MaxStepCount of them (srun says it).
STEP_LIMIT = r"Step limit reached for this job"


@record(frozen=True)
class StepLimit:
    """How many job steps one job may create, and where that number comes from."""

    count: int
    read: bool  # from the running cluster; False: Slurm's default, assumed
    why: str = ""  # why the default is assumed

    @property
    def source(self) -> str:
        """The number's origin, for a message: ``this cluster's MaxStepCount (...)``."""
        if self.read:
            return f"this cluster's {KEY} (scontrol show config)"
        return f"Slurm's default {KEY}, assumed: {self.why}" if self.why else f"Slurm's default {KEY}"


DEFAULT = StepLimit(MAX_STEP_COUNT, read=False)


def step_limit_from(config: Mapping[str, str]) -> StepLimit:
    """The limit a parsed ``scontrol show config`` sets; the default, said assumed, when it has
    no such key or a value that is no positive whole number."""
    value = config.get(KEY)
    if value is None:
        return StepLimit(MAX_STEP_COUNT, read=False, why=f"scontrol show config has no {KEY}")
    if not (value.isascii() and value.isdigit() and int(value) > 0):
        return StepLimit(MAX_STEP_COUNT, read=False, why=f"scontrol show config gives {KEY} = {value!r}")
    return StepLimit(int(value), read=True)


def _assumed(why: str) -> StepLimit:
    """Slurm's default, taken because the cluster's value cannot be read (``why``)."""
    return StepLimit(MAX_STEP_COUNT, read=False, why=why)


def read_step_limit(environ: Mapping[str, str]) -> StepLimit:
    """The running cluster's MaxStepCount, or the default with the reason it is assumed.

    ``scontrol ping`` decides: a client that cannot reach slurmctld retries for the cluster's
    ``MessageTimeout`` (10-20 s) before it says so, ``ping`` answers at once.
    """
    from torchjob import logs
    from torchjob.engines.slurm import clients

    try:
        if not clients.installed("scontrol"):
            limit = _assumed("scontrol is not on PATH")
        else:
            clients.check_config(environ)
            if clients.down_recently():
                limit = _assumed("slurmctld does not answer (it did not a moment ago)")
            else:
                limit = _asked(environ)
    except clients.SlurmError as err:
        limit = _assumed(str(err))
    if limit.read:
        logs.info("slurm: %s %d (scontrol show config)", KEY, limit.count)
    else:
        logs.info("slurm: %s %d assumed: %s", KEY, limit.count, limit.why)
    return limit


def _asked(environ: Mapping[str, str]) -> StepLimit:
    """``scontrol show config`` asked beside ``scontrol ping``, not after it (its round trip, 5-15
    ms, is then off the job's start); the ping still decides, and a read it leaves waiting on a
    slurmctld that does not answer is ended."""
    from torchjob.engines.slurm import clients

    reading = clients.start(["scontrol", "show", "config"], environ)
    try:
        said = clients.ping(environ)
        if said is not None:
            return _assumed(f"slurmctld does not answer ({said})")
        return step_limit_from(clients.parse_config(clients.finish(reading, "scontrol", READ_TIMEOUT)))
    finally:
        if reading.poll() is None:
            reading.kill()
        reading.communicate()


def reached(limit: StepLimit, step: str) -> str:
    """Why a job ends once Slurm refused its step ``step`` for the limit: a restart is a new step,
    refused as well, so retrying cannot succeed."""
    if limit.read:
        most = f"{limit.count}, {limit.source}"
    else:  # the count planned with was assumed: Slurm's own is the one that refused
        most = f"its {KEY}, which torchjob could not read: {limit.why}" if limit.why else f"its {KEY}"
    return (
        f"Slurm refused job step {step} (Step limit reached for this job): the job created as many "
        f"steps as the cluster lets one job create ({most}); each container run and each restart "
        "is a new step, so nothing more can run"
    )
