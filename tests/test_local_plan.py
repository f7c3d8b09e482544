"""The local engine's plan: what a run will do, told before it starts, and run as planned.

A run expands the job once, in its plan (checked there); when its turn comes the planned pods
are readdressed with the host ports (and names) it got, not built again; the CLI's warnings build
no pods.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from torchjob.engine_api.base import StartOptions
from torchjob.engines.local.engine import LocalEngine
from torchjob.jobs import load_jobs, load_jobs_from_text

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "pytorch-job.yaml"

SIMPLE = """\
apiVersion: batch.volcano.sh/v1alpha1
kind: Job
metadata: {name: simple}
spec:
  plugins: {env: []}
  tasks:
  - name: worker
    replicas: 2
    template:
      spec:
        restartPolicy: Never
        containers: [{name: main, image: img, command: [sh, -c, 'echo index $(VC_TASK_INDEX)']}]
"""


def test_the_plan_lists_pods_ranks_resolved_commands_and_ports(tmp_path: Path) -> None:
    job = load_jobs(str(EXAMPLE))[0].job
    plan = LocalEngine(tmp_path).plan(job, StartOptions())
    lines = plan.text.splitlines()
    assert lines[0] == "local job pytorch-job: 3 pod(s) on this machine"
    assert "ports to reserve: 23456" in lines[1]
    pods = [line for line in lines if line.startswith("pod ")]
    assert pods == [
        "pod pytorch-job-master-0 (rank 0)",
        "pod pytorch-job-worker-0 (rank 1)",
        "pod pytorch-job-worker-1 (rank 2)",
    ]
    # `python` is the interpreter torchjob runs in, as the container will run it.
    assert f"  master: {sys.executable} examples/programs/sendrecv.py" in lines
    waits = [line for line in lines if "wait-for-master" in line]
    assert len(waits) == 2
    assert all(w.startswith("  init wait-for-master: waits until the master listens on ") for w in waits)
    assert all("until" in w and "\n" not in w and "nc " not in w for w in waits)  # not its script
    assert not any(line.startswith("pod") for line in lines[:2])
    assert not list(tmp_path.iterdir())  # nothing made: no job directory, no port reserved


def test_the_plan_resolves_variables_in_commands(tmp_path: Path) -> None:
    job = load_jobs_from_text(SIMPLE)[0].job
    text = LocalEngine(tmp_path).plan(job, StartOptions()).text
    assert "  main: sh -c 'echo index 0'" in text.splitlines()
    assert "  main: sh -c 'echo index 1'" in text.splitlines()


def test_a_problem_is_the_plans_refusal_and_start_refuses_it_so(tmp_path: Path) -> None:
    """What stops the job here is the plan's refusal (run --dry-run says it): the very problems
    start refuses the plan with, found without making anything."""
    from torchjob.errors import SpecError

    job = load_jobs_from_text(SIMPLE.replace("command: [sh, -c, 'echo index $(VC_TASK_INDEX)']", ""))[0].job
    engine = LocalEngine(tmp_path / "state")
    plan = engine.plan(job, StartOptions())
    refused = plan.refused()
    assert isinstance(refused, SpecError), refused
    assert [p.path for p in refused.problems] == ["spec.tasks[0].template.spec.containers[0].command"]
    assert "pod simple-worker-1" in plan.text and "cannot run here" not in plan.text
    assert not (tmp_path / "state").exists()
    with pytest.raises(SpecError) as started:
        engine.start(plan)
    assert [(p.path, p.message) for p in started.value.problems] == [
        (p.path, p.message) for p in refused.problems
    ]
    assert engine.plan(load_jobs_from_text(SIMPLE)[0].job, StartOptions()).refused() is None


PROBE = """
import json, sys
import torchjob.expand as expand
count = [0]
pods = expand.Expansion.pods
def counted(self):
    count[0] += 1
    return pods(self)
