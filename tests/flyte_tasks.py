"""Real flytekit tasks and workflows for tests/test_flyte*.py (imports flytekit and kfpytorch).

Every distributed task joins a gloo group, all-reduces and gathers what each rank sees, and rank 0
returns it as a ``Report`` (a dataclass: flytekit's type engine carries it back, typed).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import flytekit
from flytekit import conditional, dynamic, task, workflow
from flytekit.types.directory import FlyteDirectory
from flytekit.types.file import FlyteFile
from flytekitplugins.kfpytorch import Elastic, PyTorch, Worker


@dataclass
class Report:
    world: int  # dist.get_world_size()
    total: int  # the all-reduce of every rank's rank + 1
    ranks: list[int]  # RANK of each rank, gathered at rank 0
    nodes: list[int]  # each rank's node: RANK for a PyTorch pod, GROUP_RANK under the elastic agent
    scale: int


def _report(scale: int) -> Report:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    try:
        rank = dist.get_rank()
        value = torch.tensor([rank + 1])
        dist.all_reduce(value)
        seen: list[object] = [None] * dist.get_world_size()
        node = int(os.environ.get("GROUP_RANK", os.environ["RANK"]))
        dist.all_gather_object(seen, (int(os.environ["RANK"]), node))
        pairs = sorted(p for p in seen if isinstance(p, tuple))
        return Report(
            world=dist.get_world_size(),
            total=int(value.item()),
            ranks=[r for r, _ in pairs],
            nodes=[n for _, n in pairs],
            scale=scale,
        )
    finally:
        dist.destroy_process_group()


@task(task_config=PyTorch(worker=Worker(replicas=2)))
def allreduce_pytorch(scale: int) -> Report:
    return _report(scale)


@task(task_config=Elastic(nnodes=2, nproc_per_node=2))
def allreduce_elastic(scale: int) -> Report:
    return _report(scale)


@task(task_config=Elastic(nnodes=1, nproc_per_node=2))
def allreduce_one_node(scale: int) -> Report:
    return _report(scale)


@task(task_config=Elastic(nnodes=1))
def bypassed(scale: int) -> list[int]:
    """One node, one process: called in the caller's own process, with no launcher's env."""
    return [os.getpid(), int("WORLD_SIZE" in os.environ), scale]


# Read when the module is imported, as flytesnacks' kfpytorch MNIST example reads WORLD_SIZE to
# decide whether to join a process group: each pod imports the module with its own environment.
WORLD_AT_IMPORT = os.environ.get("WORLD_SIZE", "unset")


@task(task_config=PyTorch(worker=Worker(replicas=1)))
def world_at_import(scale: int) -> str:
    return f"{WORLD_AT_IMPORT} {os.environ['WORLD_SIZE']} {scale}"


@task(task_config=PyTorch(worker=Worker(replicas=1)))
def failing(scale: int) -> int:
    if int(os.environ["RANK"]) == 1:
        raise ValueError(f"rank one refuses scale {scale}")
    return scale


@task(task_config=PyTorch(worker=Worker(replicas=1)))
def wrongly_typed(scale: int) -> float:
    return scale  # an int where float is declared: flytekit's type engine refuses it


@task
def plain(report: Report) -> int:
    return report.total * report.scale


@workflow
def elastic_leg(report: Report) -> int:
    return plain(report=allreduce_elastic(scale=plain(report=report)))


@workflow
def pipeline(scale: int, elastic: bool) -> int:
    first = allreduce_pytorch(scale=scale)
    return (  # a branch is one node: the elastic leg is a sub-workflow
        conditional("which")
        .if_(elastic.is_true())
        .then(elastic_leg(report=first))
        .else_()
        .then(plain(report=first))
    )


@dynamic
def pipeline_dynamic(scale: int) -> int:
    return plain(report=allreduce_pytorch(scale=scale))


@task(task_config=PyTorch(worker=Worker(replicas=1)), cache=True, cache_version="1")
def rank_file(scale: int) -> tuple[FlyteFile, FlyteDirectory]:
    """A file and a folder each rank writes in flytekit's working directory (in its pod's
    temporary directory, which goes with the job): rank 0's come back, written by it where the
    caller's flytekit keeps its outputs, as a Flyte pod uploads them. flytekit's local cache
    keeps the outputs: a second run with the same scale runs no job."""
    rank = os.environ["RANK"]
    print(f"rank_file runs in rank {rank}", flush=True)
    work = flytekit.current_context().working_directory
    text = f"rank {rank} of {os.environ['WORLD_SIZE']}, scale {scale}\n"
    folder = os.path.join(work, "ranks")
    os.makedirs(folder)
    for path in (os.path.join(work, "rank.txt"), os.path.join(folder, f"rank-{rank}.txt")):
        with open(path, "w") as out:
            out.write(text)
    return FlyteFile(os.path.join(work, "rank.txt")), FlyteDirectory(folder)


@task
def read_back(file: FlyteFile) -> str:
    with open(file) as handle:
        return handle.read()


@workflow
def file_pipeline(scale: int) -> tuple[str, FlyteFile, FlyteDirectory]:
    file, folder = rank_file(scale=scale)
    return read_back(file=file), file, folder
