"""What each target makes of a job: ranks and addresses, Flyte's PyTorchJob mapping, refusals, warnings.

The schema of every object is checked in test_targets_schema.py; here the meaning.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from support import Ran
from torchjob import (
    CleanPodPolicy,
    Elastic,
    Master,
    PyTorch,
    Resources,
    RestartPolicy,
    RunPolicy,
    Worker,
    task,
)
from torchjob.errors import SpecError
from torchjob.jobs import load_jobs, load_jobs_from_text
from torchjob.spec.model import Job
from torchjob.targets import JOB_LABEL, render_target

pytestmark = pytest.mark.timeout(120)

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"


def fn() -> int:
    return 1


def example(name: str) -> Job:
    return load_jobs(str(EXAMPLES / name))[0].job


def sdk(config: Any) -> Job:
    return task(task_config=config)(fn).to_job()


def main_object(job: Job, target: str, **kw: Any) -> dict[str, Any]:
    rendered = render_target(job, target, **kw)
    (obj,) = [o for o in rendered.objects if o["kind"] == rendered.kind]
    return obj


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def yaml_job(tasks: str, plugins: str = "pytorch: []", extra: str = "") -> Job:
    text = f"apiVersion: batch.volcano.sh/v1alpha1\nkind: Job\nmetadata: {{name: j}}\nspec:\n{extra}"
    text += f"  plugins: {{{plugins}}}\n  tasks:\n" + textwrap.indent(textwrap.dedent(tasks), "    ")
    return load_jobs_from_text(text)[0].job


def one_task(
    name: str, replicas: int, container: str = "{name: c, image: img, command: [python, t.py]}"
) -> str:
    return f"- name: {name}\n  replicas: {replicas}\n  template: {{spec: {{containers: [{container}]}}}}\n"


# ---------------------------------------------------------------------------------------------- jobset


def test_jobset_ranks_and_master_address_follow_jobset_names() -> None:
    js = main_object(example("pytorch-job.yaml"), "jobset")
    spec = js["spec"]
    assert [(r["name"], r["replicas"]) for r in spec["replicatedJobs"]] == [("master", 1), ("worker", 2)]
    assert spec["network"] == {
        "enableDNSHostnames": True,
        "subdomain": "pytorch-job",
        "publishNotReadyAddresses": True,
    }
    assert spec["startupPolicy"] == {"startupPolicyOrder": "InOrder"}
    # TaskCompleted -> CompleteJob on the master: the set ends with the master.
    assert spec["successPolicy"] == {"operator": "All", "targetReplicatedJobs": ["master"]}
    for rjob in spec["replicatedJobs"]:
        job_spec = rjob["template"]["spec"]
        assert (job_spec["completionMode"], job_spec["completions"], job_spec["parallelism"]) == (
            "Indexed",
            1,
            1,
        )
        env = env_of(job_spec["template"]["spec"]["containers"][0])
        # Pod i of a task is <jobset>-<task>-<i>-0, reached through the subdomain.
        assert env["MASTER_ADDR"] == "pytorch-job-master-0-0.pytorch-job"
        assert env["MASTER_PORT"] == "23456" and env["WORLD_SIZE"] == "3"
        if rjob["name"] == "master":
            assert env["RANK"] == "0"
        else:  # worker j is the JobSet's global job index j + 1, the master being index 0
            path = env["RANK"]["fieldRef"]["fieldPath"]
            assert path == "metadata.annotations['jobset.sigs.k8s.io/job-global-index']"


def test_jobset_success_and_failure_policies_follow_the_volcano_policies() -> None:
    ddp = main_object(example("ddp-train.yaml"), "jobset")["spec"]
    assert ddp["successPolicy"] == {"operator": "All"}  # no policy: every pod must succeed
    assert ddp["failurePolicy"] == {"maxRestarts": 0}
    restart = main_object(example("restart-on-failure.yaml"), "jobset")["spec"]
    # PodFailed -> RestartJob with maxRetry 3: Volcano restarts twice, so may the JobSet.
    assert restart["failurePolicy"] == {"maxRestarts": 2}
    for rjob in restart["replicatedJobs"]:
        assert rjob["template"]["spec"]["backoffLimit"] == 0  # restartPolicy Never: the JobSet restarts
    sdk_spec = main_object(
        sdk(PyTorch(worker=Worker(replicas=1), run_policy=RunPolicy(backoff_limit=4))), "jobset"
    )
    assert sdk_spec["spec"]["failurePolicy"] == {"maxRestarts": 4}


def test_jobset_expresses_any_tasks_and_refuses_an_elastic_range() -> None:
    job = yaml_job(one_task("master", 1) + one_task("worker", 2) + one_task("eval", 2))
    names = [r["name"] for r in main_object(job, "jobset")["spec"]["replicatedJobs"]]
    assert names == ["master", "worker", "eval"]
    with pytest.raises(
        SpecError, match=r"elastic range of 1:4 nodes cannot be expressed by target 'jobset'.*kubeflow"
    ):
        render_target(sdk(Elastic(nnodes="1:4")), "jobset")


def test_jobset_refuses_pod_names_jobset_would_refuse() -> None:
    long = "t" * 55  # Volcano names fit 63 characters, JobSet's do not
    job = yaml_job(one_task("master", 1) + one_task(long, 2), plugins=f"pytorch: [--worker={long}]")
    with pytest.raises(SpecError, match=r"spec.tasks\[1\].name.*more than 63"):
        render_target(job, "jobset")


# -------------------------------------------------------------------------------------------- kubeflow


def test_kubeflow_maps_a_pytorch_task_as_flytes_backend_does() -> None:
    spec = main_object(sdk(PyTorch(worker=Worker(replicas=2))), "kubeflow")["spec"]
    replicas = spec["pytorchReplicaSpecs"]
    assert list(replicas) == ["Master", "Worker"]
    assert (replicas["Master"]["replicas"], replicas["Worker"]["replicas"]) == (1, 2)
    # An unset restart policy is Never in Flyte's backend, not the operator's OnFailure.
    assert replicas["Master"]["restartPolicy"] == replicas["Worker"]["restartPolicy"] == "Never"
    for replica in replicas.values():
        (container,) = replica["template"]["spec"]["containers"]
        assert container["name"] == "pytorch"
        assert {"name": "pytorchjob-port", "containerPort": 23456} in container["ports"]
        assert "restartPolicy" not in replica["template"]["spec"]
    assert spec["runPolicy"] == {}
    assert "elasticPolicy" not in spec


def test_kubeflow_images_restart_policies_and_run_policy() -> None:
    config = PyTorch(
        master=Master(image="img:m", restart_policy=RestartPolicy.ALWAYS),
        worker=Worker(replicas=3, image="img:w", restart_policy=RestartPolicy.FAILURE),
        run_policy=RunPolicy(
            clean_pod_policy=CleanPodPolicy.ALL,
            ttl_seconds_after_finished=60,
            active_deadline_seconds=3600,
            backoff_limit=2,
        ),
    )
    spec = main_object(sdk(config), "kubeflow")["spec"]
    master, worker = spec["pytorchReplicaSpecs"]["Master"], spec["pytorchReplicaSpecs"]["Worker"]
    assert (master["restartPolicy"], worker["restartPolicy"]) == ("Always", "OnFailure")
    assert master["template"]["spec"]["containers"][0]["image"] == "img:m"
    assert (worker["replicas"], worker["template"]["spec"]["containers"][0]["image"]) == (3, "img:w")
    assert spec["runPolicy"] == {
        "cleanPodPolicy": "All",
        "backoffLimit": 2,
        "activeDeadlineSeconds": 3600,
        "ttlSecondsAfterFinished": 60,
    }
    # Flyte: a run policy always carries cleanPodPolicy; zero values stay unset.
    none = main_object(sdk(PyTorch(worker=Worker(replicas=1), run_policy=RunPolicy())), "kubeflow")
    assert none["spec"]["runPolicy"] == {"cleanPodPolicy": "None"}


def test_kubeflow_master_only_and_elastic_jobs() -> None:
    master_only = main_object(sdk(PyTorch(worker=Worker(replicas=0))), "kubeflow")["spec"]
    assert list(master_only["pytorchReplicaSpecs"]) == ["Master"]
    elastic = main_object(sdk(Elastic(nnodes="1:4", nproc_per_node=8, max_restarts=2)), "kubeflow")["spec"]
    # Flyte deletes the Master of an elastic job: max_nodes workers rendezvous on c10d.
    assert list(elastic["pytorchReplicaSpecs"]) == ["Worker"]
    assert elastic["pytorchReplicaSpecs"]["Worker"]["replicas"] == 4
    assert elastic["elasticPolicy"] == {
        "minReplicas": 1,
        "maxReplicas": 4,
        "rdzvBackend": "c10d",
        "nProcPerNode": 8,
        "maxRestarts": 2,
    }
    assert "nprocPerNode" not in elastic


def test_kubeflow_yaml_jobs_keep_volcano_meaning() -> None:
    rendered = render_target(example("restart-on-failure.yaml"), "kubeflow")
    spec = rendered.objects[-1]["spec"]
    # maxRetry 3: the operator fails the job when the summed container restarts reach 3, i.e. on the
    # third failure, as Volcano does (two restarts).
    assert spec["runPolicy"] == {"cleanPodPolicy": "Running", "backoffLimit": 3}
    assert spec["pytorchReplicaSpecs"]["Worker"]["restartPolicy"] == "OnFailure"
    assert ("spec.tasks[1].template.spec.restartPolicy", rendered.warnings[1][1]) in rendered.warnings
    assert "Never becomes OnFailure" in rendered.warnings[1][1]


def test_kubeflow_refuses_jobs_it_cannot_express() -> None:
    three = yaml_job(one_task("master", 1) + one_task("worker", 2) + one_task("eval", 1))
    with pytest.raises(
        SpecError, match=r"spec.tasks\[2\].*task 'eval'.*'kubeflow'.*use --target pods or volcano or jobset"
    ):
        render_target(three, "kubeflow")
    plain = yaml_job(one_task("a", 2), plugins="env: []")
    with pytest.raises(SpecError, match=r"spec.plugins: a job without the pytorch plugin"):
        render_target(plain, "kubeflow")


def test_kubeflow_keeps_one_process_per_pod() -> None:
    # Unset, the operator defaults nprocPerNode to "auto": torchrun would start one process per GPU/CPU.
    for job in (example("pytorch-job.yaml"), sdk(PyTorch(worker=Worker(replicas=2)))):
        assert main_object(job, "kubeflow")["spec"]["nprocPerNode"] == "1"
    # An elastic task asks for its own count, in the field Flyte sets (the webhook refuses both).
    elastic = main_object(sdk(Elastic(nnodes=2, nproc_per_node=3)), "kubeflow")["spec"]
    assert elastic["elasticPolicy"]["nProcPerNode"] == 3
    assert "nprocPerNode" not in elastic


def test_kubeflow_yaml_jobs_clean_up_running_pods_as_volcano_does() -> None:
    # Volcano deletes the pods still running when the job ends and keeps finished ones: "Running".
    for name in ("pytorch-job.yaml", "ddp-train.yaml", "restart-on-failure.yaml"):
        assert main_object(example(name), "kubeflow")["spec"]["runPolicy"]["cleanPodPolicy"] == "Running"
    # SDK tasks keep Flyte's mapping: no run policy, no cleanPodPolicy (the operator's None).
    assert main_object(sdk(PyTorch(worker=Worker(replicas=1))), "kubeflow")["spec"]["runPolicy"] == {}


def _named(name: str, tasks: str) -> Job:
    text = f"apiVersion: batch.volcano.sh/v1alpha1\nkind: Job\nmetadata: {{name: {name}}}\nspec:\n"
    text += "  plugins: {pytorch: [--master=m, --worker=w]}\n  tasks:\n"
    return load_jobs_from_text(text + textwrap.indent(tasks, "    "))[0].job


@pytest.mark.parametrize(
    ("target", "fits", "generated"),
    [
        ("kubeflow", 54, "-master-0"),  # the operator's pods and Services <job>-master-0, <job>-worker-<i>
        ("jobset", 51, "-m-0-0-abcde"),  # JobSet's pod <job>-<rjob>-<i>-<pod>-<suffix>
        ("trainjob", 48, "-node-0-2-abcde"),  # the runtime's pod <job>-node-0-<i>-<suffix>
    ],
)
def test_every_target_refuses_names_its_controller_could_not_create(
    target: str, fits: int, generated: str
) -> None:
    tasks = one_task("m", 1) + one_task("w", 2)
    too_long = _named("k" * (fits + 1), tasks)
    render_target(too_long, "volcano")  # Volcano's own <job>-w-1 fits
    with pytest.raises(SpecError) as caught:
        render_target(too_long, target)
    (problem,) = caught.value.problems
    assert problem.path == "metadata.name"
    assert f"{'k' * (fits + 1)}{generated}" in problem.message
    assert "more than 63" in problem.message
    assert f"the longest job name that fits is {fits} characters" in problem.message
    render_target(_named("k" * fits, tasks), target)


def test_jobset_refuses_a_job_name_its_service_could_not_have() -> None:
    # Without svc, Volcano needs no Service: a name starting with a digit is valid there.
    text = "apiVersion: batch.volcano.sh/v1alpha1\nkind: Job\nmetadata: {name: 1job}\nspec:\n  tasks:\n"
    job = load_jobs_from_text(text + textwrap.indent(one_task("a", 2), "    "))[0].job
    render_target(job, "volcano")
    with pytest.raises(
        SpecError, match=r"metadata.name: --target jobset needs a job name that starts with a letter"
    ):
        render_target(job, "jobset")


def _restarts(job: Job) -> dict[str, Any]:
    """What each target writes for the restart count of one job."""
    out: dict[str, Any] = {"volcano": main_object(job, "volcano")["spec"]["maxRetry"]}
    js = main_object(job, "jobset")["spec"]
    out["jobset"] = js["failurePolicy"]["maxRestarts"]
    out["jobset-child"] = {r["name"]: r["template"]["spec"]["backoffLimit"] for r in js["replicatedJobs"]}
    out["kubeflow"] = main_object(job, "kubeflow")["spec"]["runPolicy"].get("backoffLimit")
    return out


def test_one_restart_rule_for_yaml_and_sdk_jobs() -> None:
    # YAML maxRetry 3 with PodFailed -> RestartJob: two restarts everywhere (Volcano fails on the
    # restart that reaches maxRetry; the operator when summed restarts reach backoffLimit).
    assert _restarts(example("restart-on-failure.yaml")) == {
        "volcano": 3,
        "jobset": 2,
        "jobset-child": {"master": 0, "worker": 0},  # Never: a failed pod fails its Job at once
        "kubeflow": 3,
    }
    # SDK backoff_limit=2 means two restarts (docs/sdk.md): maxRetry 3 for Volcano and the local engine.
    job = sdk(PyTorch(worker=Worker(replicas=1), run_policy=RunPolicy(backoff_limit=2)))
    assert job.spec.max_retry == 3
    assert _restarts(job) == {
        "volcano": 3,
        "jobset": 2,
        "jobset-child": {"master": 0, "worker": 0},
        "kubeflow": 2,  # Flyte's mapping, kept and warned about: its Never pods never restart
    }
    warnings = dict(render_target(job, "kubeflow").warnings)
    assert "no restart here" in warnings["run_policy.backoff_limit"]
    on_failure = sdk(
        PyTorch(
            worker=Worker(replicas=1, restart_policy=RestartPolicy.FAILURE),
            master=Master(restart_policy=RestartPolicy.FAILURE),
            run_policy=RunPolicy(backoff_limit=2),
        )
    )
    (message,) = [
        m for p, m in render_target(on_failure, "kubeflow").warnings if p == "run_policy.backoff_limit"
    ]
    assert "reach backoffLimit 2 (1 restarts)" in message


def test_kubeflow_sets_no_backoff_limit_for_pods_that_restart_in_place() -> None:
    # RestartJob never fires for OnFailure pods under Volcano: they restart in place without limit.
    text = (EXAMPLES / "restart-on-failure.yaml").read_text()
    job = load_jobs_from_text(text.replace("restartPolicy: Never", "restartPolicy: OnFailure"))[0].job
    assert "backoffLimit" not in main_object(job, "kubeflow")["spec"]["runPolicy"]


def test_jobset_restarts_on_failure_pods_in_place_without_limit_as_volcano_does() -> None:
    # Under Volcano an OnFailure pod restarts in place and never fails: no child Job may stop it
    # at batch/v1's default backoffLimit of 6.
    job = example("pytorch-job.yaml")
    assert {t.template.restart_policy for t in job.spec.tasks} == {"OnFailure"}
    assert _restarts(job)["jobset-child"] == {"master": 2**31 - 1, "worker": 2**31 - 1}


def test_trainjob_says_how_its_runtime_restarts_differ_from_the_job() -> None:
    warnings = dict(render_target(example("restart-on-failure.yaml"), "trainjob").warnings)
    message = warnings["spec.maxRetry"]
    assert "6 failures summed over the nodes" in message
    assert "asks for 2 restarts of the whole job after a failed pod (maxRetry 3)" in message
    custom = dict(render_target(example("ddp-train.yaml"), "trainjob", runtime="mine").warnings)
    assert "see runtime 'mine'" in custom["spec.maxRetry"]


def test_job_level_scheduling_is_kept_or_warned_on_every_target() -> None:
    extra = "  priorityClassName: high\n  schedulerName: my-sched\n  minAvailable: 2\n"
    tasks = one_task("master", 1) + one_task("worker", 2).replace(
        "replicas: 2\n", "replicas: 2\n  maxRetry: 5\n"
    )
    plugins = "pytorch: [--wait-master-enabled, --wait-master-timeout=30]"
    job = yaml_job(tasks, plugins=plugins, extra=extra)
    # Volcano copies them into every pod that names none; so do the PyTorchJob and the JobSet.
    kf = render_target(job, "kubeflow")
    spec = kf.objects[-1]["spec"]
    for replica in spec["pytorchReplicaSpecs"].values():
        pod = replica["template"]["spec"]
        assert (pod["priorityClassName"], pod["schedulerName"]) == ("high", "my-sched")
    # The operator's gang scheduling reads minAvailable even without a queue.
    assert spec["runPolicy"]["schedulingPolicy"] == {"minAvailable": 2, "priorityClass": "high"}
    kf_warnings = dict(kf.warnings)
    assert "--wait-master-timeout is dropped" in kf_warnings["spec.plugins.pytorch"]
    assert "maxRetry 5 is dropped" in kf_warnings["spec.tasks[1].maxRetry"]
    js = render_target(job, "jobset")
    for rjob in js.objects[-1]["spec"]["replicatedJobs"]:
        pod = rjob["template"]["spec"]["template"]["spec"]
        assert (pod["priorityClassName"], pod["schedulerName"]) == ("high", "my-sched")
    js_warnings = dict(js.warnings)
    assert "minAvailable 2 of 3" in js_warnings["spec.minAvailable"]
    assert "--wait-master-timeout is dropped" in js_warnings["spec.plugins.pytorch"]
    assert "spec.tasks[1].maxRetry" in js_warnings
    tj_warnings = dict(render_target(job, "trainjob").warnings)
    for path in (
        "spec.priorityClassName",
        "spec.schedulerName",
        "spec.minAvailable",
        "spec.tasks[1].maxRetry",
        "spec.plugins.pytorch",
    ):
        assert path in tj_warnings, path
    # Volcano's own default scheduler is not carried to clusters that have no Volcano.
    plain = main_object(example("pytorch-job.yaml"), "jobset")["spec"]["replicatedJobs"][0]
    assert "schedulerName" not in plain["template"]["spec"]["template"]["spec"]


def test_kubeflow_completes_sdk_resources_as_flyte_does() -> None:
    config = PyTorch(
        master=Master(limits=Resources(cpu="2", mem="4Gi")),  # limits only: Guaranteed under Flyte
        worker=Worker(replicas=1, requests=Resources(cpu="1", gpu=1), limits=Resources(mem="2Gi")),
    )
    replicas = main_object(sdk(config), "kubeflow")["spec"]["pytorchReplicaSpecs"]
    master = replicas["Master"]["template"]["spec"]["containers"][0]["resources"]
    assert master == {"requests": {"cpu": "2", "memory": "4Gi"}, "limits": {"cpu": "2", "memory": "4Gi"}}
    worker = replicas["Worker"]["template"]["spec"]["containers"][0]["resources"]
    assert worker["requests"] == worker["limits"] == {"cpu": "1", "nvidia.com/gpu": "1", "memory": "2Gi"}
    # A YAML job's resources are the user's own: Volcano and the operator take them as written.
    yaml_pod = main_object(example("pytorch-job.yaml"), "kubeflow")["spec"]["pytorchReplicaSpecs"]["Master"]
    volcano_pod = main_object(example("pytorch-job.yaml"), "volcano")["spec"]["tasks"][0]["template"]
    assert yaml_pod["template"]["spec"]["containers"][0].get("resources") == volcano_pod["spec"][
        "containers"
    ][0].get("resources")


def test_pods_target_says_no_controller_restarts_the_job() -> None:
    warnings = dict(render_target(example("restart-on-failure.yaml"), "pods").warnings)
    assert "a failed pod fails the job, where the job asks for 2 restarts" in warnings["spec.maxRetry"]
    assert "spec.maxRetry" not in dict(render_target(example("ddp-train.yaml"), "pods").warnings)


# -------------------------------------------------------------------------------------------- trainjob


def test_trainjob_runs_the_command_through_torchrun() -> None:
    tj = main_object(example("ddp-train.yaml"), "trainjob")
    assert tj["spec"]["runtimeRef"]["name"] == "torch-distributed"
    trainer = tj["spec"]["trainer"]
    assert trainer["command"] == ["torchrun", "--no-python", "python", "examples/programs/ddp_train.py"]
    assert (trainer["numNodes"], trainer["numProcPerNode"]) == (3, 1)
    assert env_of(trainer) == {"DDP_STEPS": "40"}
    patch = tj["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
    assert patch["name"] == "node"
    assert patch["template"]["spec"]["template"]["metadata"]["labels"] == {JOB_LABEL: "ddp-train"}
    other = main_object(example("ddp-train.yaml"), "trainjob", runtime="my-runtime")
    assert other["spec"]["runtimeRef"]["name"] == "my-runtime"


OWN_TORCHRUN = """\
- name: {name}
  replicas: {replicas}
  template:
    spec:
      containers:
        - name: main
          image: img
          command: [torchrun, --nproc-per-node=4, --log-dir=/logs, train.py]
          args: [--lr, "0.1"]
