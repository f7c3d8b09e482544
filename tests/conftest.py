"""Fixtures every test may use; plain helpers (the CLI as a process, job documents, the local
engine through the interface) are in ``support.py``.

The tests' jobs use the user's real port registry, as every other torchjob of this user does: a
registry of the test run alone could not see the ports that another copy of the suite, or the
user's own jobs, have reserved but not yet bound. Tests of the registry itself point
TORCHJOB_RUNTIME_DIR at a directory of their own.
"""

from __future__ import annotations

import io
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from support import Ran, private_slurm

# tools/slurm_cluster.py builds the tests' private Slurm (and a user's, to try the engine).
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))

if TYPE_CHECKING:
    from kubeapi import FakeKubeAPI
    from slurm_cluster import SlurmCluster


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The suite's longest tests run first (suite_order.py says why)."""
    from suite_order import slow_first

    items[:] = slow_first(items)


@pytest.fixture(scope="session", autouse=True)
def _private_torchjob_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Every test that does not choose its own TORCHJOB_HOME (the ``home`` fixture) gets one of the
    session's, never the user's ``~/.torchjob``: the commands the tests run note where each job
    was started (engine_api/lastrun.py), and the user's own hints must not name the tests' jobs,
    nor two suites run side by side share that file."""
    before = os.environ.get("TORCHJOB_HOME")
    os.environ["TORCHJOB_HOME"] = str(tmp_path_factory.mktemp("torchjob-home"))
    yield
    if before is None:
        os.environ.pop("TORCHJOB_HOME", None)
    else:
        os.environ["TORCHJOB_HOME"] = before


@pytest.fixture(autouse=True)
def _signal_handlers_as_found() -> Iterator[None]:
    """Code run in-process may install handlers for the signals that stop a job and keep them (the
    Slurm batch host's loop does, as the process it runs in ends with it). A later test in the same
    worker must not inherit them: its Ctrl-C or SIGTERM would go to a finished loop. Each test
    starts with Python's own Ctrl-C handler and ends with the handlers it found."""
    import signal

    kept = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    # A test that sends itself Ctrl-C expects Python's own handler (KeyboardInterrupt), whatever a
    # library imported by another test module installed (flytekit's exits the process at import).
    if kept[signal.SIGINT] is not signal.default_int_handler:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    for signum, handler in kept.items():
        if handler is not None and signal.getsignal(signum) is not handler:
            signal.signal(signum, handler)


@pytest.fixture(autouse=True)
def _torchjob_logger_as_found() -> Iterator[None]:
    """An in-process command with -v or TORCHJOB_LOG configures torchjob's logger: a level, and a
    handler on that test's captured stderr, closed once the test ends. A later test in the same
    worker must inherit neither (its log records would go to the closed stream)."""
    yield
    if "logging" in sys.modules:
        import logging

        logger = logging.getLogger("torchjob")
        for handler in [h for h in logger.handlers if getattr(h, "_torchjob", False)]:
            logger.removeHandler(handler)
        logger.setLevel(logging.NOTSET)


@pytest.fixture
def run_main(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Callable[..., Ran]:
    """``torchjob ARGS`` in this process: the CLI's ``main`` with its output captured (argparse's
    exits as their code). ``cwd`` is where relative paths are read; ``stdin`` is what ``-`` reads.
    For what only a process shows (its real exit, signals, a fresh interpreter's imports) use
    ``support.torchjob``."""
    from torchjob.cli import main

    def run(*argv: str, cwd: Path | str | None = None, stdin: str | bytes | None = None) -> Ran:
        capsys.readouterr()
        with monkeypatch.context() as patch:
            if cwd is not None:
                patch.chdir(cwd)
            if stdin is not None:
                data = stdin.encode() if isinstance(stdin, str) else stdin
                patch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data), encoding="utf-8"))
            try:
                code: object = main(list(argv))
            except SystemExit as exit:  # argparse's usage errors and --help
                code = exit.code
        out, err = capsys.readouterr()
        assert isinstance(code, int), code
        return Ran(code, out, err)

    return run


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private TORCHJOB_HOME: the test's jobs, logs and records are its own."""
    folder = tmp_path / "home"
    monkeypatch.setenv("TORCHJOB_HOME", str(folder))
    return folder


@pytest.fixture
def job_file(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    """The test module's ``JOB`` (a job file's text) written to ``tmp_path/job.yaml``."""
    path = tmp_path / "job.yaml"
    path.write_text(request.module.JOB)
    return path


@pytest.fixture
def api() -> Iterator[FakeKubeAPI]:
    """A fake Kubernetes API server on 127.0.0.1 (tests/kubeapi.py), stopped after the test."""
    from kubeapi import FakeKubeAPI

    server = FakeKubeAPI().start()
    yield server
    server.stop()


@pytest.fixture
def kubeconfig(api: FakeKubeAPI, tmp_path: Path) -> str:
    """A kubeconfig file whose current context is ``api``."""
    return str(api.kubeconfig(tmp_path / "kubeconfig"))


@pytest.fixture
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """A private Slurm cluster (tools/slurm_cluster.py), stopped by pid after the test; skips
    where Slurm is not installed, the tests do not run as root, or such a cluster cannot be made."""
    yield from private_slurm(tmp_path_factory)


@pytest.fixture
def queue_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A queue of this test alone, on a machine of 4 CPUs, 8Gi and 2 GPUs; no settings file."""
    runtime = tmp_path / "runtime"
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv("TORCHJOB_RUNTIME_DIR", str(runtime))
    monkeypatch.setenv("TORCHJOB_QUEUE_DIR", str(runtime))  # not the machine's shared queue, if any
    monkeypatch.setenv("TORCHJOB_CAPACITY", "cpu=4,memory=8Gi,nvidia.com/gpu=2")
    monkeypatch.setenv("TORCHJOB_CONFIG", str(tmp_path / "queues.yaml"))
    monkeypatch.delenv("TORCHJOB_QUEUE", raising=False)
    return tmp_path


@pytest.fixture
def other_user() -> Iterator[pwd.struct_passwd]:
    """A fresh second user (and its group of the same name), removed after the test; skips unless
    the tests run as root with useradd."""
    if os.geteuid() != 0:
        pytest.skip("needs root to create a second user with useradd")
    if shutil.which("useradd") is None or shutil.which("userdel") is None:
        pytest.skip("useradd/userdel are not installed")
    name = f"tjq{os.getpid() % 100000}x{time.monotonic_ns() % 1000}"
    for _ in range(50):  # /etc/passwd may be locked by another test adding its own user
        made = subprocess.run(
            ["useradd", "--no-create-home", "--user-group", "--shell", "/bin/sh", name],
            capture_output=True,
            text=True,
        )
        if made.returncode == 0:
            break
        time.sleep(0.1)
    else:
        pytest.skip(f"useradd failed: {made.stderr.strip()}")
    try:
        yield pwd.getpwnam(name)
    finally:
        for _ in range(50):
            if subprocess.run(["userdel", name], capture_output=True).returncode in (0, 6):
                break
            time.sleep(0.1)


@pytest.fixture
def shared_tmp() -> Iterator[Path]:
    """A directory like /tmp (1777), that every user can write to; /tmp itself is left alone."""
    path = Path(tempfile.mkdtemp(prefix="torchjob-security-", dir="/tmp"))
    path.chmod(0o1777)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
