"""Settings every test shares."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from kubeapi import FakeKubeAPI
    from slurm_cluster import SlurmCluster


@pytest.fixture(scope="session", autouse=True)
def private_port_registry() -> Iterator[None]:
    """A port registry of this test run alone: jobs of another run (or of the user) that hold the
    declared ports would otherwise move ours, and a test of what a job start loads sees the
    taken-port path. Set in os.environ so that every torchjob the tests start inherits it."""
    old = os.environ.get("TORCHJOB_RUNTIME_DIR")
    with tempfile.TemporaryDirectory(prefix="torchjob-test-registry-") as root:
        os.chmod(root, 0o700)
        os.environ["TORCHJOB_RUNTIME_DIR"] = root
        try:
            yield
        finally:
            if old is None:
                os.environ.pop("TORCHJOB_RUNTIME_DIR", None)
            else:
                os.environ["TORCHJOB_RUNTIME_DIR"] = old


@pytest.fixture
def api() -> Iterator[FakeKubeAPI]:
    """A fake Kubernetes API server on 127.0.0.1 (tests/kubeapi.py), stopped after the test."""
    from kubeapi import FakeKubeAPI

    server = FakeKubeAPI().start()
    yield server
    server.stop()


@pytest.fixture
def kubeconfig(api: FakeKubeAPI, tmp_path: Path) -> str:
    """A kubeconfig file whose current context is ``api``."""
    return str(api.kubeconfig(tmp_path / "kubeconfig"))


@pytest.fixture
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    """A private Slurm cluster (tests/slurm_cluster.py), stopped by pid after the test; skips
    where Slurm is not installed or the tests do not run as root."""
    import slurm_cluster

    reason = slurm_cluster.why_not()
    if reason is not None:
        pytest.skip(reason)
    cluster = slurm_cluster.SlurmCluster(tmp_path_factory.mktemp("slurm") / "cluster")
    try:
        yield cluster.start()
    finally:
        cluster.stop()
