"""@workflow: task calls become nodes that run when their values are needed, with per-call overrides.

Most workflows here use tasks without a config (direct calls, no processes); the seed example,
the passing of a value into a 2-process task and the failing rank run real torch with gloo on CPU.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from support import torchjob
from torchjob import Elastic, RemoteError, Resources, task, workflow
from torchjob.errors import SpecError
from torchjob.sdk import Promise, WorkflowError
from torchjob.sdk.workflow import ValueNeeded, trace
from torchjob.sdk.workflow_cli import parse_arguments

pytestmark = pytest.mark.timeout(300)

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "sdk" / "adaptive_training.py"
# /work/main/../shared, or /work/wt/NAME/../../shared from a worktree.
SEEDS = next((p / "shared" / "seeds" for p in REPO.parents if (p / "shared" / "seeds").is_dir()), None)


@pytest.fixture(autouse=True)
def _job_dirs_in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Local-engine job directories go under the test's tmp dir, not ~/.torchjob."""
    monkeypatch.setenv("TORCHJOB_HOME", str(tmp_path / "home"))


CALLS: list[str] = []


@pytest.fixture(autouse=True)
def _no_calls() -> None:
    CALLS.clear()


@task
def double(x: int) -> int:
    CALLS.append(f"double({x})")
    return 2 * x


@task
def add(x: int, y: int) -> int:
    CALLS.append(f"add({x}, {y})")
    return x + y


@task(task_config=Elastic(nproc_per_node=2), image="repo/train:1")
def where_am_i(tag: str) -> tuple[int, str]:
    CALLS.append(f"where_am_i({tag})")
    return os.getpid(), tag


# ------------------------------------------------------------------ the seed example (real torch)

# What the seed leaves to the user ("your training code here"): a real data-parallel training
# with gloo that sets ``accuracy``, which the seed's own ``return accuracy`` then returns.
TRAINING = """\
    import os
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel
    if "WORLD_SIZE" in os.environ:
        dist.init_process_group("gloo")
    else:
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    features = torch.cat([torch.randn(256, 2) + 2.0, torch.randn(256, 2) - 2.0])[rank::world]
    labels = torch.cat([torch.ones(256), torch.zeros(256)])[rank::world]
    model = DistributedDataParallel(torch.nn.Linear(2, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(epochs):
        for start in range(0, len(labels), batch_size):
            optimizer.zero_grad()
            logits = model(features[start : start + batch_size]).squeeze(1)
            F.binary_cross_entropy_with_logits(logits, labels[start : start + batch_size]).backward()
            optimizer.step()
    with torch.no_grad():
        correct = ((model(features).squeeze(1) > 0).float() == labels).sum()
    counts = torch.tensor([float(correct), float(len(labels))])
    dist.all_reduce(counts)
    accuracy = (counts[0] / counts[1]).item()
    print(f"rank {rank}/{world} pid {os.getpid()}: accuracy {accuracy:.3f}", flush=True)
    dist.destroy_process_group()
"""


def seed_example(tmp_path: Path) -> Path:
    """The last seed document's workflow example, with only its two import lines replaced.

    Without the seed documents, the example in examples/sdk (the same workflow) stands in.
    """
    seeds = sorted(SEEDS.glob("*.txt")) if SEEDS else []
    if not seeds:
        return EXAMPLE
    blocks = re.findall(r"^```python\n(.*?)^```", seeds[-1].read_text(), re.MULTILINE | re.DOTALL)
    code = next(b for b in blocks if "@workflow" in b)
    imports = ["from flytekit import task, workflow\n", "from flytekitplugins.kfpytorch import Elastic\n"]
    assert all(line in code for line in imports)
    code = code.replace(imports[0], "from torchjob import task, workflow, Elastic\n").replace(imports[1], "")
    assert code.count("    # Your training code here\n") == 1
    code = code.replace("    # Your training code here\n", TRAINING)
    path = tmp_path / "seed_workflow.py"
    path.write_text(code)
    return path


