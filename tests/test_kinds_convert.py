"""Converting between stacks: a PyTorchJob, TrainJob or JobSet rendered for every target, what the
source meant in the target's terms.

- Every rendered object is created on a simulated cluster of that target (its CRD's schema,
  strict; tests/controllers/cluster.py) and every training process there sees the one world the
  source meant: ranks 0..N-1, one world size, a master that resolves to the pod of rank 0.
- Each thing the target expresses otherwise is a warning, at the source's field.
- A round trip is stable for every target: render, read the result back, render again: the same.
"""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from controllers.cluster import simulated
from controllers.dns import resolve
from controllers.envs import processes
from torchjob.errors import SpecError
from torchjob.jobs import load_jobs, load_jobs_from_text
from torchjob.render import dump, list_of
from torchjob.spec.model import Job
from torchjob.targets import for_cluster, target_names

REPO = Path(__file__).resolve().parent.parent
KINDS = REPO / "examples" / "kinds"
SOURCES = sorted(p.name for p in KINDS.glob("*.yaml"))
READABLE = ("volcano", "kubeflow", "trainjob", "jobset")  # targets whose object torchjob reads back
# What a target cannot express: an elastic range of nodes.
REFUSED = {("pytorchjob-elastic.yaml", "trainjob"), ("pytorchjob-elastic.yaml", "jobset")}
WORLD = {"pytorchjob.yaml": 3, "trainjob.yaml": 2, "trainjob-runtime.yaml": 3, "jobset.yaml": 2}
pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(
        not (REPO.parent / "shared" / "crds").is_dir() and not os.environ.get("TORCHJOB_SHARED"),
        reason="the CRD schemas (../shared/crds) are not beside the checkout",
    ),
]


def _job(source: str) -> Job:
    (loaded,) = load_jobs(str(KINDS / source))
    return loaded.job


def _text(objects: list[dict[str, Any]]) -> str:
    return dump(list_of(objects), "yaml")


def _top(objects: list[dict[str, Any]]) -> str:
    """The rendered job object alone, as a file holding it (the List's other items are claims)."""
    kinds = ("Job", "PyTorchJob", "TrainJob", "JobSet")
    return yaml.safe_dump(next(o for o in objects if o["kind"] in kinds), sort_keys=False)


@pytest.mark.parametrize("target", target_names())
@pytest.mark.parametrize("source", SOURCES)
def test_every_process_of_the_converted_job_sees_the_sources_world(source: str, target: str) -> None:
    job = _job(source)
    try:
        objects = for_cluster(job, target, "default").objects
    except SpecError as err:
        assert (source, target) in REFUSED, [p.message for p in err.problems]
        assert "elastic range of 1:2 nodes cannot be expressed" in err.problems[0].message
        return
    assert (source, target) not in REFUSED
    with simulated(objects, target) as api:  # created as a client would, schema checked strictly
        pods = sorted(api.objects_of("v1", "Pod"), key=lambda p: str(p["metadata"]["name"]))
        assert pods
        if source not in WORLD or source.startswith(target):
            # elastic ranks come from torch's rendezvous; a JobSet's torchrun in a shell and a
            # TrainJob's shell program (on their own kinds) rank themselves
            return
        ranked = [p for pod in pods for p in processes(pod, api) if p.rank is not None]
        assert sorted(p.rank for p in ranked) == list(range(WORLD[source])), target
        assert {p.world_size for p in ranked} == {WORLD[source]}, target
        ((address, _),) = {(p.master_addr, p.master_port) for p in ranked}
        rank0 = next(p.pod for p in ranked if p.rank == 0)
        assert [q["metadata"]["name"] for q in resolve(api, "default", str(address))] == [rank0]