"""


def test_trainjob_runs_a_jobs_own_torchrun_once_with_its_processes_per_node() -> None:
    """A container that runs torchrun itself: the runtime's torchrun starts the program (torchrun
    under torchrun would start a launcher per process), with the processes per node it asked for."""
    tasks = OWN_TORCHRUN.format(name="m", replicas=1) + OWN_TORCHRUN.format(name="w", replicas=2)
    rendered = render_target(_named("own", tasks), "trainjob")
    (tj,) = [o for o in rendered.objects if o["kind"] == "TrainJob"]
    trainer = tj["spec"]["trainer"]
    assert trainer["command"] == ["torchrun", "--no-python", "python", "train.py", "--lr", "0.1"]
    assert "args" not in trainer
    assert (trainer["numNodes"], trainer["numProcPerNode"]) == (3, 4)
    said = dict(rendered.warnings)["spec.tasks[0].template.spec.containers[0].command"]
    assert said == "torchrun's --log-dir=/logs are dropped: a TrainJob runs torchrun itself"


def test_trainjob_sdk_elastic_uses_torchrun_instead_of_its_own_launcher() -> None:
    trainer = main_object(sdk(Elastic(nnodes=2, nproc_per_node=4, max_restarts=3)), "trainjob")["spec"][
        "trainer"
    ]
    assert (trainer["numNodes"], trainer["numProcPerNode"]) == (2, 4)
    assert trainer["command"][:5] == ["torchrun", "--no-python", "python", "-m", "torchjob.sdk.entrypoint"]
    assert "--elastic" not in trainer["command"]
    assert env_of(trainer)["PET_MAX_RESTARTS"] == "3"


def test_trainjob_refusals_name_the_targets_that_can() -> None:
    with pytest.raises(
        SpecError, match=r"elastic range of 1:4 nodes.*'trainjob'.*use --target pods or volcano or kubeflow"
    ):
        render_target(sdk(Elastic(nnodes="1:4")), "trainjob")
    differ = sdk(PyTorch(master=Master(image="a"), worker=Worker(replicas=1, image="b")))
    with pytest.raises(
        SpecError, match=r"spec.tasks\[1\]: a worker task whose pod template differs.*kubeflow or jobset"
    ):
        render_target(differ, "trainjob")
    reserved = yaml_job(
        one_task("master", 1, "{name: c, image: i, command: [x], env: [{name: PET_NNODES, value: '3'}]}")
    )
    with pytest.raises(SpecError, match=r"env\[0\].name: PET_NNODES is set by the TrainJob runtime"):
        render_target(reserved, "trainjob")
    probe = yaml_job(
        one_task("master", 1, "{name: c, image: i, command: [x], livenessProbe: {exec: {command: [x]}}}")
    )
    with pytest.raises(SpecError, match=r"containers\[0\].livenessProbe: container field livenessProbe"):
        render_target(probe, "trainjob")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


PROGRAM = """\
import json, os
import torch
import torch.distributed as dist

