"""Real flytekit tasks and workflows run distributed through torchjob: real gloo all-reduces in
local-engine pods, under torch's elastic agents, and as job steps of a real Slurm allocation.

tests/flyte_tasks.py holds the tasks (each returns what its ranks saw, as a dataclass flytekit's
type engine carries back). flytekit and flytekitplugins-kfpytorch are the real packages from PyPI,
never patched; the tests skip where they (or torch) are not installed.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from support import torchjob

pytest.importorskip("flytekit", reason="flytekit is not installed (pip install -e '.[flyte]')")
pytest.importorskip("flytekitplugins.kfpytorch", reason="flytekitplugins-kfpytorch is not installed")
pytest.importorskip("torch", reason="torch is not installed")

from slurm_cluster import SlurmCluster
from torchjob.sdk.flyte import run
from torchjob.sdk.loader import import_file
from torchjob.sdk.results import RemoteError

pytestmark = [pytest.mark.timeout(300), pytest.mark.torch, pytest.mark.slow]

REPO = Path(__file__).resolve().parent.parent
TASKS = "tests/flyte_tasks.py"


@pytest.fixture(scope="module")
def tasks() -> Any:
    return import_file(str(REPO / TASKS))  # as `torchjob run FILE.py:NAME` imports it


@pytest.fixture(autouse=True)
def _private_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHJOB_HOME", str(tmp_path_factory.mktemp("home")))


def test_kfpytorch_tasks_run_distributed_and_return_typed_values(tasks: Any) -> None:
    report = run(tasks.allreduce_pytorch, scale=2)  # master + 2 workers, one process each
    assert isinstance(report, tasks.Report)
    assert report == tasks.Report(world=3, total=6, ranks=[0, 1, 2], nodes=[0, 1, 2], scale=2)
    report = run(tasks.allreduce_one_node, scale=5)  # one node, torch's launcher here, 2 processes
    assert report == tasks.Report(world=2, total=3, ranks=[0, 1], nodes=[0, 0], scale=5)
    pid, launched, scale = run(tasks.bypassed, scale=7)  # nnodes=1, one process: a direct call
    assert (pid, launched, scale) == (os.getpid(), 0, 7)


def test_each_rank_imports_the_tasks_module_with_its_pods_environment(tasks: Any) -> None:
    """Module-level code sees the pod's WORLD_SIZE, as in Flyte's pods, not the caller's (unset):
    the function is not run with the globals the caller's import computed."""
    assert "WORLD_SIZE" not in os.environ and tasks.WORLD_AT_IMPORT == "unset"
    assert run(tasks.world_at_import, scale=1) == "2 2 1"


def test_a_failing_rank_comes_back_with_its_own_traceback(tasks: Any) -> None:
    with pytest.raises(RemoteError) as info:
        run(tasks.failing, scale=4)
    error = info.value
    assert (error.rank, error.exc_type, error.message) == (1, "ValueError", "rank one refuses scale 4")
    assert f'{REPO / TASKS}", line' in error.remote_traceback
    assert 'raise ValueError(f"rank one refuses scale {scale}")' in error.remote_traceback
    assert isinstance(error.original, ValueError)
    from flytekit.core.type_engine import TypeTransformerFailedError

    with pytest.raises(TypeTransformerFailedError, match="Expected value of type <class 'float'>"):
        run(tasks.wrongly_typed, scale=1)  # rank 0's int where float is declared: flytekit refuses it


def test_flytekit_runs_the_rest_of_a_workflow_and_names_are_bound_back(tasks: Any) -> None:
    original = tasks.allreduce_pytorch
    assert run(tasks.pipeline, scale=2, elastic=False) == 12  # 1+2+3 from 3 ranks, times 2
    assert run(tasks.pipeline_dynamic, scale=1) == 6
    assert tasks.allreduce_pytorch is original


