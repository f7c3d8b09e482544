"""The local engine with real processes: pods, init containers, restart policies, env, ports."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from support import container, job_dir, leftovers, log_dir, log_text, make_job, run, sh, status_of, task
from torchjob.errors import SpecError
from torchjob.spec.model import Job

pytestmark = pytest.mark.timeout(60)


def test_init_containers_run_in_order_before_the_containers(tmp_path: Path) -> None:
    trace = tmp_path / "trace"
    job = make_job(
        "order",
        [
            task(
                "main",
                [container("app", sh(f"echo app >> {trace}"))],
                init=[
                    container("first", sh(f"sleep 0.3; echo first >> {trace}")),
                    container("second", sh(f"echo second >> {trace}")),
                ],
            )
        ],
    )
    result = run(job, tmp_path)
    assert result.ok, result.reason
    assert trace.read_text().split() == ["first", "second", "app"]
    assert result.pods[0].phase == "Succeeded"
    assert (log_dir(result, result.pods[0]) / "first.log").exists()


def test_failed_init_container_under_never_fails_the_pod_and_skips_the_containers(tmp_path: Path) -> None:
    job = make_job(
        "initfail",
        [
            task(
                "main",
                [container("app", sh("echo never"))],
                init=[container("setup", sh("echo broken; exit 3"))],
            )
        ],
    )
    result = run(job, tmp_path)
    assert result.phase == "Failed"
    assert result.pods[0].exit_code == 3
    assert "broken" in log_text(result, "main-0", "setup")
    assert not (log_dir(result, result.pods[0]) / "app.log").exists()


def test_never_reports_the_exit_code_and_fails_the_job(tmp_path: Path) -> None:
    job = make_job("exits", [task("main", [container("app", sh("echo oops; exit 7"))])])
    result = run(job, tmp_path)
    assert (result.phase, result.pods[0].exit_code, result.pods[0].restarts) == ("Failed", 7, 0)
    assert "exit" in result.reason or "failed" in result.reason


def test_on_failure_restarts_the_container_in_place_until_it_succeeds(tmp_path: Path) -> None:
    count = tmp_path / "count"
    script = f"n=$(cat {count} 2>/dev/null || echo 0); echo $((n+1)) > {count}; echo try $n; [ $n -ge 2 ]"
    job = make_job("onfail", [task("main", [container("app", sh(script))], restart="OnFailure")])
    result = run(job, tmp_path)
    assert result.ok, result.reason
    assert result.pods[0].restarts == 2
    text = log_text(result, "main-0", "app")
    assert "try 0" in text and "try 2" in text
    assert text.count("--- torchjob: container 'app' exited with code 1") == 2


def test_always_restarts_even_a_container_that_succeeded(tmp_path: Path) -> None:
    job = make_job("always", [task("main", [container("app", sh("echo run"))], restart="Always")])
    result = run(job, tmp_path, timeout=1.5)
    assert result.phase == "Terminated"
    assert "deadline" in result.reason
    assert result.pods[0].restarts >= 2
    assert leftovers(result.id) == []


def test_pod_failed_restart_job_keeps_logs_of_every_attempt(tmp_path: Path) -> None:
    flag = tmp_path / "failed-once"
    script = f"if [ -e {flag} ]; then echo second try; else touch {flag}; echo first try; exit 4; fi"
    job = make_job(
        "restartjob",
        [
            task("master", [container("m", sh("echo master $TORCHJOB_ATTEMPT"))]),
            task("worker", [container("w", sh(script))]),
        ],
        policies=[{"event": "PodFailed", "action": "RestartJob"}],
    )
    result = run(job, tmp_path)
    assert result.ok, result.reason
    status = status_of(result)
    assert status["retryCount"] == 1
    worker = next(p for p in result.pods if p.task == "worker")
    assert "first try" in log_text(result, "worker-0", "w", attempt=0)
    assert "second try" in log_text(result, "worker-0", "w", attempt=1)
    assert log_dir(result, worker).name == "attempt-1"
    assert "master 1" in log_text(result, "master-0", "m", attempt=1)


def test_exit_code_policy_aborts_the_job(tmp_path: Path) -> None:
    job = make_job(
        "abort",
        [task("main", [container("app", sh("exit 5"))], policies=[{"exitCode": 5, "action": "AbortJob"}])],
    )
    result = run(job, tmp_path)
    assert result.phase == "Aborted"
    assert "exitCode 5" in result.reason


def test_env_field_refs_config_maps_and_mounts_resolve_locally(tmp_path: Path) -> None:
    out = tmp_path / "env.json"
    keys = "POD NS IP NODE APP NOTE HOSTS CPUS MSG EXTRA MASTER_ADDR RANK TORCHJOB_VOLCANO_DIR HOSTNAME"
    program = (
        "import json, os, sys\n"
        f"data = {{k: os.environ.get(k) for k in {keys.split()!r}}}\n"
        "data.update(exe=sys.executable, argv=sys.argv[1:])\n"
        f"json.dump(data, open({str(out)!r}, 'w'))\n"
    )
    env = [
        {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        {"name": "APP", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
        {"name": "NOTE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['note']"}}},
        {"name": "HOSTS", "valueFrom": {"configMapKeyRef": {"name": "envs-svc", "key": "VC_WORKER_HOSTS"}}},
        {"name": "CPUS", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu"}}},
        {"name": "MSG", "value": "pod $(POD) in $(NS)"},
    ]
    worker = container(
        "w",
        ["python", "-c", program, "$(MSG)", "/etc/volcano/master.host"],
        env=env,
        resources={"limits": {"cpu": "1500m"}},
    )
    worker_task = task("worker", [worker], replicas=2)
    worker_task["template"]["metadata"] = {"labels": {"app": "demo"}, "annotations": {"note": "hi"}}
    job = make_job(
        "envs",
        [task("master", [container("m", sh("true"))]), worker_task],
        plugins={"pytorch": ["--master=master", "--worker=worker"]},
    )
    result = run(job, tmp_path, extra_env={"EXTRA": "yes"})
    assert result.ok, result.reason
    data = json.loads(out.read_text())
    # the cluster's names when they resolve here
    named = status_of(result).get("nameResolution") == "resolved"
    assert data["POD"] in ("envs-worker-0", "envs-worker-1")
    index = int(data["POD"][-1])
    assert data["NS"] == "default"
    assert data["IP"] == f"127.0.1.{2 + index}"
    assert data["NODE"] == socket.gethostname()
    assert (data["APP"], data["NOTE"], data["EXTRA"]) == ("demo", "hi", "yes")
    assert data["HOSTS"] == ("envs-worker-0.envs,envs-worker-1.envs" if named else "127.0.1.2,127.0.1.3")
    assert data["CPUS"] == "2"  # 1.5 cores rounded up, as the kubelet does
    assert data["MASTER_ADDR"] == ("envs-master-0.envs" if named else "127.0.1.1")
    assert data["RANK"] == str(index + 1)
    assert data["HOSTNAME"] == data["POD"]
    assert data["exe"] == sys.executable
    volcano = Path(data["TORCHJOB_VOLCANO_DIR"])
    assert data["argv"] == [f"pod {data['POD']} in default", str(volcano / "master.host")]
    assert (volcano / "master.host").read_text() == ("envs-master-0.envs" if named else "127.0.1.1")
    workers = "envs-worker-0.envs\nenvs-worker-1.envs" if named else "127.0.1.2\n127.0.1.3"
    assert (volcano / "worker.host").read_text() == workers
    assert volcano.parent.parent == job_dir(result)


def test_a_container_without_command_is_bad_input_and_nothing_starts(tmp_path: Path) -> None:
    job = make_job("nocmd", [task("main", [{"name": "trainer", "image": "pytorch/pytorch:2.3"}])])
    with pytest.raises(SpecError) as err:
        run(job, tmp_path)
    text = str(err.value)
    assert "spec.tasks[0].template.spec.containers[0].command" in text
    assert "'trainer'" in text and "pytorch/pytorch:2.3" in text
    assert not (tmp_path / "jobs").exists()


def test_cli_reports_a_missing_command_with_file_and_line(tmp_path: Path) -> None:
    yaml_file = tmp_path / "job.yaml"
    yaml_file.write_text(
        "apiVersion: batch.volcano.sh/v1alpha1\nkind: Job\nmetadata: {name: nocmd}\nspec:\n  tasks:\n"
        "    - name: main\n      replicas: 1\n      template:\n        spec:\n          containers:\n"
        "            - name: trainer\n              image: pytorch/pytorch:2.3\n"
    )
    env = {**os.environ, "TORCHJOB_HOME": str(tmp_path / "home")}
    proc = subprocess.run(
        [sys.executable, "-m", "torchjob", "run", str(yaml_file)],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{yaml_file}:11:"), proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "home" / "jobs").exists()


def test_a_missing_program_exits_127_with_a_message_in_the_log(tmp_path: Path) -> None:
    job = make_job("noprog", [task("main", [container("app", ["no-such-program-xyz"])])])
    result = run(job, tmp_path)
    assert (result.phase, result.pods[0].exit_code) == ("Failed", 127)
    assert "cannot start container 'app'" in log_text(result, "main-0", "app")


SERVER = """
import os, socket
port = int(os.environ["MASTER_PORT"])
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", port))
s.listen()
s.settimeout(20)
while True:  # the wait-for-master probe connects too: serve until a worker says bye
    c, _ = s.accept()
    c.settimeout(2)
    c.sendall(b"hello from %d" % port)
    try:
        if c.recv(3) == b"bye":
            break
    except OSError:
        pass