@pytest.mark.torch
def test_seed_example_runs_both_branches(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    pytest.importorskip("torch")
    from torchjob.sdk.loader import import_file

    module = import_file(str(seed_example(tmp_path)))
    with caplog.at_level(logging.DEBUG, logger="torchjob"):
        single = module.adaptive_training(use_single_node=True)
    # One node, one process: called in this very process, no launcher, no pods.
    assert f"rank 0/1 pid {os.getpid()}: accuracy" in capfd.readouterr().out
    assert isinstance(single, float) and single > 0.9
    log = caplog.text
    assert "task_config received (with_overrides on this call): Elastic(nnodes=1, nproc_per_node=1" in log
    assert "nnodes=1 (type int)" in log
    assert "single node detected (one process): elastic launch bypassed" in log

    multi = module.adaptive_training(use_single_node=False)
    out = capfd.readouterr().out
    # 2 nodes x 2 processes: the local engine's two pods, each with two ranks of a world of 4.
    # c10d rendezvous numbers the nodes in its own order, so either pod may hold ranks 0 and 1;
    # each rank's line is whole (the ranks of a pod share its output).
    lines = re.findall(r"^(master-0|worker-0) \| rank (\d)/4 pid \d+: accuracy [\d.]+$", out, re.MULTILINE)
    assert sorted(int(rank) for _, rank in lines) == [0, 1, 2, 3], out
    by_pod = {pod: sorted(int(rank) for p, rank in lines if p == pod) for pod in ("master-0", "worker-0")}
    assert sorted(by_pod.values()) == [[0, 1], [2, 3]], out
    assert isinstance(multi, float) and multi > 0.9
    assert module.train_model.task_config == Elastic(nnodes=2, nproc_per_node=2)


# ------------------------------------------------------------------------- promises and nodes


@workflow
def chain(n: int) -> tuple[int, int]:
    a = double(n)
    b = add(a, 1)  # the first call's promise goes into the second call
    return a, b


def test_result_of_one_task_passed_to_another() -> None:
    assert chain(5) == (10, 11)
    assert CALLS == ["double(5)", "add(10, 1)"]


@task(task_config=Elastic(nproc_per_node=2))
def scaled_sum(values: list[int], scale: float) -> float:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    try:
        mine = torch.tensor([float(values[dist.get_rank()]) * scale])
        dist.all_reduce(mine)
        return float(mine.item())
    finally:
        dist.destroy_process_group()


@task
def pair(x: int) -> list[int]:
    return [x, x + 1]


@workflow
def into_processes(x: int) -> float:
    return scaled_sum(pair(x), scale=double(1))


@pytest.mark.torch
def test_result_passed_into_a_two_process_task() -> None:
    pytest.importorskip("torch")
    # Both promises are resolved before the launcher pickles the call for its 2 ranks.
    assert into_processes(3) == (3 + 4) * 2.0


@workflow
def arithmetic(n: int) -> tuple[int, float, str, int]:
    x = double(n)
    ran_before_use = len(CALLS)
    y = x * 3 + 1  # needs the value: the node runs here
    z = 10 / x
    if x > 5:  # noqa: SIM108  (a plain `if` on a promise; Flyte needs `conditional`)
        w = add(x, 100)
    else:
        w = add(x, -100)
    return y, z, f"{x:>4}|{ran_before_use}", w


def test_promise_in_arithmetic_and_conditions() -> None:
    assert arithmetic(4) == (25, 1.25, "   8|0", 108)
    CALLS.clear()
    assert arithmetic(1) == (7, 5.0, "   2|0", -98)


@workflow
def three_in_order() -> int:
    double(1)
    double(2)
    last = double(3)
    return last


def test_every_node_runs_in_the_order_written() -> None:
    assert three_in_order() == 6
    assert CALLS == ["double(1)", "double(2)", "double(3)"]


@workflow
def needs_the_second() -> int:
    double(1)
    second = double(2)
    double(3)
    value = int(second)  # the nodes up to this one run now, the third when the workflow returns
    CALLS.append(f"used {value}")
    return value


def test_value_needed_runs_the_nodes_up_to_it() -> None:
    assert needs_the_second() == 4
    assert CALLS == ["double(1)", "double(2)", "used 4", "double(3)"]


def test_promises_inside_containers_are_resolved() -> None:
    @task
    def echo(value: Any) -> Any:
        return value

    cyclic: list[Any] = [1]
    cyclic.append(cyclic)

    @workflow
    def nested_values() -> Any:
        a = double(1)
        return echo({"a": [a, (a, {a})], "b": cyclic}), {"direct": a}

    got, direct = nested_values()
    assert got["a"] == [2, (2, {2})] and got["b"] is cyclic and direct == {"direct": 2}


def test_promise_repr_does_not_run_the_node() -> None:
    seen: list[str] = []

    @workflow
    def peek() -> int:
        p = double(7)
        seen.append(repr(p))
        return p

    assert peek() == 14
    assert seen == ["Promise(workflow peek: node 1 double (pending))"]


# ------------------------------------------------------------------------------ with_overrides


@workflow
def overridden() -> tuple[int, str]:
    return where_am_i("x").with_overrides(
        task_config=Elastic(nnodes=1, nproc_per_node=1),
        image="repo/other:2",
        requests=Resources(cpu="1", mem="1Gi"),
        limits=Resources(cpu="2"),
    )


def test_with_overrides_on_a_node_leaves_the_task_unchanged() -> None:
    # Overridden to one process: the function runs in this process (the task's own config
    # would start 2 processes under the launcher).
    pid, tag = overridden()
    assert (pid, tag) == (os.getpid(), "x")
    (node,) = trace(overridden, (), {})
    assert node.task.task_config == Elastic(nnodes=1, nproc_per_node=1)
    assert (node.task.image, node.task.requests, node.task.limits) == (
        "repo/other:2",
        Resources(cpu="1", mem="1Gi"),
        Resources(cpu="2"),
    )
    assert where_am_i.task_config == Elastic(nproc_per_node=2)
    assert (where_am_i.image, where_am_i.requests, where_am_i.limits) == ("repo/train:1", None, None)


def test_with_overrides_after_the_node_ran_is_refused() -> None:
    @workflow
    def late() -> int:
        p = double(1)
        int(p)
        return p.with_overrides(image="x")  # type: ignore[attr-defined,no-any-return]

    with pytest.raises(WorkflowError, match="with_overrides after the node done"):
        late()


def test_bad_override_fails_at_the_call() -> None:
    @workflow
    def bad() -> int:
        return double(1).with_overrides(task_config="four nodes")  # type: ignore[attr-defined,no-any-return]

    with pytest.raises(ValueError, match="task_config must be"):
        bad()
    assert CALLS == []


def test_with_overrides_on_a_direct_call_is_a_clear_error_before_running() -> None:
    with pytest.raises(TypeError, match=r"outside a @workflow.*double\.with_overrides\(task_config=\.\.\.\)"):
        double(3).with_overrides(task_config=Elastic(nnodes=1))  # type: ignore[attr-defined]
    assert CALLS == []  # refused before the task ran
    # Outside a workflow a call still runs at once, and overriding the task still works.
    assert double(3) == 6 and double.with_overrides(image="x")(4) == 8


def test_wrong_arguments_fail_on_the_line_that_wrote_them() -> None:
    @workflow
    def wrong() -> int:
        return double(1, 2)  # type: ignore[call-arg]

    with pytest.raises(TypeError, match="too many positional arguments"):
        wrong()


# ------------------------------------------------------------------------------------ nesting


@workflow
def inner(x: int) -> int:
    return add(double(x), 1)


@workflow
def outer(x: int) -> tuple[int, int]:
    first = inner(x)
    assert isinstance(first, Promise)  # nested: the inner workflow's calls are nodes of this one
    second = inner(first).with_overrides(image="repo/other:3")  # type: ignore[attr-defined]
    return first, second


def test_nested_workflows() -> None:
    assert outer(2) == (5, 11)
    assert CALLS == ["double(2)", "add(4, 1)", "double(5)", "add(10, 1)"]
    assert inner(2) == 5  # called from plain Python: a plain value
    nodes = trace(outer, (2,), {})
    assert [n.label for n in nodes] == [
        "workflow outer > inner: node 1 double",
        "workflow outer > inner: node 2 add",
        "workflow outer > inner: node 3 double",
        "workflow outer > inner: node 4 add",
    ]
    assert (nodes[1].task.image, nodes[3].task.image) == (None, "repo/other:3")


def test_tracing_runs_nothing_and_refuses_values() -> None:
    assert [n.task.name for n in trace(chain, (1,), {})] == ["double", "add"]
    with pytest.raises(
        ValueNeeded, match=r"node 1 double: its result is used as a value at .*test_sdk_workflow"
    ):
        trace(arithmetic, (1,), {})
    assert CALLS == []


# ------------------------------------------------------------------------------------ failures


@task(task_config=Elastic(nproc_per_node=2))
def fails_on_rank_1(x: int) -> int:
    if int(os.environ["RANK"]) == 1:
        raise ValueError(f"rank 1 rejects {x}")
    time.sleep(60)
    return x


@workflow
def failing(x: int) -> int:
    y = fails_on_rank_1(double(x))
    return add(y, 1)


@pytest.mark.torch
def test_exception_in_a_rank_reaches_the_workflow_caller() -> None:
    pytest.importorskip("torch")
    started = time.monotonic()
    with pytest.raises(RemoteError) as info:
        failing(2)
    assert time.monotonic() - started < 120
    error = info.value
    assert (error.rank, error.exc_type, error.message) == (1, "ValueError", "rank 1 rejects 4")
    assert __file__ in error.remote_traceback and "raise ValueError" in error.remote_traceback
    assert "torchjob workflow failing: raised by node 2 (fails_on_rank_1)" in getattr(error, "__notes__", [])
    assert CALLS == ["double(2)"]  # the node after the failed one never ran


# -------------------------------------------------------------------------- command line


class Mode(enum.Enum):
    FAST = "fast"
    SLOW = "slow"


def test_arguments_from_the_signature() -> None:
    @workflow
    def flow(
        flag: bool,
        n: int,
        rate: float = 0.1,
        name: str = "x",
        maybe: int | None = None,
        sizes: list[int] | None = None,
        mode: Mode = Mode.FAST,
        quiet: bool = False,
    ) -> None:
        return None

    args, kwargs = parse_arguments(
        flow,
        [
            "--flag",
            "--n=3",
            "--rate",
            "0.5",
            "--maybe",
            "none",
            "--sizes",
            "[1, 2]",
            "--mode",
            "slow",
            "--no-quiet",
        ],
        "f.py:flow",
    )
    assert args == []
    assert kwargs == {
        "flag": True,
        "n": 3,
        "rate": 0.5,
        "maybe": None,
        "sizes": [1, 2],
        "mode": Mode.SLOW,
        "quiet": False,
    }
    assert parse_arguments(flow, ["--flag", "false", "--n", "1"], "f.py:flow")[1] == {"flag": False, "n": 1}


@dataclasses.dataclass
class _Optimizer:
    lr: float = 0.01
    momentum: float = 0.5


@dataclasses.dataclass
class _Hyper:
    epochs: int
    batch_size: int = 64
    optimizer: _Optimizer = dataclasses.field(default_factory=_Optimizer)


def test_a_dataclass_argument_is_a_json_object_as_pyflyte_run_takes_it() -> None:
    """flytesnacks' kfpytorch MNIST task takes `hp: Hyperparameters` (a dataclass), which pyflyte
    run takes as JSON (`--hp '{"epochs": 1}'`); it was refused as not given on a command line."""

    @workflow
    def flow(hp: _Hyper) -> None:
        return None

    given = '{"epochs": 2, "optimizer": {"lr": 0.1}}'
    kwargs = parse_arguments(flow, ["--hp", given], "f.py:flow")[1]
    assert kwargs == {"hp": _Hyper(epochs=2, optimizer=_Optimizer(lr=0.1))}
    for wrong, expected in (
        ('{"epoch": 2}', "--hp: _Hyper has no field 'epoch' (it has batch_size, epochs, optimizer)"),
        ("[2]", "--hp: expected a JSON object of _Hyper's fields, got '[2]'"),
        ("{}", "--hp: _Hyper: "),  # epochs has no default
    ):
        with pytest.raises(SpecError) as caught:
            parse_arguments(flow, ["--hp", wrong], "f.py:flow")
        assert expected in str(caught.value), str(caught.value)


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        (["--n", "٣"], "expected an integer, got '٣'"),  # Arabic-Indic three: int() would take it
        (["--n", "３"], "expected an integer, got '３'"),  # fullwidth
        (["--n", "1", "--rate", "٠.٥"], "expected a number, got '٠.٥'"),
    ],
)
def test_numbers_in_workflow_arguments_are_ascii(given: list[str], expected: str) -> None:
    """As a shell, torchrun or Kubernetes read numbers: Python's int() alone takes any script's digits."""

    @workflow
    def flow(n: int, rate: float = 0.1) -> None:
        return None

    with pytest.raises(SpecError) as caught:
        parse_arguments(flow, given, "f.py:flow")
    assert expected in str(caught.value)


