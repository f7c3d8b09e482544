"""The example job on a real cluster, once per target whose CRD the cluster has.

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
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

KUBECONFIG = os.environ.get("TORCHJOB_TEST_KUBECONFIG")
pytestmark = [
    pytest.mark.skipif(not KUBECONFIG, reason="set TORCHJOB_TEST_KUBECONFIG to run against a real cluster"),
    pytest.mark.timeout(1800),
    pytest.mark.slow,
]

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "pytorch-job.yaml"
IMAGE = os.environ.get("TORCHJOB_TEST_IMAGE", "torchjob-examples:latest")
TARGETS = ("volcano", "kubeflow", "jobset", "trainjob", "pods")


@pytest.fixture(scope="module")
def engine() -> Any:
    pytest.importorskip("kubernetes")
    pytest.importorskip("torchjob.targets")
    from torchjob.engines.registry import get_engine

    return get_engine(
        "kubernetes", kubeconfig=KUBECONFIG, namespace=os.environ.get("TORCHJOB_TEST_NAMESPACE") or None
    )


def example_job(name: str, image: str = IMAGE) -> Any:
    from torchjob.jobs import load_jobs_from_text

    text = EXAMPLE.read_text().replace("torchjob-examples:latest", image)
    text = text.replace("name: pytorch-job", f"name: {name}", 1)
    return load_jobs_from_text(text, str(EXAMPLE))[0].job


@pytest.fixture
def cleanup(engine: Any) -> Iterator[list[str]]:
    names: list[str] = []
    yield names
    from torchjob.engines.base import EngineError

    for name in names:
        with contextlib.suppress(EngineError):
            engine.delete([name])


@pytest.mark.parametrize("target", TARGETS)
def test_the_example_completes(engine: Any, cleanup: list[str], target: str) -> None:
    from torchjob.engines.base import LogQuery, StartOptions

    if target != "pods" and target not in engine.discovery.available_targets():
        pytest.skip(f"this cluster has no CRD for target {target}")
    name = f"live-{target}-{secrets.token_hex(3)}"
    cleanup.append(name)
    report = engine.start(example_job(name), StartOptions(target=target, timeout=1200, quiet=True))
    assert report.phase == "Completed", (report.reason, report.first_failure)
    status = engine.status(name)
    assert status.phase == "Completed" and status.target == target and status.pods
    prefixes = {line.prefix.split()[0] for line in engine.logs(name, LogQuery())}
    assert prefixes  # every pod that is still there has a log
    assert engine.delete([name])[0].endswith(f"/{name}")


def test_an_image_that_does_not_exist_fails_fast(engine: Any, cleanup: list[str]) -> None:
    from torchjob.engines.base import EngineError, StartOptions

    targets = engine.discovery.available_targets() or ["pods"]
    name = f"live-badimage-{secrets.token_hex(3)}"
    cleanup.append(name)
    job = example_job(name, image="torchjob.invalid/no-such-image:0")
    with pytest.raises(EngineError, match=r"cannot pull image 'torchjob.invalid/no-such-image:0'"):
        engine.start(job, StartOptions(target=targets[0], timeout=600, quiet=True))