"""
CLIENT = """
import os, socket
c = socket.create_connection((os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])))
print(c.recv(100).decode())
c.sendall(b"bye")
"""


def _port_job(name: str, tmp_path: Path, port: int = 23456) -> Job:
    (tmp_path / "server.py").write_text(SERVER)
    (tmp_path / "client.py").write_text(CLIENT)
    return make_job(
        name,
        [
            task("master", [container("m", ["python", str(tmp_path / "server.py")])]),
            task("worker", [container("w", ["python", str(tmp_path / "client.py")])]),
        ],
        plugins={
            "pytorch": ["--master=master", "--worker=worker", f"--port={port}", "--wait-master-enabled"]
        },
    )


def test_a_taken_port_is_mapped_to_a_free_host_port(tmp_path: Path) -> None:
    with socket.socket() as blocker:  # a port this test surely holds, as another program would
        blocker.bind(("0.0.0.0", 0))
        blocker.listen()
        taken = blocker.getsockname()[1]
        result = run(_port_job("ports", tmp_path, taken), tmp_path)
    assert result.ok, result.reason
    (mapping,) = status_of(result)["ports"]
    assert mapping["declared"] == taken and mapping["host"] != taken
    assert f"hello from {mapping['host']}" in log_text(result, "worker-0", "w")


def test_two_copies_of_a_job_pinning_one_port_both_complete(tmp_path: Path) -> None:
    yaml_file = tmp_path / "job.json"
    job = _port_job("twin", tmp_path)
    from torchjob.spec.manifest import job_manifest

    yaml_file.write_text(json.dumps(job_manifest(job)))
    env = {**os.environ, "TORCHJOB_HOME": str(tmp_path / "home")}
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "torchjob", "run", "-q", str(yaml_file)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=45) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    statuses = [json.loads(p.read_text()) for p in (tmp_path / "home" / "jobs").glob("*/status.json")]
    hosts = {s["ports"][0]["host"] for s in statuses}
    assert len(statuses) == 2 and len(hosts) == 2
    assert all(s["phase"] == "Completed" for s in statuses)


def test_wait_for_master_works_without_nc(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("sh", "bash", "date", "sleep", "cat", "timeout"):
        found = subprocess.run(
            ["sh", "-c", f"command -v {tool}"], capture_output=True, text=True
        ).stdout.strip()
        if not found:
            pytest.skip(f"{tool} is not installed")
        (bin_dir / tool).symlink_to(found)
    job = _port_job("nonc", tmp_path)
    result = run(job, tmp_path, extra_env={"PATH": str(bin_dir)})
    assert result.ok, result.reason
    waited = log_text(result, "worker-0", "wait-for-master")
    assert "probe: nc" not in waited and "is ready" in waited


WORKDIR_JOB = """\
apiVersion: batch.volcano.sh/v1alpha1
kind: Job
metadata: {name: workdir}
spec:
  tasks:
    - name: main
      replicas: 1
      template:
        spec:
          restartPolicy: Never
          volumes: [{name: scratch, emptyDir: {}}]
          containers:
            - name: app
              image: busybox:1.36
              command: [sh, -c, "pwd; echo made > here.txt"]
              workingDir: /scratch/sub/dir
              volumeMounts: [{name: scratch, mountPath: /scratch}]
