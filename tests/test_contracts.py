"""The import contracts of pyproject.toml hold for modules that do not exist yet.

A copy of the package gets the imports a new engine or target could bring: a toy engine importing
a sibling engine and torch, a new target importing another target and the kubernetes client, the
kubernetes engine importing flytekit, the package itself importing torch. ``lint-imports``, run on
that copy with the project's own contracts, must break each contract the import goes against,
naming the import; the copy without them keeps every contract.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from support import REPO

LINT = Path(sys.executable).parent / "lint-imports"

pytestmark = pytest.mark.skipif(not LINT.exists(), reason="import-linter is not installed (the dev extra)")

# file in the package -> what is added to it
INJECTED = {
    "engines/toy/__init__.py": "import torch\nimport torchjob.engines.slurm.steps\n",  # a new engine
    "targets/relay.py": "import kubernetes\nimport torchjob.targets.volcano\n",  # a new target
    "engines/kubernetes/phase.py": "import flytekit\n",  # an engine allowed kubernetes, not flytekit
    "__init__.py": "import torch\n",  # the package itself
}
# contract name (as lint-imports prints it) -> the import lines it must name
BROKEN = {
    "torch and flytekit only in the SDK": [
        "torchjob.engines.toy -> torch",
        "torchjob.engines.kubernetes.phase -> flytekit",
        "torchjob -> torch",
    ],
    "the kubernetes client only in the kubernetes engine": ["torchjob.targets.relay -> kubernetes"],
    "engines are independent of each other": ["torchjob.engines.toy -> torchjob.engines.slurm.steps"],
    "targets are independent of each other (they share target_api)": [
        "torchjob.targets.relay -> torchjob.targets.volcano"
    ],
}


def lint(package_root: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    """lint-imports with the project's contracts, on the package found under ``package_root``."""
    env = {**os.environ, "PYTHONPATH": str(package_root)}
    return subprocess.run(
        [str(LINT), "--no-cache", str(REPO / "pyproject.toml")],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_every_contract_catches_an_import_a_new_module_could_bring(tmp_path: Path) -> None:
    root = tmp_path / "src"
    shutil.copytree(
        REPO / "src" / "torchjob", root / "torchjob", ignore=shutil.ignore_patterns("__pycache__")
    )
    kept = lint(root, tmp_path)
    assert kept.returncode == 0, kept.stdout + kept.stderr
    for file, lines in INJECTED.items():
        path = root / "torchjob" / file
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as out:
            out.write("\n" + lines)
    broken = lint(root, tmp_path)
    assert broken.returncode != 0
    report = broken.stdout
    for contract, imports in BROKEN.items():
        assert f"{contract} BROKEN" in report, report
        section = report.split(f"\n{contract}\n", 1)[1]  # the contract's own list of what broke it
        for line in imports:
            assert re.search(rf"^-\s+{re.escape(line)} \(l\.", section, re.M), (contract, line, report)
