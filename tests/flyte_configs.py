"""flytekit tasks in the configurations tests/test_flyte.py renders and compares with flytekit's own
serialization (never run: their bodies do nothing)."""

from __future__ import annotations

from types import SimpleNamespace

from flytekit import Resources, task, workflow
from flytekitplugins.kfpytorch import (
    CleanPodPolicy,
    Elastic,
    Master,
    PyTorch,
    RestartPolicy,
    RunPolicy,
    Worker,
)


@task(
    task_config=PyTorch(
        master=Master(
            image="registry.local/master:1",
            requests=Resources(cpu="2", mem="2Gi"),
            limits=Resources(cpu="4", mem="4Gi"),
            restart_policy=RestartPolicy.ALWAYS,
        ),
        worker=Worker(
            replicas=3,
            image="registry.local/worker:1",
            requests=Resources(cpu="1", gpu="1"),
            restart_policy=RestartPolicy.NEVER,
        ),
        run_policy=RunPolicy(
            clean_pod_policy=CleanPodPolicy.RUNNING,
            ttl_seconds_after_finished=60,
            active_deadline_seconds=600,
            backoff_limit=3,
        ),
    ),
    container_image="registry.local/task:1",
    requests=Resources(cpu="1", mem="1Gi"),
    limits=Resources(cpu="3", mem="3Gi"),
    environment={"DATA": "/data", "LEVEL": "debug"},
)
def every_field() -> None:
    return None


@task(task_config=PyTorch(worker=Worker(replicas=0)))
def no_workers() -> None:
    return None


@task(task_config=PyTorch(num_workers=0))
def no_workers_v0() -> None:
    return None


@task(task_config=PyTorch(worker=Worker(replicas=2), run_policy=RunPolicy()))
def empty_run_policy() -> None:
    return None


@task(
    task_config=PyTorch(
        worker=Worker(replicas=2, restart_policy=RestartPolicy.FAILURE),
        run_policy=RunPolicy(clean_pod_policy=CleanPodPolicy.NONE, backoff_limit=0),
    ),
    resources=Resources(cpu=("1", "2"), mem="1Gi"),
)
def zero_values() -> None:
    return None


@task(task_config=PyTorch(worker=Worker(replicas=1), increase_shared_mem=False), shared_memory=True)
def shared_memory_flag() -> None:
    return None


@task(task_config=Elastic(nnodes=2, nproc_per_node=2))
def elastic_two_by_two() -> None:
    return None


@task(
    task_config=Elastic(
        nnodes="1:4",
        nproc_per_node=8,
        max_restarts=3,
        rdzv_configs={"timeout": 1200, "join_timeout": 900, "read_timeout": 900},
        run_policy=RunPolicy(backoff_limit=2, active_deadline_seconds=3600),
    ),
    container_image="registry.local/elastic:2",
    requests=Resources(cpu="8", mem="16Gi"),
)
def elastic_range() -> None:
    return None


@task(task_config=Elastic(nnodes="1", nproc_per_node=2))
def elastic_one_text() -> None:
    return None


@task(task_config=Elastic(nnodes="1:1"))
def elastic_one_range() -> None:
    return None


@task(task_config=Elastic(nnodes=1, nproc_per_node=4))
def elastic_one() -> None:
    return None


@task(task_config=Elastic(nnodes=3, monitor_interval=2, start_method="fork"))
def elastic_settings() -> None:
    return None


@task
def plain_task(x: int) -> int:
    return x


@task(task_config=PyTorch(worker=Worker(replicas=2)))
def overridden() -> None:
    return None


@workflow
def with_node_overrides() -> None:
    overridden().with_overrides(requests=Resources(cpu="5"), limits=Resources(cpu="6", mem="6Gi"))
    overridden().with_overrides(container_image="registry.local/override:3")
    plain_task(x=1)


@task(task_config=Elastic(nnodes=2, nproc_per_node=2))
def changed_by_override() -> None:
    return None


@workflow
def overriding_task_config() -> None:
    # flytekit sets the task's own config here, for every node; the node count stays 2 (from init).
    changed_by_override().with_overrides(task_config=Elastic(nnodes=2, nproc_per_node=1))


_tasks = SimpleNamespace(overridden=overridden)


@workflow
def calls_through_an_attribute() -> None:
    _tasks.overridden()