@pytest.mark.parametrize("target", READABLE)
@pytest.mark.parametrize("source", SOURCES)
def test_a_round_trip_is_stable(source: str, target: str) -> None:
    if (source, target) in REFUSED:
        return
    first = for_cluster(_job(source), target, "default").objects
    runtime = (KINDS / source).read_text().split("---\n")[0] + "---\n" if "runtime" in source else ""
    (again,) = load_jobs_from_text(runtime + _top(first), "rendered.yaml")
    second = for_cluster(again.job, target, "default").objects
    assert _text(second) == _text(first)
    # and the job read back is the one rendered: read and rendered once more, the same bytes
    (third,) = load_jobs_from_text(runtime + _top(second), "rendered.yaml")
    assert _text(for_cluster(third.job, target, "default").objects) == _text(first)


def test_a_kind_rendered_for_its_own_target_is_the_object_as_written() -> None:
    for source, target in (
        ("pytorchjob.yaml", "kubeflow"),
        ("trainjob.yaml", "trainjob"),
        ("jobset.yaml", "jobset"),
    ):
        written = yaml.safe_load((KINDS / source).read_text())
        (obj,) = for_cluster(_job(source), target, "default").objects
        assert obj["spec"] != written["spec"]  # the label is on the pod templates
        assert obj["metadata"]["labels"] == {"torchjob.io/job-name": written["metadata"]["name"]}
        if target == "trainjob":
            patch = obj["spec"].pop("runtimePatches")[-1]
            assert patch["manager"] == "torchjob.io/render"
        assert _unlabelled(obj["spec"]) == written["spec"], source


def _unlabelled(value: Any) -> Any:
    if isinstance(value, dict):
        out = {k: _unlabelled(v) for k, v in value.items()}
        meta = out.get("metadata")
        if isinstance(meta, dict) and meta.get("labels") == {"torchjob.io/job-name": "pytorchjob-sendrecv"}:
            del out["metadata"]
        if isinstance(meta, dict) and meta.get("labels") == {"torchjob.io/job-name": "jobset-sendrecv"}:
            del out["metadata"]
        return out
    if isinstance(value, list):
        return [_unlabelled(v) for v in value]
    return value


def _warnings(source: str, target: str, text: str | None = None) -> list[str]:
    loaded = load_jobs_from_text(text, source) if text is not None else load_jobs(str(KINDS / source))
    rendered = for_cluster(loaded[-1].job, target, "default")
    return [loaded[-1].document.problem(path, message).format() for path, message in rendered.warnings]


def test_a_pytorchjobs_torchrun_is_told_its_rendezvous_where_no_pet_variables_are_set() -> None:
    text = (
        (KINDS / "pytorchjob.yaml")
        .read_text()
        .replace("spec:\n  pytorchReplicaSpecs", 'spec:\n  nprocPerNode: "2"\n  pytorchReplicaSpecs')
    )
    text = text.replace(
        '["python", "examples/programs/sendrecv.py"]', '["torchrun", "examples/programs/sendrecv.py"]'
    )
    (loaded,) = load_jobs_from_text(text)
    volcano = for_cluster(loaded.job, "volcano", "default").objects[0]
    command = volcano["spec"]["tasks"][0]["template"]["spec"]["containers"][0]["command"]
    assert command == [
        "torchrun", "--nnodes=3", "--nproc-per-node=2", "--node-rank=$(RANK)",
        "--master-addr=$(MASTER_ADDR)", "--master-port=$(MASTER_PORT)", "examples/programs/sendrecv.py",
    ]  # fmt: skip
    trainjob = for_cluster(loaded.job, "trainjob", "default").objects[0]["spec"]["trainer"]
    assert trainjob["command"] == ["torchrun", "--no-python", "python", "examples/programs/sendrecv.py"]
    assert (trainjob["numNodes"], trainjob["numProcPerNode"]) == (3, 2)