expand.Expansion.pods = counted
from torchjob.engine_api.base import StartOptions
from torchjob.engines.local.engine import LocalEngine
from torchjob.jobs import load_jobs
job = load_jobs(sys.argv[1])[0].job
engine = LocalEngine(sys.argv[2])
if sys.argv[3] == "cli":
    from torchjob.cli import main
    code = main(["run", "-q", "--no-queue", "--state-dir", sys.argv[2], sys.argv[1]])
    print(json.dumps({"code": code, "expansions": count[0]}))
else:
    plan = engine.plan(job, StartOptions(quiet=True, queue=False))
    planned = count[0]
    report = engine.start(plan)
    print(json.dumps({"phase": report.phase, "planned": planned, "expansions": count[0] - planned}))
"""


@pytest.mark.torch
def test_start_runs_the_plan_made_for_the_job(tmp_path: Path) -> None:
    """plan() expands the job once; start() given that job runs that plan: its pods are given
    their host ports (the pytorch plugin's MASTER_PORT) without being built again."""
    out = subprocess.run(
        [sys.executable, "-c", PROBE, str(EXAMPLE), str(tmp_path), "engine"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result == {"phase": "Completed", "planned": 1, "expansions": 0}, out.stderr


def test_a_cli_run_expands_the_job_twice_at_most(tmp_path: Path) -> None:
    """Once in the plan (checks, commands), once addressed with the ports the job got: before,
    the CLI's warnings and the engine's checks each expanded it as well."""
    job_file = tmp_path / "simple.yaml"
    job_file.write_text(SIMPLE)
    out = subprocess.run(
        [sys.executable, "-c", PROBE, str(job_file), str(tmp_path / "state"), "cli"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["code"] == 0, out.stderr
    assert 1 <= result["expansions"] <= 2


WIRED = """\
apiVersion: batch.volcano.sh/v1alpha1
kind: Job
metadata: {name: wired}
spec:
  plugins: {pytorch: [--master=master, --worker=worker, --port=23456], svc: []}
  policies: [{event: PodFailed, action: RestartJob}]
  maxRetry: 2
  tasks:
  - name: master
    replicas: 1
    template: &pod
      spec:
        restartPolicy: Never
        containers:
        - name: main
          image: img
          resources: {requests: {cpu: 100m}}
          env:
          - name: VERSION
            valueFrom: {fieldRef: {fieldPath: "metadata.annotations['volcano.sh/job-version']"}}
          command: [sh, -c, 'echo "wired $MASTER_ADDR $MASTER_PORT $VC_MASTER_HOSTS v$VERSION"; FAIL']
  - name: worker
    replicas: 2
    template: *pod
"""

# The job counted in a process of its own: the counter does not outlive it.
RUN_PROBE = """
import json, sys
import torchjob.expand as expand
count = [0]
pods = expand.Expansion.pods
def counted(self):
    count[0] += 1
    return pods(self)
expand.Expansion.pods = counted
from torchjob.cli import main
code = main(sys.argv[1:])
print(json.dumps({"code": code, "expansions": count[0]}))
"""


def run_counted(tmp_path: Path, *argv: str) -> dict[str, int]:
    """``torchjob ARGV`` run in a process that counts the pods built (``Expansion.pods`` calls),
    with a local queue of its own (4 CPUs)."""
    runtime = tmp_path / "runtime"
    runtime.mkdir(mode=0o700, exist_ok=True)
    env = {
        **os.environ,
        "TORCHJOB_RUNTIME_DIR": str(runtime),
        "TORCHJOB_CAPACITY": "cpu=4,memory=8Gi",
        "TORCHJOB_CONFIG": str(tmp_path / "queues.yaml"),
    }
    env.pop("TORCHJOB_QUEUE", None)
    out = subprocess.run(
        [sys.executable, "-c", RUN_PROBE, *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
    )
    result: dict[str, int] = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["code"] in (0, 1), out.stderr
    return result


@pytest.mark.parametrize("restart", [False, True])
def test_a_run_expands_its_job_once_and_gives_its_pods_the_host_ports(tmp_path: Path, restart: bool) -> None:
    """A queued pytorch job, run by the CLI: one expansion (the plan), whatever its turn gives it
    (a random host port for the rendezvous, maybe pod names) and however often it restarts; every
    pod sees the port and the master's address as a second expansion would have given them."""
    from torchjob.engine_api.base import LogQuery

    job_file = tmp_path / "wired.yaml"
    fail = '[ "$VERSION" = 1 ] || exit 3' if restart else "true"
    job_file.write_text(WIRED.replace("FAIL", fail))
    state = tmp_path / "state"
    result = run_counted(tmp_path, "run", "-q", "--state-dir", str(state), str(job_file))
    assert result == {"code": 0, "expansions": 1}
    engine = LocalEngine(state)
    (report,) = engine.list_jobs()
    assert report.phase == "Completed" and report.retry_count == (1 if restart else 0)
    ((declared, host),) = [(p["declared"], p["host"]) for p in report.to_dict()["ports"]]
    assert declared == 23456 and host != declared
    lines = {line.text for line in engine.logs(report.id, LogQuery())}
    (master,) = [p.address for p in report.pods if p.task == "master"]
    names = report.to_dict().get("nameResolution") == "resolved"
    address = "wired-master-0.wired" if names else master
    assert lines == {f"wired {address} {host} {address} v{1 if restart else 0}"}


def test_validate_local_expands_the_job_once(tmp_path: Path) -> None:
    job_file = tmp_path / "wired.yaml"
    job_file.write_text(WIRED.replace("FAIL", "true"))
    assert run_counted(tmp_path, "validate", "--local", str(job_file)) == {"code": 0, "expansions": 1}


# ------------------------------------------------------------------ logs (LocalEngine._log_files)

WITH_INIT = """\
apiVersion: batch.volcano.sh/v1alpha1
kind: Job
metadata: {name: logged}
spec:
  tasks:
  - name: worker
    replicas: 2
    template:
      spec:
        restartPolicy: Never
        initContainers: [{name: setup, image: img, command: [sh, -c, 'echo setting up']}]
        containers: [{name: main, image: img, command: [sh, -c, 'echo hello']}]
"""


def test_logs_by_pod_container_and_attempt_and_one_line_for_what_is_not_there(tmp_path: Path) -> None:
    from torchjob.engine_api.base import EngineError, LogQuery

    engine = LocalEngine(tmp_path / "state")
    report = engine.start(
        engine.plan(load_jobs_from_text(WITH_INIT)[0].job, StartOptions(quiet=True, queue=False))
    )
    assert report.phase == "Completed"

    def lines(**query: object) -> list[tuple[str, str]]:
        return [(line.prefix, line.text) for line in engine.logs(report.id, LogQuery(**query))]  # type: ignore[arg-type]

    assert lines(pod="worker-1") == [("worker-1/setup", "setting up"), ("worker-1", "hello")]
    assert lines(container="main") == [("worker-0", "hello"), ("worker-1", "hello")]
    assert lines(pod="worker-0", all_attempts=True) == [
        ("worker-0/setup #0", "setting up"),
        ("worker-0 #0", "hello"),
    ]
    assert lines(pod="worker-0", attempt=0, container="setup") == [("worker-0/setup", "setting up")]
    for query, message in (
        ({"pod": "nope"}, f"job {report.id} has no pod 'nope' (pods: worker-0, worker-1)"),
        ({"container": "x"}, f"job {report.id} has no container 'x' (containers: main, setup)"),
        ({"attempt": 3}, f"job {report.id} has no attempt 3 (attempts: worker-0: 0; worker-1: 0)"),
    ):
        with pytest.raises(EngineError) as err:
            lines(**query)
        assert str(err.value) == message
