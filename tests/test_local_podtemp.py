"""Each pod's temporary files go with the job, as a container's do with its pod (podtemp.py).

Every test points torchjob's ``TMPDIR`` at a directory of its own, so what a run leaves in the
machine's temporary directory is seen exactly, whatever else runs beside the suite; a short one
(pytest's are too long a path for the pods' own, see the last test).
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from support import container, job_dir, job_file, leftovers, log_text, make_job, run, task, wait_until
from torchjob.engine_api.base import ThisProcess
from torchjob.engines.local.podtemp import PREFIX

pytestmark = pytest.mark.timeout(120)

# What a program sees, and what it leaves behind: a folder from tempfile and a file in it.
REPORT = (
    "import os, stat, tempfile\n"
    "made = tempfile.mkdtemp(prefix='left-')\n"
    "open(os.path.join(made, 'data'), 'w').write('x')\n"
    "home = os.environ.get('TMPDIR', '')\n"
    "print('tmpdir', home)\n"
    "print('made', made)\n"
    "print('mode', oct(stat.S_IMODE(os.stat(home).st_mode)) if home else '-')\n"
)


@pytest.fixture(autouse=True)
def _removed_at_the_jobs_end(monkeypatch: pytest.MonkeyPatch) -> None:
    """As for ``torchjob run``: an SDK call earlier in this process would keep them to its exit
    (test_flyte_run.py shows that)."""
    monkeypatch.setattr(ThisProcess, "reads_pod_files", False)


@pytest.fixture
def base() -> Iterator[Path]:
    """A new, short, private directory for torchjob's TMPDIR."""
    path = Path(tempfile.mkdtemp(prefix="tj-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _seen(text: str) -> dict[str, str]:
    return dict(
        line.split(" ", 1)
        for line in text.splitlines()
        if line.split(" ", 1)[0] in {"tmpdir", "made", "mode"}
    )


def test_each_pod_has_a_private_tmpdir_that_goes_with_the_job(
    tmp_path: Path, base: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TMPDIR", str(base))
    job = make_job("temps", [task("a", [container("c", ["python", "-c", REPORT])], replicas=2)])
    result = run(job, tmp_path, timeout=60)
    assert result.ok, result.reason
    seen = [_seen(log_text(result, pod, "c")) for pod in ("a-0", "a-1")]
    homes = [Path(s["tmpdir"]) for s in seen]
    assert homes[0] != homes[1]  # one per pod
    for home, s in zip(homes, seen, strict=True):
        assert home.parent.parent == base and home.parent.name.startswith(PREFIX), home
        assert Path(s["made"]).parent == home  # where tempfile put it
        assert s["mode"] == "0o700"
    assert list(base.iterdir()) == []  # the folders and the file the programs left: removed


def test_a_containers_own_tmpdir_is_kept(tmp_path: Path, base: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    own = tmp_path / "own-tmp"
    own.mkdir()
    monkeypatch.setenv("TMPDIR", str(base))
    mine = container("c", ["python", "-c", REPORT], env=[{"name": "TMPDIR", "value": str(own)}])
    result = run(make_job("owntemp", [task("a", [mine])]), tmp_path, timeout=60)
    assert result.ok, result.reason
    seen = _seen(log_text(result, "a-0", "c"))
    assert seen["tmpdir"] == str(own) and Path(seen["made"]).parent == own
    assert list(base.iterdir()) == []


def test_pods_forked_from_one_preload_server_each_have_their_own(
    tmp_path: Path, base: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TMPDIR is a pod's own, like its name: pods that differ only there still share the server."""
    monkeypatch.setenv("TMPDIR", str(base))
    work = tmp_path / "work"
    work.mkdir()
    (work / "light.py").write_text("import ctypes  # as torch does: the server needs it\n")
    program = container("c", ["python", "-c", REPORT], workingDir=str(work))
    job = make_job("forktemp", [task("a", [program], replicas=2)])
    result = run(job, tmp_path, timeout=60, preload=("light",))
    assert result.ok, result.reason
    record = (job_dir(result) / "preload.log").read_text()
    assert sum(line.startswith("forked ") for line in record.splitlines()) == 2, record
    homes = {_seen(log_text(result, pod, "c"))["tmpdir"] for pod in ("a-0", "a-1")}
    made = {str(Path(_seen(log_text(result, pod, "c"))["made"]).parent) for pod in ("a-0", "a-1")}
    assert len(homes) == 2 and made == homes
    assert list(base.iterdir()) == []


def test_a_killed_supervisors_folder_is_removed_by_the_next_job(tmp_path: Path, base: Path) -> None:
    """A SIGKILLed supervisor removes nothing; its folder's lock dies with it, and the next job's
    end removes the folder (a live job's, locked, is left alone)."""
    env = {**os.environ, "TMPDIR": str(base), "TORCHJOB_HOME": str(tmp_path / "home")}
    long = job_file(tmp_path, make_job("slow", [task("a", [container("c", ["sleep", "60"])])]), "slow.yaml")
    quick = job_file(tmp_path, make_job("quick", [task("a", [container("c", ["true"])])]), "quick.yaml")
    live = job_file(tmp_path, make_job("live", [task("a", [container("c", ["sleep", "60"])])]), "live.yaml")
    proc = subprocess.Popen(
        [sys.executable, "-m", "torchjob", "run", str(long)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    other = subprocess.Popen(
        [sys.executable, "-m", "torchjob", "run", str(live)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        assert wait_until(lambda: len(list(base.glob(f"{PREFIX}*/0"))) == 2, 60), list(base.iterdir())
        folders = {p.parent for p in base.glob(f"{PREFIX}*/0")}
        assert proc.stdout is not None
        job_id = proc.stdout.readline().split()[2]  # "torchjob: job ID started; ..."
        proc.kill()
        proc.wait(timeout=10)
        assert wait_until(lambda: not leftovers(job_id), 10)  # the watchdog stopped its pod
        assert {p.parent for p in base.glob(f"{PREFIX}*/0")} == folders  # left: nobody removed it
        done = subprocess.run(
            [sys.executable, "-m", "torchjob", "run", str(quick)], env=env, capture_output=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
        kept = set(base.glob(f"{PREFIX}*"))
        assert len(kept) == 1 and kept < folders  # the live job's only
    finally:
        for p in (proc, other):
            if p.poll() is None:
                p.send_signal(signal.SIGINT)
        for p in (proc, other):
            p.wait(timeout=30)
    assert wait_until(lambda: list(base.iterdir()) == [], 10), list(base.iterdir())


def test_pods_keep_a_temporary_directory_too_long_to_add_theirs_to(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A socket's path may not pass 107 bytes: under a long TMPDIR the pods keep it as it is."""
    long = tmp_path / ("t" * 40)
    long.mkdir()
    monkeypatch.setenv("TMPDIR", str(long))
    result = run(
        make_job("longtemp", [task("a", [container("c", ["python", "-c", REPORT])])]), tmp_path, timeout=60
    )
    assert result.ok, result.reason
    seen = _seen(log_text(result, "a-0", "c"))
    assert seen["tmpdir"] == str(long) and Path(seen["made"]).parent == long


def test_a_pod_run_as_another_user_keeps_the_machines(
    tmp_path: Path, base: Path, monkeypatch: pytest.MonkeyPatch, other_user: pwd.struct_passwd
) -> None:
    """As root, a pod whose process runs as another user could not write to a directory of
    root's: it gets none of its own; the machine's temporary directory (here a sticky one, as
    /tmp is) serves it, and its other pods still get theirs."""
    base.chmod(0o1777)
    monkeypatch.setenv("TMPDIR", str(base))
    script = 'echo "tmpdir ${TMPDIR:-unset}"; echo "made $(mktemp -d)"'
    theirs = container("c", ["sh", "-c", script], securityContext={"runAsUser": other_user.pw_uid})
    ours = container("c", ["python", "-c", REPORT])
    job = make_job("usertemp", [task("them", [theirs]), task("us", [ours])])
    result = run(job, tmp_path, timeout=60)
    assert result.ok, result.reason
    seen = _seen(log_text(result, "them-0", "c"))
    assert seen["tmpdir"] == str(base) and Path(seen["made"]).parent == base
    assert Path(_seen(log_text(result, "us-0", "c"))["tmpdir"]).parent.parent == base