dist.init_process_group("gloo")  # env://: MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE
value = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(value)
seen = {k: os.environ.get(k) for k in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")}
print("RESULT " + json.dumps({"env": seen, "sum": value.item(), "world": dist.get_world_size()}), flush=True)
dist.destroy_process_group()
"""


@pytest.mark.torch
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_trainjob_command_gives_a_plain_program_its_rank_from_pet_env(tmp_path: Path) -> None:
    """Two nodes run the rendered command with the PET_* env the runtime sets; real gloo all-reduce."""
    pytest.importorskip("torch", reason="torch is not installed")
    program = tmp_path / "train.py"
    program.write_text(PROGRAM)
    job = yaml_job(
        one_task("master", 1, f"{{name: c, image: i, command: [python, {program}]}}")
        + one_task("worker", 1, f"{{name: c, image: i, command: [python, {program}]}}"),
        plugins="pytorch: [--master=master, --worker=worker]",
    )
    trainer = main_object(job, "trainjob")["spec"]["trainer"]
    assert trainer["numNodes"] == 2
    bindir = str(Path(sys.executable).parent)  # torchrun and python of this environment
    port = _free_port()
    procs = []
    for node in range(trainer["numNodes"]):
        env = {
            **os.environ,
            "PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}",
            "PET_NNODES": str(trainer["numNodes"]),
            "PET_NPROC_PER_NODE": str(trainer["numProcPerNode"]),
            "PET_NODE_RANK": str(node),
            "PET_MASTER_ADDR": "127.0.0.1",
            "PET_MASTER_PORT": str(port),
        }
        for name in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
            env.pop(name, None)
        procs.append(
            subprocess.Popen(
                trainer["command"],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=True,
            )
        )
    results = []
    try:
        for proc in procs:
            out, _ = proc.communicate(timeout=240)
            assert proc.returncode == 0, out
            (line,) = [x for x in out.splitlines() if x.startswith("RESULT ")]
            results.append(json.loads(line[len("RESULT ") :]))
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
                proc.wait(timeout=10)
    assert sorted(r["env"]["RANK"] for r in results) == ["0", "1"]
    assert all(r["env"]["WORLD_SIZE"] == "2" and r["world"] == 2 and r["sum"] == 3.0 for r in results)
    assert all(r["env"]["MASTER_ADDR"] and r["env"]["MASTER_PORT"] for r in results)


# ------------------------------------------------------------------------------------- volcano and pods


def test_volcano_is_the_defaulted_job_and_warns_about_what_it_drops() -> None:
    job = example("pytorch-job.yaml")
    obj = main_object(job, "volcano")
    assert obj["metadata"]["labels"] == {JOB_LABEL: "pytorch-job"}
    spec = obj["spec"]
    assert (spec["queue"], spec["maxRetry"], spec["schedulerName"]) == ("default", 3, "volcano")
    assert "svc" in spec["plugins"]  # Volcano's webhook turns svc on for pytorch
    assert spec["tasks"][0]["policies"] == [{"event": "TaskCompleted", "action": "CompleteJob"}]
    assert spec["tasks"][1]["template"]["metadata"]["labels"] == {JOB_LABEL: "pytorch-job"}
    deadline = sdk(PyTorch(worker=Worker(replicas=1), run_policy=RunPolicy(active_deadline_seconds=60)))
    (warning,) = render_target(deadline, "volcano").warnings
    assert warning[0] == "run_policy.active_deadline_seconds" and "dropped" in warning[1]


def test_pods_target_labels_every_object() -> None:
    rendered = render_target(example("ddp-train.yaml"), "pods")
    assert [o["kind"] for o in rendered.objects].count("Pod") == 3
    assert all(o["metadata"]["labels"][JOB_LABEL] == "ddp-train" for o in rendered.objects)


# ------------------------------------------------------------------------------------------------- CLI


def test_cli_render_target_prints_warnings_with_file_and_line(run_main: Callable[..., Ran]) -> None:
    result = run_main(
        "render", str(EXAMPLES / "restart-on-failure.yaml"), "--target", "kubeflow", "-o", "json"
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["items"][0]["kind"] == "PyTorchJob"
    first = result.stderr.splitlines()[0]
    assert first.startswith(
        f"{EXAMPLES / 'restart-on-failure.yaml'}:40: spec.tasks[0].template.spec.restartPolicy: warning:"
    )


def test_cli_render_target_errors_exit_2_with_one_line_each(
    tmp_path: Path, run_main: Callable[..., Ran]
) -> None:
    job = tmp_path / "job.yaml"
    job.write_text((EXAMPLES / "ddp-train.yaml").read_text().replace("DDP_STEPS", "PET_NNODES"))
    result = run_main("render", str(job), "--target", "trainjob")
    assert result.returncode == 2 and result.stdout == ""
    assert "Traceback" not in result.stderr
    assert f"{job}:" in result.stderr and "PET_NNODES is set by the TrainJob runtime" in result.stderr
    wrong = run_main("render", str(job), "--runtime", "x")
    assert wrong.returncode == 2 and "--runtime applies to --target trainjob only" in wrong.stderr


def test_cli_validate_target_refuses_names_the_controller_could_not_create(
    tmp_path: Path, run_main: Callable[..., Ran]
) -> None:
    # The issue's case: 56 characters with tasks m/w: <job>-w-0 fits, <job>-master-0 does not.
    job = tmp_path / "job.yaml"
    text = "apiVersion: batch.volcano.sh/v1alpha1\nkind: Job\nmetadata: {name: " + "d" * 56 + "}\nspec:\n"
    text += "  plugins: {pytorch: [--master=m, --worker=w]}\n  tasks:\n"
    job.write_text(text + textwrap.indent(one_task("m", 1) + one_task("w", 1), "    "))
    assert run_main("validate", str(job)).returncode == 0  # Volcano's own names fit
    result = run_main("validate", str(job), "--target", "kubeflow")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"{job}:") and "metadata.name: --target kubeflow:" in line
    assert "'" + "d" * 56 + "-master-0' (65 characters, more than 63)" in line
    assert "the longest job name that fits is 54 characters" in line


def test_cli_default_target_output_is_unchanged(run_main: Callable[..., Ran]) -> None:
    path = str(EXAMPLES / "pytorch-job.yaml")
    assert run_main("render", path).stdout == run_main("render", path, "--target", "pods").stdout


def test_volcano_target_reads_back_as_the_same_job() -> None:
    """The rendered Volcano Job is a job torchjob accepts, and it expands to the same pods."""
    from torchjob.expand import Expansion
    from torchjob.render import dump

    for name in ("pytorch-job.yaml", "ddp-train.yaml", "restart-on-failure.yaml"):
        job = example(name)
        text = dump(main_object(job, "volcano"), "yaml")
        again = load_jobs_from_text(text, "rendered.yaml")[0].job
        # Volcano's view (the expansion): the pods target sent to a cluster also drops a
        # defaulted scheduler, which the rendered Job now names.
        before = [*Expansion(job).objects(), *(p.manifest for p in Expansion(job).pods())]
        after = [*Expansion(again).objects(), *(p.manifest for p in Expansion(again).pods())]
        for obj in after:  # the only difference: the label on the Job reaches its pod templates
            obj["metadata"].get("labels", {}).pop(JOB_LABEL, None)
        for obj in before:
            obj["metadata"].get("labels", {}).pop(JOB_LABEL, None)
        assert after == before


def test_jobset_maps_the_env_plugin_and_kubeflow_drops_hostnames() -> None:
    job = yaml_job(
        one_task("master", 1, "{name: c, image: i, command: [x]}")
        + one_task("worker", 2, "{name: c, image: i, command: [x]}"),
        plugins="pytorch: [], env: []",
    )
    rjob = main_object(job, "jobset")["spec"]["replicatedJobs"][1]
    env = env_of(rjob["template"]["spec"]["template"]["spec"]["containers"][0])
    assert (
        env["VC_TASK_INDEX"]["fieldRef"]["fieldPath"]
        == "metadata.annotations['jobset.sigs.k8s.io/job-index']"
    )
    named = yaml_job(one_task("master", 1).replace("{spec: {", "{spec: {hostname: m, subdomain: s, "))
    rendered = render_target(named, "kubeflow")
    assert "hostname" not in rendered.objects[-1]["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
    assert [w[0] for w in rendered.warnings] == [
        "spec.tasks[0].template.spec.hostname",
        "spec.tasks[0].template.spec.subdomain",
    ]


def test_jobset_wires_every_task_as_volcanos_pytorch_and_env_plugins_do() -> None:
    evaluator = "{name: c, image: i, command: [x]}, {name: side, image: i}"
    job = yaml_job(
        one_task("master", 1)
        + one_task("worker", 2)
        + one_task("eval", 1, evaluator).replace(
            "{spec: {", "{spec: {initContainers: [{name: init, image: i}], "
        ),
        plugins="pytorch: [--port=2345], env: []",
    )
    rjobs = {r["name"]: r for r in main_object(job, "jobset")["spec"]["replicatedJobs"]}
    pod = rjobs["eval"]["template"]["spec"]["template"]["spec"]
    for container in pod["containers"]:  # every container of the other task reaches the master, no RANK
        env = env_of(container)
        assert env["MASTER_ADDR"] == "j-master-0-0.j"
        assert env["MASTER_PORT"] == "2345"
        assert env["WORLD_SIZE"] == "3"
        assert "RANK" not in env
        assert {"name": "pytorchjob-port", "containerPort": 2345} in container["ports"]
        assert "VK_TASK_INDEX" in env
    init_env = env_of(pod["initContainers"][0])
    assert set(init_env) == {"VK_TASK_INDEX", "VC_TASK_INDEX"}  # the env plugin reaches init containers
    worker = env_of(rjobs["worker"]["template"]["spec"]["template"]["spec"]["containers"][0])
    assert worker["RANK"] == {
        "fieldRef": {"fieldPath": "metadata.annotations['jobset.sigs.k8s.io/job-global-index']"}
    }


def test_trainjob_refuses_a_name_its_jobset_pods_could_not_have() -> None:
    text = (EXAMPLES / "ddp-train.yaml").read_text().replace("name: ddp-train", "name: " + "d" * 50)
    job = load_jobs_from_text(text, "long.yaml")[0].job
    with pytest.raises(
        SpecError,
        match=r"metadata.name: --target trainjob: the controller would name a pod .*-node-0-2-abcde",
    ):
        render_target(job, "trainjob")
    render_target(job, "kubeflow")  # the name itself is fine elsewhere
