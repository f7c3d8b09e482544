"""The local engine as the registry lists it: its settings, declared without importing the engine."""

from __future__ import annotations

from torchjob.engine_api.base import EngineInfo, Setting
from torchjob.engine_api.common_settings import max_restarts

ALL_COMMANDS = ("run", "status", "logs", "wait", "delete", "prune", "queue")

ENGINE = EngineInfo(
    factory="torchjob.engines.local.engine:LocalEngine",
    runs_here=True,
    start_modules=("torchjob.engines.local.planning", "torchjob.engines.local.supervisor"),
    summarizes=True,
    location="job directory",
    settings=(
        Setting(
            "state_dir",
            "local: where job directories live (default: $TORCHJOB_HOME/jobs or ~/.torchjob/jobs)",
            type="path",
            metavar="DIR",
            commands=ALL_COMMANDS,
        ),
        max_restarts(),
        Setting(
            "hang_notice",
            "local: say once when every pod of the running job has printed nothing for this long "
            "(default 300; 0: never)",
            type="float",
            default=300.0,
            metavar="SECONDS",
            minimum=0,
            invalid="expected a non-negative, finite number of seconds, got {value}",
        ),
        Setting(
            "prewarm",
            "start no container's interpreter before its pod's init containers have succeeded",
            type="bool",
            default=True,
            flags=("--no-prewarm",),
        ),
        Setting(
            "preload",
            "import these modules once (e.g. torch) and fork every python container from that process",
            type="modules",
            default=(),
            metavar="MODULE[,MODULE]",
        ),
        Setting(
            "queue",
            "local: start at once, without waiting in the machine's queue for CPUs, memory and GPUs",
            type="bool",
            default=True,
            flags=("--no-queue",),
        ),
        Setting(
            "warm",
            "keep the preload server for this process's next jobs (the SDK's warm calls; no flag)",
            type="bool",
            default=False,
            commands=(),
        ),
    ),
)
