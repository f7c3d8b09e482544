"""Real flytekit tasks through torchjob, without running them: what ``render --target kubeflow``
makes of them compared field by field with flytekit's own serialization (``get_custom``, the
task's image and resources, a workflow node's overrides as ``get_serializable`` gives them), the
conversion's corners, ``validate``, ``pyflyte run``'s arguments, and the version refusal.

flytekit and flytekitplugins-kfpytorch are the real packages from PyPI (``pip install -e
'.[flyte]'``); nothing of theirs is patched. tests/test_flyte_run.py runs tasks for real.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from support import Ran

pytest.importorskip("flytekit", reason="flytekit is not installed (pip install -e '.[flyte]')")
pytest.importorskip("flytekitplugins.kfpytorch", reason="flytekitplugins-kfpytorch is not installed")

from google.protobuf.json_format import MessageToDict

from torchjob.sdk.loader import import_file

pytestmark = pytest.mark.timeout(300)

REPO = Path(__file__).resolve().parent.parent
CONFIGS = "tests/flyte_configs.py"
README = "examples/flyte/kfpytorch_readme.py"
ADAPTIVE = "examples/flyte/adaptive_training.py"
DEFAULT_IMAGE = "pytorch/pytorch:latest"
K8S_NAMES = {
    "CPU": "cpu",
    "MEMORY": "memory",
    "GPU": "nvidia.com/gpu",
    "EPHEMERAL_STORAGE": "ephemeral-storage",
}
RESTART = {"RESTART_POLICY_ON_FAILURE": "OnFailure", "RESTART_POLICY_ALWAYS": "Always"}
CLEAN = {"CLEANPOD_POLICY_ALL": "All", "CLEANPOD_POLICY_RUNNING": "Running"}


@pytest.fixture(autouse=True)
def _in_repo(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)


def settings() -> Any:
    from flytekit.configuration import ImageConfig, SerializationSettings

    return SerializationSettings(image_config=ImageConfig.auto_default_image())


def rendered(run_main: Callable[..., Ran], ref: str, *args: str) -> list[dict[str, Any]]:
    code, out, err = run_main("render", ref, "--target", "kubeflow", "-o", "json", *args)
    assert code == 0, err
    return [item for item in json.loads(out)["items"] if item["kind"] == "PyTorchJob"]


# What Flyte's backend makes of the serialization (flyte_kubeflow.md B.2-B.5), written from the
# serialized dicts alone: resource entries named CPU/MEMORY/GPU, restart and clean-pod enums by name.
def k8s_resources(serialized: dict[str, Any] | None) -> dict[str, dict[str, str]]:
    from torchjob.spec.units import parse_quantity

    serialized = serialized or {}
    requests = {K8S_NAMES[e["name"]]: e["value"] for e in serialized.get("requests", [])}
    limits = {K8S_NAMES[e["name"]]: e["value"] for e in serialized.get("limits", [])}
    for key in {*requests, *limits}:  # the backend's completion: a missing half is the other
        requests.setdefault(key, limits.get(key, ""))
        limits.setdefault(key, requests[key])
        if parse_quantity(requests[key]) > parse_quantity(limits[key]):
            requests[key] = limits[key]
    return {"requests": requests, "limits": limits} if requests else {}


def task_resources(task: Any) -> dict[str, Any]:
    from flytekit.core.resources import convert_resources_to_resource_model

    spec = task.resources
    model = convert_resources_to_resource_model(requests=spec.requests, limits=spec.limits)
    return MessageToDict(model.to_flyte_idl())


def expected_job(task: Any, node_overrides: Any = None) -> dict[str, Any]:
    custom = task.get_custom(settings())
    image = task.get_image(settings()) if task.container_image else DEFAULT_IMAGE
    resources = task_resources(task)
    if node_overrides is not None:
        if node_overrides.container_image:
            image = node_overrides.container_image
        if node_overrides.resources is not None:
            resources = MessageToDict(node_overrides.resources.to_flyte_idl())
    replicas: dict[str, Any] = {}

    def replica(spec: dict[str, Any], count: int) -> dict[str, Any]:
        own = spec.get("resources") or {}
        return {
            "replicas": count,
            "restartPolicy": RESTART.get(spec.get("restartPolicy", ""), "Never"),
            "image": spec.get("image") or image,
            "resources": k8s_resources(own if own.get("requests") or own.get("limits") else resources),
        }

    if "elasticConfig" in custom:
        elastic = custom["elasticConfig"]
        replicas["Worker"] = replica(custom["workerReplicas"], custom["workerReplicas"]["replicas"])
        policy = {
            "minReplicas": elastic.get("minReplicas", 0),
            "maxReplicas": elastic.get("maxReplicas", 0),
            "rdzvBackend": elastic.get("rdzvBackend", ""),
            "nProcPerNode": elastic.get("nprocPerNode", 0),
            "maxRestarts": elastic.get("maxRestarts", 0),
        }
    else:
        replicas["Master"] = replica(custom["masterReplicas"], 1)
        workers = custom["workerReplicas"].get("replicas", 0)
        if workers > 0:
            replicas["Worker"] = replica(custom["workerReplicas"], workers)
        policy = None
    run_policy: dict[str, Any] = {}
    if "runPolicy" in custom:
        given = custom["runPolicy"]
        run_policy["cleanPodPolicy"] = CLEAN.get(given.get("cleanPodPolicy", ""), "None")
        for key in ("backoffLimit", "activeDeadlineSeconds", "ttlSecondsAfterFinished"):
            if given.get(key):
                run_policy[key] = int(given[key])
    return {"replicas": replicas, "elasticPolicy": policy, "runPolicy": run_policy}


def actual_job(job: dict[str, Any]) -> dict[str, Any]:
    replicas = {}
    for kind, spec in job["spec"]["pytorchReplicaSpecs"].items():
        container = spec["template"]["spec"]["containers"][0]
        assert container["name"] == "pytorch"
        replicas[kind] = {
            "replicas": spec["replicas"],
            "restartPolicy": spec["restartPolicy"],
            "image": container["image"],
            "resources": container.get("resources", {}),
        }
    spec = job["spec"]
    return {"replicas": replicas, "elasticPolicy": spec.get("elasticPolicy"), "runPolicy": spec["runPolicy"]}


def crd_valid(obj: dict[str, Any]) -> None:
    from test_targets_schema import validate

    validate(obj)


README_TASKS = ["pytorch_job", "pytorch_job_with_policies", "pytorch_job_v0", "pytorch_job_v1"]
CONFIG_TASKS = [
    "every_field",
    "no_workers",
    "no_workers_v0",
    "empty_run_policy",
    "zero_values",
    "shared_memory_flag",
    "elastic_two_by_two",
    "elastic_range",
    "elastic_one_text",
    "elastic_one_range",
    "elastic_settings",
]


@pytest.mark.parametrize(
    "path, name", [(README, n) for n in README_TASKS] + [(CONFIGS, n) for n in CONFIG_TASKS]
)
def test_render_is_the_pytorchjob_flytes_backend_makes_of_the_serialization(
    run_main: Callable[..., Ran], path: str, name: str
) -> None:
    task = getattr(import_file(path), name)
    [job] = rendered(run_main, f"{path}:{name}")
    assert actual_job(job) == expected_job(task)
    crd_valid(job)
    environment = task.environment or {}
    for spec in job["spec"]["pytorchReplicaSpecs"].values():
        container = spec["template"]["spec"]["containers"][0]
        env = {e["name"]: e["value"] for e in container["env"]}
        assert environment.items() <= env.items()
        mounts = {m["mountPath"] for m in container.get("volumeMounts", [])}
        assert ("/dev/shm" in mounts) == bool(task.task_config.increase_shared_mem or task.shared_memory)


def test_the_readme_examples_are_the_configs_it_describes(run_main: Callable[..., Ran]) -> None:
    jobs = {name: rendered(run_main, f"{README}:{name}")[0]["spec"] for name in README_TASKS}
    assert jobs["pytorch_job"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == 5
    master = jobs["pytorch_job"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
    assert master["image"] == "test_image"
    assert master["resources"] == {
        "requests": {"cpu": "1", "memory": "1Gi"},
        "limits": {"cpu": "1", "memory": "1Gi"},
    }
    policies = jobs["pytorch_job_with_policies"]
    assert policies["pytorchReplicaSpecs"]["Worker"]["restartPolicy"] == "OnFailure"
    assert policies["pytorchReplicaSpecs"]["Master"]["restartPolicy"] == "Never"  # the README's default
    assert policies["runPolicy"] == {"cleanPodPolicy": "All"}
    # v0 (num_workers) and v1 (worker.replicas) describe the same job
    v0, v1 = (jobs[n]["pytorchReplicaSpecs"] for n in ("pytorch_job_v0", "pytorch_job_v1"))
    assert v0["Worker"]["replicas"] == v1["Worker"]["replicas"] == 10
    for spec in (*v0.values(), *v1.values()):  # the task's name differs, nothing else
        spec["template"]["spec"]["containers"][0]["command"][4] = "TASK"
    assert json.dumps(v0, sort_keys=True).replace("pytorch-job-v0", "J") == json.dumps(
        v1, sort_keys=True
    ).replace("pytorch-job-v1", "J")


def test_elastic_pods_run_the_launch_flytekit_would_with_its_runtime_settings(
    run_main: Callable[..., Ran],
) -> None:
    """What flytekit keeps out of the serialization but uses at run time (rdzv_configs,
    start_method, monitor_interval) reaches each pod's elastic agent."""
    [job] = rendered(run_main, f"{CONFIGS}:elastic_range")
    command = job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["command"]
    flags = dict(itertools.pairwise(command))  # each flag and its value
    assert flags["--nnodes"] == "1:4" and flags["--nproc-per-node"] == "8" and flags["--max-restarts"] == "3"
    assert json.loads(flags["--rdzv-configs"]) == {"timeout": 1200, "join_timeout": 900, "read_timeout": 900}
    assert flags["--monitor-interval"] == "0.1"  # flytekit's default 5 s, run as torchrun's 0.1 s
    [settings_job] = rendered(run_main, f"{CONFIGS}:elastic_settings")
    command = settings_job["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0][
        "command"
    ]
    flags = dict(itertools.pairwise(command))  # each flag and its value
    assert flags["--monitor-interval"] == "2" and flags["--start-method"] == "fork"