def test_each_difference_of_the_target_is_a_warning_at_the_sources_field() -> None:
    found = _warnings("pytorchjob.yaml", "trainjob")
    assert any(
        w.endswith(
            "pytorchjob.yaml:16: spec.pytorchReplicaSpecs.Master.restartPolicy: restartPolicy is dropped: "
            "the runtime's Job decides how pods restart"
        )
        for w in found
    ), found
    # The job's restart limit comes from the replicas' restartPolicy: told there, not at a Volcano field.
    assert any(
        "pytorchjob.yaml:13: spec.pytorchReplicaSpecs: a TrainJob has no restart settings" in w for w in found
    ), found
    assert not any("spec.maxRetry" in w for w in found), found
    found = _warnings("trainjob.yaml", "kubeflow")
    assert any(
        "spec.template.spec.replicatedJobs[0].template.spec.backoffLimit: target 'kubeflow': a Job fails "
        "after 6 container restart(s)" in w
        for w in found
    ), found
    found = _warnings("jobset.yaml", "kubeflow")
    assert any(
        "spec: target 'kubeflow': MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE written in the pods' env are "
        "set by this target instead" in w
        for w in found
    ), found
    found = _warnings("jobset.yaml", "trainjob")
    assert any(
        "containers[0].command: target 'trainjob': a TrainJob runs the command under torchrun" in w
        for w in found
    ), found
    found = _warnings("trainjob-runtime.yaml", "volcano")
    assert any(
        "command: target 'volcano': the command reads PET_* variables, which this target does not set" in w
        for w in found
    ), found


def test_a_jobset_without_a_rendezvous_of_its_own_has_no_master_for_the_targets_that_need_one() -> None:
    text = (KINDS / "jobset.yaml").read_text()
    text = "\n".join(line for line in text.splitlines() if "MASTER_ADDR" not in line)
    (loaded,) = load_jobs_from_text(text)
    with pytest.raises(SpecError) as err:
        for_cluster(loaded.job, "kubeflow", "default")
    # told in the JobSet's words, at its replicated jobs (not the Volcano Job's plugins or tasks)
    (problem,) = [loaded.document.problem(p.path, p.message) for p in err.value.problems]
    assert problem.path == "spec.replicatedJobs"
    assert problem.message.startswith(
        "a JobSet without one master pod and one replicated job of workers cannot be expressed by "
        "target 'kubeflow' (it needs to know them"
    ), problem.message
    assert for_cluster(loaded.job, "volcano", "default").objects  # any tasks


STEPS = """\
apiVersion: jobset.x-k8s.io/v1alpha2
kind: JobSet
metadata: {name: steps}
spec:
  replicatedJobs:
    - name: init
      template: {spec: {template: {spec: {containers: [{name: a, image: 'a:1', command: ['true']}]}}}}
    - name: train
      dependsOn: [{name: init, status: Complete}]
      template: {spec: {template: {spec: {containers: [{name: a, image: 'a:1', command: ['true']}]}}}}
"""


def test_a_start_once_a_job_completed_is_kept_as_written_or_refused() -> None:
    """Volcano's dependsOn (volcano, pods) starts a task once those it names run, and the other
    targets start every pod at once: a JobSet's ``status: Complete`` is refused there, at its line,
    and goes out in the JobSet as written, which JobSet's CRD takes."""
    (loaded,) = load_jobs_from_text(STEPS, "steps.yaml")
    for target in ("pods", "volcano", "kubeflow", "trainjob"):
        with pytest.raises(SpecError) as err:
            for_cluster(loaded.job, target, "default")
        (problem,) = [loaded.document.problem(p.path, p.message).format() for p in err.value.problems]
        assert problem == (
            "steps.yaml:9: spec.replicatedJobs[1].dependsOn: a start once init-0 completed (dependsOn "
            f"status Complete) cannot be expressed by target {target!r}: these pods would start while "
            "those still run; use --target jobset, which sends the JobSet as written"
        )
    objects = for_cluster(loaded.job, "jobset", "default").objects
    assert objects[0]["spec"]["replicatedJobs"][1]["dependsOn"] == [{"name": "init", "status": "Complete"}]
    with simulated(objects, "jobset") as api:  # created as a client would, schema checked strictly
        assert api.objects_of("jobset.x-k8s.io/v1alpha2", "JobSet")


