"""torchrun's habits get one line naming torchjob's way, exit 2, no usage (issue 34, item 4)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from torchjob.cli import main

L = "<command line>"
RDZV = "torchjob sets the rendezvous itself"


@pytest.fixture(autouse=True)
def _script(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TORCHJOB_HOME", str(tmp_path / "home"))
    (tmp_path / "train.py").write_text("print('hi')\n")


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        # the two
        (
            "run --nproc-per-node=2 train.py",
            f"{L}: --nproc-per-node: torchrun's flag; torchjob takes -j NODESxPROCS: "
            "torchjob run -j 1x2 train.py",
        ),
        (
            "run python train.py",
            f"{L}: python: torchjob run runs the script itself, with no python before it: "
            "torchjob run train.py",
        ),
        # each flag, its underscore spelling and a value apart; the script's own arguments kept
        (
            "run --nproc_per_node 4 train.py --lr 0.1",
            f"{L}: --nproc_per_node: torchrun's flag; torchjob takes -j NODESxPROCS: "
            "torchjob run -j 1x4 train.py --lr 0.1",
        ),
        (
            "run --nnodes=2 train.py",
            f"{L}: --nnodes: torchrun's flag; torchjob takes -j NODESxPROCS: torchjob run -j 2x1 train.py",
        ),
        (
            "run --nnodes 2 --nproc-per-node 4 train.py",
            f"{L}: --nnodes: torchrun's flags --nnodes, --nproc-per-node; torchjob takes -j NODESxPROCS: "
            "torchjob run -j 2x4 train.py",
        ),
        (
            "run --nnodes=1:4 train.py",
            f"{L}: --nnodes: torchrun's flag; torchjob takes -j NODESxPROCS: torchjob run -j 4x1 train.py "
            "(-j takes a number of nodes, not torchrun's range 1:4: the SDK's Elastic takes one)",
        ),
        (
            "run --nproc-per-node=gpu train.py",
            f"{L}: --nproc-per-node: torchrun's flag; torchjob takes -j NODESxPROCS: torchjob run -j 1xN "
            "train.py (N processes per node: torchrun's 'gpu' has no counterpart)",
        ),
        (
            "run --standalone train.py",
            f"{L}: --standalone: torchrun's flag: torchjob run train.py ({RDZV}: --standalone left out)",
        ),
        (
            "run --standalone --nproc-per-node=4 train.py",
            f"{L}: --standalone: torchrun's flags --standalone, --nproc-per-node; torchjob takes -j "
            f"NODESxPROCS: torchjob run -j 1x4 train.py ({RDZV}: --standalone left out)",
        ),
        (
            "run --rdzv-backend=c10d --rdzv-endpoint=host:29400 --rdzv_id=7 --rdzv-conf=a=1 -j 2x2 train.py",
            f"{L}: --rdzv-backend: torchrun's flags --rdzv-backend, --rdzv-endpoint, --rdzv-id, --rdzv-conf: "
            f"torchjob run -j 2x2 train.py ({RDZV}: --rdzv-backend, --rdzv-endpoint, --rdzv-id, --rdzv-conf "
            "left out)",
        ),
        (
            "run --master-port=29500 train.py",
            f"{L}: --master-port: torchrun's flag: torchjob run train.py ({RDZV}: --master-port left out)",
        ),
        (
            "run -d -e A=1 --master-addr localhost --master-port 29500 --node-rank 0 -j2x2 train.py",
            f"{L}: --master-addr: torchrun's flags --master-addr, --master-port, --node-rank: "
            f"torchjob run -d -e A=1 -j 2x2 train.py ({RDZV}: --master-addr, --master-port, --node-rank "
            "left out)",
        ),
        # launchers as the FILE
        (
            "run python3.11 -u train.py --lr 1",
            f"{L}: python3.11: torchjob run runs the script itself, with no python3.11 before it: "
            "torchjob run train.py --lr 1",
        ),
        (
            "run torchrun --nproc-per-node=2 --rdzv-backend c10d train.py",
            f"{L}: torchrun: torchjob run runs the script itself, with no torchrun before it; "
            f"torchjob takes -j NODESxPROCS: torchjob run -j 1x2 train.py ({RDZV}: --rdzv-backend left out)",
        ),
        (
            "run python -m torch.distributed.run --nnodes=2 train.py",
            f"{L}: python: torchjob run runs the script itself, with no python before it; torchjob takes -j "
            "NODESxPROCS: torchjob run -j 2x1 train.py",
        ),
        (
            "run python -m mypkg.train",
            f"{L}: python: torchjob run takes a script file, not 'python -m mypkg.train': torchjob run "
            "SCRIPT.py (a job file's containers can run any command)",
        ),
        # render and submit take a script as run does
        (
            "render --nproc-per-node=2 train.py",
            f"{L}: --nproc-per-node: torchrun's flag; torchjob takes -j NODESxPROCS: "
            "torchjob render -j 1x2 train.py",
        ),
        (
            "submit python train.py",
            f"{L}: python: torchjob submit runs the script itself, with no python before it: "
            "torchjob submit train.py",
        ),
        # a job file has no -j: the shape is in the file
        (
            "run --nnodes 2 job.yaml",
            f"{L}: --nnodes: torchrun's flag; a job file sets its own pods (--set TASK.replicas=N changes "
            "them): torchjob run job.yaml",
        ),
    ],
)
def test_torchrun_habits_get_one_line_naming_the_torchjob_way(
    argv: str, line: str, capfd: pytest.CaptureFixture[str]
) -> None:
    assert main(argv.split()) == 2
    out, err = capfd.readouterr()
    assert (out, err) == ("", line + "\n")
    assert not (Path("home") / "jobs").exists()  # nothing started


def _master(rendered: str) -> dict[str, list[str]]:
    """The master pod's container of a rendered List."""
    items = yaml.safe_load(rendered)["items"]
    pod = next(i for i in items if i["kind"] == "Pod" and i["metadata"]["name"].endswith("-master-0"))
    container: dict[str, list[str]] = pod["spec"]["containers"][0]
    return container


def test_the_suggested_command_does_what_the_torchrun_one_meant(capfd: pytest.CaptureFixture[str]) -> None:
    assert main(["render", "--nnodes", "2", "--nproc-per-node", "3", "train.py", "--lr", "1"]) == 2
    suggested = capfd.readouterr().err.split(": torchjob ", 1)[1].split()
    assert suggested == ["render", "-j", "2x3", "train.py", "--lr", "1"]
    assert main(suggested) == 0
    container = _master(capfd.readouterr().out)
    assert {"--nnodes=2", "--nproc-per-node=3"} <= set(container["command"])
    assert container["args"] == ["train.py", "--lr", "1"]


def test_after_the_script_torchrun_flags_are_the_scripts_own(capfd: pytest.CaptureFixture[str]) -> None:
    assert main(["render", "train.py", "--nproc-per-node=2", "--master-port", "1"]) == 0
    assert _master(capfd.readouterr().out)["args"] == ["train.py", "--nproc-per-node=2", "--master-port", "1"]


def test_a_script_named_python_is_a_script(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "python").write_text("#!/usr/bin/env python3\nprint('hi')\n")
    assert main(["render", "python"]) == 0
    assert _master(capfd.readouterr().out)["args"] == ["python"]
