"""Which of a followed job's containers have their logs streamed, and each pod's last lines.

Every main container that has run, of the pods asked for (``logs POD -f``: one pod, a task; one
container; one attempt of a restarted job), gets a stream of its own (``podlogs.LogStreams``),
with the prefix of its pod, rank and, when the pod has several, container. The last lines
streamed of each pod are kept: the log of a failed pod deleted before its log was read.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any

from torchjob.engine_api.base import LogLine
from torchjob.engines.kubernetes.phase import pod_attempt, pod_identity, pod_rank, prefix_for
from torchjob.engines.kubernetes.podlogs import LogStreams, streamable

TAIL_LINES = 20  # streamed lines kept per pod, for a failed pod deleted before its log is read


class ChosenLogs:
    """The containers asked for of a job's pods, each followed once it has a log."""

    def __init__(
        self,
        streams: LogStreams,
        name: str,
        target: str,
        pod_filter: Callable[[str, str], bool] | None = None,
        container: str | None = None,
        attempt: int | None = None,
    ) -> None:
        self.streams, self.name, self.target = streams, name, target
        self.pod_filter = pod_filter
        self.container = container
        self.attempt = attempt  # follow only the pods of this attempt (a restart's), when given
        self._tails: dict[str, collections.deque[str]] = {}  # each pod's last streamed lines

    def start(self, pods: dict[str, dict[str, Any]], names: set[str], has_master: Callable[[], bool]) -> None:
        """A stream for each container of the pods ``names`` that is wanted and has a log
        (``has_master``: whether the job has a master, which ranks count from; kept by the caller)."""
        ordinals = {name: i for i, name in enumerate(sorted(pods))}
        for name in names:
            pod = pods.get(name)
            if pod is None:
                continue
            task, index = pod_identity(self.name, pod, self.target)
            short = f"{task}-{index}"
            if self.pod_filter is not None and not self.pod_filter(name, short):
                continue
            if self.attempt is not None and pod_attempt(pod, self.target) != self.attempt:
                continue
            rank = pod_rank(pod, task, index, has_master())
            main = {c.get("name") for c in (pod.get("spec") or {}).get("containers") or []}
            several = len(main) > 1
            for status in (pod.get("status") or {}).get("containerStatuses") or []:
                container = str(status.get("name"))
                if self.container is not None and container != self.container:
                    continue
                if container in main and streamable(status):
                    prefix = prefix_for(short, rank, container if several else None)
                    restarts = int(status.get("restartCount") or 0)
                    uid = str((pod.get("metadata") or {}).get("uid") or name)
                    self.streams.add(name, uid, container, restarts, prefix, ordinals[name])

    def keep(self, line: LogLine) -> None:
        short = line.prefix.split(" ")[0].split("/")[0]
        self._tails.setdefault(short, collections.deque(maxlen=TAIL_LINES)).append(line.text)

    def tail(self, short: str) -> list[str]:
        return list(self._tails.get(short) or [])
