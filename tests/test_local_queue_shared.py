"""One queue per machine where users share GPUs (issue 33, item 6): the queue directory an
administrator sets up for a group holds every member's jobs, under one capacity; and every session
of one user (an ssh login, a cron job) finds the same private queue whatever its environment.

The two-user test runs a real second user, made by the test as root (skipped otherwise).
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import stat
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from queue_support import gpu_job, intervals, release, status, submit, wait_all
from support import cli, container, make_job, task
from torchjob.engines.local.admission import Place, Ticket, config_path, locate, plan_for
from torchjob.engines.local.admission import place as place_module

pytestmark = pytest.mark.timeout(120)

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def world_tmp() -> Iterator[Path]:
    """A directory like /tmp (1777) that every user can write to; /tmp itself is left alone."""
    path = Path(tempfile.mkdtemp(prefix="torchjob-queue-", dir="/tmp"))
    path.chmod(0o1777)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def user_python(user: pwd.struct_passwd) -> tuple[str, dict[str, str]]:
    """A Python the user may run torchjob with, and what its environment needs; skips when none."""
    paths = sysconfig.get_paths()
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    path = os.pathsep.join([str(REPO / "src"), paths["purelib"], paths["platlib"]])
    for python, env in ((sys.executable, {}), (f"/usr/bin/python{version}", {"PYTHONPATH": path})):
        try:
            probe = subprocess.run(
                [python, "-c", "import torchjob, yaml, psutil"],
                user=user.pw_uid,
                group=user.pw_gid,
                extra_groups=[],
                env={"PATH": "/usr/bin:/bin", **env},
                capture_output=True,
                cwd="/",
                timeout=60,
            )
        except OSError:
            continue
        if probe.returncode == 0:
            return python, env
    pytest.skip(f"no Python {version} that user {user.pw_name} may run finds torchjob's dependencies")


def test_two_users_share_the_queue_an_administrator_set_up(
    other_user: pwd.struct_passwd, world_tmp: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    python, python_env = user_python(other_user)
    uid, gid = other_user.pw_uid, other_user.pw_gid
    work = world_tmp / "work"  # the job files, the trace and the gate, for both users
    work.mkdir(mode=0o777)
    work.chmod(0o777)
    (work / "trace").touch()
    (work / "trace").chmod(0o666)
    queue = world_tmp / "queue"  # as docs/local-engine.md says to make it
    queue.mkdir()
    os.chown(queue, 0, gid)
    queue.chmod(0o2770)
    (queue / "queues.yaml").write_text("capacity: {cpu: 64, memory: 8Gi, nvidia.com/gpu: 2}\n")
    (queue / "queues.yaml").chmod(0o644)
    theirs = {}
    for name in ("home", "runtime"):
        theirs[name] = world_tmp / f"their-{name}"
        theirs[name].mkdir(mode=0o700)
        os.chown(theirs[name], uid, gid)
    (tmp_path / "mine.yaml").write_text("capacity: {nvidia.com/gpu: 8}\n")  # not read: the queue is shared
    for name, value in (("TORCHJOB_QUEUE_DIR", queue), ("TORCHJOB_CONFIG", tmp_path / "mine.yaml")):
        monkeypatch.setenv(name, str(value))
    monkeypatch.setenv("TORCHJOB_RUNTIME_DIR", str(tmp_path / "runtime"))
    monkeypatch.delenv("TORCHJOB_CAPACITY", raising=False)

    def as_them(*args: str) -> subprocess.CompletedProcess[str]:
        env = {
            "PATH": "/usr/bin:/bin",
            "HOME": str(theirs["home"]),
            "TORCHJOB_HOME": str(theirs["home"]),
            "TORCHJOB_RUNTIME_DIR": str(theirs["runtime"]),
            "TORCHJOB_QUEUE_DIR": str(queue),
            **python_env,
        }
        return subprocess.run(
            [python, "-m", "torchjob", *args],
            user=uid,
            group=gid,
            extra_groups=[],
            env=env,
            capture_output=True,
            text=True,
            cwd="/",
            timeout=60,
        )

    first = submit(tmp_path, gpu_job(work, "first", gpus=2, gate=True))
    second = ""
    try:
        assert status(tmp_path, first)["phase"] == "Running"
        submitted = as_them("run", "-d", gpu_job(work, "second", sleep=0))
        assert submitted.returncode == 0, submitted.stdout + submitted.stderr
        second = submitted.stdout.strip()
        report = as_them("status", second, "-o", "json")
        assert report.returncode == 0, report.stderr
        reason = json.loads(report.stdout)["reason"]
        assert reason.startswith("waiting for 1 nvidia.com/gpu, 0 free"), reason
        listing = as_them("queue", "-o", "json")
        assert listing.returncode == 0, listing.stderr
        data = json.loads(listing.stdout)
        assert {j["id"]: (j["user"], j["state"]) for j in data["jobs"]} == {
            first: ("root", "Running"),
            second: (other_user.pw_name, "Waiting"),
        }
        assert data["where"] == f"{queue} (shared by group {other_user.pw_name})"
        for name in ("admission.json", "admission.lock"):
            info = (queue / name).stat()
            assert (stat.S_IMODE(info.st_mode), info.st_gid) == (0o660, gid), name
        release(work)
        wait_all(tmp_path, [first])
        waited = as_them("wait", second, "--timeout", "30")
        assert waited.returncode == 0, waited.stdout + waited.stderr
    finally:
        release(work)
        if second:
            as_them("delete", second)
    spans = intervals(work)
    assert spans["second-main-0"][0] >= spans["first-main-0"][1]
    assert spans["second-main-0"][2] in ("0", "1")


def test_an_unsafe_shared_queue_directory_or_file_is_refused_in_one_line(
    world_tmp: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    queue = world_tmp / "queue"
    queue.mkdir()
    queue.chmod(0o2777)
    monkeypatch.setenv("TORCHJOB_QUEUE_DIR", str(queue))
    result = cli(tmp_path, "queue")
    assert result.returncode == 2
    assert result.stderr == (
        f"{queue}: the shared queue directory has mode 2777: anyone may write in it; refusing it: "
        "ask the administrator who set up the machine's queue (docs/local-engine.md)\n"
    )
    queue.chmod(0o2770)
    precious = world_tmp / "precious"
    precious.write_text("keep me\n")
    os.link(precious, queue / "admission.json")  # a hard link planted where the state goes
    result = cli(tmp_path, "queue")
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        f"{queue / 'admission.json'}: not a regular file with a single link; refusing to use it: remove it"
    ]
    assert precious.read_text() == "keep me\n"


def test_every_session_of_a_user_finds_the_same_private_queue(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An ssh login (XDG_RUNTIME_DIR, TMPDIR set) and a cron job (neither) queue together."""
    monkeypatch.setattr(place_module, "SHARED_DIR", tmp_path / "no-machine-queue")
    monkeypatch.setattr(place_module, "PRIVATE_BASE", tmp_path)  # stands for /tmp
    for name in ("TORCHJOB_QUEUE_DIR", "TORCHJOB_RUNTIME_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TORCHJOB_CAPACITY", "nvidia.com/gpu=2")
    monkeypatch.setenv("TORCHJOB_CONFIG", str(tmp_path / "queues.yaml"))
    session = tmp_path / "run-user"
    session.mkdir(mode=0o700)
    limits = {"resources": {"limits": {"nvidia.com/gpu": 2}}}
    plan = plan_for(make_job("both", [task("main", [container("main", ["true"], **limits)])]))
    assert plan is not None
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(session))
    monkeypatch.setenv("TMPDIR", str(session))
    ssh = Ticket(plan, "ssh", "ssh")
    assert ssh.poll()
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    monkeypatch.delenv("TMPDIR")
    cron = Ticket(plan, "cron", "cron")
    try:
        assert not cron.poll()
        assert cron.reason.startswith("waiting for 2 nvidia.com/gpu, 0 free"), cron.reason
    finally:
        cron.release()
        ssh.release()
    assert locate() == Place(tmp_path / f"torchjob-{os.getuid()}")
    machine = tmp_path / "machine"  # once an administrator made the machine's queue, it is everyone's
    machine.mkdir()
    machine.chmod(0o2770)
    monkeypatch.setattr(place_module, "SHARED_DIR", machine)
    monkeypatch.setenv("TORCHJOB_RUNTIME_DIR", str(session))
    assert locate() == Place(machine, shared=True, gid=machine.stat().st_gid)
    assert config_path() == machine / "queues.yaml"