"""


def test_a_working_directory_below_an_empty_dir_mount_is_made(tmp_path: Path) -> None:
    """Container runtimes make a missing working directory; it failed here with exit 127."""
    job_file = tmp_path / "job.yaml"
    job_file.write_text(WORKDIR_JOB)
    proc = subprocess.run(
        [sys.executable, "-m", "torchjob", "run", "--state-dir", str(tmp_path / "jobs"), str(job_file)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [made] = (tmp_path / "jobs").rglob("here.txt")
    assert made.parent.parts[-4:] == ("volumes", "scratch", "sub", "dir")
    assert f"{made.parent}\n" in proc.stdout


def test_a_working_directory_that_cannot_exist_is_named_in_the_log(tmp_path: Path) -> None:
    """Below a ConfigMap volume (read-only data) nothing is made: the log says what is missing."""
    main = task(
        "main",
        [
            container(
                "app",
                ["true"],
                workingDir="/config/sub",
                volumeMounts=[{"name": "config", "mountPath": "/config"}],
            )
        ],
    )
    main["template"]["spec"]["volumes"] = [{"name": "config", "configMap": {"name": "nosuch"}}]
    result = run(make_job("workdir-missing", [main]), tmp_path)
    assert (result.phase, result.pods[0].exit_code) == ("Failed", 127)
    text = log_text(result, "main-0", "app")
    assert "cannot start container 'app': its working directory " in text
    assert text.rstrip().endswith("nosuch/sub does not exist")


LAUNCHER_ENV = {  # what torchrun gives one of its workers (rank 3 of 7), and one of the caller's own
    "TORCHELASTIC_RUN_ID": "outer",
    "TORCHELASTIC_USE_AGENT_STORE": "True",
    "TORCHELASTIC_RESTART_COUNT": "0",
    "LOCAL_RANK": "3",
    "RANK": "3",
    "GROUP_RANK": "1",
    "WORLD_SIZE": "7",
    "MASTER_ADDR": "10.9.9.9",
    "MASTER_PORT": "29400",
    "KEPT_BY_THE_CALLER": "yes",
}
SHOW_LAUNCHER_ENV = (
    'echo "store=${TORCHELASTIC_USE_AGENT_STORE-unset} run=${TORCHELASTIC_RUN_ID-unset} '
    "local=${LOCAL_RANK-unset} group=${GROUP_RANK-unset} rank=${RANK-unset} world=${WORLD_SIZE-unset} "
    'master=${MASTER_ADDR-unset} kept=$KEPT_BY_THE_CALLER"'
)


@pytest.mark.parametrize("worker", [True, False], ids=["from-a-torchrun-worker", "from-a-shell"])
def test_a_job_started_from_a_torchrun_worker_does_not_hand_its_rank_to_the_pods(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, worker: bool
) -> None:
    """An SDK call (or `torchjob run`) in a script that torchrun runs: the caller's rank variables
    are not the pods' (TORCHELASTIC_USE_AGENT_STORE=True made every rank of a nested PyTorch task
    wait forever for a store). Outside a torch launcher's worker, the environment is left as it is."""
    for name, value in LAUNCHER_ENV.items():
        if worker or not name.startswith("TORCHELASTIC_"):
            monkeypatch.setenv(name, value)
    job = make_job("nested", [task("main", [container("app", sh(SHOW_LAUNCHER_ENV))])])
    result = run(job, tmp_path)
    assert result.ok, result.reason
    if worker:
        expected = (
            "store=unset run=unset local=unset group=unset rank=unset world=unset master=unset kept=yes"
        )
    else:
        expected = "store=unset run=unset local=3 group=1 rank=3 world=7 master=10.9.9.9 kept=yes"
    assert log_text(result, "main-0", "app").strip() == expected