def test_single_node_configs_bypass_the_launcher_as_the_readme_says() -> None:
    """nnodes 1, "1" and "1:1" are one node; with one process the function is called directly."""
    from torchjob.sdk.flyte.convert import convert
    from torchjob.sdk.workflow import plan

    module = import_file(CONFIGS)
    for name, processes in (("elastic_one", 4), ("elastic_one_text", 2), ("elastic_one_range", 1)):
        config = convert(getattr(module, name)).task.task_config
        assert config is not None and config.single_node and config.nproc_per_node == processes, name
    assert plan(convert(module.elastic_one_range).task.task_config).startswith("single node detected")
    assert convert(module.plain_task).task.task_config is None
    range_config = convert(module.elastic_range).task.task_config
    assert (range_config.min_nodes, range_config.max_nodes) == (1, 4)


def test_int_one_is_a_plain_pod_on_a_cluster_and_render_says_so(run_main: Callable[..., Ran]) -> None:
    task = import_file(CONFIGS).elastic_one
    assert task.get_custom(settings()) is None and task.task_type == "python-task"
    code, _, err = run_main("render", f"{CONFIGS}:elastic_one", "--target", "kubeflow")
    assert code == 0
    assert "Flyte runs this task as one plain pod (python-task), not a PyTorchJob" in err


