"""The root cause of a failed job, from the evidence in its failed pods' logs (controller/rootcause.py).

The logs here are written as torch 2.13 and torchrun write them (taken from real runs); the pods are
the kubelet's attempts, ended in the order a busy machine may see them end.
"""

from __future__ import annotations

from pathlib import Path

from torchjob.controller.kubelet import FAILED, RUNNING, Container, Pod
from torchjob.controller.rootcause import (
    STOPPED_AFTER_RAISING,
    failure_of,
    first_failure,
    told,
    torchrun_root_cause,
    weigh,
)
from torchjob.jobs import load_jobs_from_text
from torchjob.reports import FailureReport
from torchjob.spec.model import Job

GLOO = (
    "RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection "
    "closed by peer [127.0.0.1]:41150. This is typically caused by a remote worker crashing."
)


def raised(rank: int, exception: str, where: str = "boom.py") -> list[str]:
    return [
        f"[rank{rank}]: Traceback (most recent call last):",
        f'[rank{rank}]:   File "/tmp/{where}", line 7, in <module>',
        f"[rank{rank}]:     dist.barrier()",
        f"[rank{rank}]: {exception}",
    ]


def torchrun_report(root: tuple[int, int], others: list[tuple[int, int]]) -> list[str]:
    """torchrun's ChildFailedError block: ``root`` as its first observed failure, then the rest."""

    def entry(i: int, rank: int, code: int) -> list[str]:
        return [
            f"[{i}]:",
            "  time      : 2026-11-28_20:22:51",
            "  host      : localhost",
            f"  rank      : {rank} (local_rank: {rank % 2})",
            f"  exitcode  : {code} (pid: 2866{i}) ",
            "  error_file: <N/A>",
            "  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html",
        ]

    lines = [
        "E1128 20:22:51.430000 28553 torch/distributed/elastic/multiprocessing/api.py:1002] "
        "failed (exitcode: 1)",
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
        "============================================================",
        "boom.py FAILED",
        "------------------------------------------------------------",
        "Failures:",
    ]
    for i, (rank, code) in enumerate(others, start=1):
        lines += entry(i, rank, code)
    lines += [
        "------------------------------------------------------------",
        "Root Cause (first observed failure):",
    ]
    lines += entry(0, *root)
    return [*lines, "============================================================"]


def job() -> Job:
    text = (
        "apiVersion: batch.volcano.sh/v1alpha1\nkind: Job\nmetadata: {name: j}\nspec:\n  tasks:\n"
        "  - {name: master, replicas: 1, template: {spec: {containers: [{name: main, image: i}]}}}\n"
        "  - {name: worker, replicas: 2, template: {spec: {containers: [{name: main, image: i}]}}}\n"
    )
    return load_jobs_from_text(text)[0].job


def failed_pod(tmp_path: Path, name: str, rank: int, lines: list[str], ended: float, code: int = 1) -> Pod:
    task, _, index = name.rpartition("-")
    log = tmp_path / f"{name}.log"
    log.write_text("".join(f"{line}\n" for line in lines))
    container = Container("main", False, None, log, exit_code=code, done=True)
    pod = Pod(
        name=f"j-{name}",
        task=task,
        index=int(index),
        attempt=0,
        containers=[container],
        restart_policy="Never",
        log_dir=tmp_path,
        rank=rank,
    )
    pod.phase, pod.exit_code, pod.finished_at, pod.failed = FAILED, code, ended, container
    return pod


def test_the_rank_that_raised_beats_peers_whose_connection_closed_first(tmp_path: Path) -> None:
    peers = [
        failed_pod(tmp_path, "master-0", 0, raised(0, GLOO), ended=10.0),
        failed_pod(tmp_path, "worker-1", 2, raised(2, GLOO), ended=10.5),
    ]
    culprit = failed_pod(tmp_path, "worker-0", 1, raised(1, "RuntimeError: boom on rank 1"), ended=11.0)
    failure = first_failure(job(), [*peers, culprit])
    assert failure is not None
    assert (failure.short, failure.rank, failure.exit_code) == ("worker-0", 1, 1)
    assert failure.log_tail[-1] == "[rank1]: RuntimeError: boom on rank 1"