@pytest.mark.skipif(not hasattr(sys, "get_int_max_str_digits"), reason="no int digits limit here")
def test_an_integer_argument_past_pythons_digits_limit_is_named_as_such() -> None:
    """int() refuses text of more than 4300 digits: the message says so (and how to lift the
    limit), instead of 'expected an integer' followed by every digit."""

    @workflow
    def flow(n: int, x: float = 0.0) -> None:
        return None

    limit = sys.get_int_max_str_digits()
    assert parse_arguments(flow, ["--n", "9" * limit], "f.py:flow")[1]["n"] == 10**limit - 1
    with pytest.raises(SpecError) as caught:
        parse_arguments(flow, ["--n", "9" * (limit + 1)], "f.py:flow")
    message = str(caught.value)
    assert f"--n: expected an integer of at most {limit} digits" in message
    assert f"got one of {limit + 1}" in message and "PYTHONINTMAXSTRDIGITS=0" in message
    assert len(message) < 300
    with pytest.raises(SpecError) as caught:  # not an integer at all: said as before, cut short
        parse_arguments(flow, ["--n", "9" * (limit + 1) + "x"], "f.py:flow")
    assert "expected an integer, got '999" in str(caught.value) and len(str(caught.value)) < 300


BIG_FLOW = """
from torchjob import workflow

@workflow
def big(n: int) -> int:
    return n * 10 ** 5000
"""