def test_node_overrides_are_rendered_as_flytekit_serializes_them(run_main: Callable[..., Ran]) -> None:
    from collections import OrderedDict

    from flytekit.tools.translator import get_serializable

    module = import_file(CONFIGS)
    spec = get_serializable(OrderedDict(), settings(), module.with_node_overrides)
    overrides = [n.task_node.overrides for n in spec.template.nodes if n.task_node and n.id != "n2"]
    code, out, err = run_main(
        "render", f"{CONFIGS}:with_node_overrides", "--target", "kubeflow", "-o", "json"
    )
    assert code == 0, err
    decoder, text, jobs = json.JSONDecoder(), out.strip(), []
    while text:  # one List per node, one JSON document after another
        document, end = decoder.raw_decode(text)
        jobs += [i for i in document["items"] if i["kind"] == "PyTorchJob"]
        text = text[end:].strip()
    assert len(jobs) == 2
    for job, node in zip(jobs, overrides, strict=True):
        assert actual_job(job) == expected_job(module.overridden, node)
    assert "nodes flytekit runs itself (not rendered): n2 (plain_task)" in err


def test_a_workflow_renders_every_branch_of_its_conditional(run_main: Callable[..., Ran]) -> None:
    code, out, err = run_main("render", f"{ADAPTIVE}:adaptive_training", "--target", "kubeflow")
    assert code == 0, err
    assert "# node n0 > n0 (train_model_single_node)" in out and "# node n0 > n1 (train_model)" in out
    assert "Flyte runs this task as one plain pod" in err  # the single-node branch
    code, _, err = run_main("render", f"{ADAPTIVE}:adaptive_training_dynamic")
    assert code == 2 and "its nodes are decided when it runs" in err
    code, out, err = run_main("render", "tests/flyte_tasks.py:pipeline", "--target", "kubeflow")
    assert code == 0, err  # a conditional whose branch is a sub-workflow
    assert [line for line in out.splitlines() if line.startswith("# ")] == [
        "# node n0 (allreduce_pytorch)",
        "# node n1 > n0 > n1 (allreduce_elastic)",
    ]
    assert "(not rendered): n1 > n0 > n0 (plain), n1 > n0 > n2 (plain), n1 > n1 (plain)" in err


