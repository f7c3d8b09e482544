"""Regenerate src/torchjob/spec/schemas/kinds.json from the CRDs of the kinds torchjob reads.

torchjob reads Kubeflow's PyTorchJob, Kubeflow Trainer's TrainJob and its runtimes, and JobSet
(spec/kinds/). Each document is checked against the ``openAPIV3Schema`` of its kind's CRD, kept
the way tools/podtemplate_schema.py keeps the Volcano Job's pod template: only what the checker
(torchjob.spec.podschema) understands (and the kinds' own list keys and bounds), repeated
subschemas folded into named definitions. The pod templates inside each kind are left out
(``x-torchjob-podtemplate``): a kind's pod templates become the tasks' templates of the job
torchjob runs and are checked there, against the same pod schema as a Volcano Job's, with their
paths given back in the kind's own terms. ``status`` is not checked.
The runtimes Kubeflow Trainer installs (``runtimes/``: ``torch-distributed``) are kept too, as
data: a TrainJob that names one is read without it in the file.
Rerun it when a CRD is updated:

    .venv/bin/python tools/kinds_schema.py ../shared/crds
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from podtemplate_schema import KEPT, fold, strip

REPO = Path(__file__).resolve().parent.parent
OUTPUT = REPO / "src" / "torchjob" / "spec" / "schemas" / "kinds.json"
DEFAULT_CRDS = REPO.parent / "shared" / "crds"
TEMPLATE = {"x-torchjob-podtemplate": True}
# Beyond the pod template's keywords, the kinds' own limits: lists keyed by a field (one entry per
# key), list and text lengths, number bounds; the API server refuses a document past them.
KINDS_KEPT = KEPT | {"x-kubernetes-list-map-keys", "maxItems", "minLength", "maxLength", "minimum", "maximum"}

# kind -> (CRD file, the path of each pod template inside its schema; "[]" an array's items,
# "{}" a map's values)
RUNTIME_TEMPLATE = ("spec", "template", "spec", "replicatedJobs", "[]", "template", "spec", "template")
KINDS: dict[str, tuple[str, tuple[tuple[str, ...], ...]]] = {
    "PyTorchJob": ("kubeflow.org_pytorchjobs.yaml", (("spec", "pytorchReplicaSpecs", "{}", "template"),)),
    "JobSet": (
        "jobset.x-k8s.io_jobsets.yaml",
        (("spec", "replicatedJobs", "[]", "template", "spec", "template"),),
    ),
    "TrainJob": ("trainer.kubeflow.org_trainjobs.yaml", ()),
    "TrainingRuntime": ("trainer.kubeflow.org_trainingruntimes.yaml", (RUNTIME_TEMPLATE,)),
    "ClusterTrainingRuntime": ("trainer.kubeflow.org_clustertrainingruntimes.yaml", (RUNTIME_TEMPLATE,)),
}


def root_schema(crd: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    (version,) = [v for v in crd["spec"]["versions"] if v.get("storage")]
    group = crd["spec"]["group"]
    return f"{group}/{version['name']}", version["schema"]["openAPIV3Schema"]


def cut_templates(schema: dict[str, Any], paths: tuple[tuple[str, ...], ...]) -> None:
    for path in paths:
        node = schema
        for part in path[:-1]:
            if part == "[]":
                node = node["items"]
            elif part == "{}":
                node = node["additionalProperties"]
            else:
                node = node["properties"][part]
        last = path[-1]
        assert last in node["properties"], path
        node["properties"][last] = dict(TEMPLATE)


def build(crds: Path) -> dict[str, Any]:
    kinds: dict[str, Any] = {}
    versions: dict[str, str] = {}
    sources = []
    for kind, (file, templates) in KINDS.items():
        crd = yaml.safe_load((crds / file).read_text())
        api_version, schema = root_schema(crd)
        schema = dict(schema)
        schema["properties"] = {k: v for k, v in schema["properties"].items() if k != "status"}
        stripped = strip(schema, KINDS_KEPT)
        cut_templates(stripped, templates)
        stripped["properties"]["status"] = {}  # as kubectl prints it; not checked
        kinds[kind] = stripped
        versions[kind] = api_version
        generator = crd["metadata"].get("annotations", {}).get("controller-gen.kubebuilder.io/version", "?")
        sources.append(f"{crd['metadata']['name']} (controller-gen {generator})")
    # Fold across every kind at once: the runtimes share JobSet's spec, every kind its volumes.
    root, definitions = fold({"type": "object", "properties": kinds})
    runtimes = {}
    for file in sorted((crds / "runtimes").glob("*.yaml")):
        runtime = yaml.safe_load(file.read_text())
        runtimes[runtime["metadata"]["name"]] = runtime
    return {
        "source": ", ".join(sources),
        "apiVersions": versions,
        "definitions": definitions,
        "kinds": root["properties"],
        "runtimes": runtimes,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("crds", nargs="?", type=Path, default=DEFAULT_CRDS, help="the directory of CRD files")
    parser.add_argument("-o", "--output", type=Path, default=OUTPUT)
    args = parser.parse_args(argv)
    text = json.dumps(build(args.crds), sort_keys=True, separators=(",", ":")) + "\n"
    args.output.write_text(text)
    print(f"wrote {args.output} ({len(text):,} bytes)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
