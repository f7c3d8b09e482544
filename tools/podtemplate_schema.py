"""Regenerate src/torchjob/spec/schemas/podtemplate.json from the Volcano Job CRD.

The Volcano Job CRD embeds Kubernetes' full pod template schema (``spec.tasks[].template``);
torchjob checks every task's template against it. This script keeps what the check uses, drops
the rest (defaults, list types), folds subschemas that repeat (the three container kinds, probe
handlers, ...) into named definitions, and adds the value sets the API server enforces in code
rather than in the schema. Rerun it when the CRD is updated:

    .venv/bin/python tools/podtemplate_schema.py ../shared/crds/batch.volcano.sh_jobs.yaml
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
OUTPUT = REPO / "src" / "torchjob" / "spec" / "schemas" / "podtemplate.json"
DEFAULT_CRD = REPO.parent / "shared" / "crds" / "batch.volcano.sh_jobs.yaml"

# What the validator (torchjob.spec.podschema) understands; every other keyword is dropped.
KEPT = {"type", "properties", "additionalProperties", "items", "required", "format", "pattern",
        "x-kubernetes-int-or-string", "x-kubernetes-preserve-unknown-fields", "enum"}  # fmt: skip
# A repeated subschema smaller than this (in JSON characters) stays inline.
FOLD_MIN = 300

# The CRD leaves these value sets to the API server's own validation code, so they are not in the
# schema; these are the values that code accepts (Kubernetes API reference, core/v1).
ENUMS: dict[tuple[str, ...], list[str]] = {
    ("spec", "restartPolicy"): ["Always", "OnFailure", "Never"],
    ("spec", "dnsPolicy"): ["ClusterFirstWithHostNet", "ClusterFirst", "Default", "None"],
    ("spec", "preemptionPolicy"): ["PreemptLowerPriority", "Never"],
    ("spec", "tolerations", "[]", "operator"): ["Exists", "Equal"],
    ("spec", "tolerations", "[]", "effect"): ["NoSchedule", "PreferNoSchedule", "NoExecute"],
    ("spec", "initContainers", "[]", "restartPolicy"): ["Always"],
}
for _kind in ("containers", "initContainers", "ephemeralContainers"):
    ENUMS[("spec", _kind, "[]", "imagePullPolicy")] = ["Always", "Never", "IfNotPresent"]
    ENUMS[("spec", _kind, "[]", "terminationMessagePolicy")] = ["File", "FallbackToLogsOnError"]
    ENUMS[("spec", _kind, "[]", "ports", "[]", "protocol")] = ["TCP", "UDP", "SCTP"]


def template_schema(crd: dict[str, Any]) -> dict[str, Any]:
    (version,) = [v for v in crd["spec"]["versions"] if v.get("storage")]
    schema = version["schema"]["openAPIV3Schema"]
    for key in ("spec", "tasks", "items", "template"):
        schema = schema["items"] if key == "items" else schema["properties"][key]
    return schema  # type: ignore[no-any-return]


def strip(schema: dict[str, Any], kept: frozenset[str] | set[str] = KEPT) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key not in kept:
            continue
        if key == "properties":
            value = {name: strip(sub, kept) for name, sub in sorted(value.items())}
        elif key in ("items", "additionalProperties") and isinstance(value, dict):
            value = strip(value, kept)
        out[key] = value
    return out


def add_enums(schema: dict[str, Any]) -> None:
    for path, values in ENUMS.items():
        node = schema
        for part in path:
            node = node["items"] if part == "[]" else node["properties"][part]
        assert node.get("type") == "string", path
        node["enum"] = values


def _children(schema: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    found = [(name, sub) for name, sub in schema.get("properties", {}).items()]
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            found.append((key, schema[key]))
    return found


def fold(schema: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Move repeated large subschemas into definitions, referenced as ``{"$ref": NAME}``."""
    counts: Counter[str] = Counter()

    def count(node: dict[str, Any]) -> None:
        counts[json.dumps(node, sort_keys=True)] += 1
        for _, sub in _children(node):
            count(sub)

    count(schema)
    definitions: dict[str, Any] = {}
    names: dict[str, str] = {}

    def rewrite(node: dict[str, Any], name: str) -> dict[str, Any]:
        text = json.dumps(node, sort_keys=True)
        if counts[text] > 1 and len(text) >= FOLD_MIN:
            if text not in names:
                ref = name if name not in definitions else f"{name}{len(definitions)}"
                names[text] = ref
                definitions[ref] = {}  # reserve the name before the body's own folds
                definitions[ref] = shallow(node, name)
            return {"$ref": names[text]}
        return shallow(node, name)

    def shallow(node: dict[str, Any], name: str = "template") -> dict[str, Any]:
        out = dict(node)
        if "properties" in node:
            out["properties"] = {k: rewrite(v, k) for k, v in node["properties"].items()}
        for key, suffix in (("items", "[]"), ("additionalProperties", "{}")):
            if isinstance(node.get(key), dict):
                out[key] = rewrite(node[key], name + suffix)
        return out

    return shallow(schema), definitions


def build(crd_file: Path) -> dict[str, Any]:
    crd = yaml.safe_load(crd_file.read_text())
    schema = strip(template_schema(crd))
    add_enums(schema)
    root, definitions = fold(schema)
    generator = crd["metadata"].get("annotations", {}).get("controller-gen.kubebuilder.io/version", "?")
    return {
        "source": f"{crd['metadata']['name']} CRD (controller-gen {generator}): spec.tasks[].template",
        "definitions": definitions,
        "schema": root,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("crd", nargs="?", type=Path, default=DEFAULT_CRD, help="the Volcano Job CRD")
    parser.add_argument("-o", "--output", type=Path, default=OUTPUT)
    args = parser.parse_args(argv)
    text = json.dumps(build(args.crd), sort_keys=True, separators=(",", ":")) + "\n"
    args.output.write_text(text)
    print(f"wrote {args.output} ({len(text):,} bytes)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
