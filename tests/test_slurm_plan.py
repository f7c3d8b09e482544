"""The Slurm plan: a job as one allocation, its batch script, and each pod's node, ports and env."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from torchjob.engines.slurm.plan import (
    NOT_SHARED,
    PlanError,
    Resources,
    launches,
    place,
    plan_job,
    tasks_per_node,
)
from torchjob.engines.slurm.settings import SlurmSettings, job_root
from torchjob.engines.slurm.steps import layout_from_env
from torchjob.jobs import load_jobs_from_text
from torchjob.spec.model import Job

pytestmark = pytest.mark.timeout(60)

EVIL = 'it\'s "quoted" $(touch MARK) `touch MARK` ;touch MARK\nnext line $HOME'


def container(
    name: str = "main",
    command: list[str] | None = None,
    env: list[dict[str, Any]] | None = None,
    ports: list[dict[str, Any]] | None = None,
    **resources: Any,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "name": name,
        "image": "python:3.11",
        "command": command or ["python", "train.py"],
    }
    if env:
        body["env"] = env
    if ports:
        body["ports"] = ports
    if resources:
        body["resources"] = resources
    return body


def load(tasks: list[dict[str, Any]], plugins: dict[str, list[str]] | None = None) -> Job:
    doc = {
        "apiVersion": "batch.volcano.sh/v1alpha1",
        "kind": "Job",
        "metadata": {"name": "train"},
        "spec": {"plugins": plugins or {}, "tasks": tasks},
    }
    loaded = load_jobs_from_text(yaml.safe_dump(doc))[0]
    assert loaded.job is not None, loaded.problems
    return loaded.job


def task(name: str, replicas: int, *containers: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {
        "name": name,
        "replicas": replicas,
        "template": {"spec": {"containers": list(containers), **spec}},
    }


PYTORCH = {"pytorch": ["--master=master", "--worker=worker", "--port=29500"], "env": [], "svc": []}


def pytorch_job(workers: int = 2, **resources: Any) -> Job:
    return load(
        [task("master", 1, container(**resources)), task("worker", workers, container(**resources))], PYTORCH
    )


def test_resources_come_from_the_pod_template() -> None:
    job = load(
        [
            task(
                "worker",
                2,
                container(limits={"cpu": "2500m", "memory": "3Gi", "nvidia.com/gpu": 2}),
                container("side", requests={"cpu": "500m", "memory": "512Mi"}),
                initContainers=[container("init", limits={"cpu": "8"})],
            )
        ]
    )
    plan = plan_job(job, SlurmSettings(), "/jobs/train", ["ctl"])
    (component,) = plan.components
    # main containers add up (2.5 + 0.5 = 3 CPUs); the init container runs alone, and wants 8
    assert component.resources == Resources(cpus=8, memory_mib=3584, gpus=2)
    assert component.sbatch_args() == [
        "--ntasks=2",
        "--cpus-per-task=8",
        "--mem-per-cpu=448M",
        "--gpus-per-task=2",
    ]


def test_a_pod_without_resources_gets_one_cpu_and_slurms_default_memory() -> None:
    plan = plan_job(load([task("worker", 3, container())]), SlurmSettings(), "/j", ["ctl"])
    assert plan.components[0].sbatch_args() == ["--ntasks=3", "--cpus-per-task=1"]
    assert not plan.heterogeneous


def test_a_fraction_of_a_gpu_is_refused_with_its_path() -> None:
    job = load([task("worker", 1, container(limits={"nvidia.com/gpu": "500m"}))])
    with pytest.raises(PlanError) as caught:
        plan_job(job, SlurmSettings(), "/j", ["ctl"])
    assert caught.value.path == "spec.tasks[0].template.spec.containers"
    assert "whole number" in caught.value.message


def test_tasks_that_differ_become_heterogeneous_components() -> None:
    job = load(
        [
            task("master", 1, container(limits={"cpu": "1"})),
            task("worker", 3, container(limits={"cpu": "4", "nvidia.com/gpu": "1"})),
            task("evaluator", 1, container(limits={"cpu": "1"})),  # same as master: same component
        ]
    )
    settings = SlurmSettings(
        partition="gpu",
        account="proj",
        qos="high",
        time_limit="2:00:00",
        exclusive=True,
        sbatch_args=("--constraint=fast",),
    )
    plan = plan_job(job, settings, "/jobs/train", ["ctl"])
    assert plan.heterogeneous
    assert [(c.tasks, c.ntasks) for c in plan.components] == [(["master", "evaluator"], 2), (["worker"], 3)]
    assert [(p.name, p.component, p.ordinal) for p in plan.pods] == [
        ("train-master-0", 0, 0),
        ("train-evaluator-0", 0, 1),
        ("train-worker-0", 1, 0),
        ("train-worker-1", 1, 1),
        ("train-worker-2", 1, 2),
    ]
    # job-wide options in every component: Slurm carries only some of them into the next one
    job_wide = [
        "--parsable",
        "--job-name=train",
        "--output=/dev/null",
        "--chdir=/jobs/train",
        "--no-requeue",
        "--partition=gpu",
        "--account=proj",
        "--qos=high",
        "--time=2:00:00",
        "--exclusive",
        "--constraint=fast",
    ]
    assert plan.sbatch_args == [
        *job_wide,
        "--ntasks=2",
        "--cpus-per-task=1",
        ":",
        *job_wide,
        "--ntasks=3",
        "--cpus-per-task=4",
        "--gpus-per-task=1",
    ]


def test_sbatch_args_that_torchjob_sets_itself_are_refused_by_name() -> None:
    job = pytorch_job()
    refused = {
        "--output=/nonexistent/x.out": "--output is not passed on: the controller's output goes to",
        "-o x": "-o is not passed on: the controller's output goes to",
        "--out=x": "--out is not passed on",  # sbatch takes a prefix of a long option
        "-Qp main": "-p (in -Qp) is not passed on: use -p/--partition",
        "-pmain": "-p (in -pmain) is not passed on",
        "--ntasks-per-node=2": "--ntasks-per-node is not passed on: use --nodes, --pods-per-node",
        "--mem=4G": "--mem is not passed on: torchjob asks for each pod's resources",
        "--gres=gpu:2": "--gres is not passed on",
        "--time 10": "--time is not passed on: use --time-limit",
        "--requeue": "--requeue is not passed on",
        "-N 2": "-N is not passed on: use --nodes",
        "--array=1-3": "--array is not passed on",
        ": -n 2": "':' starts a component",
    }
    for given, expected in refused.items():
        with pytest.raises(PlanError) as caught:
            plan_job(job, SlurmSettings(sbatch_args=tuple(given.split())), "/j", ["ctl"])
        assert caught.value.path == "--sbatch-args"
        assert caught.value.message.startswith(expected) or expected in caught.value.message, given
    allowed = (
        "--constraint=fast",
        "-C",
        "fast",
        "--nodelist=n1",
        "-w",
        "n2",
        "--mail-type=END",
        "--comment=x",
    )
    plan = plan_job(job, SlurmSettings(sbatch_args=allowed), "/j", ["ctl"])
    assert all(arg in plan.sbatch_args for arg in allowed)
    with pytest.raises(PlanError, match="B: signals the batch shell"):
        plan_job(job, SlurmSettings(signal="B:USR1@60"), "/j", ["ctl"])
    with pytest.raises(PlanError, match="expected SIG"):
        plan_job(job, SlurmSettings(signal="USR1 @60"), "/j", ["ctl"])
    assert "--signal=USR1@60" in plan_job(job, SlurmSettings(signal="USR1@60"), "/j", ["ctl"]).sbatch_args


def test_single_component_sizes_every_pod_for_the_largest() -> None:
    job = load(
        [
            task("master", 1, container(limits={"cpu": "1", "memory": "1Gi"})),
            task("worker", 2, container(limits={"cpu": "2"})),
        ]
    )
    plan = plan_job(job, SlurmSettings(single_component=True), "/j", ["ctl"])
    assert [(c.tasks, c.ntasks, c.resources) for c in plan.components] == [
        (["master", "worker"], 3, Resources(cpus=2, memory_mib=1024))
    ]


def test_pyxis_images_are_opt_in() -> None:
    job = pytorch_job()
    assert plan_job(job, SlurmSettings(), "/j", ["ctl"]).components[0].resources.image is None
    plan = plan_job(job, SlurmSettings(container_images=True), "/j", ["ctl"])
    assert plan.components[0].resources.image == "python:3.11"


def test_the_batch_script_and_command_line_never_give_a_user_value_to_a_shell(tmp_path: Path) -> None:
    job_dir = tmp_path / EVIL
    job_dir.mkdir()
    settings = SlurmSettings(partition=EVIL, sbatch_args=(EVIL,))
    program = "import os, sys; print(repr((os.environ['TORCHJOB_JOB_DIR'], sys.argv[1:])))"
    plan = plan_job(pytorch_job(), settings, str(job_dir), [sys.executable, "-c", program, EVIL])
    script = job_dir / "batch.sh"
    script.write_text(plan.script)
    env = {**os.environ, "SLURM_JOB_ID": "7"}
    output = job_dir / "slurm-7.out"  # the script's output, once it found its job directory
    for shell in ("sh", "bash", "dash"):
        output.unlink(missing_ok=True)
        done = subprocess.run(
            [shell, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=30
        )
        assert done.returncode == 0, done.stderr
        assert output.read_text() == repr((str(job_dir), [EVIL])) + "\n"
    assert not (tmp_path / "MARK").exists()
    # A host that does not see the job directory (no batch.sh in it): the script says so by its code.
    moved = tmp_path / "elsewhere.sh"
    script.rename(moved)
    done = subprocess.run(["sh", str(moved)], cwd=tmp_path, env=env, capture_output=True, timeout=30)
    assert done.returncode == NOT_SHARED == 66
    assert "#SBATCH" not in plan.script
    # what --dry-run prints splits back into exactly the arguments sbatch gets
    assert shlex.split(plan.command_line("/j/batch.sh")) == ["sbatch", *plan.sbatch_args, "/j/batch.sh"]
    assert f"--partition={EVIL}" in plan.sbatch_args and EVIL in plan.sbatch_args


def test_a_pods_command_reaches_its_step_as_arguments_not_shell_text() -> None:
    job = load(
        [
            task(
                "worker",
                1,
                container(
                    command=["python", "-c", "print(1)", EVIL, "$(X)"], env=[{"name": "X", "value": EVIL}]
                ),
            )
        ]
    )
    plan = plan_job(job, SlurmSettings(), "/j", ["ctl"])
    (launch,) = launches(plan, place(plan, {0: [("n1", 1)]}))
    assert launch.argv == ["python", "-c", "print(1)", EVIL, EVIL]  # $(X) expanded as a kubelet does
    assert launch.env["X"] == EVIL


def test_tasks_per_node_reads_slurms_compressed_counts() -> None:
    assert tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    assert tasks_per_node("4") == [4]
    with pytest.raises(ValueError):
        tasks_per_node("2(x)")


def test_pods_get_their_nodes_and_two_pods_on_one_node_never_share_a_port() -> None:
    job = load(
        [
            task("master", 1, container(ports=[{"containerPort": 8080}])),
            task("worker", 3, container()),
        ],
        PYTORCH,
    )
    plan = plan_job(job, SlurmSettings(), "/j", ["ctl"])
    assert plan.master == ("master", 0)
    assert plan.ports == [8080, 29500]
    # Slurm put two tasks on n1 and two on n2: master and worker-0 share n1
    placements = place(plan, {0: [("n1", 2), ("n2", 2)]})
    assert [(k, p.host, p.slot) for k, p in placements.items()] == [
        (("master", 0), "n1", 0),
        (("worker", 0), "n1", 1),
        (("worker", 1), "n2", 0),
        (("worker", 2), "n2", 1),
    ]
    runs = {launch.pod: launch for launch in launches(plan, placements)}
    master, worker0 = runs["train-master-0"].env, runs["train-worker-0"].env
    assert master["TORCHJOB_PORT_29500"] == "29500"
    assert worker0["TORCHJOB_PORT_29500"] == str(29500 + 21421)  # one stride: 29500 - 8080 + 1
    assert master["TORCHJOB_PORT_8080"] != worker0["TORCHJOB_PORT_8080"]
    ports_by_host: dict[str, set[str]] = {}
    for run in runs.values():
        mine = {
            v for k, v in run.env.items() if k.startswith("TORCHJOB_PORT_") and k != "TORCHJOB_PORT_OFFSET"
        }
        assert not (ports_by_host.setdefault(run.placement.host, set()) & mine)
        ports_by_host[run.placement.host] |= mine


def test_the_env_is_volcanos_with_the_masters_node_as_master_addr() -> None:
    plan = plan_job(pytorch_job(workers=2), SlurmSettings(), "/j", ["ctl"])
    # the master is not first on its node in Slurm's order: it still gets slot 0 and the port as declared
    placements = place(plan, {0: [("n1", 1), ("n2", 2)]})
    runs = {launch.pod: launch.env for launch in launches(plan, placements)}
    for pod, rank, index in (
        ("train-master-0", "0", "0"),
        ("train-worker-0", "1", "0"),
        ("train-worker-1", "2", "1"),
    ):
        env = runs[pod]
        assert env["MASTER_ADDR"] == "n1"
        assert env["MASTER_PORT"] == "29500"
        assert env["WORLD_SIZE"] == "3"
        assert env["RANK"] == rank
        assert env["VK_TASK_INDEX"] == env["VC_TASK_INDEX"] == index
        assert env["VC_MASTER_HOSTS"] == "n1" and env["VC_MASTER_NUM"] == "1"
        assert env["VC_WORKER_HOSTS"] == "n2,n2" and env["VC_WORKER_NUM"] == "2"
        assert env["TORCHJOB_POD_NAME"] == pod


def test_the_master_gets_slot_zero_even_when_slurm_lists_another_pod_first() -> None:
    job = load([task("worker", 2, container()), task("master", 1, container())], PYTORCH)
    plan = plan_job(job, SlurmSettings(), "/j", ["ctl"])
    placements = place(plan, {0: [("n1", 3)]})
    assert placements[("master", 0)].slot == 0
    assert sorted(p.slot for p in placements.values()) == [0, 1, 2]
    env = next(launch.env for launch in launches(plan, placements) if launch.pod == "train-worker-0")
    assert env["MASTER_PORT"] == "29500"


def test_unsupported_env_sources_are_named() -> None:
    job = load(
        [
            task(
                "worker",
                1,
                container(env=[{"name": "S", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]),
            )
        ]
    )
    plan = plan_job(job, SlurmSettings(), "/j", ["ctl"])
    with pytest.raises(PlanError) as caught:
        launches(plan, place(plan, {0: [("n1", 1)]}))
    assert caught.value.path == "train-worker-0.containers[0].env[0]"
    assert "secretKeyRef" in caught.value.message


def test_the_layout_comes_from_slurms_variables() -> None:
    expand = {"n[1-2]": ["n1", "n2"], "g1": ["g1"]}.__getitem__
    plain = {"SLURM_JOB_NODELIST": "n[1-2]", "SLURM_TASKS_PER_NODE": "2(x2)"}
    assert layout_from_env(plain, expand) == {0: [("n1", 2), ("n2", 2)]}
    het = {
        "SLURM_HET_SIZE": "2",
        "SLURM_JOB_NODELIST_HET_GROUP_0": "g1",
        "SLURM_TASKS_PER_NODE_HET_GROUP_0": "1",
        "SLURM_JOB_NODELIST_HET_GROUP_1": "n[1-2]",
        "SLURM_TASKS_PER_NODE_HET_GROUP_1": "3,1",
    }
    assert layout_from_env(het, expand) == {0: [("g1", 1)], 1: [("n1", 3), ("n2", 1)]}


def test_the_job_root_defaults_under_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    assert job_root(SlurmSettings()) == tmp_path / ".torchjob" / "slurm"
    assert job_root(SlurmSettings(job_root="/shared/jobs")) == Path("/shared/jobs")


def test_a_node_list_without_ranges_needs_no_slurm_client(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from torchjob.engines.slurm.steps import hostnames

    monkeypatch.setenv("PATH", str(tmp_path))  # no scontrol: a plain list is split without it
    assert hostnames("vm") == ["vm"]
    assert hostnames("n1,gpu-2") == ["n1", "gpu-2"]


# The controller's job as the engine writes it, read in a fresh interpreter: the job must come back
# the same, and PyYAML (about 15 ms of imports on the way to the first pod) must stay unloaded.
LOAD_JOB_PROBE = """
import json, sys
from pathlib import Path
from torchjob.engines.slurm.batch import load_job
from torchjob.spec.manifest import job_manifest
job = load_job(Path(sys.argv[1]))
loaded = sorted(name for name in sys.modules if name.split(".")[0] == "yaml")
print(json.dumps({"manifest": job_manifest(job), "yaml": loaded}))
"""


def test_the_controller_reads_its_job_without_pyyaml(tmp_path: Path) -> None:
    from torchjob.render import dump
    from torchjob.spec.manifest import job_manifest

    job = load(
        [
            task("master", 1, container(env=[{"name": "NOTE", "value": 'caf\u00e9 \U0001f600 "q" 1e3'}])),
            task("worker", 2, container(limits={"cpu": "2"})),
        ],
        PYTORCH,
    )
    path = tmp_path / "job.json"
    path.write_text(dump(job_manifest(job), "json"), encoding="utf-8")  # as SlurmEngine.start does
    done = subprocess.run(
        [sys.executable, "-c", LOAD_JOB_PROBE, str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    found = json.loads(done.stdout)
    assert found["yaml"] == []
    assert found["manifest"] == job_manifest(job)


def test_a_damaged_job_json_is_refused_with_its_path(tmp_path: Path) -> None:
    from torchjob.engines.slurm.batch import load_job
    from torchjob.errors import SpecError

    path = tmp_path / "job.json"
    path.write_text('{"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "spec": {"tasks": 3}}')
    with pytest.raises(SpecError) as err:
        load_job(path)
    assert "spec.tasks" in str(err.value) and str(path) in str(err.value)


def test_the_controller_expands_the_job_once_per_attempt(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The controller asks for the desired pods on every pass; the expansion is built once and
    restamped for a restart, with the pods an expansion of that version would have."""
    from torchjob.engines.slurm.batch import BatchController
    from torchjob.expand import expand

    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "n1")
    monkeypatch.setenv("SLURM_TASKS_PER_NODE", "3")
    job = pytorch_job(workers=2)
    plan = plan_job(job, SlurmSettings(), str(tmp_path), ["true"])
    controller = BatchController(tmp_path, job, plan, {"id": "train-abc"})
    assert controller.controller.expansion == controller.expansion  # the controller's own source
    first = controller.expansion(0, 0)
    assert controller.expansion(0, 0) is first
    assert [p.manifest for p in first.pods] == [p.manifest for p in expand(job, controller.addressing).pods]
    restarted = controller.expansion(1, 1)
    assert restarted is not first and controller.expansion(1, 1) is restarted
    wanted = expand(job, controller.addressing, version=1, retry_count=1)
    assert [p.manifest for p in restarted.pods] == [p.manifest for p in wanted.pods]
    assert [p.manifest for p in restarted.pods] != [p.manifest for p in first.pods]
    assert controller.expansion(0, 0) is first  # the first is kept, to restamp again