def test_torchjob_run_of_a_workflow_takes_pyflyte_run_arguments() -> None:
    """A plain task and two distributed ones (master + 2 workers; 2 nodes x 2 processes), chosen
    by a conditional on a flag given as pyflyte run takes it."""
    done = torchjob("run", f"{TASKS}:pipeline", "--scale", "2", "--elastic", timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    # 2 * (1+2+3) = 12 ranks the elastic task scales by; 12 * (1+2+3+4) = 120
    assert "torchjob: workflow pipeline returned 120\n" in done.stdout
    assert "rendezvous: 2/2 nodes joined" in done.stderr


def _kept(path: str, base: Path) -> Path:
    """An output's path, checked to exist where the caller's flytekit keeps its outputs."""
    found = Path(path)
    assert found.exists(), path
    assert found.is_relative_to(base) and found.relative_to(base).parts[0].startswith("flyte-"), path
    assert found.relative_to(base).parts[1] == "raw", path
    return found


def test_files_a_rank_returns_outlive_the_command_and_come_from_the_cache_next_time(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """The FlyteFile and FlyteDirectory rank 0 makes in its pod's temporary directory (which goes
    with the job) are written where the command's flytekit keeps outputs, as a Flyte pod uploads
    them: they exist after the command, as after `pyflyte run`. The task has cache=True: the
    second run takes the cached outputs, runs no job, and they still name the files."""
    base = Path(tempfile.mkdtemp(prefix="tj-", dir="/tmp"))  # short: see test_local_podtemp.py
    home = tmp_path_factory.mktemp("user")  # flytekit's local cache: ~/.flyte/local-cache
    try:
        env = {**os.environ, "TMPDIR": str(base), "HOME": str(home)}
        said = []
        for _ in range(2):
            done = torchjob("run", f"{TASKS}:file_pipeline", "--scale", "3", env=env, timeout=240)
            assert done.returncode == 0, done.stdout + done.stderr
            said.append(done.stdout + done.stderr)
            assert not [p.name for p in base.iterdir() if p.name.startswith("torchjob-tmp-")]
            found = re.search(
                r"returned DefaultNamedTupleOutput\(o0='(.*?)', o1=(\S+), o2=(\S+)\)\n", done.stdout
            )
            assert found, done.stdout
            text, file, folder = found[1], _kept(found[2], base), _kept(found[3], base)
            assert text == "rank 0 of 2, scale 3\\n"  # read by a plain task in the command
            assert file.read_text() == "rank 0 of 2, scale 3\n"
            assert [p.name for p in folder.iterdir()] == ["rank-0.txt"]
            assert (folder / "rank-0.txt").read_text() == "rank 0 of 2, scale 3\n"
        assert "rank_file runs in rank 0" in said[0]
        assert "rank_file runs in rank" not in said[1]  # flytekit's cache: no job
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_a_file_a_task_called_from_python_returns_outlives_the_process(tmp_path: Path) -> None:
    """torchjob.sdk.flyte.run of a lone kfpytorch task, in a Python process of its own: the
    FlyteFile and FlyteDirectory it returns are there once that process has exited."""
    script = (
        "import sys\n"
        "from torchjob.sdk.flyte import run\n"
        "from torchjob.sdk.loader import import_file\n"
        f"tasks = import_file({str(REPO / TASKS)!r})\n"
        "file, folder = run(tasks.rank_file, scale=5)\n"
        "print('paths', file.path, folder.path)\n"
    )
    base = Path(tempfile.mkdtemp(prefix="tj-", dir="/tmp"))
    try:
        env = {**os.environ, "TMPDIR": str(base), "HOME": str(tmp_path)}
        done = subprocess.run(
            [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=240, check=False
        )
        assert done.returncode == 0, done.stdout + done.stderr
        found = re.search(r"^paths (\S+) (\S+)$", done.stdout, re.M)
        assert found, done.stdout
        file, folder = _kept(found[1], base), _kept(found[2], base)
        assert file.read_text() == "rank 0 of 2, scale 5\n"
        assert (folder / "rank-0.txt").read_text() == "rank 0 of 2, scale 5\n"
        assert not [p.name for p in base.iterdir() if p.name.startswith("torchjob-tmp-")]
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_rank_zero_writes_outputs_under_the_callers_prefix_and_leaves_what_flytekit_refuses(
    tasks: Any, tmp_path: Path
) -> None:
    """values.stored, as rank 0 runs it: the file and folder are copied under the prefix given
    and named there by the literals; a value of another type or shape comes back as it is, for
    the caller's flytekit to refuse with its own error."""
    from flytekit.types.directory import FlyteDirectory
    from flytekit.types.file import FlyteFile

    from torchjob.sdk.flyte.values import Outputs, stored

    (tmp_path / "work" / "ranks").mkdir(parents=True)
    (tmp_path / "work" / "rank.txt").write_text("file\n")
    (tmp_path / "work" / "ranks" / "rank-0.txt").write_text("folder\n")
    prefix = tmp_path / "raw"
    made = (FlyteFile(str(tmp_path / "work" / "rank.txt")), FlyteDirectory(str(tmp_path / "work" / "ranks")))
    outputs = stored(str(prefix), tasks.rank_file.task_function, made)
    assert isinstance(outputs, Outputs)
    literals = outputs.literal_map().literals
    file, folder = Path(literals["o0"].scalar.blob.uri), Path(literals["o1"].scalar.blob.uri)
    assert file.is_relative_to(prefix) and file.read_text() == "file\n"
    assert folder.is_relative_to(prefix) and (folder / "rank-0.txt").read_text() == "folder\n"
    assert stored(str(prefix), tasks.wrongly_typed.task_function, 3) == 3
    assert stored(str(prefix), tasks.rank_file.task_function, "one") == "one"


def test_the_readme_example_rewritten_in_flytekit_runs_both_ways(capfd: pytest.CaptureFixture[str]) -> None:
    """examples/flyte/adaptive_training.py: conditional picks 2 nodes x 2 processes (local-engine
    pods, each an elastic agent) or one process called directly."""
    example = import_file(str(REPO / "examples/flyte/adaptive_training.py"))
    accuracy = run(example.adaptive_training, use_single_node=False)
    out = capfd.readouterr().out
    assert isinstance(accuracy, float) and accuracy > 0.9
    for rank in range(4):
        assert f"rank {rank}/4: accuracy {accuracy:.3f}" in out
    assert run(example.adaptive_training_dynamic, use_single_node=True) > 0.9
    assert "rank 0/1: accuracy" in capfd.readouterr().out


def test_the_same_task_on_slurm(slurm: SlurmCluster, tmp_path: Path) -> None:
    from test_slurm_engine import cli_env

    env = cli_env(slurm, tmp_path / "root")
    done = torchjob(
        "run", f"{TASKS}:allreduce_pytorch", "--scale", "3", "--engine", "slurm", env=env, timeout=240
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert (
        "torchjob: rank 0 returned Report(world=3, total=6, ranks=[0, 1, 2], nodes=[0, 1, 2], scale=3)"
        in (done.stdout)
    )
    assert slurm.jobs() == []


def test_the_kfpytorch_readmes_first_example_runs_as_written() -> None:
    """The README's `PyTorch(worker=Worker(replicas=5))` task, unchanged but for valid flytekit
    (examples/flyte/kfpytorch_readme.py): 1 master + 5 workers join one gloo group of 6. Each
    rank's flytekit makes a sandbox folder in its temporary directory, which goes with its pod
    (engines/local/podtemp.py): only the command's own is left in the machine's."""
    base = Path(tempfile.mkdtemp(prefix="tj-", dir="/tmp"))  # short: see test_local_podtemp.py
    try:
        env = {**os.environ, "TMPDIR": str(base)}
        done = torchjob("run", "examples/flyte/kfpytorch_readme.py:pytorch_job", env=env, timeout=240)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "torchjob: rank 0 returned 6" in done.stdout, done.stdout
        left = [p.name for p in base.iterdir()]
        sandboxes = [n for n in left if n.startswith("flyte-")]
        assert len(sandboxes) == 1, left  # the command's own (before: one a rank besides)
        assert not [n for n in left if n.startswith(("torchjob-tmp-", "torchelastic_"))], left
    finally:
        shutil.rmtree(base, ignore_errors=True)