@pytest.mark.skipif(not hasattr(sys, "get_int_max_str_digits"), reason="no int digits limit here")
def test_cli_prints_a_workflow_value_that_python_cannot_turn_into_text(tmp_path: Path) -> None:
    (tmp_path / "big.py").write_text(BIG_FLOW)
    out = torchjob("run", f"{tmp_path / 'big.py'}:big", "--", "--n", "7", home=tmp_path, timeout=200)
    assert out.returncode == 0, out.stderr
    assert "Traceback" not in out.stderr
    assert "torchjob: workflow big returned an integer of 5001 digits, too many to print" in out.stdout
    limited = "9" * (sys.get_int_max_str_digits() + 1)
    out = torchjob("run", f"{tmp_path / 'big.py'}:big", "--", "--n", limited, home=tmp_path, timeout=200)
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    assert "expected an integer of at most" in out.stderr


RAISING_FLOW = """
from torchjob import task, workflow

@task
def double(n: int) -> int:
    return 2 * n

@workflow
def boom(n: int) -> int:
    return {}[double(n=n) if n > 100 else n]
"""


@pytest.mark.parametrize("command", ["run", "render"])
def test_cli_a_workflow_that_raises_shows_its_own_traceback_and_exits_1(tmp_path: Path, command: str) -> None:
    """The workflow's own error (not a task's): its traceback from its own frame, not torchjob's
    eight, then one line naming the workflow; exit 1 as for a failed task."""
    (tmp_path / "boom.py").write_text(RAISING_FLOW)
    out = torchjob(command, f"{tmp_path / 'boom.py'}:boom", "--", "--n", "2", home=tmp_path, timeout=200)
    assert out.returncode == 1, out.stderr
    lines = out.stderr.splitlines()
    assert lines[0] == "Traceback (most recent call last):" and "boom.py" in lines[1], out.stderr
    assert "torchjob" not in "\n".join(lines[1:-1]), out.stderr
    assert lines[-2] == "KeyError: 2"
    assert lines[-1].startswith("torchjob: workflow boom failed") and lines[-1].endswith(": KeyError: 2")


