"""Settings every test shares.

The tests' jobs use the user's real port registry, as every other torchjob of this user does: a
registry of the test run alone could not see the ports that another copy of the suite, or the
user's own jobs, have reserved but not yet bound. Tests of the registry itself point
TORCHJOB_RUNTIME_DIR at a directory of their own.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

# tools/slurm_cluster.py builds the tests' private Slurm (and a user's, to try the engine).
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))

if TYPE_CHECKING:
    from kubeapi import FakeKubeAPI
    from slurm_cluster import SlurmCluster


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
    """A private Slurm cluster (tools/slurm_cluster.py), stopped by pid after the test; skips
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