def test_a_requeued_job_counts_the_requeue_against_max_retry(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Slurm runs the batch script again (SLURM_RESTART_COUNT=1): the controller goes on from the
    run before (test_slurm_nodes runs a real requeue); with maxRetry 1 used up by it, the job
    fails at once, starting no pod."""
    from torchjob.engines.slurm.batch import BatchController

    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "n1")
    monkeypatch.setenv("SLURM_TASKS_PER_NODE", "3")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    job = pytorch_job(workers=2)
    job.spec.max_retry = 1
    previous = {"engine": "slurm", "id": "train-abc", "name": "train", "phase": "Terminated", "retryCount": 0}
    (tmp_path / "status.json").write_text(json.dumps(previous))
    (tmp_path / "logs" / "train-master-0" / "0").mkdir(parents=True)
    plan = plan_job(job, SlurmSettings(requeue=True), str(tmp_path), ["true"])
    assert "--requeue" in plan.sbatch_args and "--no-requeue" not in plan.sbatch_args
    controller = BatchController(tmp_path, job, plan, {"id": "train-abc"})
    assert controller.run() == 1
    status = json.loads((tmp_path / "status.json").read_text())
    assert (status["phase"], status["retryCount"]) == ("Failed", 1)
    assert status["reason"] == "Slurm requeued the allocation (restart 1); maxRetry 1 used up"
    assert all(p["phase"] == "Pending" for p in status["pods"])  # none started
    assert controller.runtime.attempts == {"train-master-0": 0}  # a next attempt would be 1


def test_slurm_clients_are_found_as_shutil_which_finds_them(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """steps looks up srun without importing shutil; what it finds must be what shutil.which finds."""
    import shutil

    from torchjob.engines.slurm import clients, steps

    bin_dir, other = tmp_path / "bin", tmp_path / "other"
    for folder in (bin_dir, other):
        folder.mkdir()
    for path, mode in ((bin_dir / "srun", 0o755), (bin_dir / "plain", 0o644), (other / "srun", 0o755)):
        path.write_text("#!/bin/sh\n")
        path.chmod(mode)
    (bin_dir / "adir").mkdir()
    monkeypatch.chdir(bin_dir)
    paths = [f"{other}:{bin_dir}", f"{bin_dir}:{other}", f":{other}", "", str(tmp_path / "none")]
    for path in paths:
        monkeypatch.setenv("PATH", path)
        for name in ("srun", "plain", "adir", "missing", str(bin_dir / "srun"), str(bin_dir / "plain")):
            found = shutil.which(name)
            if found is None:
                with pytest.raises(steps.SlurmError, match="not on PATH"):
                    clients.client(name)
            else:
                assert clients.client(name) == found, (path, name)


def test_torchruns_ranks_start_through_the_rank_guard_unless_the_pod_names_its_own(tmp_path: Path) -> None:
    from torchjob.engines.slurm.runtime import step_env, write_rank_guard, write_runner

    job_dir = tmp_path / EVIL.replace("\n", " ").replace("/", "")  # quoted in the guard, never run
    job_dir.mkdir(mode=0o700)
    runner = write_runner(job_dir)  # the runner a step reads: the job directory's copy
    assert sorted(os.listdir(job_dir / "bin")) == ["agentbarrier.py", "mainguard.py", "warmstart.py"]
    guard = write_rank_guard(job_dir, runner)
    assert guard == str(job_dir / "bin" / "torchjob-rank") and runner == str(job_dir / "bin" / "warmstart.py")
    assert (os.stat(job_dir / "bin").st_mode & 0o777, os.stat(guard).st_mode & 0o777) == (0o700, 0o700)
    assert os.stat(runner).st_mode & 0o777 == 0o600
    # What torchrun runs: $PYTHON_EXEC [-u] SCRIPT ARGS; the rank writes whole lines, unbuffered or not.
    code = "import sys; print(sys.argv[1:], sys.stdout.line_buffering, sys.stdout.write_through)"
    (tmp_path / "rank.py").write_text(code)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    done = subprocess.run(
        [guard, "-u", str(tmp_path / "rank.py"), "a b"], env=env, capture_output=True, text=True, timeout=30
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, "['a b'] True False\n", "")
    assert not (tmp_path / "MARK").exists() and not Path("MARK").exists()

    own = [{"name": "PYTHON_EXEC", "value": "/opt/py/bin/python"}]
    job = load([task("master", 1, container(env=own)), task("worker", 1, container())], PYTORCH)
    plan = plan_job(job, SlurmSettings(), str(job_dir), ["ctl"])
    runs = {x.pod: x for x in launches(plan, place(plan, {0: [("n1", 2)]}))}
    base = {"PATH": "/usr/bin", "PYTHON_EXEC": "/from/the/login/shell"}
    assert step_env(base, runs["train-worker-0"], {}, guard)["PYTHON_EXEC"] == guard
    assert step_env(base, runs["train-master-0"], {}, guard)["PYTHON_EXEC"] == "/opt/py/bin/python"
    assert step_env(base, runs["train-worker-0"], {"PYTHON_EXEC": "/e"}, guard)["PYTHON_EXEC"] == "/e"
    assert step_env(base, runs["train-worker-0"], {}, None)["PYTHON_EXEC"] == "/from/the/login/shell"


def test_a_python_main_container_starts_through_the_jobs_runner_by_the_local_engines_rule() -> None:
    from torchjob.engines.slurm.runtime import through_runner
    from torchjob.pyrunner.pyrun import BOOT

    py, runner = sys.executable, "/jobs/train-1a2b3c/bin/warmstart.py"
    for argv, options, tail in (
        ([py, "-u", "t.py", "a b"], ["-u"], ["t.py", "a b"]),
        ([py, "-X", "dev", "-m", "pkg.mod", "-x"], ["-X", "dev"], ["-m", "pkg.mod", "-x"]),
        ([py, "-c", "print(1)", "b"], [], ["-c", "print(1)", "b"]),
    ):
        env = {"TORCHJOB_FINISHED": "/the/pods/own"}  # the engine's marker wins over a pod's
        assert through_runner(argv, env, runner, "/m") == [
            py,
            *options,
            "-c",
            BOOT,
            runner,
            "-",
            "0",
            "",
            ".",
            *tail,
        ]
        assert env["TORCHJOB_FINISHED"] == "/m"
    # Not a form the runner starts as python would, not this interpreter, no runner (an image): as
    # it is, without any marker.
    for argv, env, where in (
        ([py, "-i", "t.py"], {}, runner),
        ([py, "-m"], {}, runner),
        ([py], {}, runner),
        (["/opt/other/bin/python3", "t.py"], {}, runner),
        ([py, "t.py"], {"PYTHONINSPECT": "1"}, runner),
        ([py, "t.py"], {}, None),
        (["sh", "-c", "python t.py"], {}, runner),
    ):
        env["TORCHJOB_FINISHED"] = "/the/pods/own"
        assert through_runner(list(argv), env, where, "/m") == argv and "TORCHJOB_FINISHED" not in env


def test_dry_run_says_the_masters_port_is_the_declared_one_and_may_change() -> None:
    from torchjob.engines.slurm.dryrun import port_lines

    job = pytorch_job()
    plan = plan_job(job, SlurmSettings(), "/jobs/train-1", ["ctl"])
    assert port_lines(job, plan) == [
        "# the master's port 29500 (MASTER_PORT) as declared: claimed on the master's node",
        "# when the job runs, another free port there if 29500 is taken (status shows the one it got)",
    ]
    alone = load([task("main", 2, container())])  # no plugin gives a port: nothing to claim
    assert port_lines(alone, plan_job(alone, SlurmSettings(), "/jobs/main-1", ["ctl"])) == []


def test_a_bare_python_in_a_pyxis_image_stays_the_images_own() -> None:
    """Locally and on the cluster's file system a bare ``python`` is torchjob's interpreter; inside
    an image (--container-images) that path does not exist: the image's python is meant."""
    from torchjob.engines.slurm.runtime import step_argv, step_env

    assert step_argv(["python", "t.py"], None) == [sys.executable, "t.py"]
    assert step_argv(["python3", "-u", "t.py"], None) == [sys.executable, "-u", "t.py"]
    assert step_argv(["python", "t.py"], "python:3.11") == ["python", "t.py"]
    assert step_argv(["/opt/py/bin/python", "t.py"], None) == ["/opt/py/bin/python", "t.py"]
    job = load([task("master", 1, container())], PYTORCH)
    plan = plan_job(job, SlurmSettings(container_images=True), "/j", ["ctl"])
    run = next(iter(launches(plan, place(plan, {0: [("n1", 1)]}))))
    base = {"PATH": "/usr/bin"}
    assert step_env(base, run, {}, None, "python:3.11")["PATH"] == "/usr/bin"
    here = step_env(base, run, {}, None)["PATH"].split(os.pathsep)
    assert here == [os.path.dirname(sys.executable), "/usr/bin"]