@pytest.mark.torch
def test_cli_runs_the_example_workflow_with_arguments(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    out = torchjob(
        "run",
        f"{EXAMPLE}:adaptive_training",
        "--",
        "--use-single-node",
        "true",
        env={**os.environ, "TORCHJOB_LOG": "debug", "TORCHJOB_HOME": str(tmp_path)},
        timeout=200,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert re.search(r"^torchjob: workflow adaptive_training returned 0\.9\d*$", out.stdout, re.MULTILINE), (
        out.stdout
    )
    assert re.search(r"^rank 0/1 pid \d+: accuracy", out.stdout, re.MULTILINE)
    for line in (
        "task_config received (with_overrides on this call): Elastic(nnodes=1, nproc_per_node=1",
        "nnodes=1 (type int), nproc_per_node=1",
        "single node detected (one process): elastic launch bypassed",
    ):
        assert line in out.stderr


FLOW_FILE = """
from torchjob import Elastic, PyTorch, Worker, task, workflow

@task(task_config=Elastic(nnodes=2, nproc_per_node=2))
def train(epochs: int) -> float:
    return 1.0

@task
def evaluate(score: float) -> bool:
    return score > 0.5

@workflow
def two_steps(epochs: int = 1) -> bool:
    return evaluate(train(epochs).with_overrides(task_config=PyTorch(worker=Worker(replicas=3))))

@workflow
def bad_override() -> float:
    return train(1).with_overrides(task_config=Elastic(nnodes=2), image="")

@workflow
def decides(epochs: int = 1) -> bool:
    if train(epochs) > 0.5:
        return evaluate(1.0)
    return False
"""


def test_cli_render_prints_one_list_per_node(tmp_path: Path) -> None:
    path = tmp_path / "flows.py"
    path.write_text(FLOW_FILE)
    out = torchjob("render", f"{path}:two_steps", timeout=200)
    assert out.returncode == 0, out.stderr
    lists = list(yaml.safe_load_all(out.stdout))
    assert [doc["kind"] for doc in lists] == ["List", "List"]
    pods = [[i["metadata"]["name"] for i in doc["items"] if i["kind"] == "Pod"] for doc in lists]
    assert pods == [
        ["train-1-master-0", "train-1-worker-0", "train-1-worker-1", "train-1-worker-2"],  # the override
        ["evaluate-2-master-0"],
    ]
    assert out.stdout.startswith("# workflow two_steps: node 1 train\n")
    single = torchjob(
        "render", f"{EXAMPLE}:adaptive_training", "--", "--use-single-node", "true", timeout=200
    )
    assert single.returncode == 0, single.stderr
    (only,) = yaml.safe_load_all(single.stdout)
    assert [i["metadata"]["name"] for i in only["items"] if i["kind"] == "Pod"] == ["train-model-1-master-0"]


@pytest.mark.parametrize(
    ("ref", "args", "message"),
    [
        (
            "EXAMPLE:adaptive_training",
            [],
            ": --use-single-node: missing (bool); give it after --: -- --use-single-node VALUE",
        ),
        (
            "EXAMPLE:adaptive_training",
            ["--", "--use-single-node", "maybe"],
            ": --use-single-node: expected true or false, got 'maybe'",
        ),
        (
            "EXAMPLE:adaptive_training",
            ["--", "--use-single-node", "true", "--epochs", "3"],
            ": --epochs: adaptive_training has no such parameter",
        ),
        ("FLOWS:decides", [], ": workflow decides: node 1 train: its result is used as a value at"),
        (
            "FLOWS:bad_override",
            [],
            ": workflow bad_override: node 1 train: with_overrides at FLOWS:18: image must be a non-empty",
        ),
    ],
)
def test_cli_bad_workflow_input_is_one_line_and_exit_2(
    tmp_path: Path, ref: str, args: list[str], message: str
) -> None:
    flows = tmp_path / "flows.py"
    flows.write_text(FLOW_FILE)
    ref = ref.replace("EXAMPLE", str(EXAMPLE)).replace("FLOWS", str(flows))
    message = message.replace("FLOWS", str(flows))
    for command in ("render", "run"):
        if command == "run" and ref.endswith(":decides"):
            continue  # running it is fine: the value exists then
        out = torchjob(command, ref, *args, home=tmp_path, timeout=200)
        assert out.returncode == 2, (command, out.stdout, out.stderr)
        assert out.stderr.count("\n") == 1 and message in out.stderr, out.stderr
        assert "Traceback" not in out.stderr and out.stdout == ""


def test_cli_refuses_options_and_arguments_that_do_not_apply(tmp_path: Path) -> None:
    out = torchjob(
        "run", "--detach", f"{EXAMPLE}:adaptive_training", "--", "--use-single-node", "true", timeout=200
    )
    assert out.returncode == 2 and "--detach: not for a workflow" in out.stderr
    task_file = tmp_path / "t.py"
    task_file.write_text("from torchjob import task\n@task\ndef t():\n    return 1\n")
    out = torchjob("run", f"{task_file}:t", "--", "--x", "1", home=tmp_path, timeout=200)
    assert out.returncode == 2 and "--x: t has no such parameter (its parameters: none)" in out.stderr
    out = torchjob("status", "--", "x", timeout=200)
    assert out.returncode == 2 and "arguments after -- are the program's" in out.stderr


FAILING_FLOW = """
from torchjob import PyTorch, Worker, task, workflow

@task(task_config=PyTorch(worker=Worker(replicas=1)))
def picky(limit: int) -> int:
    import os
    rank = int(os.environ["RANK"])
    if rank == 1:
        raise ValueError(f"rank {rank} refuses {limit}")
    return limit

@workflow
def flow(limit: int) -> int:
    return picky(limit=limit) + 1
"""


@pytest.mark.torch
def test_cli_run_of_a_workflow_whose_rank_fails_exits_1_and_names_the_rank(tmp_path: Path) -> None:
    """`torchjob run FILE.py:WORKFLOW` of a failing call: exit 1, the rank's error in one place."""
    pytest.importorskip("torch")
    script = tmp_path / "failing_flow.py"
    script.write_text(FAILING_FLOW)
    out = torchjob("run", f"{script}:flow", "--", "--limit", "3", home=tmp_path, cwd=tmp_path, timeout=200)
    assert out.returncode == 1, out.stdout[-2000:] + out.stderr[-2000:]
    assert "torchjob: workflow flow failed:" in out.stderr
    assert "rank 1" in out.stderr and "ValueError" in out.stderr and "refuses 3" in out.stderr, out.stderr
    assert "workflow flow returned" not in out.stdout
