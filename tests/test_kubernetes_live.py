"""The examples on a real cluster, rendered by torchjob.targets, once per target whose CRD it has.

Skipped unless TORCHJOB_TEST_KUBECONFIG names a kubeconfig (docs/kubernetes.md says how to make a
kind cluster with Volcano, the training operator, Trainer and JobSet). The image the pods run is
TORCHJOB_TEST_IMAGE (default torchjob-examples:latest): it needs torch and this repository at its
working directory (``kind load docker-image`` it first). Jobs go to TORCHJOB_TEST_NAMESPACE
(default: the context's namespace) and are deleted afterwards.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from torchjob.targets import target_names

KUBECONFIG = os.environ.get("TORCHJOB_TEST_KUBECONFIG")
pytestmark = [
    pytest.mark.skipif(not KUBECONFIG, reason="set TORCHJOB_TEST_KUBECONFIG to run against a real cluster"),
    pytest.mark.timeout(1800),
    pytest.mark.slow,
]

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
IMAGE = os.environ.get("TORCHJOB_TEST_IMAGE", "torchjob-examples:latest")
TARGETS = target_names()
# Each example on every target; restart-on-failure counts attempts by Volcano's retry-count
# annotation, which only Volcano sets.
RUNS = [(example, target) for example in ("pytorch-job", "ddp-train") for target in TARGETS]
RUNS.append(("restart-on-failure", "volcano"))


@pytest.fixture(scope="module")
def engine() -> Any:
    pytest.importorskip("kubernetes")
    from torchjob.engine_api.registry import get_engine

    return get_engine(
        "kubernetes", kubeconfig=KUBECONFIG, namespace=os.environ.get("TORCHJOB_TEST_NAMESPACE") or None
    )


def example_text(example: str, name: str, image: str = IMAGE) -> str:
    """The example's YAML with the test image and a name of its own."""
    from torchjob.jobs import load_jobs_from_text

    path = EXAMPLES / f"{example}.yaml"
    text = path.read_text().replace("torchjob-examples:latest", image)
    original = load_jobs_from_text(text, str(path))[0].job.name
    return text.replace(f"name: {original}", f"name: {name}", 1)


def example_job(example: str, name: str, image: str = IMAGE) -> Any:
    from torchjob.jobs import load_jobs_from_text

    return load_jobs_from_text(example_text(example, name, image), f"{example}.yaml")[0].job


def require(engine: Any, target: str) -> None:
    if target != "pods" and target not in engine.discovery.available_targets():
        pytest.skip(f"this cluster has no CRD for target {target}")


@pytest.fixture
def cleanup(engine: Any) -> Iterator[list[str]]:
    names: list[str] = []
    yield names
    from torchjob.engine_api.base import EngineError

    for name in names:
        with contextlib.suppress(EngineError):
            engine.delete([name])


@pytest.mark.parametrize(("example", "target"), RUNS)
def test_the_example_completes(engine: Any, cleanup: list[str], example: str, target: str) -> None:
    from torchjob.engine_api.base import LogQuery, StartOptions

    require(engine, target)
    name = f"live-{example}-{target}-{secrets.token_hex(3)}"[:40]
    cleanup.append(name)
    report = engine.start(
        engine.plan(example_job(example, name), StartOptions(target=target, timeout=1200, quiet=True))
    )
    assert report.phase == "Completed", (report.reason, report.first_failure)
    status = engine.status(name)
    assert status.phase == "Completed" and status.target == target and status.pods
    ranks = sorted(p.rank for p in status.pods if p.rank is not None)
    assert ranks == list(range(len(ranks))), [(p.short, p.rank) for p in status.pods]
    prefixes = {line.prefix.split()[0] for line in engine.logs(name, LogQuery())}
    assert prefixes  # every pod that is still there has a log
    assert engine.delete([name])[0].endswith(f"/{name}")


def test_the_cli_runs_the_example_on_the_cluster(engine: Any, cleanup: list[str], tmp_path: Path) -> None:
    """`torchjob run FILE --engine kubernetes`, the command the README shows, as a user runs it."""
    name = f"live-cli-{secrets.token_hex(3)}"
    cleanup.append(name)
    job_file = tmp_path / "job.yaml"
    job_file.write_text(example_text("pytorch-job", name))
    argv = [sys.executable, "-m", "torchjob", "run", str(job_file), "--engine", "kubernetes"]
    argv += ["--kubeconfig", str(KUBECONFIG)]
    if os.environ.get("TORCHJOB_TEST_NAMESPACE"):
        argv += ["-n", os.environ["TORCHJOB_TEST_NAMESPACE"]]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=1500, check=False)
    assert done.returncode == 0, done.stderr
    assert f"torchjob: job {name} Completed" in done.stderr
    assert " r0 | " in done.stdout  # the master's log, prefixed as in local runs


def test_an_image_that_does_not_exist_fails_fast(engine: Any, cleanup: list[str]) -> None:
    from torchjob.engine_api.base import EngineError, StartOptions

    targets = engine.discovery.available_targets() or ["pods"]
    name = f"live-badimage-{secrets.token_hex(3)}"
    cleanup.append(name)
    job = example_job("pytorch-job", name, image="torchjob.invalid/no-such-image:0")
    with pytest.raises(EngineError, match=r"cannot pull image 'torchjob.invalid/no-such-image:0'"):
        engine.start(engine.plan(job, StartOptions(target=targets[0], timeout=600, quiet=True)))
