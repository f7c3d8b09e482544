"""A rank's traceback shows every frame of the user's code as a local call would: file, line and
source, also for helpers of the user's script that cloudpickle sends by value (issue 34, item 1)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import types
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from torchjob.sdk.results import dump_call, load_call

if TYPE_CHECKING:
    from slurm_cluster import SlurmCluster

# A script whose task calls a helper of its own, which calls another that raises. Run as a
# script, its functions live in __main__ and are pickled by value.
SCRIPT = textwrap.dedent(
    """\
    import os
    import sys

    from torchjob import Elastic, PyTorch, Worker, task


    def deeper(x):
        raise ValueError(f"bad value {x}")


    def helper(x):
        return deeper(x) + 1


    def body(x):
        if os.environ.get("RANK") == "1":
            helper(x)
        return x


    configs = {
        "pytorch": PyTorch(worker=Worker(replicas=1)),
        "elastic": Elastic(nproc_per_node=2),
    }


    @task(task_config=configs["pytorch"])
    def train(x: int) -> int:
        return body(x)


    if __name__ == "__main__":
        call = train.with_overrides(task_config=configs[sys.argv[1]])
        try:
            call(3)
        except Exception as err:
            print("REMOTE-TRACEBACK-START")
            print(err.remote_traceback)
            raise SystemExit(0)
        raise SystemExit("the task did not raise")
    """
)


def expected_frames(script: Path) -> list[tuple[str, int, str, str]]:
    """The frames a local call of ``train`` would show from ``body`` on: file, line, function, source."""
    return [
        (str(script), 17, "body", "helper(x)"),
        (str(script), 12, "helper", "return deeper(x) + 1"),
        (str(script), 8, "deeper", 'raise ValueError(f"bad value {x}")'),
    ]


def frames_in(text: str) -> list[tuple[str, int, str, str]]:
    """(file, line, function, source) of each frame of a printed traceback; "" for no source."""
    import re

    lines = text.splitlines()
    found = []
    for i, line in enumerate(lines):
        frame = re.fullmatch(r'  File "(.+)", line (\d+), in (.+)', line)
        if frame:
            after = lines[i + 1] if i + 1 < len(lines) else ""
            source = after.strip() if after.startswith("    ") and not after.strip().startswith("^") else ""
            found.append((frame[1], int(frame[2]), frame[3], source))
    return found


def write_script(folder: Path) -> Path:
    script = folder / "helpers_raise.py"
    script.write_text(SCRIPT)
    return script


def remote_traceback(script: Path, config: str, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        [sys.executable, str(script), config],
        cwd=script.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout.split("REMOTE-TRACEBACK-START\n", 1)[1]


def test_code_pickled_by_value_keeps_its_file_and_lines(tmp_path: Path) -> None:
    """In process: functions, nested functions, lambdas and methods of a module pickled by value."""
    import cloudpickle

    source = tmp_path / "by_value.py"
    source.write_text(
        textwrap.dedent(
            """\
            class Box:
                def open(self):
                    inner = lambda: [1 / 0 for _ in range(1)]
                    return inner()


            def outer():
                def nested():
                    return Box().open()
                return nested()
            """
        )
    )
    module = types.ModuleType("by_value_module")
    module.__file__ = str(source)
    exec(compile(source.read_text(), str(source), "exec"), module.__dict__)
    sys.modules[module.__name__] = module
    cloudpickle.register_pickle_by_value(module)
    try:
        call = load_call(dump_call(module.outer, (), {}))
    finally:
        cloudpickle.unregister_pickle_by_value(module)
        del sys.modules[module.__name__]
    assert call.function is not module.outer  # a copy, as a rank gets it
    with pytest.raises(ZeroDivisionError) as info:
        call.function()
    import traceback

    frames = [(f.filename, f.lineno, f.name, f.line) for f in traceback.extract_tb(info.value.__traceback__)]
    assert frames[1:] == [
        (str(source), 10, "outer", "return nested()"),
        (str(source), 9, "nested", "return Box().open()"),
        (str(source), 4, "open", "return inner()"),
        (str(source), 3, "<lambda>", "inner = lambda: [1 / 0 for _ in range(1)]"),
        (str(source), 3, "<listcomp>", "inner = lambda: [1 / 0 for _ in range(1)]"),
    ]


@pytest.mark.torch
@pytest.mark.timeout(240)
@pytest.mark.parametrize("config", ["pytorch", "elastic"])
def test_a_helper_raising_inside_a_task_shows_its_line(tmp_path: Path, config: str) -> None:
    """pytorch: pods of the local engine; elastic: torch's launcher in the caller's process."""
    pytest.importorskip("torch")
    script = write_script(tmp_path)
    import os

    env = {**os.environ, "TORCHJOB_HOME": str(tmp_path / "home")}
    text = remote_traceback(script, config, env)
    assert "<dynamic-code>" not in text
    assert frames_in(text)[-3:] == expected_frames(script), text
    assert text.rstrip().endswith("ValueError: bad value 3"), text
    assert "torchjob" not in text.split("ValueError")[0], text  # the runner's frames are left out


@pytest.mark.torch
@pytest.mark.timeout(240)
def test_a_task_run_from_the_cli_logs_the_helpers_lines(tmp_path: Path) -> None:
    """``torchjob run FILE.py:TASK``: each pod imports the file and pickles the task by value; the
    failing rank's log, shown as the root cause, has every frame of the user's code."""
    pytest.importorskip("torch")
    import os

    script = write_script(tmp_path)
    env = {**os.environ, "TORCHJOB_HOME": str(tmp_path / "home")}
    done = subprocess.run(
        [sys.executable, "-m", "torchjob", "run", f"{script}:train", "--", "--x", "3"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    logged = "\n".join(
        line.split(" | ", 1)[1] for line in done.stdout.splitlines() if line.startswith("worker-0 r1 | ")
    )
    assert "<dynamic-code>" not in done.stdout
    assert frames_in(logged)[-3:] == expected_frames(script), done.stdout
    assert "entrypoint.py" not in logged  # torchjob's runner frames are not the user's


@pytest.mark.torch
@pytest.mark.timeout(300)
def test_on_slurm_a_helper_raising_inside_a_task_shows_its_line(slurm: SlurmCluster, tmp_path: Path) -> None:
    """TORCHJOB_ENGINE=slurm: the call's pods are job steps of a Slurm allocation."""
    pytest.importorskip("torch")
    script = write_script(tmp_path)
    env = {
        **slurm.env,
        "TORCHJOB_ENGINE": "slurm",
        "TORCHJOB_SLURM_JOB_ROOT": str(tmp_path / "root"),
        "TORCHJOB_SLURM_PARTITION": slurm.partition,
        "TORCHJOB_HOME": str(tmp_path / "home"),
    }
    text = remote_traceback(script, "pytorch", env)
    assert "<dynamic-code>" not in text
    assert frames_in(text)[-3:] == expected_frames(script), text
    # It ran on Slurm: one job directory beside the root's marker (.torchjob-state).
    (job_dir,) = [p for p in (tmp_path / "root").iterdir() if p.name != ".torchjob-state"]
    assert (job_dir / "status.json").is_file()
    # `status JOB` without --engine says where the job is (issue 34, item 6), and that finds it.
    cli = [sys.executable, "-m", "torchjob", "status", job_dir.name]
    lost = subprocess.run(cli, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert lost.returncode == 2
    said = (
        f"a slurm job '{job_dir.name}' was last started by a Python call: "
        f"torchjob status {job_dir.name} --engine slurm"
    )
    assert lost.stderr.endswith(said + "\n"), lost.stderr
    found = subprocess.run(
        [*cli, "--engine", "slurm"], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    # an SDK task whose rank raised failed (issue 34, item 5): not Volcano's Terminated
    assert found.returncode == 0 and found.stdout.startswith(f"job {job_dir.name}: Failed"), found.stdout