LATE_MASTER = """\
import os, socket, time
time.sleep(1.5)  # the worker's wait-for-master polls meanwhile
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(("0.0.0.0", int(os.environ["MASTER_PORT"])))
server.listen()
server.settimeout(20)
server.accept()[0].close()  # the probe's connection
"""


def _nice_and_group(pid: int) -> tuple[int, str | None]:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    try:
        group = Path(f"/proc/{pid}/autogroup").read_text().split()[-1]
    except OSError:
        group = None  # a kernel without autogroup scheduling
    return int(fields[16]), group  # nice is field 19 of stat, the 17th after the name


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_the_plugins_wait_for_master_polls_below_the_pods_cpu_priority(tmp_path: Path) -> None:
    """Its polls fork a few processes every 20 ms while the ranks import torch on the same cores:
    torchjob's helper yields to them (nice 10, its session's autogroup too); the job's own
    containers, init containers included, keep the priority they were given."""
    import threading

    (tmp_path / "master.py").write_text(LATE_MASTER)
    mine = tmp_path / "mine"
    job = make_job(
        "nice",
        [
            task("master", [container("m", ["python", str(tmp_path / "master.py")])]),
            task(
                "worker",
                [container("w", sh("true"))],
                init=[container("mine", sh(f"cat /proc/self/stat > {mine}"))],
            ),
        ],
        plugins={"pytorch": ["--master=master", "--worker=worker", "--wait-master-enabled"]},
    )
    results: list[Any] = []
    runner = threading.Thread(target=lambda: results.append(run(job, tmp_path)))
    runner.start()
    marker = f"TORCHJOB_JOB_DIR={tmp_path / 'jobs'}".encode()
    found: dict[str, tuple[int, str | None]] = {}
    try:
        deadline = time.monotonic() + 20
        while runner.is_alive() and time.monotonic() < deadline and len(found) < 2:
            for entry in os.listdir("/proc"):
                if not entry.isdigit():
                    continue
                try:
                    environ = Path(f"/proc/{entry}/environ").read_bytes()
                    argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
                    if marker not in environ:
                        continue
                    if argv[:2] == [b"sh", b"-c"] and b"wait-for-master: " in argv[2]:
                        found.setdefault("probe", _nice_and_group(int(entry)))
                    elif any(b"master.py" in a for a in argv):
                        found.setdefault("master", _nice_and_group(int(entry)))
                except (OSError, IndexError):
                    continue
            time.sleep(0.05)
    finally:
        runner.join(timeout=30)
    assert results and results[0].ok, results and results[0].reason
    assert found.get("probe") is not None and found.get("master") is not None, found
    # Relative to this test's own nice value (a suite run under `nice` starts the job niced too);
    # lowering a nice value below one's own is root's right only.
    ours = os.getpriority(os.PRIO_PROCESS, 0)
    helper = 10 if ours <= 10 or os.geteuid() == 0 else ours
    assert found["probe"][0] == helper and found["probe"][1] in (None, "10"), found
    assert found["master"][0] == ours and found["master"][1] in (None, "0"), found
    own_nice = int(mine.read_text().rsplit(")", 1)[1].split()[16])
    assert own_nice == ours  # the job's own init container
