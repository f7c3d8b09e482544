"""The order the suite runs in (this module holds no tests): its longest tests first.

`make test` spreads the tests over workers with xdist's worksteal: each worker starts with a
contiguous quarter of the collection and an idle worker takes the tail of the longest queue. A
test of a minute or more that falls late in a quarter (the Slurm files sort near the end) starts
when the others are nearly done and the whole run waits for it. Started first, it overlaps the
rest of the suite; the worker that took it is left fewer of the short tests, which the others take.

SLOW_FIRST: test ids, longest first, from a run with ``--durations`` (seconds there, on a quiet
2-core machine). A test with a module-scoped fixture comes with every other test of its module,
next to each other, so that the fixture is still set up once. An id that no longer names a test
fails test_suite_order.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, TypeVar

SLOW_FIRST = [
    # Slurm's time limit counts in whole minutes: 91 s.
    "tests/test_slurm_engine.py::test_a_time_limit_reached_is_reported_as_timeout_after_the_signal_before_it",
    "tests/test_kinds_run.py::test_each_kind_runs_on_slurm",  # three kinds' jobs on a private Slurm
    # The whole module, around its one cluster: 25 s and 15 s, then 25 s to stop that cluster; it
    # ended both timed runs of the suite 20-40 s after every other worker had finished.
    "tests/test_slurm_outage.py::test_an_attached_run_rides_an_outage_and_a_step_that_could_not_start_is_started_again",
    "tests/test_slurm_outage.py::test_a_pod_to_stop_during_an_outage_is_stopped_once_slurmctld_is_back",
    "tests/test_torchrun_exit.py::test_a_successful_2x1_job_ends_cleanly_every_time",  # 4 jobs, 32 s
    "tests/test_sdk_hardening.py::test_ranks_end_safely_after_the_result_is_sent[elastic]",
    "tests/test_kubernetes_interrupts.py::test_an_interrupted_creation_gives_up_its_clean_up_within_the_bound",
    "tests/test_local_preload.py::test_an_sdk_task_returns_the_same_value_cold_and_preloaded",
    "tests/test_cli_convenience.py::test_quick_mode_runs_a_script_on_nodes_times_processes_with_gloo",
    "tests/test_cli_messages.py::test_a_silent_job_gets_one_notice_and_status_shows_each_pods_last_output",
    "tests/test_sdk_warm.py::test_a_server_that_does_not_stop_when_asked_is_killed_not_waited_for",
]


class _Item(Protocol):
    @property
    def nodeid(self) -> str: ...


Item = TypeVar("Item", bound=_Item)


def slow_first(items: Sequence[Item]) -> list[Item]:
    """``items`` with those SLOW_FIRST names in its order at the front, the others as they were.
    Deterministic, as xdist needs: every worker collects the same order."""
    rank = {nodeid: i for i, nodeid in enumerate(SLOW_FIRST)}
    first = sorted((item for item in items if item.nodeid in rank), key=lambda item: rank[item.nodeid])
    return first + [item for item in items if item.nodeid not in rank]
