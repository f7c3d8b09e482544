"""What kube-apiserver does with a created object's fields: the CRD's schema, and core objects' own.

A custom resource is checked against the ``openAPIV3Schema`` of its CRD (``../shared/crds`` beside
the checkout, ``TORCHJOB_SHARED`` elsewhere), as apiextensions-apiserver does it: fields the schema
does not declare are *unknown* (what an older CRD lacks); with ``fieldValidation=Strict`` they
refuse the object (400, ``strict decoding error: unknown field "spec.x"``), otherwise they are
pruned, with a ``Warning`` header under ``Warn`` (the server's default). What remains must match
the schema's types, enums and bounds (422 Invalid). Core objects (pods, Services, claims) are
checked with kubernetes-validate when it is installed. ``older()`` makes the schema of an older
controller's CRD: the current one without the fields that version lacks.
"""

from __future__ import annotations

import copy
import functools
import os
import re
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parent.parent
SHARED = Path(os.environ.get("TORCHJOB_SHARED") or REPO.parent / "shared")
CRDS = SHARED / "crds"
CRD_FILES = {
    ("batch.volcano.sh/v1alpha1", "Job"): "batch.volcano.sh_jobs.yaml",
    ("kubeflow.org/v1", "PyTorchJob"): "kubeflow.org_pytorchjobs.yaml",
    ("trainer.kubeflow.org/v1alpha1", "TrainJob"): "trainer.kubeflow.org_trainjobs.yaml",
    ("jobset.x-k8s.io/v1alpha2", "JobSet"): "jobset.x-k8s.io_jobsets.yaml",
}


def available() -> bool:
    return CRDS.is_dir()


@functools.cache
def shipped(api_version: str, kind: str) -> dict[str, Any] | None:
    """The served version's schema from the shipped CRD; None when ``../shared`` is not there."""
    name = CRD_FILES.get((api_version, kind))
    if name is None or not (CRDS / name).is_file():
        return None
    crd = yaml.safe_load((CRDS / name).read_text())
    version = api_version.split("/")[1]
    (served,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
    return dict(served["schema"]["openAPIV3Schema"])


def older(api_version: str, kind: str, *missing: str) -> dict[str, Any]:
    """The shipped schema without the fields ``missing`` names (dotted paths, ``[]`` for a list's
    items): the CRD of a controller released before those fields."""
    schema = shipped(api_version, kind)
    assert schema is not None, f"no CRD for {kind} in {CRDS}"
    schema = copy.deepcopy(schema)
    for path in missing:
        node = schema
        parts = path.replace("[]", ".[]").split(".")
        for part in parts[:-1]:
            node = node["items"] if part == "[]" else node["properties"][part]
        del node["properties"][parts[-1]]
    return schema


def _child(schema: dict[str, Any], key: str) -> dict[str, Any] | None:
    """The schema of field ``key`` of an object; None when the schema does not declare it."""
    properties = schema.get("properties")
    if properties is not None and key in properties:
        return dict(properties[key])
    extra = schema.get("additionalProperties")
    if isinstance(extra, dict):
        return extra
    if extra is True or (properties is None and schema.get("type") != "object"):
        return {"x-kubernetes-preserve-unknown-fields": True}
    return None  # a structural schema's object keeps only the fields it declares


def unknown_fields(obj: Any, schema: dict[str, Any], path: str = "") -> list[str]:
    """Paths (``spec.tasks[0].foo``) of the fields of ``obj`` its schema does not declare."""
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return []
    found: list[str] = []
    if isinstance(obj, dict) and (schema.get("type") == "object" or "properties" in schema):
        for key, value in obj.items():
            where = f"{path}.{key}" if path else key
            if not path and key in ("apiVersion", "kind", "metadata"):
                continue  # ObjectMeta is the server's, not the CRD's
            child = _child(schema, key)
            if child is None:
                found.append(where)
            else:
                found += unknown_fields(value, child, where)
    elif isinstance(obj, list) and isinstance(schema.get("items"), dict):
        for i, value in enumerate(obj):
            found += unknown_fields(value, schema["items"], f"{path}[{i}]")
    return found


def prune(obj: Any, schema: dict[str, Any], top: bool = True) -> Any:
    """``obj`` without the fields its schema does not declare (what the server stores)."""
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return obj
    if isinstance(obj, dict) and (schema.get("type") == "object" or "properties" in schema):
        out = {}
        for key, value in obj.items():
            if top and key in ("apiVersion", "kind", "metadata"):
                out[key] = value
                continue
            child = _child(schema, key)
            if child is not None:
                out[key] = prune(value, child, False)
        return out
    if isinstance(obj, list) and isinstance(schema.get("items"), dict):
        return [prune(value, schema["items"], False) for value in obj]
    return obj


@functools.cache
def _validator(key: str, schema_text: str) -> Any:
    import json

    import jsonschema

    schema = json.loads(schema_text)
    schema.get("properties", {}).pop("metadata", None)
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft7Validator)
    return cls(schema)


def invalid(obj: dict[str, Any], schema: dict[str, Any]) -> list[str]:
    """What the server's schema validation says of a (pruned) object: ``path: message`` each."""
    import json

    validator = _validator(f"{obj.get('apiVersion')}/{obj.get('kind')}", json.dumps(schema, sort_keys=True))
    errors = sorted(validator.iter_errors(obj), key=lambda e: [str(p) for p in e.absolute_path])
    return [f"{_dotted(e.absolute_path)}: Invalid value: {e.message}" for e in errors]


def _dotted(path: Any) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


CORE_VERSIONS = ("v1", "batch/v1", "networking.k8s.io/v1")
_UNEXPECTED = re.compile(r"'([^']+)' was unexpected")


def core_problems(obj: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(unknown fields, other problems) of a core object, by kubernetes-validate; none without it."""
    if obj.get("apiVersion") not in CORE_VERSIONS:
        return [], []
    try:
        import kubernetes_validate
    except ImportError:
        return [], []
    try:
        kubernetes_validate.validate(obj, kubernetes_validate.latest_version(), strict=True)
    except kubernetes_validate.ValidationError as err:
        where = _dotted(err.path)
        names = _UNEXPECTED.findall(str(err.message))
        if "Additional properties" in str(err.message) and names:
            return [f"{where}.{n}" if where else n for n in names], []
        return [], [f"{where}: Invalid value: {err.message}"]
    except Exception:  # a kind kubernetes-validate has no schema for
        return [], []
    return [], []
