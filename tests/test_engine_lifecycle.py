"""Volcano's job lifecycle, the same scenarios on every engine that runs the controller.

Each scenario is a small job of shell commands run through the CLI (``torchjob run FILE --engine
E``), then judged by what every engine reports alike: the exit code, ``status -o json`` (phase,
reason, retries, each pod's phase, attempt and restarts, the first failure) and the followed logs.
The ``local`` leg runs processes on this machine; the ``slurm`` leg runs the same job as job steps
of one allocation on a private Slurm (tools/slurm_cluster.py, one per module), and skips with the
reason where Slurm is not installed or the tests do not run as root; the ``fake`` leg runs it in this
process through the controller, the kubelet and the report builder over the smallest container
runtime an engine can write (tests/fake_pods.py: start, poll and signal a container), and answers
the same commands. Between them, every policy
action is taken at least once: RestartPod, RestartTask, RestartJob (maxRetry used up), AbortJob
(a task's maxRetry, a policy's timeout), CompleteJob, TerminateJob; and minAvailable, minSuccess,
dependsOn, the active deadline, restartPolicy OnFailure in place and ``--max-restarts``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

import slurm_cluster
from fake_pods import FakeHost
from torchjob.display import summary

pytestmark = [pytest.mark.timeout(180)]

REPO = Path(__file__).resolve().parent.parent
ENGINES = ["local", pytest.param("slurm", marks=pytest.mark.slow), "fake"]


class Engine:
    """One engine's leg: ``torchjob`` commands with its flags and its private state."""

    def __init__(self, name: str, env: dict[str, str]) -> None:
        self.name = name
        self.env = env

    def cli(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "torchjob", *args, "--engine", self.name],
            env=self.env,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def run(self, path: Path, *flags: str) -> subprocess.CompletedProcess[str]:
        return self.cli("run", str(path), *flags)

    def status(self, name: str) -> dict[str, Any]:
        done = self.cli("status", name, "-o", "json", timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr
        data: dict[str, Any] = json.loads(done.stdout)
        return data

    def run_script(self, shape: str, script: Path) -> subprocess.CompletedProcess[str]:
        """``run -j SHAPE SCRIPT`` (the engine's flag before the script: what follows is its own)."""
        return subprocess.run(
            [sys.executable, "-m", "torchjob", "run", "--engine", self.name, "-j", shape, str(script)],
            env=self.env,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=150,
            check=False,
        )

    def start_with_deadline(self, path: Path) -> subprocess.CompletedProcess[str]:
        """The job started through the engine interface with runPolicy.activeDeadlineSeconds 3."""
        return subprocess.run(
            [sys.executable, "-c", RUN_WITH_DEADLINE, self.name, str(path)],
            env=self.env,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )


class FakeLeg(Engine):
    """The commands of the scenarios, answered in this process by :class:`FakeHost`: ``run``
    (attached, or ``--detach`` in a thread), ``status [-o json]``, ``delete``."""

    def __init__(self, root: Path) -> None:
        super().__init__("fake", {})
        self.root = root
        self.hosts: dict[str, FakeHost] = {}
        self.threads: dict[str, threading.Thread] = {}

    def host(self, path: str, flags: tuple[str, ...], deadline: int | None = None) -> FakeHost:
        from torchjob.jobs import load_jobs_from_text
        from torchjob.quick import quick_job
        from torchjob.spec.model import JobRunPolicy

        if path == "-j":  # run -j SHAPE SCRIPT: the job torchjob makes of a script
            job = quick_job(flags[0], flags[1], []).job
            flags = flags[2:]
        else:
            job = load_jobs_from_text(Path(path).read_text(), path)[0].job
        if deadline is not None:
            job.run_policy = JobRunPolicy(active_deadline_seconds=deadline)  # as the SDK's RunPolicy sets it
        given = dict(zip(flags[::2], flags[1::2], strict=False))
        timeout = float(given["--timeout"]) if "--timeout" in given else None
        most = int(given["--max-restarts"]) if "--max-restarts" in given else None
        host = self.hosts[job.name] = FakeHost(job, self.root, timeout=timeout, max_restarts=most)
        return host

    def cli(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        verb, name, flags = args[0], args[1], args[2:]
        if verb == "run" and "--detach" in flags:
            host = self.host(name, tuple(f for f in flags if f != "--detach"))
            self.threads[host.job.name] = threading.Thread(target=host.run, daemon=True)
            self.threads[host.job.name].start()
            return subprocess.CompletedProcess(args, 0, host.job.name, "")
        if verb == "run":
            host = self.host(name, flags)
            report = host.run()
            out = "\n".join([*host.lines, *summary(report)]) + "\n"
            return subprocess.CompletedProcess(args, 0 if report.ok else 1, out, "\n".join(host.said))
        found = self.hosts.get(name)
        if found is None or found.expired():
            return subprocess.CompletedProcess(args, 2, "", f"torchjob: no fake job {name}")
        if verb == "delete":
            found.stop.set()
            self.threads[name].join(timeout)
            return subprocess.CompletedProcess(args, 0, name, "")
        report = found.report()
        out = json.dumps(report.to_dict()) if "-o" in flags else "\n".join(summary(report))
        return subprocess.CompletedProcess(args, 0, out, "")

    def run_script(self, shape: str, script: Path) -> subprocess.CompletedProcess[str]:
        return self.cli("run", "-j", shape, str(script))

    def start_with_deadline(self, path: Path) -> subprocess.CompletedProcess[str]:
        report = self.host(str(path), (), deadline=3).run()
        return subprocess.CompletedProcess(
            [], 0, json.dumps({"phase": report.phase, "reason": report.reason}), ""
        )

    def close(self) -> None:
        for host in self.hosts.values():
            host.stop.set()
        for thread in self.threads.values():
            thread.join(30)
        for host in self.hosts.values():
            host.kill_all()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[slurm_cluster.SlurmCluster]:
    """One private Slurm for the module's scenarios (starting one costs seconds), of two nodes:
    ``run -j 2x2`` is two nodes of two processes, one pod on each."""
    reason = slurm_cluster.why_not()
    if reason is not None:
        pytest.skip(reason)
    try:
        found = slurm_cluster.SlurmCluster(tmp_path_factory.mktemp("slurm") / "cluster", nodes=2, tied=True)
    except slurm_cluster.Unsupported as err:
        pytest.skip(str(err))
    try:
        try:
            found.start()
        except slurm_cluster.Unsupported as err:
            pytest.skip(str(err))
        yield found
    finally:
        found.stop()


@pytest.fixture(params=ENGINES)
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Engine]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCHJOB_")}
    env["TORCHJOB_HOME"] = str(tmp_path / "home")
    if request.param == "slurm":
        found: slurm_cluster.SlurmCluster = request.getfixturevalue("cluster")
        env.update(found.env)
        env.pop("TORCHJOB_ENGINE", None)
        env["TORCHJOB_SLURM_JOB_ROOT"] = str(tmp_path / "slurm-root")
        env["TORCHJOB_SLURM_PARTITION"] = found.partition
        yield Engine("slurm", env)
        assert found.jobs() == [], "an allocation outlived its job"
    elif request.param == "fake":
        leg = FakeLeg(tmp_path / "fake")
        try:
            yield leg
        finally:
            leg.close()
    else:
        yield Engine("local", env)


def sh(script: str) -> list[str]:
    return ["sh", "-c", script]


def task(
    name: str,
    script: str,
    *,
    replicas: int = 1,
    restart: str = "Never",
    init: str | None = None,
    **extra: Any,
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "restartPolicy": restart,
        "terminationGracePeriodSeconds": 2,
        "containers": [{"name": "app", "image": "busybox:1.36", "command": sh(script)}],
    }
    if init is not None:
        spec["initContainers"] = [{"name": "prep", "image": "busybox:1.36", "command": sh(init)}]
    return {"name": name, "replicas": replicas, "template": {"spec": spec}, **extra}


def job_file(tmp_path: Path, name: str, tasks: list[dict[str, Any]], **spec: Any) -> Path:
    doc = {
        "apiVersion": "batch.volcano.sh/v1alpha1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {**spec, "tasks": tasks},
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def said(out: str, pod: str, text: str) -> int:
    """How many lines of the followed logs are ``text`` from ``pod`` (a container ``pod/c``),
    whatever the padding and rank of the prefix."""
    line = re.compile(rf"^{re.escape(pod)}(?: r\d+)? *\| {re.escape(text)}$", re.MULTILINE)
    return len(line.findall(out))


def pods(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {p["short"]: p for p in status["pods"]}


def fail_once(flag: Path, code: int = 3) -> str:
    """Fails the first time it runs (``crash``), succeeds after (``recovered``)."""
    return f"if [ -e {flag} ]; then echo recovered; else : > {flag}; echo crash; exit {code}; fi"


SLEEPER = "echo up; sleep 600"  # never ends by itself: the job's decision stops it


def test_restart_pod_recreates_only_the_failed_pod(engine: Engine, tmp_path: Path) -> None:
    flag = tmp_path / "flag"
    script = (
        f"if [ $VK_TASK_INDEX = 1 ] && [ ! -e {flag} ]; then : > {flag}; echo crash; exit 3; fi; sleep 0.5"
    )
    path = job_file(
        tmp_path,
        "rpod",
        [
            task("master", "sleep 2"),
            task("worker", script, replicas=2, policies=[{"event": "PodFailed", "action": "RestartPod"}]),
        ],
        plugins={"env": []},
    )
    done = engine.run(path)
    assert done.returncode == 0, done.stdout + done.stderr
    status = engine.status("rpod")
    assert status["phase"] == "Completed" and status["retryCount"] == 1
    attempts = {short: p["attempt"] for short, p in pods(status).items()}
    assert attempts == {"master-0": 0, "worker-0": 0, "worker-1": 1}
    assert said(done.stdout, "worker-1", "crash") == 1, done.stdout


def test_each_attempt_reads_its_own_retry_count_inside_the_pod(engine: Engine, tmp_path: Path) -> None:
    """A restarted job's pods are made from that attempt's pod: the downward API gives them its
    retry count and job version (Volcano's annotations), so a program can tell a retry."""

    def annotation(name: str, key: str) -> dict[str, Any]:
        return {
            "name": name,
            "valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['volcano.sh/{key}']"}},
        }

    main = task(
        "main",
        'echo "retry $RETRY version $VERSION"; [ "$RETRY" -ge 1 ]',
        policies=[{"event": "PodFailed", "action": "RestartJob"}],
    )
    main["template"]["spec"]["containers"][0]["env"] = [
        annotation("RETRY", "job-retry-count"),
        annotation("VERSION", "job-version"),
    ]
    path = job_file(tmp_path, "retrycount", [main], maxRetry=3)
    done = engine.run(path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert said(done.stdout, "main-0", "retry 0 version 0") == 1, done.stdout
    assert said(done.stdout, "main-0", "retry 1 version 1") == 1, done.stdout
    status = engine.status("retrycount")
    assert (status["phase"], status["retryCount"], pods(status)["main-0"]["attempt"]) == ("Completed", 1, 1)


def test_restart_task_recreates_the_task_and_leaves_the_others(engine: Engine, tmp_path: Path) -> None:
    path = job_file(
        tmp_path,
        "rtask",
        [
            task("master", "sleep 2"),
            task(
                "worker",
                fail_once(tmp_path / "flag"),
                policies=[{"event": "PodFailed", "action": "RestartTask"}],
            ),
        ],
    )
    done = engine.run(path)
    assert done.returncode == 0, done.stdout + done.stderr
    status = engine.status("rtask")
    assert status["phase"] == "Completed" and status["retryCount"] == 1
    assert {s: p["attempt"] for s, p in pods(status).items()} == {"master-0": 0, "worker-0": 1}
    assert said(done.stdout, "worker-0", "recovered")


def test_restart_job_until_max_retry_is_used_up(engine: Engine, tmp_path: Path) -> None:
    counter, ups = tmp_path / "runs", tmp_path / "ups"
    # Each run of main fails once side is up in the same attempt (bounded): a main that failed
    # first would stop the side before it said so, on a busy machine.
    script = (
        f"n=$(cat {counter} 2>/dev/null || echo 0); echo run $n; echo $((n + 1)) > {counter}; i=0; "
        f'while [ "$(cat {ups} 2>/dev/null | wc -l)" -le "$n" ] && [ $i -lt 200 ]; do '
        "sleep 0.05; i=$((i + 1)); done; "
        "exit 1"
    )
    side = f"echo up >> {ups}; {SLEEPER}"
    path = job_file(
        tmp_path,
        "exhaust",
        [task("main", script), task("side", side)],
        maxRetry=2,
        policies=[{"event": "PodFailed", "action": "RestartJob"}],
    )
    done = engine.run(path)
    assert done.returncode == 1, done.stdout + done.stderr
    status = engine.status("exhaust")
    assert status["phase"] == "Failed" and status["retryCount"] == 2
    assert "maxRetry 2" in status["reason"]
    assert counter.read_text().strip() == "2"  # two runs: the second restart is refused
    assert said(done.stdout, "side-0", "up") == 2, done.stdout  # the whole job restarted once
    main = pods(status)["main-0"]
    assert (main["phase"], main["exitCode"], main["attempt"]) == ("Failed", 1, 1)
    assert (status["firstFailure"]["exitCode"], status["firstFailure"]["logTail"]) == (1, ["run 1"])


def test_task_failed_aborts_once_in_place_restarts_reach_the_tasks_max_retry(
    engine: Engine, tmp_path: Path
) -> None:
    path = job_file(
        tmp_path,
        "taskfail",
        [
            task(
                "main",
                "echo failing; exit 2",
                restart="OnFailure",
                maxRetry=2,
                policies=[{"event": "TaskFailed", "action": "AbortJob"}],
            )
        ],
    )
    done = engine.run(path)
    assert done.returncode == 1, done.stdout + done.stderr
    status = engine.status("taskfail")
    assert status["phase"] == "Aborted" and "TaskFailed" in status["reason"]
    main = pods(status)["main-0"]
    assert main["restarts"] >= 2 and main["attempt"] == 0  # restarted in place, never recreated


def test_on_failure_restarts_the_container_in_place(engine: Engine, tmp_path: Path) -> None:
    path = job_file(tmp_path, "inplace", [task("main", fail_once(tmp_path / "flag"), restart="OnFailure")])
    done = engine.run(path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert said(
        done.stdout,
        "main-0",
        "--- torchjob: container 'app' exited with code 3; restart 1 in 0.1s (restartPolicy OnFailure) ---",
    )
    assert said(done.stdout, "main-0", "recovered")
    status = engine.status("inplace")
    main = pods(status)["main-0"]
    assert (status["phase"], main["restarts"], main["attempt"], main["exitCode"]) == ("Completed", 1, 0, 0)
    assert main["containers"][0]["restarts"] == 1


def test_a_failed_init_container_restarts_in_place_under_on_failure(engine: Engine, tmp_path: Path) -> None:
    path = job_file(
        tmp_path,
        "initretry",
        [task("main", "echo main ran", restart="OnFailure", init=fail_once(tmp_path / "flag", 4))],
    )
    done = engine.run(path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert said(done.stdout, "main-0", "main ran")
    restart = (
        "--- torchjob: container 'prep' exited with code 4; restart 1 in 0.1s (restartPolicy OnFailure) ---"
    )
    assert said(done.stdout, "main-0/prep", restart), done.stdout
    main = pods(engine.status("initretry"))["main-0"]
    assert (main["restarts"], main["attempt"]) == (1, 0)


def test_max_restarts_fails_a_crash_looping_job(engine: Engine, tmp_path: Path) -> None:
    path = job_file(
        tmp_path, "loop", [task("master", "echo cannot open train.py; exit 2", restart="OnFailure")]
    )
    done = engine.run(path, "--max-restarts", "2")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "pod master-0 restarted 3 times, more than --max-restarts 2" in done.stdout + done.stderr
    status = engine.status("loop")
    assert status["phase"] == "Failed"
    assert "more than --max-restarts 2" in status["reason"]
    failure = status["firstFailure"]
    assert (failure["short"], failure["exitCode"], failure["reason"]) == ("master-0", 2, "CrashLoopBackOff")
    assert "cannot open train.py" in failure["logTail"]
    assert pods(status)["master-0"]["restarts"] == 3


def test_task_completed_completes_the_job_and_stops_the_rest(engine: Engine, tmp_path: Path) -> None:
    path = job_file(
        tmp_path,
        "chief",
        [
            task(
                "chief",
                "sleep 1; echo chief done",
                policies=[{"event": "TaskCompleted", "action": "CompleteJob"}],
            ),
            task("worker", SLEEPER, replicas=2),
        ],
    )
    done = engine.run(path)
    assert done.returncode == 0, done.stdout + done.stderr
    status = engine.status("chief")
    assert status["phase"] == "Completed"
    phases = {s: p["phase"] for s, p in pods(status).items()}
    assert phases == {"chief-0": "Succeeded", "worker-0": "Stopped", "worker-1": "Stopped"}
    assert pods(status)["worker-0"]["reason"] == "job completed"  # stopped, not failed
    assert pods(status)["chief-0"]["containers"][0]["reason"] == "Completed"


def test_pod_failed_terminates_the_job(engine: Engine, tmp_path: Path) -> None:
    path = job_file(
        tmp_path,
        "term",
        [
            task(
                "worker",
                "sleep 1; echo broken; exit 5",
                policies=[{"event": "PodFailed", "action": "TerminateJob"}],
            ),
            task("side", SLEEPER),
        ],
    )
    done = engine.run(path)
    assert done.returncode == 1, done.stdout + done.stderr
    status = engine.status("term")
    assert status["phase"] == "Terminated" and status["retryCount"] == 0
    failure = status["firstFailure"]
    # the program's own lines only (no srun message), the reason Kubernetes would give
    assert (failure["short"], failure["exitCode"], failure["reason"], failure["logTail"]) == (
        "worker-0",
        5,
        "Error",
        ["broken"],
    )
    side = pods(status)["side-0"]
    assert (side["phase"], side["reason"], side["exitCode"]) == ("Stopped", "job terminated", 143), side
    (app,) = side["containers"]
    assert (app["state"], app["exitCode"], app["reason"]) == ("terminated", 143, "Error (killed by SIGTERM)")
    worker = pods(status)["worker-0"]
    assert (worker["reason"], worker["containers"][0]["reason"]) == ("", "Error")


def test_min_success_completes_the_job_early(engine: Engine, tmp_path: Path) -> None:
    script = "if [ $VK_TASK_INDEX = 0 ]; then sleep 1; echo first; else echo up; sleep 600; fi"
    path = job_file(tmp_path, "minsucc", [task("w", script, replicas=2)], minSuccess=1, plugins={"env": []})
    done = engine.run(path)
    assert done.returncode == 0, done.stdout + done.stderr
    status = engine.status("minsucc")
    assert status["phase"] == "Completed" and "minSuccess 1 reached" in status["reason"]
    assert {s: p["phase"] for s, p in pods(status).items()} == {"w-0": "Succeeded", "w-1": "Stopped"}


def test_min_available_judges_a_job_whose_pods_all_ended(engine: Engine, tmp_path: Path) -> None:
    script = "sleep 0.5; if [ $VK_TASK_INDEX = 2 ]; then exit 7; fi"
    path = job_file(
        tmp_path, "minavail", [task("w", script, replicas=3)], minAvailable=2, plugins={"env": []}
    )
    done = engine.run(path)
    assert done.returncode == 0, done.stdout + done.stderr
    status = engine.status("minavail")
    assert status["phase"] == "Completed" and "minAvailable 2" in status["reason"]
    assert {s: p["phase"] for s, p in pods(status).items()} == {
        "w-0": "Succeeded",
        "w-1": "Succeeded",
        "w-2": "Failed",
    }


def test_depends_on_starts_a_task_once_its_dependency_runs(engine: Engine, tmp_path: Path) -> None:
    # The server's init container leaves the marker: a pod is Running only once its init
    # containers ended, so the marker is there when the client starts (its main container's first
    # line may still be ahead, so that could not be the marker).
    marker = tmp_path / "server-up"
    path = job_file(
        tmp_path,
        "deps",
        [
            task("client", f"test -e {marker} && echo server was up", dependsOn={"name": ["server"]}),
            task("server", "sleep 1", init=f": > {marker}"),
        ],
    )
    done = engine.run(path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert said(done.stdout, "client-0", "server was up")
    assert "task client waits for task(s) server to be running" in done.stdout + done.stderr


def test_a_policy_timeout_delays_its_action(engine: Engine, tmp_path: Path) -> None:
    path = job_file(
        tmp_path,
        "pendingtoolong",
        [task("main", "echo never", init="sleep 600")],
        policies=[{"event": "PodPending", "action": "AbortJob", "timeout": "2s"}],
    )
    done = engine.run(path)
    assert done.returncode == 1, done.stdout + done.stderr
    status = engine.status("pendingtoolong")
    assert status["phase"] == "Aborted" and "PodPending" in status["reason"]
    assert not said(done.stdout, "main-0", "never")


def test_a_later_event_cancels_a_delayed_action(engine: Engine, tmp_path: Path) -> None:
    # Pending briefly (a quick init container; a step starts within the timeout), then running
    # past the timeout: PodRunning cancels the PodPending action.
    path = job_file(
        tmp_path,
        "pendingbriefly",
        [task("main", "sleep 4; echo finished", init="sleep 0.1")],
        policies=[{"event": "PodPending", "action": "AbortJob", "timeout": "3s"}],
    )
    done = engine.run(path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert engine.status("pendingbriefly")["phase"] == "Completed"
    assert said(done.stdout, "main-0", "finished")


def test_the_deadline_terminates_the_job(engine: Engine, tmp_path: Path) -> None:
    path = job_file(tmp_path, "deadline", [task("main", SLEEPER, replicas=2)])
    done = engine.run(path, "--timeout", "3")
    assert done.returncode == 1, done.stdout + done.stderr
    status = engine.status("deadline")
    assert status["phase"] == "Terminated" and "deadline of 3s passed" in status["reason"]
    assert {p["phase"] for p in status["pods"]} == {"Stopped"}


BOOM_IN_A_BARRIER = """
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
if rank == 2:
    raise RuntimeError(f"boom on rank {rank}")
dist.barrier()  # the others wait here, then lose their peer: their errors come later, or first
"""


@pytest.mark.torch
def test_the_root_cause_is_the_rank_that_raised_not_the_peers_it_left_waiting(
    engine: Engine, tmp_path: Path
) -> None:
    """``run -j 2x2``: global rank 2 (worker-0's first process) raises while the others wait in a
    barrier and then fail with lost connections. Every engine names rank 2 and its exception,
    whichever exit it saw first, and speaks in the script's terms (nothing restarted). On a busy
    machine master-0 may fail first and the job stop worker-0 before its torchrun reports: then
    worker-0 is Stopped, and the reason says the job stopped it (the next test forces that)."""
    pytest.importorskip("torch")
    script = tmp_path / "boom.py"
    script.write_text(BOOM_IN_A_BARRIER)
    done = engine.run_script("2x2", script)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "maxRetry" not in done.stdout + done.stderr
    shown = engine.cli("status", "boom").stdout  # the report as display.py shows it, on every engine
    status = engine.status("boom")
    worker = next(p for p in status["pods"] if p["short"] == "worker-0")
    code = worker["exitCode"]
    if worker["phase"] == "Failed":  # its torchrun reported rank 2's exit
        how = "exit code 1 (Error)"
        said = f"rank 2 (pod worker-0) failed with exit code 1: {RAISED_2}"
    else:
        assert worker["phase"] == "Stopped", worker
        how = f"exit code {code} (Stopped by the job after its program raised)"
        said = (
            f"rank 2 (pod worker-0) raised {RAISED_2}, and the job stopped its pod (exit code {code}) when "
        )
    assert f"root cause: worker-0 (rank 2), {how}" in shown, shown
    assert f"    {RAISED_2}" in shown.splitlines(), shown
    assert "ChildFailedError" not in shown
    failure = status["firstFailure"]
    assert (failure["short"], failure["rank"], failure["exitCode"]) == ("worker-0", 2, code), failure
    assert failure["logTail"][-1] == RAISED_2, failure
    assert (status["phase"], status["retryCount"]) == ("Failed", 0)
    assert status["reason"].startswith(said) and status["reason"].endswith("; nothing was restarted"), status


RAISED_2 = "RuntimeError: boom on rank 2"
# Rank 1 raises, and its process is slow to end after its traceback (an upload at exit, say): its
# peer loses it at once and master-0 fails, so the job stops worker-0 before it fails by itself.
RAISES_THEN_LINGERS = """
import atexit, time
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()


def slow_exit():
    dist.destroy_process_group()  # the peer's barrier fails now, not at the process's end
    time.sleep(300)


if rank == 1:
    atexit.register(slow_exit)
    raise RuntimeError(f"boom on rank {rank}")
dist.barrier()
"""


@pytest.mark.torch
def test_the_root_cause_is_the_rank_that_raised_also_when_the_job_stopped_its_pod_first(
    engine: Engine, tmp_path: Path
) -> None:
    """``run -j 2x1``: rank 1 (worker-0) raises but its process lingers at exit; rank 0 loses its
    peer and master-0 fails first; the job stops worker-0. The reason and the root cause name rank
    1 and its exception once worker-0 is gone, and say that the job stopped it."""
    pytest.importorskip("torch")
    script = tmp_path / "linger.py"
    script.write_text(RAISES_THEN_LINGERS)
    done = engine.run_script("2x1", script)
    assert done.returncode == 1, done.stdout + done.stderr
    status = engine.status("linger")
    master, worker = (next(p for p in status["pods"] if p["short"] == s) for s in ("master-0", "worker-0"))
    assert (master["phase"], worker["phase"]) == ("Failed", "Stopped"), status["pods"]
    code = worker["exitCode"]
    failure = status["firstFailure"]
    assert (failure["short"], failure["rank"], failure["exitCode"]) == ("worker-0", 1, code), failure
    assert failure["reason"] == "Stopped by the job after its program raised", failure
    assert failure["logTail"][-1] == "RuntimeError: boom on rank 1", failure
    assert status["reason"] == (
        f"rank 1 (pod worker-0) raised RuntimeError: boom on rank 1, and the job stopped its pod (exit code "
        f"{code}) when rank 0 (pod master-0) failed; nothing was restarted"
    ), status["reason"]
    shown = engine.cli("status", "linger").stdout
    assert (
        f"root cause: worker-0 (rank 1), exit code {code} (Stopped by the job after its program raised)"
        in (shown)
    ), shown
    said = done.stdout + done.stderr  # the run's summary (Slurm's: the settled reason, told)
    assert "rank 1 (pod worker-0) raised RuntimeError: boom on rank 1" in said, said


RUN_WITH_DEADLINE = """
import json, sys
from torchjob.engine_api.base import StartOptions
from torchjob.engine_api.registry import get_engine
from torchjob.jobs import load_jobs_from_text
from torchjob.spec.model import JobRunPolicy

job = load_jobs_from_text(open(sys.argv[2]).read(), sys.argv[2])[0].job
job.run_policy = JobRunPolicy(active_deadline_seconds=3)  # as the SDK's RunPolicy sets it
engine = get_engine(sys.argv[1])
report = engine.start(engine.plan(job, StartOptions(quiet=True)))
print(json.dumps({"phase": report.phase, "reason": report.reason}))
"""


def test_the_jobs_own_active_deadline_terminates_it(engine: Engine, tmp_path: Path) -> None:
    """An SDK job's runPolicy.activeDeadlineSeconds, which no Volcano manifest field carries."""
    path = job_file(tmp_path, "owndeadline", [task("main", SLEEPER)])
    done = engine.start_with_deadline(path)
    assert done.returncode == 0, done.stdout + done.stderr
    status = engine.status("owndeadline")
    assert status["phase"] == "Terminated" and "deadline of 3s passed" in status["reason"], status


def test_an_exit_code_policy_sees_a_signal_death_as_128_plus_the_signal(
    engine: Engine, tmp_path: Path
) -> None:
    flag = tmp_path / "flag"
    # $$$$ is the shell's $$: a kubelet (and torchjob) reads $$ in a command as an escaped $
    script = f"if [ -e {flag} ]; then echo recovered; else : > {flag}; echo dying; kill -9 $$$$; fi"
    path = job_file(
        tmp_path,
        "sigkill",
        [task("main", script)],
        policies=[{"exitCode": 137, "action": "RestartJob"}],
    )
    done = engine.run(path)
    assert done.returncode == 0, done.stdout + done.stderr
    status = engine.status("sigkill")
    assert status["phase"] == "Completed" and status["retryCount"] == 1, status
    assert said(done.stdout, "main-0", "recovered")


def test_a_crash_loop_is_told_once(engine: Engine, tmp_path: Path) -> None:
    path = job_file(
        tmp_path, "crashloop", [task("master", "echo cannot open train.py; exit 2", restart="OnFailure")]
    )
    done = engine.run(path, "--timeout", "4")
    assert done.returncode == 1, done.stdout + done.stderr
    told = [line for line in (done.stdout + done.stderr).splitlines() if "CrashLoopBackOff" in line]
    assert len(told) == 1, told
    assert (
        "pod master-0 is in CrashLoopBackOff: container app ended 3 times in a row (last exit code 2)"
        in told[0]
    )
    assert "torchjob run --max-restarts N fails the job instead" in told[0]
    assert pods(engine.status("crashloop"))["master-0"]["restarts"] >= 3


def test_always_restarts_even_a_container_that_succeeded(engine: Engine, tmp_path: Path) -> None:
    path = job_file(tmp_path, "always", [task("main", "echo tick", restart="Always")])
    done = engine.run(path, "--max-restarts", "1")
    assert done.returncode == 1, done.stdout + done.stderr
    out = done.stdout + done.stderr
    assert "task main: restartPolicy Always (the Kubernetes default) restarts containers even after" in out
    assert said(done.stdout, "main", "tick") == 0 and said(done.stdout, "main-0", "tick") == 2, done.stdout
    status = engine.status("always")
    assert status["phase"] == "Failed" and "restarted 2 times, more than --max-restarts 1" in status["reason"]


def test_ttl_seconds_after_finished_removes_the_job(engine: Engine, tmp_path: Path) -> None:
    path = job_file(tmp_path, "shortlived", [task("main", "echo done")], ttlSecondsAfterFinished=3)
    done = engine.run(path)
    assert done.returncode == 0, done.stdout + done.stderr
    kept = engine.status("shortlived")  # kept until its TTL passed
    assert kept["phase"] == "Completed"
    job_dir = Path(kept["location"])
    assert job_dir.is_dir()
    time.sleep(max(0.0, kept["finishedAt"] + 3 - time.time()) + 0.5)
    gone = engine.cli("status", "shortlived", timeout=60)
    assert gone.returncode == 2 and "shortlived" in gone.stderr, gone.stdout + gone.stderr
    assert not job_dir.exists()


def test_status_shows_a_crash_loop_while_it_lasts(engine: Engine, tmp_path: Path) -> None:
    path = job_file(tmp_path, "looping", [task("main", "echo failing; exit 2", restart="OnFailure")])
    started = engine.cli("run", str(path), "--detach")
    assert started.returncode == 0, started.stdout + started.stderr
    try:
        deadline = time.monotonic() + 60
        seen: dict[str, Any] = {}
        while time.monotonic() < deadline:
            seen = pods(engine.status("looping")).get("main-0", {})
            # waiting out its back-off (0.8 s and more after the 4th failure)
            if seen.get("restarts", 0) >= 4 and seen.get("reason") == "CrashLoopBackOff":
                break
            time.sleep(0.1)
        assert seen.get("reason") == "CrashLoopBackOff", seen
        (app,) = seen["containers"]
        assert (app["state"], app["reason"], app["exitCode"]) == ("waiting", "CrashLoopBackOff", 2)
        assert seen["phase"] == "Running" and seen["attempt"] == 0
    finally:
        deleted = engine.cli("delete", "looping", timeout=60)
    assert deleted.returncode == 0, deleted.stdout + deleted.stderr
