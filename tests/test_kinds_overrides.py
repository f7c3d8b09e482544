"""``run --set`` on a PyTorchJob, TrainJob or JobSet in the kind's own words (spec/kinds/overrides.py):
its replica types, replicated jobs and trainer fields are set in its document, which is read again,
so the job is the one the file so written gives (its pods, their env, its size); its mistakes are
the option's, at the kind's field; an unknown name is told with the kind's names. What worked
before still does: the tasks of the Volcano Job it became (``workers-0.maxRetry``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from support import Ran
from torchjob.addressing import ClusterAddressing
from torchjob.expand import expand
from torchjob.jobs import LoadedJob, load_jobs_from_text
from torchjob.overrides import Overrides, apply
from torchjob.spec.manifest import job_manifest

pytestmark = pytest.mark.timeout(120)

REPO = Path(__file__).resolve().parent.parent
KINDS = REPO / "examples" / "kinds"


def _doc(name: str) -> dict[str, Any]:
    found: dict[str, Any] = yaml.safe_load((KINDS / name).read_text())
    return found


def _read(doc: dict[str, Any]) -> LoadedJob:
    (loaded,) = load_jobs_from_text(yaml.safe_dump(doc, sort_keys=False), "job.yaml")
    return loaded


def _set(name: str, *sets: str) -> LoadedJob:
    (loaded,) = load_jobs_from_text((KINDS / name).read_text(), "job.yaml")
    return apply(loaded, Overrides(sets=list(sets)))


def _same(changed: LoadedJob, written: LoadedJob) -> None:
    """The job ``--set`` made is the one of the file written so: its spec and every pod's env."""
    assert job_manifest(changed.job) == job_manifest(written.job)
    envs = [
        [(p.name, c.get("env")) for c in p.manifest["spec"]["containers"]]
        for p in expand(changed.job, ClusterAddressing()).pods
    ]
    assert envs == [
        [(p.name, c.get("env")) for c in p.manifest["spec"]["containers"]]
        for p in expand(written.job, ClusterAddressing()).pods
    ]