def test_with_overrides_task_config_is_flytekits_change_of_the_task(
    run_main: Callable[..., Ran],
) -> None:
    """flytekit replaces the task's own config when the workflow is compiled (for every node of
    that task), keeping the node count of the task's definition; torchjob renders what that
    serializes."""
    task = import_file(CONFIGS).changed_by_override
    assert task.task_config.nproc_per_node == 2
    code, out, err = run_main(
        "render", f"{CONFIGS}:overriding_task_config", "--target", "kubeflow", "-o", "json"
    )
    assert code == 0, err
    [job] = [i for i in json.loads(out)["items"] if i["kind"] == "PyTorchJob"]
    assert task.task_config.nproc_per_node == 1  # compiling the workflow set it
    assert actual_job(job) == expected_job(task)
    assert job["spec"]["elasticPolicy"] == {
        "minReplicas": 2,
        "maxReplicas": 2,
        "rdzvBackend": "c10d",
        "nProcPerNode": 1,
        "maxRestarts": 0,
    }


def test_validate_describes_tasks_and_workflows(run_main: Callable[..., Ran]) -> None:
    code, out, err = run_main(
        "validate",
        f"{CONFIGS}:every_field",
        f"{ADAPTIVE}:adaptive_training",
        f"{ADAPTIVE}:adaptive_training_dynamic",
    )
    assert code == 0, err
    assert f"{CONFIGS}:every_field: job every-field: valid; 4 pods (masterx1, workerx3)" in out
    assert (
        "flytekit workflow adaptive_training: valid; parameters: --use-single-node (bool); kfpytorch task "
        "nodes: n0 > n0 (train_model_single_node: 1 pods), n0 > n1 (train_model: 2 pods)"
    ) in out
    assert "flytekit @dynamic task adaptive_training_dynamic: valid" in out


def test_what_torchjob_cannot_run_is_one_line(run_main: Callable[..., Ran]) -> None:
    code, _, err = run_main("run", f"{CONFIGS}:calls_through_an_attribute")
    assert code == 2
    assert err.strip().count("\n") == 0 and "otherwise than by a name of its" in err
    code, _, err = run_main("render", f"{CONFIGS}:nothing_here")
    assert code == 2 and "tasks in this file:" in err and "every_field" in err
    code, _, err = run_main("run", f"{CONFIGS}:plain_task", "--x", "one")
    assert code == 2 and "--x: expected an integer, got 'one'" in err


def test_pyflyte_run_arguments_follow_the_reference() -> None:
    from torchjob.cli.app import _split_program_args, build_parser

    argv = ["run", "wf.py:train", "--epochs", "10", "--engine", "slurm", "--batch_size", "32", "--flag", "-v"]
    own, program = _split_program_args(argv, build_parser("run"))
    assert own == ["run", "wf.py:train", "--engine", "slurm", "-v"]
    assert program == ["--epochs", "10", "--batch_size", "32", "--flag"]
    own, program = _split_program_args(["render", "wf.py:train", "-o", "json", "--", "--engine", "x"], None)
    assert (own, program) == (["render", "wf.py:train", "-o", "json"], ["--engine", "x"])
    own, program = _split_program_args(
        ["run", "wf.py:train", "--lr", "-0.5", "--no-use-single-node", "--", "--image", "x"],
        build_parser("run"),
    )
    assert own == ["run", "wf.py:train"]
    assert program == ["--lr", "-0.5", "--no-use-single-node", "--image", "x"]