def test_between_equal_evidence_the_pod_that_ended_first(tmp_path: Path) -> None:
    later = failed_pod(tmp_path, "master-0", 0, raised(0, "ValueError: bad"), ended=12.0)
    earlier = failed_pod(tmp_path, "worker-0", 1, raised(1, "KeyError: 'x'"), ended=11.0)
    failure = first_failure(job(), [later, earlier])
    assert failure is not None and failure.short == "worker-0"


def test_an_exit_without_a_traceback_beats_a_stop_and_a_lost_peer(tmp_path: Path) -> None:
    stopped = failed_pod(tmp_path, "master-0", 0, ["waiting"], ended=10.0, code=143)
    lost = failed_pod(tmp_path, "worker-1", 2, ["gloo: Connection reset by peer"], ended=10.2)
    exited = failed_pod(tmp_path, "worker-0", 1, ["cannot open data.csv"], ended=10.4, code=3)
    failure = first_failure(job(), [stopped, lost, exited])
    assert failure is not None and (failure.short, failure.exit_code) == ("worker-0", 3)


def test_under_torchrun_the_failed_rank_that_raised_beats_its_first_observed_failure(tmp_path: Path) -> None:
    """-j 2x2: global rank 3 raises; its local peer (rank 2) loses the connection and torchrun sees it
    end first. Rank 3 is the root cause, with its own lines, not torchrun's report."""
    lines = [*raised(2, GLOO), *raised(3, "RuntimeError: boom on rank 3"), *torchrun_report((2, 1), [(3, 1)])]
    found = torchrun_root_cause(lines)
    assert found is not None
    rank, code, own = found
    assert (rank, code, own[-1]) == (3, 1, "RuntimeError: boom on rank 3")
    master = failed_pod(tmp_path, "master-0", 0, [*raised(0, GLOO), *torchrun_report((0, 1), [])], ended=1.0)
    worker = failed_pod(tmp_path, "worker-0", 1, lines, ended=2.0)
    failure = first_failure(job(), [master, worker])
    assert failure is not None
    assert (failure.short, failure.rank, failure.exit_code) == ("worker-0", 3, 1)
    assert failure.log_tail[-1] == "RuntimeError: boom on rank 3"
    assert not any("ChildFailedError" in line for line in failure.log_tail)


def test_torchrun_without_rank_prefixes_keeps_its_root_cause_and_the_lines_before_its_report() -> None:
    """A rank that failed before init_process_group has no ``[rankN]:`` lines."""
    lines = ["Traceback (most recent call last):", "ModuleNotFoundError: No module named 'data'"]
    found = torchrun_root_cause([*lines, *torchrun_report((1, 1), [(0, -15)])])
    assert found is not None
    assert (found[0], found[1], found[2]) == (1, 1, lines)


def test_a_signal_in_torchruns_report_is_128_plus_the_signal() -> None:
    found = torchrun_root_cause(torchrun_report((0, -9), []))
    assert found is not None and found[1] == 137


def test_weights() -> None:
    assert weigh(["Traceback (most recent call last):", "RuntimeError: boom"], 1) == 3
    assert weigh(["Traceback (most recent call last):", GLOO], 1) == 1
    assert weigh(["Traceback (most recent call last):", "KeyboardInterrupt"], 130) == 0
    assert weigh(["exiting"], 2) == 2
    assert weigh([], 143) == 0


SIGTERMED_TORCHRUN = [
    "Traceback (most recent call last):",
    '  File "torch/distributed/elastic/multiprocessing/api.py", line 86, in _terminate_process_handler',
    "torch.distributed.elastic.multiprocessing.api.SignalException: Process 1158 got signal: 15",
]


def stopped_pod(tmp_path: Path, name: str, rank: int, lines: list[str], ended: float) -> Pod:
    """An attempt the job stopped before it ended by itself (Running when stopped), now gone."""
    pod = failed_pod(tmp_path, name, rank, lines, ended)
    pod.phase, pod.failed, pod.gone, pod.terminating = RUNNING, None, True, True
    return pod