@pytest.mark.parametrize("option", ["Worker.replicas", "worker.replicas", "WORKER.replicas"])
@pytest.mark.parametrize("count", [1, 4])
def test_a_pytorchjobs_replica_type_is_set_as_if_written_in_its_file(option: str, count: int) -> None:
    """Fewer workers than written were refused (the job's minAvailable stayed 3); more kept it 3 of
    5 pods; ``Worker`` was no task at all."""
    doc = _doc("pytorchjob.yaml")
    doc["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] = count
    changed = _set("pytorchjob.yaml", f"{option}={count}")
    _same(changed, _read(doc))
    assert changed.job.spec.min_available == count + 1
    world = {
        e["value"]
        for p in expand(changed.job, ClusterAddressing()).pods
        for e in p.manifest["spec"]["containers"][0]["env"]
        if e["name"] == "WORLD_SIZE"
    }
    assert world == {str(count + 1)}
    # the PyTorchJob as read, with the change: what its own target sends to a cluster
    assert changed.job.kind is not None and changed.job.kind.source is not None
    assert changed.job.kind.source["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] == count


def test_a_jobsets_replicated_job_is_set_as_if_written_in_its_file() -> None:
    doc = _doc("jobset.yaml")
    rjob = doc["spec"]["replicatedJobs"][0]
    rjob["replicas"] = 2
    rjob["template"]["spec"]["completions"] = 3
    rjob["template"]["spec"]["parallelism"] = 3
    changed = _set("jobset.yaml", "workers.replicas=2", "workers.completions=3", "workers.parallelism=3")
    _same(changed, _read(doc))
    assert [(t.name, t.replicas) for t in changed.job.spec.tasks] == [("workers-0", 3), ("workers-1", 3)]


@pytest.mark.parametrize("option", ["trainer.numNodes=3", "node-0.replicas=3"])
def test_a_trainjobs_nodes_are_set_as_if_written_in_its_file(option: str) -> None:
    """``node-0.replicas`` (the Volcano task of its nodes, which worked before) is numNodes too."""
    doc = _doc("trainjob.yaml")
    doc["spec"]["trainer"]["numNodes"] = 3
    doc["spec"]["trainer"]["numProcPerNode"] = 2
    _same(_set("trainjob.yaml", option, "trainer.numProcPerNode=2"), _read(doc))


def test_the_volcano_jobs_tasks_and_fields_still_take_a_set() -> None:
    """What worked before a kind had names of its own: a task's maxRetry and replicas, the job's
    fields; a Job of a JobSet made smaller no longer trips the set's own minAvailable."""
    changed = _set("pytorchjob.yaml", "worker.maxRetry=5", "Master.maxRetry=4", "queue=q")
    tasks = {t.name: t.max_retry for t in changed.job.spec.tasks}
    assert tasks == {"master": 4, "worker": 5} and changed.job.spec.queue == "q"
    smaller = _set("jobset.yaml", "workers-0.replicas=1")
    assert [(t.name, t.replicas) for t in smaller.job.spec.tasks] == [("workers-0", 1)]
    assert smaller.job.spec.min_available == 1


def _said(run_main: Callable[..., Ran], file: str, option: str) -> str:
    result = run_main("run", "--dry-run", str(KINDS / file), "--set", option)
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stdout == "" and "Traceback" not in result.stderr
    (line,) = result.stderr.splitlines()
    return str(line)


@pytest.mark.parametrize(
    ("file", "option", "message"),
    [
        (
            "pytorchjob.yaml",
            "Chief.replicas=2",
            "--set: the PyTorchJob has no replica type 'Chief' (it has Master, Worker)",
        ),
        (
            "pytorchjob.yaml",
            "Worker.restartPolicy=Never",
            "--set: 'restartPolicy': the fields of a replica type that can be set are replicas, "
            "minAvailable, maxRetry",
        ),
        (
            "pytorchjob.yaml",
            "Worker.replicas=0",
            "spec.pytorchReplicaSpecs.Worker.replicas: --set Worker.replicas=0: expected at least 1 "
            "replica, got 0",
        ),
        (
            "jobset.yaml",
            "driver.replicas=1",
            "--set: the JobSet has no replicated job 'driver' (it has workers)",
        ),
        (
            "jobset.yaml",
            "workers.backoffLimit=1",
            "--set: 'backoffLimit': the fields of a replicated job that can be set are replicas, "
            "parallelism, completions",
        ),
        (
            "jobset.yaml",
            "workers.replicas=-1",
            "spec.replicatedJobs[0].replicas: --set workers.replicas=-1: expected an integer >= 0, got -1",
        ),
        (
            "jobset.yaml",
            "workers-0.replicas=-1",
            "spec.replicatedJobs[0].template.spec.completions: --set workers-0.replicas=-1: expected an "
            "integer >= 0, got -1",
        ),
        (
            "trainjob.yaml",
            "trainer.image=x",
            "--set: 'trainer.image' is not a field of the TrainJob that can be set; it takes "
            "trainer.numNodes, trainer.numProcPerNode",
        ),
        (
            "trainjob.yaml",
            "trainer.numNodes=0",
            "spec.trainer.numNodes: --set trainer.numNodes=0: expected at least 1 node, got 0",
        ),
    ],
)
def test_a_set_the_kind_refuses_is_told_in_its_words_as_the_options(
    run_main: Callable[..., Ran], file: str, option: str, message: str
) -> None:
    assert _said(run_main, file, option) == f"<command line>: {message}"


def test_a_kind_in_a_list_is_set_and_told_at_its_item(tmp_path: Path, run_main: Callable[..., Ran]) -> None:
    rendered = run_main("render", "--target", "kubeflow", str(KINDS / "pytorchjob.yaml"))
    assert rendered.returncode == 0, rendered.stderr
    file = tmp_path / "list.yaml"
    file.write_text(rendered.stdout)
    result = run_main("run", "--dry-run", str(file), "--set", "Worker.replicas=0")
    assert result.returncode == 2
    assert result.stderr == (
        "<command line>: items[0].spec.pytorchReplicaSpecs.Worker.replicas: --set Worker.replicas=0: "
        "expected at least 1 replica, got 0\n"
    )
    (item,) = load_jobs_from_text(rendered.stdout, "list.yaml")
    changed = apply(item, Overrides(sets=["Worker.replicas=3"]))
    assert [(t.name, t.replicas) for t in changed.job.spec.tasks] == [("master", 1), ("worker", 3)]
