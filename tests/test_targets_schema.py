"""Every object of every target validates against its upstream schema.

Custom resources (Volcano Job, PyTorchJob, TrainJob, JobSet) are checked with ``jsonschema``
against the ``openAPIV3Schema`` of the CRDs in ``../shared/crds`` beside the checkout, made strict
the way the API server's ``fieldValidation=Strict`` is (an unknown field is an error); core
objects (pods, Services, ConfigMaps, claims) with kubernetes-validate. Inputs: every example, the
seed jobs and a set of SDK configurations. Without ``../shared`` the CRD checks skip.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

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
from torchjob.cli.sources import load_ref
from torchjob.errors import SpecError
from torchjob.jobs import load_jobs, load_jobs_from_text
from torchjob.spec.model import Job
from torchjob.targets import JOB_LABEL, render_target, target_names

jsonschema = pytest.importorskip("jsonschema", reason="jsonschema is not installed (pip install -e .[dev])")
kubernetes_validate = pytest.importorskip(
    "kubernetes_validate", reason="kubernetes-validate is not installed"
)

pytestmark = pytest.mark.timeout(300)

REPO = Path(__file__).resolve().parent.parent
# CI clones the repository with shared/ beside it; TORCHJOB_SHARED points elsewhere (a worktree).
SHARED = Path(os.environ.get("TORCHJOB_SHARED") or REPO.parent / "shared")
CRDS = SHARED / "crds"
SEEDS = SHARED / "seeds"
CRD_FILES = {
    ("batch.volcano.sh/v1alpha1", "Job"): "batch.volcano.sh_jobs.yaml",
    ("kubeflow.org/v1", "PyTorchJob"): "kubeflow.org_pytorchjobs.yaml",
    ("trainer.kubeflow.org/v1alpha1", "TrainJob"): "trainer.kubeflow.org_trainjobs.yaml",
    ("jobset.x-k8s.io/v1alpha2", "JobSet"): "jobset.x-k8s.io_jobsets.yaml",
}


def fn() -> int:
    return 1


SDK_CONFIGS: dict[str, Any] = {
    "pytorch-default": PyTorch(worker=Worker(replicas=2)),
    "pytorch-master-only": PyTorch(worker=Worker(replicas=0)),
    "pytorch-full": PyTorch(
        master=Master(
            image="img:m", requests=Resources(cpu="1", mem="1Gi"), restart_policy=RestartPolicy.ALWAYS
        ),
        worker=Worker(
            replicas=3, image="img:w", limits=Resources(cpu=2, gpu=1), restart_policy=RestartPolicy.FAILURE
        ),
        run_policy=RunPolicy(
            clean_pod_policy=CleanPodPolicy.ALL,
            ttl_seconds_after_finished=60,
            active_deadline_seconds=3600,
            backoff_limit=2,
        ),
        increase_shared_mem=False,
    ),
    "elastic-single": Elastic(nproc_per_node=2),
    "elastic-fixed": Elastic(
        nnodes=2, nproc_per_node=4, max_restarts=3, run_policy=RunPolicy(backoff_limit=1)
    ),
    "elastic-range": Elastic(nnodes="1:4", nproc_per_node=8),
}


# (SDK config, target) pairs a target must refuse: an elastic range, or master and workers that differ.
REFUSED = {
    ("elastic-range", "jobset"),
    ("elastic-range", "trainjob"),
    ("pytorch-full", "trainjob"),
    # The seeds (Volcano's guide) run the image's entrypoint, and only the worker sets a workingDir.
    ("seed", "trainjob"),
}


# One job using what each target maps beyond the basics: job volumes (a new claim), pod settings a
# TrainJob patches into its runtime, labels, a TTL, a restart policy and job-level scheduling.
RICH = """\
apiVersion: batch.volcano.sh/v1alpha1
kind: Job
metadata: {name: rich, namespace: research, labels: {team: ml}}
spec:
  maxRetry: 4
  ttlSecondsAfterFinished: 600
  queue: gpu
  priorityClassName: high
  schedulerName: my-scheduler
  minAvailable: 2
  volumes:
    - mountPath: /ckpt
      volumeClaim: {accessModes: [ReadWriteOnce], resources: {requests: {storage: 1Gi}}}
  policies: [{event: PodFailed, action: RestartJob}]
  plugins: {pytorch: ["--port=29400"], env: []}
  tasks:
