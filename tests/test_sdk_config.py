"""The SDK's config classes: Flyte's names and defaults, and a ValueError for every bad config."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

import torchjob
from torchjob import (
    CleanPodPolicy,
    Elastic,
    Master,
    PyTorch,
    Resources,
    RestartPolicy,
    RunPolicy,
    Worker,
    task,
)


def test_defaults_match_flyte() -> None:
    e = Elastic()
    assert (e.nnodes, e.nproc_per_node, e.start_method, e.max_restarts) == (1, 1, "spawn", 0)
    assert e.rdzv_configs == {"timeout": 900, "join_timeout": 900}
    assert e.run_policy is None and e.increase_shared_mem is True
    p = PyTorch(worker=Worker(replicas=3))
    assert p.master == Master() and p.run_policy is None and p.num_workers is None and p.workers == 3
    assert RunPolicy() == RunPolicy(None, None, None, None)
    assert {m.name for m in RestartPolicy} == {"ALWAYS", "FAILURE", "NEVER"}
    assert {m.name for m in CleanPodPolicy} == {"NONE", "ALL", "RUNNING"}
    assert Resources(cpu="2", mem="4Gi", gpu=1).to_k8s() == {
        "cpu": "2",
        "memory": "4Gi",
        "nvidia.com/gpu": "1",
    }


def test_rdzv_configs_default_is_not_shared() -> None:
    a, b = Elastic(), Elastic()
    a.rdzv_configs["timeout"] = 1
    assert b.rdzv_configs["timeout"] == 900


@pytest.mark.parametrize(
    ("nnodes", "expected", "single"),
    [
        (1, (1, 1), True),
        ("1", (1, 1), True),
        ("1:1", (1, 1), True),
        (2, (2, 2), False),
        ("1:4", (1, 4), False),
    ],
)
def test_nnodes_forms(nnodes: Any, expected: tuple[int, int], single: bool) -> None:
    config = Elastic(nnodes=nnodes)
    assert (config.min_nodes, config.max_nodes) == expected
    assert config.single_node is single


def test_num_workers_is_the_old_spelling() -> None:
    assert PyTorch(num_workers=2).workers == 2


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: Worker(replicas=-1), "Worker.replicas must be >= 0"),
        (lambda: PyTorch(worker=Worker(replicas=-2)), "Worker.replicas must be >= 0"),
        (lambda: Elastic(nnodes="4:1"), "minimum (4) is larger than the maximum (1)"),
        (lambda: Elastic(nnodes="a"), "not a node count"),
        (lambda: Elastic(nnodes=0), "at least 1"),
        (lambda: Elastic(nnodes=True), "integer or a 'MIN:MAX' string"),
        (lambda: Elastic(nnodes="1:2:3"), "not a node count"),
        (lambda: Elastic(nnodes="٣"), "not a node count"),  # int() reads Arabic-Indic digits; torchrun not
        # Past int()'s 4,300 digits: said as a count too large, not as Python's conversion limit.
        (lambda: Elastic(nnodes="1:" + "9" * 5000), "a node count of 5000 digits is too large"),
        (lambda: Elastic(nnodes="x" * 5000), "... (5000 characters) is not a node count"),
        (lambda: Elastic(nproc_per_node=0), "nproc_per_node must be at least 1"),
        (lambda: Elastic(start_method="thread"), "start_method must be one of"),
        (lambda: Elastic(max_restarts=-1), "max_restarts must be >= 0"),
        (lambda: Elastic(rdzv_configs={"timeout": -5}), "rdzv_configs['timeout']"),
        (lambda: PyTorch(num_workers=2, worker=Worker(replicas=2)), "both set"),
        (lambda: PyTorch(), "number of workers is missing"),
        (lambda: RunPolicy(backoff_limit=-1), "backoff_limit must be >= 0"),
        (lambda: RunPolicy(clean_pod_policy="All"), "CleanPodPolicy.ALL"),  # type: ignore[arg-type]
        (lambda: Worker(restart_policy="Never"), "RestartPolicy.NEVER"),  # type: ignore[arg-type]
        (lambda: Resources(mem="lots"), "not a Kubernetes quantity"),
    ],
)
def test_bad_configs_raise_value_error(build: Any, message: str) -> None:
    with pytest.raises(ValueError) as info:
        build()
    assert message in str(info.value)


def test_bad_config_fails_at_decoration() -> None:
    with pytest.raises(ValueError, match="minimum"):

        @task(task_config=Elastic(nnodes="4:1"))
        def never() -> None: ...

    with pytest.raises(ValueError, match="task_config must be"):
        task(task_config="elastic")(lambda: None)  # type: ignore[call-overload]


def test_bad_image_fails_at_decoration_with_field_path() -> None:
    with pytest.raises(ValueError, match=r"spec\.tasks\[0\]\.template\.spec\.containers\[0\]\.image"):

        @task(task_config=Elastic(), image="Not An Image")
        def f() -> None: ...


def test_bad_env_name_fails_at_decoration() -> None:
    with pytest.raises(ValueError, match="not a valid environment variable name"):

        @task(env={"1BAD": "x"})
        def f() -> None: ...


def test_sdk_names_are_exported_without_importing_torch() -> None:
    code = (
        "import sys, torchjob\n"
        "names = [torchjob.PyTorch, torchjob.Elastic, torchjob.task, torchjob.Task, torchjob.Master,\n"
        "         torchjob.Worker, torchjob.RunPolicy, torchjob.RestartPolicy, torchjob.CleanPodPolicy,\n"
        "         torchjob.Resources]\n"
        "@torchjob.task(task_config=torchjob.Elastic(nnodes=2))\n"
        "def f(): pass\n"
        "f.to_job()\n"
        "print('torch' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "False"


def test_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError):
        torchjob.NotAThing  # noqa: B018
