"""Every Volcano Job in the seed documents validates and renders through the real CLI.

The seeds live outside the repository, in ``../shared/seeds/`` next to the checkout; the tests skip
when that folder is not there (a fresh clone elsewhere).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from support import Ran

pytestmark = pytest.mark.timeout(120)

REPO = Path(__file__).resolve().parent.parent
SEEDS = REPO.parent / "shared" / "seeds"
_FENCE = re.compile(r"^```ya?ml[ \t]*\n(.*?)^```", re.MULTILINE | re.DOTALL)


def is_volcano_job(text: str) -> bool:
    try:
        docs = list(yaml.safe_load_all(text))
    except yaml.YAMLError:
        return False
    return any(
        isinstance(d, dict)
        and str(d.get("apiVersion", "")).startswith("batch.volcano.sh/")
        and d.get("kind") == "Job"
        for d in docs
    )


def seed_jobs() -> list[Any]:
    if not SEEDS.is_dir():
        return [pytest.param(None, id="no-seeds", marks=pytest.mark.skip(reason=f"{SEEDS} is not there"))]
    found = []
    for path in sorted(SEEDS.glob("*.txt")):
        for n, match in enumerate(_FENCE.finditer(path.read_text(encoding="utf-8"))):
            if is_volcano_job(match.group(1)):
                found.append(pytest.param(match.group(1), id=f"{path.stem}-{n}"))
    return found


def test_the_seeds_hold_volcano_jobs() -> None:
    if not SEEDS.is_dir():
        pytest.skip(f"{SEEDS} is not there")
    assert len(seed_jobs()) >= 3


@pytest.mark.parametrize("text", seed_jobs())
def test_seed_job_validates_and_renders(text: str, tmp_path: Path, run_main: Callable[..., Ran]) -> None:
    path = tmp_path / "seed.yaml"
    path.write_text(text, encoding="utf-8")
    source = yaml.safe_load(text)

    validated = run_main("validate", str(path))
    assert validated.returncode == 0, validated.stderr
    assert validated.stderr == ""
    [summary] = validated.stdout.splitlines()
    assert f"job {source['metadata']['name']}: valid" in summary

    for fmt in ("yaml", "json"):
        rendered = run_main("render", str(path), "-o", fmt)
        assert rendered.returncode == 0, rendered.stderr
        out = yaml.safe_load(rendered.stdout)
        assert out["kind"] == "List"
        pods = [i for i in out["items"] if i["kind"] == "Pod"]
        assert len(pods) == sum(t["replicas"] for t in source["spec"]["tasks"])
        for pod in pods:
            env = {e["name"] for c in pod["spec"]["containers"] for e in c["env"]}
            assert {"MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK"} <= env
        assert {i["kind"] for i in out["items"]} == {"ConfigMap", "Service", "NetworkPolicy", "Pod"}