""" + "".join(
    f"""\
    - name: {name}
      replicas: {replicas}
      template:
        metadata: {{labels: {{role: trainer}}, annotations: {{note: x}}}}
        spec:
          restartPolicy: Never
          serviceAccountName: trainer
          nodeSelector: {{pool: gpu}}
          tolerations: [{{key: gpu, operator: Exists, effect: NoSchedule}}]
          volumes: [{{name: shm, emptyDir: {{medium: Memory}}}}]
          containers:
            - name: main
              image: python:3.11
              command: [python, train.py]
              args: [--epochs, "3"]
              env: [{{name: A, value: "1"}}]
              resources: {{limits: {{cpu: "2", memory: 4Gi}}}}
              volumeMounts: [{{name: shm, mountPath: /dev/shm}}]
"""
    for name, replicas in (("master", 1), ("worker", 3))
)


def sdk_job(name: str) -> Job:
    return task(task_config=SDK_CONFIGS[name])(fn).to_job()


def _fenced(text: str) -> list[str]:
    import re

    return [m.group(1) for m in re.finditer(r"^```ya?ml[ \t]*\n(.*?)^```", text, re.MULTILINE | re.DOTALL)]


def seed_jobs() -> list[tuple[str, Job]]:
    found = []
    for path in sorted(SEEDS.glob("*.txt")) if SEEDS.is_dir() else []:
        for n, block in enumerate(_fenced(path.read_text(encoding="utf-8"))):
            try:
                docs = list(yaml.safe_load_all(block))
            except yaml.YAMLError:
                continue
            if not any(isinstance(d, dict) and d.get("kind") == "Job" for d in docs):
                continue
            try:
                loaded = load_jobs_from_text(block, f"{path.name}#{n}")
            except SpecError:
                continue  # a seed that is not a valid job: test_seeds covers what it should say
            found += [(f"{path.stem}-{n}-{item.job.name}", item.job) for item in loaded]
    return found


def all_jobs() -> list[Any]:
    jobs: list[Any] = []
    for path in sorted((REPO / "examples").glob("*.yaml")):
        jobs += [pytest.param(path, None, id=f"example-{path.stem}")]
    for ref in SDK_EXAMPLES:
        jobs += [pytest.param(REPO / "examples" / "sdk" / ref, None, id=f"example-sdk-{ref}")]
    jobs += [pytest.param(None, name, id=f"sdk-{name}") for name in SDK_CONFIGS]
    jobs += [pytest.param(None, "rich", id="rich")]
    if SEEDS.is_dir():
        jobs += [pytest.param(None, f"seed:{i}", id=f"seed-{name}") for i, (name, _) in enumerate(_seeds())]
    else:
        jobs += [
            pytest.param(None, "seed:0", id="seeds", marks=pytest.mark.skip(reason=f"{SEEDS} is not there"))
        ]
    return jobs


@functools.cache
def _seeds() -> list[tuple[str, Job]]:
    return seed_jobs()


# The SDK examples, as `torchjob render examples/sdk/FILE.py:TASK` reads them.
SDK_EXAMPLES = ("allreduce.py:allreduce", "failing_rank.py:check_shard")


def _job(path: Path | None, name: str | None) -> Job:
    if path is not None:
        return load_ref(str(path))[0].job
    assert name is not None
    if name.startswith("seed:"):
        if not SEEDS.is_dir():
            pytest.skip(f"{SEEDS} is not there (set TORCHJOB_SHARED to the shared folder)")
        return _seeds()[int(name.split(":")[1])][1]
    if name == "rich":
        return load_jobs_from_text(RICH, "rich.yaml")[0].job
    return sdk_job(name)


def _strict(schema: Any) -> Any:
    """The schema with unknown fields refused wherever the API server would refuse them."""
    if isinstance(schema, list):
        return [_strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _strict(v) for k, v in schema.items()}
    if (
        out.get("type") == "object"
        and "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


@functools.cache
def crd_validator(api_version: str, kind: str) -> Any:
    if not CRDS.is_dir():
        pytest.skip(f"{CRDS} is not there: the CRD schema checks need the shared folder beside the checkout")
    crd = yaml.safe_load((CRDS / CRD_FILES[(api_version, kind)]).read_text())
    version = api_version.split("/")[1]
    (served,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
    schema = _strict(served["schema"]["openAPIV3Schema"])
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft7Validator)
    return cls(schema)


# The fields of Volcano's PodGroup the pods target writes, as its CRD types them
# (volcano-sh/volcano config/crd/volcano/bases/scheduling.volcano.sh_podgroups.yaml; not in ../shared).
PODGROUP_SCHEMA = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "scheduling.volcano.sh/v1beta1"},
        "kind": {"const": "PodGroup"},
        "metadata": {"type": "object"},
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "minMember": {"type": "integer", "minimum": 0},
                "queue": {"type": "string"},
                "priorityClassName": {"type": "string"},
            },
        },
    },
}


def validate(obj: dict[str, Any]) -> None:
    key = (obj["apiVersion"], obj["kind"])
    where = f"{obj['kind']} {obj['metadata']['name']}"
    if key == ("scheduling.volcano.sh/v1beta1", "PodGroup"):
        jsonschema.validate(obj, PODGROUP_SCHEMA)
        return
    if key in CRD_FILES:
        errors = sorted(crd_validator(*key).iter_errors(obj), key=lambda e: list(e.absolute_path))
        if errors:
            lines = [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in errors[:5]]
            pytest.fail(f"{where} breaks its CRD schema:\n" + "\n".join(lines))
        return
    try:
        kubernetes_validate.validate(obj, kubernetes_validate.latest_version(), strict=True)
    except kubernetes_validate.ValidationError as err:
        pytest.fail(f"{where}: {'/'.join(map(str, err.path))}: {err.message}")


def pod_templates(obj: dict[str, Any]) -> list[dict[str, Any]]:
    """Every pod template of a rendered object (a Pod counts as its own)."""
    spec = obj.get("spec") or {}
    kind = obj["kind"]
    if kind == "Pod":
        return [obj]
    if kind == "Job":
        return [t["template"] for t in spec["tasks"]]
    if kind == "PyTorchJob":
        return [r["template"] for r in spec["pytorchReplicaSpecs"].values()]
    if kind == "JobSet":
        return [r["template"]["spec"]["template"] for r in spec["replicatedJobs"]]
    if kind == "TrainJob":
        patch = spec["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
        return [patch["template"]["spec"]["template"]]
    return []


@pytest.mark.parametrize("target", target_names())
@pytest.mark.parametrize(("path", "name"), all_jobs())
def test_every_object_validates_and_carries_the_job_label(
    path: Path | None, name: str | None, target: str
) -> None:
    job = _job(path, name)
    kind = (name or "").split(":")[0]
    try:
        rendered = render_target(job, target)
    except SpecError as err:
        # Only these jobs are beyond these targets, and the message names the targets that can.
        assert (kind, target) in REFUSED, err
        assert all("use --target" in p.message for p in err.problems), err
        return
    assert (kind, target) not in REFUSED
    if kind == "rich" and target != "volcano":  # the new claim is created beside the job
        assert "PersistentVolumeClaim" in [o["kind"] for o in rendered.objects]
    assert rendered.objects
    main = [o for o in rendered.objects if o["kind"] == rendered.kind]
    assert main and main[0]["apiVersion"] == rendered.api_version
    for obj in rendered.objects:
        assert obj["metadata"]["labels"][JOB_LABEL] == job.name
        for template in pod_templates(obj):
            assert template["metadata"]["labels"][JOB_LABEL] == job.name
        validate(obj)


def test_the_strict_crd_schema_refuses_a_misspelt_field() -> None:
    """The checks above can fail: a typo in a JobSet, a wrong type in a PyTorchJob."""
    rendered = render_target(load_jobs(str(REPO / "examples" / "ddp-train.yaml"))[0].job, "jobset")
    jobset = rendered.objects[-1]
    jobset["spec"]["replicatedJobs"][0]["replica"] = 2
    assert list(crd_validator("jobset.x-k8s.io/v1alpha2", "JobSet").iter_errors(jobset))
    pytorchjob = render_target(sdk_job("pytorch-default"), "kubeflow").objects[-1]
    pytorchjob["spec"]["pytorchReplicaSpecs"]["Master"]["replicas"] = "one"
    assert list(crd_validator("kubeflow.org/v1", "PyTorchJob").iter_errors(pytorchjob))
