"""The local engine on a shared machine: other users, planted symlinks, names that are paths.

Tests that need a second user create one with ``useradd`` (root only) and remove it afterwards;
without root they are skipped with the reason.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from support import (
    as_user,
    container,
    job_dir,
    leftovers,
    log_dir,
    log_text,
    make_job,
    run,
    sh,
    start,
    status_of,
    task,
    torchjob,
    wait_until,
)
from torchjob.engines.local import check_job, ports
from torchjob.engines.local.admission import place
from torchjob.engines.local.process import marked_processes
from torchjob.errors import Issue, SpecError
from torchjob.spec.defaults import apply_defaults
from torchjob.spec.model import Job
from torchjob.spec.parse import parse_job

pytestmark = pytest.mark.timeout(90)

ROOT = os.geteuid() == 0


# ------------------------------------------------------------------ helpers


def cli_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    unset = ("TORCHJOB_RUNTIME_DIR", "XDG_RUNTIME_DIR", ports.LOCK_TIMEOUT_ENV)
    env = {k: v for k, v in os.environ.items() if k not in unset}
    env["TORCHJOB_HOME"] = str(tmp_path / "home")
    env.update(extra)
    return env


JOB_WITH_PORT = """\
apiVersion: batch.volcano.sh/v1alpha1
kind: Job
metadata: {name: ported}
spec:
  tasks:
    - name: main
      replicas: 1
      template:
        spec:
          restartPolicy: Never
          containers:
            - name: main
              image: busybox:1.36
              command: [sh, -c, "echo ran"]
              ports: [{containerPort: 23999}]
"""


def unvalidated(doc: dict[str, Any]) -> Job:
    """A job as parsing and defaulting make it, without validation: to reach the engine's own checks."""
    job, issues = parse_job(doc)
    assert job is not None and not issues, issues
    apply_defaults(job)
    return job


def job_doc(tasks: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "batch.volcano.sh/v1alpha1",
        "kind": "Job",
        "metadata": {"name": "sec"},
        "spec": {**spec, "tasks": tasks},
    }


# ------------------------------------------------------------ port registry


def test_a_registry_directory_made_by_another_user_is_refused(
    other_user: pwd.struct_passwd, shared_tmp: Path, tmp_path: Path
) -> None:
    victim = tmp_path / "bashrc"
    victim.write_text("export SAFE=1\n")
    planted = shared_tmp / f"torchjob-{os.getuid()}"
    attack = as_user(
        other_user,
        f"mkdir -m 0777 {planted} && chmod 0777 {planted} && ln -s {victim} {planted}/ports.json"
        f" && ln -s {victim} {planted}/ports.lock",
    )
    assert attack.returncode == 0, attack.stderr
    (tmp_path / "job.yaml").write_text(JOB_WITH_PORT)
    # The registry's place, made by another user first (in /tmp: a shared directory).
    env = cli_env(tmp_path, TORCHJOB_RUNTIME_DIR=str(planted))
    result = torchjob("run", "job.yaml", env=env, cwd=tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"{planted}: ")
    assert f"belongs to uid {other_user.pw_uid}" in lines[0]
    assert victim.read_text() == "export SAFE=1\n"
    assert not (tmp_path / "home" / "jobs").exists() or not any((tmp_path / "home" / "jobs").iterdir())


@pytest.fixture
def registry_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The default location, in the test's own directory standing for /tmp."""
    monkeypatch.delenv("TORCHJOB_RUNTIME_DIR", raising=False)
    monkeypatch.setattr(place, "PRIVATE_BASE", tmp_path)  # the user's directory (admission/place.py)
    return tmp_path / f"torchjob-{os.getuid()}"


def test_a_registry_directory_open_to_others_is_refused(registry_env: Path) -> None:
    registry_env.mkdir(mode=0o755)
    registry_env.chmod(0o755)
    with pytest.raises(SpecError, match="has mode 0755, expected 0700"):
        ports.reserve("job", [23999])
    assert not (registry_env / "ports.json").exists()


def test_a_registry_directory_that_is_a_symlink_is_refused(registry_env: Path, tmp_path: Path) -> None:
    real = tmp_path / "elsewhere"
    real.mkdir(mode=0o700)
    registry_env.symlink_to(real)
    with pytest.raises(SpecError, match="is a symlink"):
        ports.reserve("job", [23999])
    assert list(real.iterdir()) == []


def test_a_symlink_planted_as_the_temporary_file_is_not_followed(registry_env: Path, tmp_path: Path) -> None:
    registry_env.mkdir(mode=0o700)
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    for name in (f"ports.json.{os.getpid()}.tmp", f"ports.{os.getpid()}.tmp"):  # now, and before
        (registry_env / name).symlink_to(victim)
    mapping = ports.reserve("job", [23999])
    assert victim.read_text() == "precious\n"
    assert json.loads((registry_env / "ports.json").read_text())[str(mapping[23999])]["job"] == "job"
    assert not (registry_env / "ports.json").is_symlink()
    ports.release("job")