def test_a_rank_that_raised_in_a_pod_the_job_stopped_beats_a_failed_peer(tmp_path: Path) -> None:
    """master-0 fails first (its rank lost the connection); the job stops worker-0, whose torchrun
    was ended by the stop before it reported rank 2's exception."""
    master = failed_pod(tmp_path, "master-0", 0, [*raised(0, GLOO), *torchrun_report((0, 1), [])], ended=1.0)
    lines = [*raised(2, "RuntimeError: boom on rank 2"), *raised(3, GLOO), *SIGTERMED_TORCHRUN]
    worker = stopped_pod(tmp_path, "worker-0", 1, lines, ended=2.0)
    failure = first_failure(job(), [master, worker])
    assert failure is not None
    assert (failure.short, failure.rank, failure.exit_code) == ("worker-0", 2, 1)
    assert failure.reason == STOPPED_AFTER_RAISING
    assert failure.log_tail[-1] == "RuntimeError: boom on rank 2"
    said = told(failure, failure_of(job(), master))
    assert said == (
        "rank 2 (pod worker-0) raised RuntimeError: boom on rank 2, and the job stopped its pod "
        "(exit code 1) when rank 0 (pod master-0) failed"
    )


def test_a_stopped_pod_counts_only_for_an_exception_and_only_once_gone(tmp_path: Path) -> None:
    master = failed_pod(tmp_path, "master-0", 0, [*raised(0, GLOO), *torchrun_report((0, 1), [])], ended=1.0)
    lost = stopped_pod(tmp_path, "worker-0", 1, [*raised(2, GLOO), *SIGTERMED_TORCHRUN], ended=2.0)
    failure = first_failure(job(), [master, lost])
    assert failure is not None and failure.short == "master-0"
    assert told(failure, failure) == f"rank 0 (pod master-0) failed with exit code 1: {GLOO}"
    stopping = stopped_pod(tmp_path, "worker-1", 2, raised(3, "RuntimeError: boom"), ended=3.0)
    stopping.gone = False  # still stopping: its log may not be complete, and is not read yet
    failure = first_failure(job(), [master, stopping])
    assert failure is not None and failure.short == "master-0" and stopping.evidence is None


def test_between_exceptions_a_pod_that_failed_beats_one_the_job_stopped(tmp_path: Path) -> None:
    stopped = stopped_pod(tmp_path, "worker-0", 1, raised(1, "KeyError: 'x'"), ended=1.0)
    failed = failed_pod(tmp_path, "master-0", 0, raised(0, "ValueError: bad"), ended=2.0)
    failure = first_failure(job(), [stopped, failed])
    assert failure is not None and failure.short == "master-0"


def test_a_stopped_root_cause_with_a_traceback_longer_than_its_tail_still_reads(tmp_path: Path) -> None:
    frames = [f'[rank1]:   File "/tmp/deep.py", line {i}, in f{i}' for i in range(30)]
    lines = ["[rank1]: Traceback (most recent call last):", *frames, "[rank1]: ValueError: deep"]
    master = failed_pod(tmp_path, "master-0", 0, [*raised(0, GLOO), *torchrun_report((0, 1), [])], ended=1.0)
    worker = stopped_pod(tmp_path, "worker-0", 1, [*lines, *SIGTERMED_TORCHRUN], ended=2.0)
    failure = first_failure(job(), [master, worker])
    assert failure is not None and failure.short == "worker-0" and failure.log_tail[-1] == "ValueError: deep"
    assert told(failure, failure_of(job(), master)).startswith(
        "rank 1 (pod worker-0) raised ValueError: deep, "
    )


def test_a_failed_root_cause_with_a_deep_traceback_names_its_exception(
    tmp_path: Path,
) -> None:
    """Distributed tracebacks run deeper than the 20 lines a report keeps: the exception is read
    from the whole tail read, so the job's reason still says what the program raised."""
    frames = [f'  File "/tmp/deep.py", line {i}, in f{i}' for i in range(30)]
    lines = ["Traceback (most recent call last):", *frames, "ValueError: deep"]
    pod = failed_pod(tmp_path, "worker-0", 1, lines, ended=1.0)
    failure = first_failure(job(), [pod])
    assert failure is not None and "Traceback (most recent call last):" not in failure.log_tail
    assert failure.exception == "ValueError: deep"
    assert told(failure, failure) == "rank 1 (pod worker-0) failed with exit code 1: ValueError: deep"
    assert FailureReport.from_dict(failure.to_dict()) == failure  # as status -o json carries it
