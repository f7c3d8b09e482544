"""Print a desired state as a Kubernetes ``List`` in YAML or JSON, byte-for-byte deterministic."""

from __future__ import annotations

import json
from typing import Any

import yaml

from torchjob.expand import DesiredState

try:
    from yaml import CSafeDumper as _Dumper
except ImportError:  # pragma: no cover - depends on how PyYAML was built
    from yaml import SafeDumper as _Dumper  # type: ignore[assignment]

FORMATS = ("yaml", "json")


def as_list(states: list[DesiredState]) -> dict[str, Any]:
    """Job-level objects first (so ``kubectl apply`` creates the ConfigMap before the pods)."""
    items: list[dict[str, Any]] = []
    for state in states:
        items.extend(state.objects)
        items.extend(p.manifest for p in state.pods)
    return {"apiVersion": "v1", "kind": "List", "items": items}


def dump(obj: Any, fmt: str) -> str:
    if fmt == "json":
        return json.dumps(obj, indent=2) + "\n"
    if fmt == "yaml":
        return str(yaml.dump(obj, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=1_000_000))
    raise ValueError(f"unknown output format {fmt!r}; expected one of {', '.join(FORMATS)}")