def test_every_session_of_a_user_finds_the_same_port_registry(
    registry_env: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An ssh login (XDG_RUNTIME_DIR, TMPDIR set) and a cron job (neither) see each other's
    reservations: with two registries they could give two jobs the same port."""
    session = tmp_path / "run-user"
    session.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(session))
    monkeypatch.setenv("TMPDIR", str(session))
    ssh = ports.reserve("ssh", [23999])
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    monkeypatch.delenv("TMPDIR")
    try:
        assert ports.registry_dir() == registry_env
        cron = ports.reserve("cron", [23999])
        assert cron[23999] != ssh[23999]  # the port the ssh session's job holds is not given again
        assert stat.S_IMODE(registry_env.stat().st_mode) == 0o700
        assert list(session.iterdir()) == []
    finally:
        ports.release("cron")
        ports.release("ssh")


@contextlib.contextmanager
def registry_locked_by_another_process(runtime: Path) -> Iterator[None]:
    """``runtime`` (a private registry directory) with its lock held by another process."""
    runtime.mkdir(mode=0o700)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, os, sys, time\n"
            f"fd = os.open({str(runtime / 'ports.lock')!r}, os.O_RDWR | os.O_CREAT, 0o600)\n"
            "fcntl.flock(fd, fcntl.LOCK_EX)\nprint('locked', flush=True)\ntime.sleep(60)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "locked\n"
        yield
    finally:
        holder.kill()
        holder.wait(10)


def test_a_registry_lock_held_too_long_is_one_clear_line(tmp_path: Path) -> None:
    """With the wait lowered from its 10 s by the setting (the lowest it takes: the lock is still
    waited for, and still refuses the job while another process holds it)."""
    runtime = tmp_path / "runtime"
    low = ports.LOCK_TIMEOUT_RANGE[0]
    with registry_locked_by_another_process(runtime):
        (tmp_path / "job.yaml").write_text(JOB_WITH_PORT)
        env = cli_env(tmp_path, TORCHJOB_RUNTIME_DIR=str(runtime), TORCHJOB_PORT_LOCK_TIMEOUT=f"{low:g}")
        result = torchjob("run", "job.yaml", env=env, cwd=tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    assert result.stderr.splitlines() == [
        f"{runtime / 'ports.lock'}: the port registry has been locked by another process for more than "
        f"{low:g}s; if no other torchjob is starting, find the holder with 'fuser' and stop it"
    ]
    assert not (tmp_path / "home" / "jobs").exists() or not any((tmp_path / "home" / "jobs").iterdir())


@pytest.mark.parametrize("value", ["0", "-1", "0.05", "601", "nan", "inf", "soon", ""])
def test_a_lock_timeout_that_would_not_wait_or_never_end_is_refused(tmp_path: Path, value: str) -> None:
    """The setting says how long to wait for the registry's lock, never that it is not taken."""
    (tmp_path / "job.yaml").write_text(JOB_WITH_PORT)
    env = cli_env(tmp_path, TORCHJOB_RUNTIME_DIR=str(tmp_path / "runtime"), TORCHJOB_PORT_LOCK_TIMEOUT=value)
    result = torchjob("run", "job.yaml", env=env, cwd=tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.splitlines() == [
        "<environment>: TORCHJOB_PORT_LOCK_TIMEOUT: must be a number of seconds from 0.1 to 600, "
        f"got {value!r}"
    ]
    assert not (tmp_path / "home" / "jobs").exists() or not any((tmp_path / "home" / "jobs").iterdir())


def test_a_job_without_ports_never_touches_the_port_registry(tmp_path: Path) -> None:
    """Not to reserve, nor to release at the end: a held lock costs it nothing (it used to wait
    up to the lock timeout as it ended), and the registry directory is not even made."""
    runtime = tmp_path / "runtime"
    with registry_locked_by_another_process(runtime):
        (tmp_path / "job.yaml").write_text(
            JOB_WITH_PORT.replace("              ports: [{containerPort: 23999}]\n", "")
        )
        started = time.monotonic()
        result = torchjob(
            "run", "job.yaml", env=cli_env(tmp_path, TORCHJOB_RUNTIME_DIR=str(runtime)), cwd=tmp_path
        )
        took = time.monotonic() - started
    assert result.returncode == 0, result.stdout + result.stderr
    assert took < ports.LOCK_TIMEOUT / 2, f"the run waited for the registry's lock: {took:.1f}s"
    unused = tmp_path / "unused-runtime"
    result = torchjob(
        "run", "job.yaml", env=cli_env(tmp_path, TORCHJOB_RUNTIME_DIR=str(unused)), cwd=tmp_path
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert not unused.exists()


def test_the_lock_is_taken_through_no_symlink(registry_env: Path, tmp_path: Path) -> None:
    registry_env.mkdir(mode=0o700)
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    (registry_env / "ports.lock").symlink_to(victim)
    with pytest.raises(SpecError, match="cannot open the port registry"):
        ports.reserve("job", [23999])
    assert victim.read_text() == "precious\n"


# --------------------------------------------------------------- privacy


def _loose(path: Path) -> list[str]:
    """Every directory and file at or below ``path`` with a group or other permission bit."""
    found = []
    for item in [path, *path.rglob("*")]:
        info = item.lstat()
        if stat.S_ISLNK(info.st_mode):
            continue
        if info.st_mode & 0o077:
            found.append(f"{item.relative_to(path.parent)} {stat.S_IMODE(info.st_mode):04o}")
    return found


PRIVATE_JOB = """\
apiVersion: batch.volcano.sh/v1alpha1
kind: Job
metadata: {name: secret}
spec:
  plugins: {svc: []}
  tasks:
    - name: main
      replicas: 1
      template:
        spec:
          restartPolicy: Never
          containers:
            - name: main
              image: busybox:1.36
              command: [sh, -c, "echo token=$TOKEN"]
              volumeMounts: [{name: scratch, mountPath: /scratch}]
          volumes: [{name: scratch, emptyDir: {}}]
"""


def test_job_state_is_private_whatever_the_umask(tmp_path: Path) -> None:
    """Detached, so that supervisor.log is made too; umask 022 as on most machines."""
    (tmp_path / "job.yaml").write_text(PRIVATE_JOB)
    state = tmp_path / "state" / "jobs"
    result = torchjob(
        "run",
        "--detach",
        "--state-dir",
        str(state),
        "-e",
        "TOKEN=hunter2",
        "job.yaml",
        env=cli_env(tmp_path, TORCHJOB_RUNTIME_DIR=str(tmp_path / "runtime")),
        cwd=tmp_path,
        preexec_fn=lambda: os.umask(0o022),
    )
    assert result.returncode == 0, result.stderr
    job_dir = state / result.stdout.strip()

    def finished() -> bool:
        try:
            return json.loads((job_dir / "status.json").read_text())["phase"] == "Completed"
        except (OSError, ValueError, KeyError):
            return False

    assert wait_until(finished, 30)
    assert wait_until(lambda: not (job_dir / "supervisor.pid").exists() or _supervisor_gone(job_dir), 10)
    names = {p.name for p in job_dir.iterdir()}
    assert {"job.yaml", "status.json", "supervisor.log", "hosts", "bin", "volumes", "pods", "logs"} <= names
    assert "token=hunter2" in (job_dir / "logs/secret-main-0/attempt-0/main.log").read_text()
    assert _loose(state.parent) == []


def _supervisor_gone(job_dir: Path) -> bool:
    from torchjob.engines.local.state import JobDir

    return not JobDir(job_dir).supervisor_alive()


def test_another_user_cannot_read_a_jobs_log(
    other_user: pwd.struct_passwd, shared_tmp: Path, tmp_path: Path
) -> None:
    """Even with the state directory in a place everyone can walk into."""
    state = shared_tmp / "state"
    old = os.umask(0o022)
    try:
        job = make_job("readable", [task("main", [container("main", sh("echo password=swordfish"))])])
        result = start("local", job, {"state_dir": state}, quiet=True, timeout=30)
    finally:
        os.umask(old)
    assert result.ok, result.reason
    log = log_dir(result, result.pods[0]) / "main.log"
    assert "swordfish" in log.read_text()
    for target in (log, job_dir(result) / "job.yaml", job_dir(result) / "status.json"):
        attempt = as_user(other_user, f"cat {target}")
        assert attempt.returncode != 0 and "swordfish" not in attempt.stdout, target
    listing = as_user(other_user, f"ls {state}")
    assert listing.returncode != 0


# ------------------------------------------------------------- volume names


@pytest.mark.parametrize("name", ["../x", "/abs", "..", "a/../../b"])
def test_an_empty_dir_named_as_a_path_is_refused_by_the_engine(name: str, tmp_path: Path) -> None:
    """Validation refuses such names first; the engine's own check stands behind it."""
    doc = job_doc(
        [
            {
                "name": "main",
                "replicas": 1,
                "template": {
                    "spec": {
                        "restartPolicy": "Never",
                        "containers": [
                            container(
                                "main",
                                sh("echo hi > /scratch/out"),
                                volumeMounts=[{"name": name, "mountPath": "/scratch"}],
                            )
                        ],
                        "volumes": [{"name": name, "emptyDir": {}}],
                    }
                },
            }
        ]
    )
    problems = check_job(unvalidated(doc))
    assert problems, "a volume outside the pod's directory must be refused"
    assert any("outside" in p.message for p in problems), problems
    assert problems[0].path.startswith("spec.tasks[0].template.spec.")


def test_a_subpath_that_climbs_out_is_refused(tmp_path: Path) -> None:
    doc = job_doc(
        [
            {
                "name": "main",
                "replicas": 1,
                "template": {
                    "spec": {
                        "containers": [
                            container(
                                "main",
                                ["true"],
                                volumeMounts=[{"name": "v", "mountPath": "/v", "subPath": "../../../etc"}],
                            )
                        ],
                        "volumes": [{"name": "v", "emptyDir": {}}],
                    }
                },
            }
        ]
    )
    problems = check_job(unvalidated(doc))
    assert problems == [
        Issue(
            "spec.tasks[0].template.spec.containers[0].volumeMounts[0].subPath",
            "'../../../etc' must be a relative path without '..' (as Kubernetes requires)",
        )
    ]


@pytest.mark.parametrize("name", ["../x", "/abs"])
def test_run_refuses_an_empty_dir_named_as_a_path_and_writes_nothing(name: str, tmp_path: Path) -> None:
    if name == "/abs":  # an absolute path of the test's own, not one at the machine's root
        name = str(tmp_path / "abs")
    target = tmp_path / "x" if name == "../x" else Path(name)
    doc = job_doc(
        [
            {
                "name": "main",
                "replicas": 1,
                "template": {
                    "spec": {
                        "restartPolicy": "Never",
                        "containers": [
                            container(
                                "main",
                                sh("echo hi > /scratch/out"),
                                volumeMounts=[{"name": name, "mountPath": "/scratch"}],
                            )
                        ],
                        "volumes": [{"name": name, "emptyDir": {}}],
                    }
                },
            }
        ]
    )
    (tmp_path / "job.json").write_text(json.dumps(doc))
    result = torchjob(
        "run", "--state-dir", str(tmp_path / "jobs"), "job.json", env=cli_env(tmp_path), cwd=tmp_path
    )
    assert result.returncode == 2
    assert "spec.tasks[0].template.spec.volumes[0].name: " in result.stderr
    assert "Traceback" not in result.stderr
    assert not target.exists()
    assert not (tmp_path / "jobs").exists()


def test_the_configmap_files_stay_inside_the_job_directory(tmp_path: Path) -> None:
    from torchjob.engines.local.roots import new_job_dir
    from torchjob.engines.local.state import JobDir

    job_dir: JobDir = new_job_dir(tmp_path / "jobs", "cm")
    with pytest.raises(ValueError, match="outside"):
        job_dir.write_configmaps({"ok": {"../../escaped": "x"}})
    with pytest.raises(ValueError, match="outside"):
        job_dir.write_configmaps({"../..": {"escaped": "x"}})
    assert not (tmp_path / "escaped").exists() and not (tmp_path / "jobs" / "escaped").exists()


# -------------------------------------------------------------- securityContext


def _secured(pod: dict[str, Any], own: dict[str, Any], script: str, **extra: Any) -> dict[str, Any]:
    return job_doc(
        [
            {
                "name": "main",
                "replicas": 2,
                "template": {
                    "spec": {
                        "restartPolicy": "Never",
                        "securityContext": pod,
                        "containers": [container("main", sh(script), securityContext=own, **extra)],
                        **(
                            {"volumes": [{"name": "scratch", "emptyDir": {}}]}
                            if "volumeMounts" in extra
                            else {}
                        ),
                    }
                },
            }
        ]
    )


def _load(doc: dict[str, Any]) -> Job:
    from torchjob.jobs import load_jobs_from_text

    return load_jobs_from_text(json.dumps(doc), "job.json")[0].job


def test_run_as_user_runs_the_process_as_that_user(other_user: pwd.struct_passwd, tmp_path: Path) -> None:
    """And its emptyDir is its own: with the volume as working directory it can write there."""
    doc = _secured(
        {"runAsUser": other_user.pw_uid, "runAsGroup": other_user.pw_gid, "fsGroup": 4321},
        {},
        "echo uid=$(id -u) gid=$(id -g) groups=$(id -G); echo data > ./written && echo wrote",
        workingDir="/scratch",
        volumeMounts=[{"name": "scratch", "mountPath": "/scratch"}],
    )
    result = run(_load(doc), tmp_path)
    assert result.ok, (result.reason, (log_dir(result, result.pods[0]) / "main.log").read_text())
    for pod in result.pods:
        text = (log_dir(result, pod) / "main.log").read_text()
        assert f"uid={other_user.pw_uid} gid={other_user.pw_gid} " in text
        assert "4321" in text.split("groups=")[1].split()
        assert "wrote" in text
    volume = job_dir(result) / "pods" / result.pods[0].name / "attempt-0" / "volumes" / "scratch"
    assert (volume / "written").stat().st_uid == other_user.pw_uid
    assert (volume.stat().st_uid, volume.stat().st_gid) == (other_user.pw_uid, 4321)


def test_a_container_run_as_user_overrides_the_pods(other_user: pwd.struct_passwd, tmp_path: Path) -> None:
    doc = _secured({"runAsUser": 0}, {"runAsUser": other_user.pw_uid}, "id -u")
    result = run(_load(doc), tmp_path)
    assert result.ok, result.reason
    assert (log_dir(result, result.pods[0]) / "main.log").read_text().split() == [str(other_user.pw_uid)]


@pytest.mark.skipif(not ROOT, reason="runAsNonRoot can only be broken by a torchjob running as root")
def test_run_as_non_root_is_refused_for_a_process_that_would_run_as_root(tmp_path: Path) -> None:
    assert check_job(_load(_secured({"runAsNonRoot": True}, {}, "id -u"))) == [
        Issue(
            "spec.tasks[0].template.spec.securityContext.runAsNonRoot",
            "container 'main' would run as root (uid 0): set runAsUser to a non-zero uid, "
            "or run torchjob as another user",
        )
    ]
    problems = check_job(_load(_secured({}, {"runAsNonRoot": True, "runAsUser": 0}, "id -u")))
    assert [p.path for p in problems] == [
        "spec.tasks[0].template.spec.containers[0].securityContext.runAsNonRoot"
    ]
    assert check_job(_load(_secured({"runAsNonRoot": True, "runAsUser": 1000}, {}, "id -u"))) == []
    (tmp_path / "job.json").write_text(json.dumps(_secured({"runAsNonRoot": True}, {}, "id -u")))
    result = torchjob(
        "run", "--state-dir", str(tmp_path / "jobs"), "job.json", env=cli_env(tmp_path), cwd=tmp_path
    )
    assert result.returncode == 2
    assert result.stderr.startswith("job.json:") and "would run as root" in result.stderr
    assert len(result.stderr.splitlines()) == 1 and not (tmp_path / "jobs").exists()


def test_fields_without_local_effect_are_warned_about_once_per_job(tmp_path: Path) -> None:
    doc = _secured(
        {"seccompProfile": {"type": "RuntimeDefault"}},
        {"capabilities": {"drop": ["ALL"]}, "readOnlyRootFilesystem": True, "privileged": False},
        "echo ran",
    )
    (tmp_path / "job.json").write_text(json.dumps(doc))
    result = torchjob(
        "run",
        "--state-dir",
        str(tmp_path / "jobs"),
        "job.json",
        env=cli_env(tmp_path, TORCHJOB_RUNTIME_DIR=str(tmp_path / "runtime")),
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    warned = [line for line in result.stdout.splitlines() if "warning: " in line]
    base = "spec.tasks[0].template.spec"
    for path in (
        f"{base}.securityContext.seccompProfile",
        f"{base}.containers[0].securityContext.capabilities",
        f"{base}.containers[0].securityContext.readOnlyRootFilesystem",
        f"{base}.containers[0].securityContext.privileged",
    ):
        hits = [line for line in warned if f"warning: {path}: " in line]
        assert len(hits) == 1, (path, result.stdout)  # two replicas, one warning
        assert "not enforced here" in hits[0]
    assert len(warned) == 4, result.stdout


# ------------------------------------------------------------- reserved env


def test_a_job_cannot_override_the_engines_own_variables(tmp_path: Path) -> None:
    """A job setting TORCHJOB_JOB_ID still has every process listed and stopped (issue 8)."""
    pid_file = tmp_path / "escaped.pid"
    seen = tmp_path / "seen"
    script = (
        f"echo $TORCHJOB_JOB_ID $TORCHJOB_POD_UID $TORCHJOB_POD_NAME ${{TORCHJOB_PORT_1:-unset}} > {seen}; "
        f"setsid sleep 300 & echo $! > {pid_file}; sleep 30"
    )
    env = [
        {"name": name, "value": "not-the-job"}
        for name in ("TORCHJOB_JOB_ID", "TORCHJOB_POD_UID", "TORCHJOB_POD_NAME", "TORCHJOB_PORT_1")
    ]
    job = make_job("reserved", [task("main", [container("main", sh(script), env=env)])])
    started = run(job, tmp_path, detach=True, extra_env={"TORCHJOB_JOB_ID": "x"})
    job_id = started.id
    try:
        assert wait_until(lambda: pid_file.exists() and pid_file.read_text().strip().isdigit(), 20)
        escaped = int(pid_file.read_text())
        words = seen.read_text().split()
        assert words[0] == job_id and words[1] != "not-the-job" and words[2] == "reserved-main-0", words
        assert words[3] == "unset", "no port 1 is mapped: the job's value is dropped, not passed on"
        assert (job_dir(started) / "logs/reserved-main-0/attempt-0/main.log").exists()
        # Read until it is there: the pid file is written as the background process starts, and
        # a process in the middle of its exec shows no environment for that instant.
        marked = wait_until(lambda: escaped in {p.pid for p in marked_processes(job_id)}, 10)
        assert marked, "the job's processes must carry the engine's marker"

        def messages() -> list[str]:  # status.json is rewritten by the loop: it may lag the pods
            status = json.loads((job_dir(started) / "status.json").read_text())
            return [e["message"] for e in status["events"]]

        def warned() -> bool:
            found = messages()
            return any("env[0].name: TORCHJOB_JOB_ID is set by torchjob" in m for m in found) and any(
                m.startswith("warning: --env: TORCHJOB_JOB_ID") for m in found
            )

        assert wait_until(warned, 10), messages()
    finally:
        delete = subprocess.run(
            [sys.executable, "-m", "torchjob", "delete", "--state-dir", str(tmp_path / "jobs"), job_id],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert delete.returncode == 0, delete.stderr
    assert wait_until(lambda: not _alive(escaped), 10), "the escaped process outlived its job"
    assert leftovers(job_id) == []


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_no_privilege_escalation_sets_no_new_privs(tmp_path: Path) -> None:
    """allowPrivilegeEscalation: false is applied for any user, root or not."""
    doc = _secured({}, {"allowPrivilegeEscalation": False}, "grep NoNewPrivs /proc/self/status")
    result = run(_load(doc), tmp_path)
    assert result.ok, result.reason
    assert (log_dir(result, result.pods[0]) / "main.log").read_text().split() == ["NoNewPrivs:", "1"]


def test_the_default_state_root_is_tightened_and_a_given_one_left_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from torchjob.engines.local.roots import new_job_dir, state_root

    monkeypatch.setenv("TORCHJOB_HOME", str(tmp_path / "home"))
    default = state_root()
    default.mkdir(parents=True)
    default.chmod(0o755)  # as an earlier torchjob made it under umask 022
    made = new_job_dir(default, "job")
    assert stat.S_IMODE(default.stat().st_mode) == 0o700
    assert stat.S_IMODE(made.path.stat().st_mode) == 0o700
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)  # a --state-dir such as /tmp: not ours to change
    made = new_job_dir(shared, "job")
    assert stat.S_IMODE(shared.stat().st_mode) == 0o1777
    assert stat.S_IMODE(made.path.stat().st_mode) == 0o700


# ------------------------------------------------- what a state directory holds


def _project(root: Path) -> dict[Path, str]:
    """A user's project directory, given by mistake as --state-dir: files named like torchjob's."""
    files = {
        root / "cache-a" / "expires": "0\n",  # a TTL long past, were it a job's
        root / "src" / "status.json": '{"phase": "Completed"}\n',
        root / "src" / "train.py": "print('the user's code')\n",
        root / "notes-abcdef" / "status.json": "not json\n",  # the job-id pattern, but no job of ours
        root / "notes-abcdef" / "expires": "0\n",
    }
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return files


@pytest.mark.parametrize("command", [["status", "cache"], ["status"], ["prune"], ["delete", "--all"]])
def test_a_state_dir_that_is_a_project_loses_nothing(command: list[str], tmp_path: Path) -> None:
    proj = tmp_path / "proj"
    files = _project(proj)
    result = torchjob(*command, "--state-dir", str(proj), env=cli_env(tmp_path), cwd=tmp_path)
    assert all(path.read_text() == text for path, text in files.items()), result
    if command[0] in ("delete", "prune"):  # the commands that delete refuse such a root outright
        assert result.returncode == 2, result
        assert "is not a torchjob state directory" in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    else:  # no job at all: "status cache" finds none, "status" lists none
        assert "cache-a" not in result.stdout and "src" not in result.stdout, result.stdout
        assert result.returncode == (2 if len(command) > 1 else 0), result


def test_in_a_state_dir_of_torchjobs_only_its_own_jobs_are_touched(tmp_path: Path) -> None:
    """After a run the root is torchjob's; the user's directories in it are still not jobs."""
    proj = tmp_path / "proj"
    env = cli_env(tmp_path)
    (tmp_path / "job.yaml").write_text(JOB_WITH_PORT.replace("ports: [{containerPort: 23999}]", ""))
    ran = torchjob("run", "-q", "--state-dir", str(proj), "job.yaml", env=env, cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    files = _project(proj)
    listed = torchjob("status", "--state-dir", str(proj), env=env, cwd=tmp_path)
    assert listed.returncode == 0 and "ported-" in listed.stdout, listed
    assert "notes" not in listed.stdout and "src" not in listed.stdout
    deleted = torchjob("delete", "--all", "--state-dir", str(proj), env=env, cwd=tmp_path)
    assert deleted.returncode == 0, deleted.stderr
    assert deleted.stdout.count("deleted ") == 1, deleted.stdout
    assert all(path.read_text() == text for path, text in files.items())
    assert sorted(p.name for p in proj.iterdir()) == [".torchjob-state", "cache-a", "notes-abcdef", "src"]


def test_a_job_dir_of_another_user_or_through_a_symlink_is_not_a_job(tmp_path: Path) -> None:
    from torchjob.engine_api.base import JobReport
    from torchjob.engines.local.roots import is_job_dir, new_job_dir

    made = new_job_dir(tmp_path / "jobs", "job")
    os.close(made.write_pid())
    made.write_status(JobReport(engine="local", id=made.id, name="job", phase="Running"))
    assert is_job_dir(made.path)
    link = tmp_path / "jobs" / "link-abcdef"
    link.symlink_to(made.path)
    assert not is_job_dir(link)
    if ROOT:  # the same directory, owned by someone else, is not this user's job
        os.chown(made.path, 12345, 12345)
        assert not is_job_dir(made.path)


# ------------------------------------------------------- who the supervisor is


def test_a_forged_supervisor_pid_does_not_make_delete_kill_that_process(tmp_path: Path) -> None:
    """supervisor.pid names a live process of this user with the right start time, but not the
    job's supervisor: status says nobody supervises the job, delete removes it and kills nothing."""
    from torchjob.engine_api.base import JobReport
    from torchjob.engines.local.roots import new_job_dir
    from torchjob.engines.local.state import start_time

    root = tmp_path / "jobs"
    made = new_job_dir(root, "forged")
    os.close(made.write_pid())
    made.write_status(JobReport(engine="local", id=made.id, name="forged", phase="Running"))
    bystander = subprocess.Popen(["sleep", "300"])
    try:
        forged = {"pid": bystander.pid, "created": start_time(bystander.pid)}
        (made.path / "supervisor.pid").write_text(json.dumps(forged))
        env = cli_env(tmp_path)
        status = torchjob("status", "--state-dir", str(root), made.id, env=env, cwd=tmp_path)
        assert "Unknown" in status.stdout and "supervisor" in status.stdout, status
        deleted = torchjob("delete", "--state-dir", str(root), made.id, env=env, cwd=tmp_path)
        assert deleted.returncode == 0, deleted.stderr
        assert not made.path.exists()
        assert bystander.poll() is None, "delete killed a process that was not the job's supervisor"
    finally:
        bystander.kill()
        bystander.wait()


# ------------------------------------------------------------- ports of a job


def test_a_rendezvous_port_is_random_and_a_container_port_kept(registry_env: Path) -> None:
    """Another user's job asks for the same declared 23456: a random host port is nobody's guess."""
    with contextlib.ExitStack() as stack:
        free = []
        for _ in range(2):
            sock = stack.enter_context(__import__("socket").socket())
            sock.bind(("127.0.0.1", 0))
            free.append(sock.getsockname()[1])
    rendezvous, service = free
    mapping = ports.reserve("job-a", [rendezvous, service], unpredictable=[rendezvous])
    assert mapping[rendezvous] != rendezvous and mapping[service] == service
    ports.release("job-a")


ATTACKER = """
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(sys.argv[1])))
s.listen(8)
open(sys.argv[2], "w").close()
s.settimeout(12)
try:
    s.accept()
    print("accepted a connection")
except OSError:
    print("nobody connected")
"""

MASTER = """
import os, socket, time
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
try:
    s.bind(("0.0.0.0", int(os.environ["MASTER_PORT"])))
except OSError:
    time.sleep(2)  # time enough for a worker to connect to whoever listens there
    raise
s.listen(8)
c, _ = s.accept()
c.sendall(b"secret for the worker")
"""


def test_another_users_listener_on_the_master_port_is_neither_served_nor_silent(
    other_user: pwd.struct_passwd, shared_tmp: Path, tmp_path: Path
) -> None:
    """On the machine's network (a job in a network of its own cannot meet this: see
    test_another_user_reaches_nothing_of_a_job_in_its_own_network), between the reservation and the
    master's bind another user listens on MASTER_PORT: the worker's wait-for-master does not connect
    to it, and the job's reason names the port and the process that took it, not only the master's
    'Address already in use'."""
    python = "/usr/bin/python3"  # one the other user may run (not this venv's, under /root)
    if not os.access(python, os.X_OK):
        pytest.skip(f"{python} is needed to listen as the other user")
    (tmp_path / "master.py").write_text(MASTER)
    (shared_tmp / "attacker.py").write_text(ATTACKER)
    (shared_tmp / "attacker.py").chmod(0o644)
    port_file, go = tmp_path / "port", tmp_path / "go"
    hold = f"echo $MASTER_PORT > {port_file}; while [ ! -e {go} ]; do sleep 0.05; done; "
    job = make_job(
        "stolen",
        [
            task("master", [container("m", sh(hold + f"exec python {tmp_path / 'master.py'}"))]),
            task("worker", [container("w", sh("python -c 'import os; print(os.environ[\"MASTER_PORT\"])'"))]),
        ],
        plugins={"pytorch": ["--master=master", "--worker=worker", "--wait-master-enabled"]},
        policies=[{"event": "PodFailed", "action": "AbortJob"}],
    )
    from support import write_job

    job_file = write_job(tmp_path, job)
    env = cli_env(tmp_path, TORCHJOB_NETWORK="host")
    run = subprocess.Popen(
        [sys.executable, "-m", "torchjob", "run", "--timeout", "40", job_file],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    attacker = None
    try:
        assert wait_until(lambda: port_file.exists() and port_file.read_text().strip(), 20), "no master"
        port = int(port_file.read_text())
        listening = shared_tmp / "listening"
        attacker = subprocess.Popen(
            [python, str(shared_tmp / "attacker.py"), str(port), str(listening)],
            user=other_user.pw_uid,
            group=other_user.pw_gid,
            extra_groups=[],
            stdout=subprocess.PIPE,
            text=True,
            cwd="/",
        )
        assert wait_until(listening.exists, 10), "the other user could not listen"
        go.touch()
        out, _ = run.communicate(timeout=60)
        attacker_out, _ = attacker.communicate(timeout=20)
    finally:
        for proc in (run, attacker):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
    assert run.returncode == 1, out
    assert attacker_out.strip() == "nobody connected", "the worker connected to the other user's listener"
    assert f"port {port} (declared 23456) was taken by another process" in out, out
    assert f"pid {attacker.pid} ({python} {shared_tmp / 'attacker.py'}" in out, out
    assert f"uid {other_user.pw_uid}" in out
    # The worker's probe, if it spoke before the port watch failed the job (on a loaded machine the
    # niced probe may not have), never found the master ready and named the other user's listener.
    said = [line for line in out.splitlines() if "wait-for-master:" in line and "waiting up to" not in line]
    held = f"port {port} is held by a process of uid {other_user.pw_uid}, not by this job"
    assert all(held in line or "not ready yet" in line for line in said), out


# ------------------------------------------------------------- /etc/hosts


def _names_resolve(result: Any) -> None:
    if not status_of(result).get("nameResolution", "").startswith("resolved"):
        pytest.skip(f"pod names do not resolve here: {status_of(result).get('nameResolution')}")


def test_each_pod_has_its_own_hosts_file(tmp_path: Path) -> None:
    """What one pod writes into its /etc/hosts no other pod of the job sees."""
    script = (
        'echo "10.9.9.9 scribbled-by-$TORCHJOB_POD_NAME" >> /etc/hosts; '
        f"touch {tmp_path}/$TORCHJOB_POD_NAME; "
        f'while [ "$(ls {tmp_path} | grep -c sec-main)" -lt 2 ]; do sleep 0.02; done; cat /etc/hosts'
    )
    job = make_job("sec", [task("main", [container("main", sh(script))], replicas=2)])
    result = run(job, tmp_path, timeout=30)
    assert result.ok, result.reason
    _names_resolve(result)
    for me, other in (("main-0", "main-1"), ("main-1", "main-0")):
        text = log_text(result, me, "main")
        assert f"scribbled-by-sec-{me}" in text and f"scribbled-by-sec-{other}" not in text, text
    assert "scribbled" not in (job_dir(result) / "hosts").read_text()
    assert "scribbled" not in Path("/etc/hosts").read_text()


def test_host_aliases_are_appended_to_the_pods_hosts_file(tmp_path: Path) -> None:
    aliases = [{"ip": "10.1.2.3", "hostnames": ["foo.local", "bar"]}, {"ip": "fd00::7", "hostnames": ["six"]}]
    lookup = "import socket; print(socket.gethostbyname('foo.local'), socket.gethostbyname('bar'))"
    job = make_job(
        "sec",
        [
            task("aliased", [container("main", ["python", "-c", lookup])]),
            task("plain", [container("main", sh("cat /etc/hosts"))]),
        ],
    )
    job.spec.tasks[0].template.spec["hostAliases"] = aliases
    result = run(job, tmp_path, timeout=30)
    assert result.ok, result.reason
    _names_resolve(result)
    assert log_text(result, "aliased-0", "main").split() == ["10.1.2.3", "10.1.2.3"]
    assert "foo.local" not in log_text(result, "plain-0", "main")  # another pod's aliases are its own
    (pod_dir,) = (job_dir(result) / "pods").glob("sec-aliased-0/attempt-0")
    tail = (pod_dir / "hosts").read_text().splitlines()[-3:]
    assert tail == ["# Entries added by HostAliases.", "10.1.2.3\tfoo.local\tbar", "fd00::7\tsix"]


def test_hostnames_and_host_aliases_that_are_not_names_or_addresses_are_refused(tmp_path: Path) -> None:
    spec = {
        "restartPolicy": "Never",
        "hostname": "w0\n10.0.0.1 github.com",
        "subdomain": "sub\n",
        "hostAliases": [
            {"ip": "1.2.3.4", "hostnames": ["ok.example", "a\n6.6.6.6 github.com"]},
            {"ip": "x y"},
        ],
        "containers": [{"name": "main", "image": "busybox", "command": ["true"]}],
    }
    doc = job_doc([{"name": "main", "replicas": 1, "template": {"spec": spec}}])
    (tmp_path / "job.json").write_text(json.dumps(doc))
    result = torchjob("validate", "job.json", env=cli_env(tmp_path), cwd=tmp_path)
    assert result.returncode == 2, result
    assert (
        "spec.tasks[0].template.spec.hostAliases[0].hostnames[1]: 'a\\n6.6.6.6 github.com' is not a DNS"
        in (result.stderr)
    )
    assert "spec.tasks[0].template.spec.hostAliases[1].ip: 'x y' is not an IP address" in result.stderr
    assert "spec.tasks[0].template.spec.hostname: 'w0\\n10.0.0.1 github.com' is not a DNS-1123 label" in (
        result.stderr
    )
    assert "spec.tasks[0].template.spec.subdomain: 'sub\\n' is not a DNS-1123 label" in result.stderr
    assert result.stdout == ""


SQUATTER = """
import socket, sys, time
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(sys.argv[1])))
s.listen(8)
open(sys.argv[2], "w").close()
time.sleep(60)
"""

FALLBACK_MASTER = """
import os, socket, time
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
try:
    s.bind(("0.0.0.0", int(os.environ["MASTER_PORT"])))
except OSError:  # as torchrun's c10d rendezvous does: be a client of whoever holds the port
    socket.create_connection(("127.0.0.1", int(os.environ["MASTER_PORT"])))
    time.sleep(120)  # and wait there for a world that never forms
"""


def test_a_rendezvous_port_served_by_another_process_ends_the_job_at_once(tmp_path: Path) -> None:
    """On the machine's network, another process of this very user (another copy of the test suite,
    say) listens on the job's rendezvous port: the job's ranks, all Running, would wait there for
    minutes. The job ends in seconds instead, naming the port and the process."""
    (tmp_path / "master.py").write_text(FALLBACK_MASTER)
    port_file, go = tmp_path / "port", tmp_path / "go"
    hold = f"echo $MASTER_PORT > {port_file}; while [ ! -e {go} ]; do sleep 0.05; done; "
    job = make_job(
        "hijacked",
        [
            task("master", [container("m", sh(hold + f"exec python {tmp_path / 'master.py'}"))]),
            task("worker", [container("w", ["sleep", "120"])]),
        ],
        plugins={"pytorch": ["--master=master", "--worker=worker"]},
    )
    from support import write_job

    env = cli_env(tmp_path, TORCHJOB_NETWORK="host")
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "torchjob", "run", "--timeout", "100", write_job(tmp_path, job)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    other = None
    try:
        assert wait_until(lambda: port_file.exists() and port_file.read_text().strip(), 20), "no master"
        port = int(port_file.read_text())
        other = subprocess.Popen(
            [sys.executable, "-c", SQUATTER, str(port), str(tmp_path / "listening")], stdout=subprocess.PIPE
        )
        assert wait_until((tmp_path / "listening").exists, 10)
        go.touch()
        out, _ = proc.communicate(timeout=60)
    finally:
        for each in (proc, other):
            if each is not None and each.poll() is None:
                each.kill()
                each.wait()
    assert time.monotonic() - started < 40, out
    assert proc.returncode == 1, out
    assert f"port {port} (declared 23456) was taken by another process" in out, out
    assert f"pid {other.pid} ({sys.executable} -c" in out, out
    assert "the job's ranks would rendezvous with it" in out


SERVER = """
import os, socket, time
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(os.environ["MASTER_PORT"])))
s.listen(8)
s.settimeout(0.2)
start, served = time.monotonic(), False
# Both jobs hold their ports at the same time (3 s at least), and each master stays until a client
# said it was served: on a loaded machine the worker may come long after wait-for-master's probe.
while not (served and time.monotonic() > start + 3) and time.monotonic() < start + 60:
    try:
        c, _ = s.accept()  # wait-for-master's probes connect too: answer every connection
        c.sendall(os.environ["TORCHJOB_JOB_DIR"].encode())
        c.settimeout(0.5)
        served = served or c.recv(10) == b"done"
        c.close()
    except (TimeoutError, OSError):
        pass
"""

CLIENT = """
import os, socket
c = socket.create_connection((os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])))
served_by = c.recv(1000).decode()
c.sendall(b"done")
assert served_by == os.environ["TORCHJOB_JOB_DIR"], f"served by another job: {served_by}"
print("served by my own master")
"""


def test_two_jobs_with_registries_of_their_own_do_not_share_a_rendezvous_port(tmp_path: Path) -> None:
    """As two copies of the test suite (or a user's job and the suite) once did: neither registry
    sees the other's reservation, and both jobs declare --port=23456."""
    (tmp_path / "server.py").write_text(SERVER)
    (tmp_path / "client.py").write_text(CLIENT)
    job = make_job(
        "twin",
        [
            task("master", [container("m", ["python", str(tmp_path / "server.py")])]),
            task("worker", [container("w", ["python", str(tmp_path / "client.py")])]),
        ],
        plugins={"pytorch": ["--master=master", "--worker=worker", "--port=23456", "--wait-master-enabled"]},
    )
    from support import write_job

    job_file = write_job(tmp_path, job)
    procs = []
    for copy in ("a", "b"):
        runtime = tmp_path / f"runtime-{copy}"
        env = cli_env(tmp_path / copy, TORCHJOB_RUNTIME_DIR=str(runtime))
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "torchjob", "run", "--timeout", "60", job_file],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    outs = [proc.communicate(timeout=90)[0] for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], outs
    assert all("served by my own master" in out for out in outs), outs


WRITE_HOSTS = """
import os
try:
    with open("/etc/hosts", "a") as hosts:
        hosts.write("10.9.9.9 scribbled\\n")
    print("written")
except OSError as err:
    print("refused:", err.strerror)
"""


def test_pods_forked_from_one_preload_server_cannot_change_their_shared_hosts(tmp_path: Path) -> None:
    (tmp_path / "write.py").write_text(WRITE_HOSTS)
    job = make_job(
        "sec", [task("main", [container("main", ["python", str(tmp_path / "write.py")])], replicas=2)]
    )
    result = run(job, tmp_path, timeout=60, preload=("ctypes",))  # a light import; the server needs it
    assert result.ok, result.reason
    _names_resolve(result)
    forked = (job_dir(result) / "preload.log").read_text()
    if forked.count("forked") < 2:
        pytest.skip(f"the pods were not forked from the preload server: {forked}")
    for pod in ("main-0", "main-1"):
        assert log_text(result, pod, "main").strip() == "refused: Read-only file system"
    assert "scribbled" not in (job_dir(result) / "hosts").read_text()
