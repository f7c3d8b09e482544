"""The spec commands stay light: ``--help`` and ``validate`` never import torch, kubernetes or flytekit."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from torchjob.engines.local.podtemp import cache_user
from torchjob.targets import target_names

pytestmark = pytest.mark.timeout(120)

REPO = Path(__file__).resolve().parent.parent
SEED = REPO.parent / "shared" / "seeds" / "000_0d2fbf9b8108d20a.txt"
EXAMPLE = REPO / "examples" / "pytorch-job.yaml"
HEAVY = ("torch", "kubernetes", "flytekit")

# Runs the CLI in-process, then reports which heavy top-level packages got imported.
PROBE = """
import json, sys
from torchjob.cli import main
try:
    code = main(sys.argv[1:])
except SystemExit as exit:
    code = exit.code
heavy = sorted({name.split(".")[0] for name in sys.modules} & set(HEAVY))
print(json.dumps({"code": code, "heavy": heavy}), file=sys.stderr)
"""


def seed_job(tmp_path: Path) -> Path:
    if SEED.exists():
        match = re.search(r"^```ya?ml[ \t]*\n(.*?)^```", SEED.read_text(), re.MULTILINE | re.DOTALL)
        assert match
        path = tmp_path / "seed.yaml"
        path.write_text(match.group(1))
        return path
    if EXAMPLE.exists():
        return EXAMPLE
    pytest.skip("neither the seed documents nor examples/pytorch-job.yaml are there")


def probe(*args: str) -> tuple[int, list[str]]:
    result = subprocess.run(
        [sys.executable, "-c", f"HEAVY = {HEAVY!r}\n{PROBE}", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    report = json.loads(result.stderr.strip().splitlines()[-1])
    return report["code"], report["heavy"]


def imported_by_importtime(*args: str) -> set[str]:
    """Top-level modules Python reports importing (``-X importtime``) while running the CLI."""
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "torchjob", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    names = set()
    for line in result.stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            names.add(line.rsplit("|", 1)[1].strip().split(".")[0])
    return names


def test_help_imports_neither_torch_nor_kubernetes() -> None:
    code, heavy = probe("--help")
    assert code == 0
    assert heavy == []
    assert not imported_by_importtime("--help") & set(HEAVY)


def test_validate_imports_neither_torch_nor_kubernetes(tmp_path: Path) -> None:
    job = seed_job(tmp_path)
    code, heavy = probe("validate", str(job))
    assert code == 0
    assert heavy == []
    names = imported_by_importtime("validate", str(job))
    assert "torchjob" in names  # the probe does see imports
    assert not names & set(HEAVY)


def test_render_imports_neither_torch_nor_kubernetes(tmp_path: Path) -> None:
    code, heavy = probe("render", str(seed_job(tmp_path)))
    assert code == 0
    assert heavy == []


@pytest.mark.parametrize("target", target_names())
def test_render_target_imports_neither_torch_nor_kubernetes(target: str) -> None:
    """Rendering for a cluster stack is pure: the kubernetes client is for the engine that submits."""
    code, heavy = probe("render", str(REPO / "examples" / "ddp-train.yaml"), "--target", target)
    assert code == 0
    assert heavy == []


def test_submit_help_and_a_bad_submit_import_neither_torch_nor_kubernetes(tmp_path: Path) -> None:
    """The kubernetes client loads only once a job is really sent to a cluster."""
    code, heavy = probe("submit", "--help")
    assert (code, heavy) == (0, [])
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: Job\n")
    code, heavy = probe("submit", str(bad))
    assert (code, heavy) == (2, [])


def test_import_torchjob_and_a_torchjob_task_leave_flytekit_alone() -> None:
    """flytekit is imported only when a flytekit object is seen (sdk/flyte): not by ``import
    torchjob``, nor by rendering a torchjob task, which loads the SDK's loader."""
    code, heavy = probe("render", str(REPO / "examples" / "sdk" / "allreduce.py") + ":allreduce")
    assert code == 0
    assert "flytekit" not in heavy
    result = subprocess.run(
        [sys.executable, "-c", "import sys, torchjob, torchjob.sdk; print('flytekit' in sys.modules)"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.stdout.strip() == "False", result.stderr


def test_the_probe_notices_a_heavy_import() -> None:
    """The checks above can fail: importing torch shows up in the same report."""
    pytest.importorskip("torch", reason="torch is not installed")
    result = subprocess.run(
        [sys.executable, "-c", f"import torch\nHEAVY = {HEAVY!r}\n{PROBE}", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert json.loads(result.stderr.strip().splitlines()[-1])["heavy"] == ["torch"]


def assert_runs_without(
    unwanted: tuple[str, ...], state: Path, job: Path, env: dict[str, str] | None = None
) -> None:
    """``torchjob run -q JOB`` succeeds and never imports any of ``unwanted``."""
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            f"HEAVY = {unwanted!r}\n{PROBE}",
            "run",
            "-q",
            "--state-dir",
            str(state),
            str(job),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    report = json.loads(result.stderr.strip().splitlines()[-1])
    assert report["code"] == 0, result.stdout + result.stderr
    assert report["heavy"] == []


@pytest.fixture(params=[False, True], ids=["no-compile-cache", "compile-cache"])
def machine_temp(request: pytest.FixtureRequest) -> Iterator[dict[str, str]]:
    """The environment of a run whose temporary directory is a new short one, with or without
    torch's compile cache folder in it (each pod's directory then holds a link to it, podtemp.py)."""
    base = Path(tempfile.mkdtemp(prefix="tj-", dir="/tmp"))
    if request.param:
        (base / f"torchinductor_{cache_user(os.environ)}").mkdir()
    yield {**os.environ, "TMPDIR": str(base)}
    shutil.rmtree(base, ignore_errors=True)


def test_run_of_a_short_job_loads_only_what_starting_pods_needs(
    tmp_path: Path, machine_temp: dict[str, str]
) -> None:
    """The modules a job run used to load while its first ranks started: each took 2-17 ms of CPU.

    The pods outlive the first scan for descendants (0.5 s), which imported psutil every time. The
    pods' temporary directories go without shutil, also with links to the compile cache in them.
    """
    job = tmp_path / "short.yaml"
    job.write_text(
        "apiVersion: batch.volcano.sh/v1alpha1\nkind: Job\nmetadata: {name: short}\nspec:\n"
        "  plugins: {pytorch: [--master=master, --worker=worker]}\n  tasks:\n"
        + "".join(
            f"    - name: {name}\n      replicas: 1\n      template:\n        spec:\n"
            "          restartPolicy: Never\n          containers:\n"
            "            - {name: main, image: x, command: [sleep, '0.6']}\n"
            for name in ("master", "worker")
        )
    )
    unwanted = ("psutil", "logging", "shutil", "tempfile", "random", "torch", "kubernetes")
    assert_runs_without(unwanted, tmp_path, job, machine_temp)
    assert [p.name for p in Path(machine_temp["TMPDIR"]).iterdir() if p.name.startswith("torchjob-")] == []


def test_a_worker_waiting_for_its_master_costs_the_supervisor_no_psutil(tmp_path: Path) -> None:
    """The wait-for-master script naps in a `sleep` child: the scan for descendants found it and
    imported psutil (10 ms of CPU) while the master was starting. torchjob's own helpers are not
    scanned: their children stay in their process group and end with it."""
    master = (
        "import os, socket, time; time.sleep(0.8); s = socket.socket(); "
        "s.bind(('', int(os.environ['MASTER_PORT']))); s.listen(); time.sleep(0.5)"
    )
    job = tmp_path / "waiting.yaml"
    job.write_text(
        "apiVersion: batch.volcano.sh/v1alpha1\nkind: Job\nmetadata: {name: waiting}\nspec:\n"
        "  plugins: {pytorch: [--master=master, --worker=worker, --wait-master-enabled=true]}\n"
        "  tasks:\n"
        + "".join(
            f"    - name: {name}\n      replicas: 1\n      template:\n        spec:\n"
            "          restartPolicy: Never\n          containers:\n"
            f"            - {{name: main, image: x, command: {json.dumps(command)}}}\n"
            for name, command in (("master", [sys.executable, "-c", master]), ("worker", ["true"]))
        )
    )
    unwanted = ("psutil", "torch", "kubernetes")
    assert_runs_without(unwanted, tmp_path, job)


# Runs `torchjob run` in-process and reports the modules it loaded by the time the first container
# process is started (the engine starts every container with subprocess.Popen).
FIRST_POD_PROBE = """
import json, subprocess, sys
at_start = set(sys.modules)  # the interpreter's own (a site's .pth files may import anything)
at_first_pod = []
start = subprocess.Popen._execute_child
def spy(self, *args, **kwargs):
    if not at_first_pod:
        at_first_pod.append(sorted(set(sys.modules) - at_start))
    return start(self, *args, **kwargs)
subprocess.Popen._execute_child = spy
from torchjob.cli import main
try:
    code = main(sys.argv[1:])
except SystemExit as exit:
    code = exit.code
print(json.dumps({"code": code, "modules": at_first_pod[0] if at_first_pod else None}), file=sys.stderr)
"""

# Loaded by some runs only, or by every run only once its pods run: none of it is needed to start
# the first pod of a plain job (no plugin, no GPU, no progress bar).
NOT_BEFORE_FIRST_POD = (
    "torchjob.plugins.waitmaster",  # the pytorch plugin's wait-for-master script (workers only)
    "shlex",  # quoting in that script
    "torchjob.render",  # job.yaml and pods.yaml, written once the pods run
    "torchjob.spec.manifest",  # the same job.yaml
    "importlib",  # the engine registry imports an engine's module with __import__
    "typing",  # 1.6 ms; typing's names are imported under TYPE_CHECKING (torchjob/typecheck.py)
)


def test_a_plain_job_starts_its_first_pod_without_what_it_does_not_use(tmp_path: Path) -> None:
    job = tmp_path / "plain.yaml"
    job.write_text(
        "apiVersion: batch.volcano.sh/v1alpha1\nkind: Job\nmetadata: {name: plain}\nspec:\n  tasks:\n"
        + "".join(
            f"    - name: {name}\n      replicas: 1\n      template:\n        spec:\n"
            "          restartPolicy: Never\n          containers:\n"
            "            - {name: main, image: x, command: [sh, -c, 'true']}\n"
            for name in ("master", "worker")
        )
    )
    result = subprocess.run(
        [sys.executable, "-c", FIRST_POD_PROBE, "run", "-q", "--state-dir", str(tmp_path), str(job)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    report = json.loads(result.stderr.strip().splitlines()[-1])
    assert report["code"] == 0, result.stdout + result.stderr
    assert report["modules"], "no container was started through subprocess.Popen"
    assert "torchjob.engines.local.supervisor" in report["modules"]  # the probe sees the engine's imports
    assert sorted(set(report["modules"]) & set(NOT_BEFORE_FIRST_POD)) == []


GC_PROBE = """
import atexit, gc, json, sys
from torchjob.cli import main
default = gc.get_threshold()
file = sys.argv[1]
as_library = main(["validate", file]), gc.get_threshold()
# The program's main() does not return: it leaves once the exit handlers ran.
atexit.register(lambda: print(json.dumps([default, as_library, gc.get_threshold()])))
sys.argv = ["torchjob", "validate", file]
main()
"""


def test_only_the_program_collects_garbage_less_often(tmp_path: Path) -> None:
    """`torchjob` makes about 25,000 lasting objects while it starts: it sets the collector's first
    threshold to 50,000 new objects; a Python program calling ``main`` keeps its own setting."""
    job = seed_job(tmp_path)
    result = subprocess.run(
        [sys.executable, "-c", GC_PROBE, str(job)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    default, as_library, as_program = json.loads(result.stdout.strip().splitlines()[-1])
    assert default == [700, 10, 10]
    assert as_library == [0, [700, 10, 10]]
    assert as_program == [50000, 10, 10]


def test_the_import_contracts_hold() -> None:
    """The layers and import rules of pyproject.toml ([tool.importlinter]), as `make lint` checks them."""
    pytest.importorskip("importlinter", reason="import-linter (the dev extra) is not installed")
    lint = Path(sys.executable).with_name("lint-imports")
    result = subprocess.run(
        [str(lint), "--config", str(REPO / "pyproject.toml")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout
