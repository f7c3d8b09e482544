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
    (work / "light.py").write_text(  # ctypes: as torch does, the server needs it; tempfile asked
        "import ctypes, tempfile\ntempfile.gettempdir()\n"  # at import, as torch._inductor does
    )
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


# A program that keeps a file in torch's compile cache folder, found as torch.compile finds it
# (inductor's kernels, graphs and precompiled header go there), and says what it saw there.
COMPILE_CACHE = (
    "import os\n"
    "from torch._inductor.runtime.cache_dir_utils import default_cache_dir\n"
    "home = default_cache_dir()\n"
    "os.makedirs(home, exist_ok=True)\n"
    "print('cache', os.path.realpath(home))\n"
    "print('seen', ','.join(sorted(os.listdir(home))))\n"
    "open(os.path.join(home, os.environ['TORCHJOB_POD_NAME']), 'w').close()\n"
)


def _cache_seen(text: str) -> dict[str, str]:
    return dict(
        line.split(" ", 1) for line in text.splitlines() if line.split(" ", 1)[0] in {"cache", "seen"}
    )


@pytest.mark.timeout(240)
def test_torchs_compile_cache_outlives_the_job_where_a_bare_run_keeps_it(
    tmp_path: Path, base: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torch.compile caches in <temporary directory>/torchinductor_<user>: with each pod's own
    TMPDIR, every run compiled from nothing. The first run's cache becomes the machine's, and the
    next run's pods use that, the folder a bare python uses."""
    monkeypatch.setenv("TMPDIR", str(base))
    monkeypatch.setenv("LOGNAME", "tj:user")  # getpass's first choice; torch replaces the ':'
    cache = base / "torchinductor_tj_user"
    program = container("c", ["python", "-c", COMPILE_CACHE])
    first = run(make_job("cache1", [task("a", [program], replicas=2)]), tmp_path, timeout=200)
    assert first.ok, first.reason
    assert [_cache_seen(log_text(first, pod, "c"))["seen"] for pod in ("a-0", "a-1")] == ["", ""]
    assert list(base.iterdir()) == [cache]  # one pod's cache kept, the job's folder gone
    kept = sorted(p.name for p in cache.iterdir())
    assert kept in (["cache1-a-0"], ["cache1-a-1"])
    second = run(make_job("cache2", [task("b", [program])]), tmp_path, timeout=200)
    assert second.ok, second.reason
    seen = _cache_seen(log_text(second, "b-0", "c"))
    assert seen == {"cache": str(cache), "seen": kept[0]}  # the machine's, with the first run's file
    assert sorted(p.name for p in cache.iterdir()) == [*kept, "cache2-b-0"]
    assert list(base.iterdir()) == [cache]
    bare = subprocess.run(  # where torch in a bare python keeps it
        [sys.executable, "-c", COMPILE_CACHE.split("os.makedirs")[0] + "print(home)"],
        capture_output=True, text=True, timeout=120, check=True,
    ).stdout.strip()  # fmt: skip
    assert bare == str(cache)


def test_a_compile_cache_name_that_is_not_the_users_folder_is_left_alone(
    tmp_path: Path, base: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing in the machine's temporary directory is trusted that this user did not make: a
    link planted where the cache would be is neither followed by the pods nor replaced."""
    monkeypatch.setenv("TMPDIR", str(base))
    monkeypatch.setenv("LOGNAME", "tjuser")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    planted = base / "torchinductor_tjuser"
    planted.symlink_to(elsewhere)
    script = (
        "import os\n"
        "home = os.path.join(os.environ['TMPDIR'], 'torchinductor_tjuser')\n"
        "print('cache', 'link' if os.path.islink(home) else 'own')\n"
        "os.makedirs(os.path.join(home, 'kernels'))\n"  # as torch would make it
    )
    result = run(
        make_job("planted", [task("a", [container("c", ["python", "-c", script])])]), tmp_path, timeout=60
    )
    assert result.ok, result.reason
    assert _cache_seen(log_text(result, "a-0", "c"))["cache"] == "own"
    assert list(elsewhere.iterdir()) == []
    assert planted.is_symlink() and os.readlink(planted) == str(elsewhere)
    assert list(base.iterdir()) == [planted]