def test_a_version_torchjob_does_not_serve_is_refused_in_one_line(tmp_path: Path) -> None:
    from torchjob.sdk.flyte.support import refusal

    assert refusal({"flytekit": "1.16.31", "flytekitplugins-kfpytorch": "1.16.31"}) is None
    assert refusal({"flytekit": "1.16.0", "flytekitplugins-kfpytorch": None}) is None
    message = refusal({"flytekit": "1.15.4", "flytekitplugins-kfpytorch": "1.16.31"})
    assert message == (
        "flytekit 1.15.4 installed; torchjob serves flytekit and flytekitplugins-kfpytorch 1.16.x "
        "(tested with 1.16.31): pip install flytekit==1.16.31 flytekitplugins-kfpytorch==1.16.31"
    )
    # The installed distribution's metadata, as importlib finds it first on the path, says 1.17.0.
    dist = tmp_path / "flytekit-1.17.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: flytekit\nVersion: 1.17.0\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-m", "torchjob", "render", f"{CONFIGS}:every_field"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and done.stdout == ""
    lines = [line for line in done.stderr.splitlines() if "torchjob serves" in line]
    assert lines == [
        f"{CONFIGS}: flytekit 1.17.0 installed; torchjob serves flytekit and flytekitplugins-kfpytorch "
        "1.16.x (tested with 1.16.31): pip install flytekit==1.16.31 flytekitplugins-kfpytorch==1.16.31"
    ]


# ``torchjob render`` in a process that says, once it is done, which heavy modules it imported.
RENDER_AND_TELL = """
import json, sys
from torchjob.cli import main
code = main(["render", sys.argv[1]])
print(json.dumps({"code": code, "heavy": sorted({"flytekit", "torch"} & set(sys.modules))}))
"""


def render_with_flytekit_said_to_be(version: str, folder: Path, ref: str) -> tuple[dict[str, Any], str, str]:
    """``render ref`` where the installed flytekit's metadata, as importlib finds it first on the
    path, says ``version`` (the real package stays importable)."""
    dist = folder / f"flytekit-{version}.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: flytekit\nVersion: {version}\n")
    done = subprocess.run(
        [sys.executable, "-c", RENDER_AND_TELL, ref],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(folder)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    *output, last = done.stdout.splitlines()
    return json.loads(last), "\n".join(output), done.stderr


@pytest.mark.parametrize("ref", [f"{CONFIGS}:every_field", f"{ADAPTIVE}:adaptive_training"])
def test_an_unserved_flytekit_is_refused_before_flytekit_or_torch_is_imported(
    tmp_path: Path, ref: str
) -> None:
    told, out, err = render_with_flytekit_said_to_be("1.17.0", tmp_path, ref)
    assert told == {"code": 2, "heavy": []}, err
    assert out == ""
    path = ref.rpartition(":")[0]
    assert err.splitlines() == [
        f"{path}: flytekit 1.17.0 installed; torchjob serves flytekit and flytekitplugins-kfpytorch "
        "1.16.x (tested with 1.16.31): pip install flytekit==1.16.31 flytekitplugins-kfpytorch==1.16.31"
    ]


def test_a_served_flytekit_said_so_by_its_metadata_still_renders(tmp_path: Path) -> None:
    told, out, err = render_with_flytekit_said_to_be("1.16.5", tmp_path, f"{CONFIGS}:every_field")
    assert told == {"code": 0, "heavy": ["flytekit", "torch"]}, err
    import yaml

    rendered = yaml.safe_load(out)
    assert rendered["kind"] == "List" and rendered["items"], out


def test_a_file_that_does_not_import_flytekit_renders_whatever_flytekit_is_installed(tmp_path: Path) -> None:
    plain = tmp_path / "plain.py"
    plain.write_text(
        "# not flytekit's tasks: torchjob's own\n"
        "from torchjob import PyTorch, Worker, task\n\n\n"
        "@task(task_config=PyTorch(worker=Worker(replicas=1)))\n"
        "def train() -> int:\n"
        "    return 1\n"
    )
    (tmp_path / "dists").mkdir()
    told, out, err = render_with_flytekit_said_to_be("1.17.0", tmp_path / "dists", f"{plain}:train")
    assert told["code"] == 0 and "flytekit" not in told["heavy"], err
    assert "torchjob serves" not in err and "kind: List" in out


def test_a_dataclass_pickled_by_value_keeps_its_fields_after_a_round_trip() -> None:
    """A rank's value of a class defined in the task's file comes back into the caller's own class;
    cloudpickle rebuilt its fields then, with copies of dataclasses.MISSING unless results.py
    pickles that by reference (flytekit's type engine failed on the class afterwards)."""
    import dataclasses

    import cloudpickle

    import torchjob.sdk.results  # noqa: F401 - registers the reducers

    module = import_file("tests/flyte_tasks.py")
    report = module.Report(world=1, total=1, ranks=[0], nodes=[0], scale=1)
    back = cloudpickle.loads(cloudpickle.dumps(report))
    assert type(back) is module.Report
    assert all(f.default is dataclasses.MISSING for f in dataclasses.fields(module.Report))