def test_the_worked_migration_in_the_docs_is_what_render_does(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """docs/kinds.md's PyTorchJob-to-TrainJob migration: its command, the TrainJob it describes and
    every warning it quotes come out of the real CLI."""
    from torchjob.cli import main

    text = (REPO / "docs" / "kinds.md").read_text()
    section = text[text.index("### Worked migration") :]
    section = section[: section.index("\n## ")]
    command = re.search(r"```sh\n(torchjob render [^\n>]*?)\s*>", section)
    assert command is not None, "the migration no longer shows its render command"
    prose = " ".join(section.split())  # quoted phrases may wrap across lines
    monkeypatch.chdir(REPO)
    assert main(shlex.split(command[1])[1:]) == 0
    out, err = capfd.readouterr()
    (trainjob,) = [o for o in yaml.safe_load(out)["items"] if o["kind"] == "TrainJob"]
    trainer = trainjob["spec"]["trainer"]
    assert (
        f"`numNodes: {trainer['numNodes']}`" in prose
        and f"`numProcPerNode: {trainer['numProcPerNode']}`" in prose
    )
    assert f"the command `{' '.join(trainer['command'])}`" in prose
    assert trainjob["spec"]["runtimeRef"]["name"] == "torch-distributed" and "`torch-distributed`" in prose
    assert "runtimePatches" in trainjob["spec"] and "`runtimePatches`" in prose
    quoted = re.findall(r"- `([^`]+)`", section)  # the warnings the bullets quote
    assert len(quoted) >= 2, section
    for warning in quoted:
        assert warning in err, (warning, err)
    for field in re.findall(r"the `(\w+)` warning", prose):  # warnings named by their field
        assert f": spec.{field}: warning: " in err, (field, err)
    assert err.count("warning:") == len(quoted) + len(re.findall(r"the `(\w+)` warning", prose)), err


LEADER_FAILS = """\
apiVersion: jobset.x-k8s.io/v1alpha2
kind: JobSet
metadata: {name: llm}
spec:
  failurePolicy:
    maxRestarts: 2
    rules:
      - {name: leader_fails, action: FailJobSet, targetReplicatedJobs: [leader]}
  replicatedJobs:
    - name: leader
      template:
        spec:
          backoffLimit: 0
          template:
            spec:
              restartPolicy: Never
              containers:
                - name: leader
                  image: "t:1"
                  env: [{name: MASTER_ADDR, value: llm-leader-0-0.llm}, {name: MASTER_PORT, value: "29500"}]
                  command: [python, train.py]
    - name: workers
      template:
        spec:
          completions: 2
          parallelism: 2
          backoffLimit: 0
          template:
            spec:
              restartPolicy: Never
              containers:
                - name: worker
                  image: "t:1"
                  env: [{name: MASTER_ADDR, value: llm-leader-0-0.llm}, {name: MASTER_PORT, value: "29500"}]
                  command: [python, train.py]
"""


def test_a_failure_that_ends_the_set_is_kept_beside_failures_that_restart_it() -> None:
    """A JobSet that fails when its leader fails and restarts when a worker does: Volcano keeps both
    (the leader's task policy beside the job's RestartJob); a target with no task policies says
    that it drops the leader's rule, at the rule, instead of restarting on it in silence."""
    (loaded,) = load_jobs_from_text(LEADER_FAILS, "js.yaml")
    (job,) = [o for o in for_cluster(loaded.job, "volcano", "default").objects if o["kind"] == "Job"]
    assert job["spec"]["policies"] == [{"event": "PodFailed", "action": "RestartJob"}]
    leader, workers = job["spec"]["tasks"]
    assert leader["policies"] == [{"event": "PodFailed", "action": "TerminateJob"}], leader
    assert "policies" not in workers
    found = _warnings("js.yaml", "kubeflow", LEADER_FAILS)
    assert any(
        w.startswith(
            "js.yaml:8: spec.failurePolicy.rules[0]: target 'kubeflow' has no task policies; "
            "TerminateJob on PodFailed is dropped"
        )
        for w in found
    ), found


def test_a_deadline_and_clean_pod_policy_a_target_drops_are_told_at_the_kinds_fields() -> None:
    """A PyTorchJob's runPolicy and a TrainJob's activeDeadlineSeconds rendered for a target without
    a place for them: the warning names the kind's field and line (not the SDK's run_policy), and
    the bare pods of ``pods``, which no controller stops, say so too instead of dropping it."""
    text = (
        (KINDS / "pytorchjob.yaml")
        .read_text()
        .replace(
            "spec:\n  pytorchReplicaSpecs",
            "spec:\n  runPolicy: {activeDeadlineSeconds: 600, cleanPodPolicy: All}\n  pytorchReplicaSpecs",
        )
    )
    line = text.splitlines().index("  runPolicy: {activeDeadlineSeconds: 600, cleanPodPolicy: All}") + 1
    at = f"ptj.yaml:{line}: spec.runPolicy"
    found = _warnings("ptj.yaml", "volcano", text)
    deadline = [w for w in found if "deadline" in w]
    assert deadline == [
        f"{at}.activeDeadlineSeconds: Volcano Jobs have no deadline; the deadline of 600 s is dropped"
    ], found
    assert any(w.startswith(f"{at}.cleanPodPolicy: Volcano Jobs have no") for w in found), found
    found = _warnings("ptj.yaml", "pods", text)
    assert any(
        w.startswith(
            f"{at}.activeDeadlineSeconds: target 'pods' creates the pods without a controller: nothing "
            "ends them at the deadline"
        )
        for w in found
    ), found
    assert any(w.startswith(f"{at}.cleanPodPolicy: target 'pods'") for w in found), found
    trainjob = (
        (KINDS / "trainjob.yaml")
        .read_text()
        .replace("spec:\n  runtimeRef", "spec:\n  activeDeadlineSeconds: 60\n  runtimeRef", 1)
    )
    assert "activeDeadlineSeconds: 60" in trainjob
    found = [w for w in _warnings("tj.yaml", "volcano", trainjob) if "deadline" in w]
    assert (
        len(found) == 1 and found[0].startswith("tj.yaml:") and ": spec.activeDeadlineSeconds: " in found[0]
    )


def test_what_render_prints_is_read_back_as_the_docs_migration_runs_it(tmp_path: Path) -> None:
    """docs/kinds.md: `render --target trainjob > trainjob.yaml`, then `torchjob run trainjob.yaml`.
    render prints a `kind: List`, as kubectl does; its items are the jobs read, and a mistake in
    one is told at its path in the List (items[0]...) and its line."""
    from torchjob.cli import main

    rendered = for_cluster(_job("pytorchjob.yaml"), "trainjob", "default").objects
    listed = _text(rendered)
    assert listed.startswith("apiVersion: v1\nkind: List\n")
    (loaded,) = load_jobs_from_text(listed, "trainjob.yaml")
    assert loaded.job.kind is not None and loaded.job.kind.kind == "TrainJob"
    assert loaded.job.total_replicas == 3
    (tmp_path / "trainjob.yaml").write_text(listed)
    assert main(["run", "--dry-run", str(tmp_path / "trainjob.yaml")]) == 0
    two = _text(for_cluster(_job("jobset.yaml"), "volcano", "default").objects + rendered)
    assert [item.job.name for item in load_jobs_from_text(two)] == ["jobset-sendrecv", "pytorchjob-sendrecv"]
    broken = listed.replace("numNodes: 3", "numNodes: three")
    line = broken.splitlines().index("      numNodes: three") + 1
    with pytest.raises(SpecError) as err:
        load_jobs_from_text(broken, "trainjob.yaml")
    assert [p.format() for p in err.value.problems] == [
        f"trainjob.yaml:{line}: items[0].spec.trainer.numNodes: expected an integer, got string 'three'"
    ]
    pods = _text(for_cluster(_job("jobset.yaml"), "pods", "default").objects)
    with pytest.raises(SpecError) as err:
        load_jobs_from_text(pods, "pods.yaml")
    assert (
        err.value.problems[0].path == "items[0].kind"
        and "not a job torchjob reads" in err.value.problems[0].message
    )
