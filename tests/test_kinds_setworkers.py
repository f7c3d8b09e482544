"""A JobSet of a one-pod driver and a replicated job of several Jobs of workers, rendered for the
targets that need a master and one task of workers (``kubeflow``, ``trainjob``;
target_api/setworkers.py): converted where every worker pod sees what it saw in the JobSet (its
rank, the world, the master), refused in one line at the replicated job where it would not.

The JobSet runs here as JobSet would run it, and the PyTorchJob rendered from it too: the same
three ranks, verified by real torch (gloo, CPU)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from support import Ran

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.timeout(240)
SHARED = (REPO.parent / "shared" / "crds").is_dir() or bool(os.environ.get("TORCHJOB_SHARED"))

GLOBAL_INDEX = "metadata.annotations['jobset.sigs.k8s.io/job-global-index']"


def _jobset(rank: str = GLOBAL_INDEX, world: str = "3", command: Any = None, **spec: Any) -> str:
    """A driver and 2 Jobs of workers, one pod each; RANK the Job's global index (0, 1, 2)."""
    container = {
        "name": "pytorch",
        "image": "torchjob-examples:latest",
        "ports": [{"containerPort": 3389}],
        "env": [
            {"name": "MASTER_ADDR", "value": "ddp-driver-0-0.ddp"},
            {"name": "MASTER_PORT", "value": "3389"},
            {"name": "WORLD_SIZE", "value": world},
            {"name": "RANK", "valueFrom": {"fieldRef": {"fieldPath": rank}}},
        ],
        "command": command or ["python", "examples/programs/sendrecv.py"],
    }

    def rjob(name: str, replicas: int) -> dict[str, Any]:
        pod = {"spec": {"containers": [container]}}
        return {
            "name": name,
            "replicas": replicas,
            "template": {"spec": {"backoffLimit": 0, "template": pod}},
        }

    doc = {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": "ddp"},
        "spec": {**spec, "replicatedJobs": [rjob("driver", 1), rjob("workers", 2)]},
    }
    return yaml.safe_dump(doc, sort_keys=False)


def _write(tmp_path: Path, text: str) -> Path:
    file = tmp_path / "ddp.yaml"
    file.write_text(text)
    return file


@pytest.mark.skipif(not SHARED, reason="the CRD schemas (../shared/crds) are not beside the checkout")
@pytest.mark.parametrize("target", ["kubeflow", "trainjob"])
def test_every_worker_of_the_converted_set_sees_the_sets_world(target: str) -> None:
    from controllers.cluster import simulated
    from controllers.dns import resolve
    from controllers.envs import processes
    from torchjob.jobs import load_jobs_from_text
    from torchjob.targets import for_cluster

    (loaded,) = load_jobs_from_text(_jobset(), "ddp.yaml")
    objects = for_cluster(loaded.job, target, "default").objects
    with simulated(objects, target) as api:  # created as a client would, schema checked strictly
        pods = api.objects_of("v1", "Pod")
        ranked = [p for pod in pods for p in processes(pod, api) if p.rank is not None]
        assert sorted(p.rank for p in ranked) == [0, 1, 2]
        assert {p.world_size for p in ranked} == {3}
        ((address, _),) = {(p.master_addr, p.master_port) for p in ranked}
        rank0 = next(p.pod for p in ranked if p.rank == 0)
        assert [q["metadata"]["name"] for q in resolve(api, "default", str(address))] == [rank0]


def _refused(run_main: Callable[..., Ran], file: Path, target: str) -> str:
    """What ``render --target`` and ``validate --target`` say of ``file``: one line, exit 2."""
    said = []
    for command in ("render", "validate"):
        result = run_main(command, "--target", target, str(file))
        assert result.returncode == 2, (command, result.stdout + result.stderr)
        assert result.stdout == "" and "Traceback" not in result.stderr
        said += [line for line in result.stderr.splitlines() if ": warning: " not in line]
    first, again = said
    assert first == again
    return str(first)


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        (
            _jobset(rank="metadata.annotations['jobset.sigs.k8s.io/job-index']"),
            "RANK is 0 in pod 0 of Job 0, where the target gives it 1 (the master is 0, the workers "
            "follow in order)",
        ),
        (_jobset(world="2"), "WORLD_SIZE is 2, where the target gives 3"),
        (
            _jobset(command=["sh", "-c", "exec python examples/programs/sendrecv.py $JOB_COMPLETION_INDEX"]),
            "their pods read their Job's index or completion index (JOB_COMPLETION_INDEX or a JobSet "
            "label), which the target's workers do not have",
        ),
        (
            _jobset(successPolicy={"operator": "Any", "targetReplicatedJobs": ["workers"]}),
            "the set completes with any one of its Jobs (successPolicy), not with its workers",
        ),
    ],
)
def test_workers_the_target_would_change_are_refused_at_their_replicated_job(
    tmp_path: Path, run_main: Callable[..., Ran], text: str, reason: str
) -> None:
    file = _write(tmp_path, text)
    line = file.read_text().splitlines().index("  - name: workers") + 1
    for target in ("kubeflow", "trainjob"):
        assert _refused(run_main, file, target) == (
            f"{file}:{line}: spec.replicatedJobs[1]: replicated job 'workers' of 2 Jobs cannot be "
            f"expressed by target {target!r} as its workers: {reason}; use --target pods or volcano or jobset"
        )
    for target in ("volcano", "pods", "jobset"):  # those that need no roles take it as before
        assert run_main("render", "--target", target, str(file)).returncode == 0, target


def _run(home: Path, file: Path) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "torchjob", "run", str(file)],
        env={**os.environ, "TORCHJOB_HOME": str(home)},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=200,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.mark.torch
@pytest.mark.slow
def test_the_set_and_the_pytorchjob_rendered_from_it_run_here_with_the_same_ranks(
    tmp_path: Path, run_main: Callable[..., Ran]
) -> None:
    pytest.importorskip("torch")
    file = _write(tmp_path, _jobset())
    out = _run(tmp_path / "set", file)
    for pod, rank in (("driver-0-0 r0", 0), ("workers-0-0  ", 1), ("workers-1-0  ", 2)):
        assert f"{pod} | sendrecv: rank {rank} OK" in out, out
    assert "sendrecv: all 3 ranks verified" in out
    rendered = run_main("render", "--target", "kubeflow", str(file))
    assert rendered.returncode == 0, rendered.stderr
    converted = tmp_path / "ptj.yaml"
    converted.write_text(rendered.stdout)
    out = _run(tmp_path / "ptj", converted)
    for pod, rank in (("master-0 r0", 0), ("worker-0 r1", 1), ("worker-1 r2", 2)):
        assert f"{pod} | sendrecv: rank {rank} OK" in out, out
    assert "master-0 r0 | sendrecv: all 3 ranks verified" in out
