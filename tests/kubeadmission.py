"""What kube-apiserver does to an object before it stores it: its schema, its name, admission.

In the order the server applies them (``admit``):

- the schema (tests/crds.py): a custom resource against its CRD, a core object against its own;
  unknown fields refused under ``fieldValidation=Strict`` (400), else pruned (with a warning under
  ``Warn``, the default); anything else that breaks the schema refused (422);
- names: a Service's must be a DNS-1035 label (the training operator's per-pod Services), a pod's
  hostname a DNS-1123 label, every other name a DNS-1123 subdomain (422);
- the webhooks a controller registers (``FakeKubeAPI.webhooks``): they default fields and may deny
  the object (403, ``admission webhook "..." denied the request: ...``);
- built-in admission plugins: ``StorageObjectInUseProtection`` puts the ``kubernetes.io/pvc-protection``
  finalizer on every claim; ``Priority`` resolves a pod's ``priorityClassName`` to ``spec.priority``
  (a class the cluster lacks is forbidden); and the pod's QoS class (``status.qosClass``), after
  the defaulting that makes a missing request equal to its limit.

Clients' creates go through all of it; controllers' (``FakeKubeAPI.put``) skip the schema, as their
typed clients cannot send unknown fields.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import crds

if TYPE_CHECKING:
    from kubeapi import FakeKubeAPI

PVC_PROTECTION = "kubernetes.io/pvc-protection"
_DNS1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?\Z")
_DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?\Z")
_DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\Z")
# The classes every cluster has (kube-apiserver creates them), and their values.
SYSTEM_PRIORITY_CLASSES = {"system-cluster-critical": 2000000000, "system-node-critical": 2000001000}


class Refused(Exception):
    """The server refuses the object: an HTTP code, a Status reason, a message."""

    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message


def _group_kind(obj: dict[str, Any]) -> str:
    group = str(obj.get("apiVersion", "")).rpartition("/")[0]
    return f"{obj.get('kind')}.{group}" if group else str(obj.get("kind"))


def _invalid(obj: dict[str, Any], problems: list[str]) -> Refused:
    name = (obj.get("metadata") or {}).get("name", "")
    listed = problems[0] if len(problems) == 1 else "[" + ", ".join(problems) + "]"
    return Refused(422, "Invalid", f'{_group_kind(obj)} "{name}" is invalid: {listed}')


def _drop(obj: dict[str, Any], path: str) -> None:
    """Remove the field at ``path`` (``spec.containers[0].foo``) from ``obj``."""
    parts = re.findall(r"[^.\[\]]+|\[\d+\]", path)
    node: Any = obj
    for part in parts[:-1]:
        node = node[int(part[1:-1])] if part.startswith("[") else node[part]
    if isinstance(node, dict):
        node.pop(parts[-1], None)


def check_schema(
    api: FakeKubeAPI, obj: dict[str, Any], validation: str | None
) -> tuple[dict[str, Any], list[str]]:
    """The object as stored (unknown fields pruned) and the warnings to send, or Refused."""
    key = (str(obj.get("apiVersion")), str(obj.get("kind")))
    schema = api.schemas.get(key, crds.shipped(*key) if api.schemas_shipped else None)
    if schema is not None:
        unknown = crds.unknown_fields(obj, schema)
        stored = crds.prune(obj, schema) if unknown else obj
        problems = crds.invalid(stored, schema)
    else:
        unknown, problems = crds.core_problems(obj)
        stored = obj
        for path in unknown:
            _drop(stored, path)
    mode = validation or "Warn"
    if unknown and mode == "Strict":
        kind, version = key[1], key[0].rpartition("/")[2]
        fields = ", ".join(f'unknown field "{p}"' for p in unknown)
        raise Refused(
            400,
            "BadRequest",
            f'{kind} in version "{version}" cannot be handled as a {kind}: strict decoding error: {fields}',
        )
    if problems:
        raise _invalid(stored, problems)
    warnings = [f'unknown field "{p}"' for p in unknown] if mode == "Warn" else []
    return stored, warnings


def check_names(obj: dict[str, Any]) -> None:
    name = str((obj.get("metadata") or {}).get("name") or "")
    kind = obj.get("kind")
    if kind == "Service":
        rule, what, limit = _DNS1035, "a DNS-1035 label", 63
    else:
        rule, what, limit = _DNS1123_SUBDOMAIN, "a lowercase RFC 1123 subdomain", 253
    if len(name) > limit:
        raise _invalid(
            obj, [f'metadata.name: Invalid value: "{name}": must be no more than {limit} characters']
        )
    if not rule.match(name):
        raise _invalid(obj, [f'metadata.name: Invalid value: "{name}": must be {what}'])
    if kind == "Pod":
        hostname = str((obj.get("spec") or {}).get("hostname") or "")
        if hostname and (len(hostname) > 63 or not _DNS1123_LABEL.match(hostname)):
            raise _invalid(
                obj,
                [
                    f'spec.hostname: Invalid value: "{hostname}": '
                    "must be a DNS-1123 label of at most 63 characters"
                ],
            )


def admit(
    api: FakeKubeAPI, obj: dict[str, Any], validation: str | None, *, client: bool
) -> tuple[dict[str, Any], list[str]]:
    """``obj`` as the server stores it, and the warnings for the client; Refused otherwise."""
    warnings: list[str] = []
    if client:
        obj, warnings = check_schema(api, obj, validation)
    check_names(obj)
    for webhook in api.webhooks.get((str(obj.get("apiVersion")), str(obj.get("kind"))), []):
        denied = webhook(obj)
        if denied:
            raise Refused(403, "Forbidden", f"admission webhook denied the request: {denied}")
    if obj.get("kind") == "PersistentVolumeClaim":
        finalizers = obj["metadata"].setdefault("finalizers", [])
        if PVC_PROTECTION not in finalizers:
            finalizers.append(PVC_PROTECTION)
    if obj.get("kind") == "Pod":
        _priority(api, obj)
        obj.setdefault("status", {})["qosClass"] = qos_class(obj["spec"])
    return obj, warnings


def _priority(api: FakeKubeAPI, pod: dict[str, Any]) -> None:
    name = pod["spec"].get("priorityClassName")
    if not name:
        return
    classes = {**SYSTEM_PRIORITY_CLASSES, **api.priority_classes}
    if name not in classes:
        raise Refused(
            403,
            "Forbidden",
            f'pods "{pod["metadata"]["name"]}" is forbidden: no PriorityClass with name {name} was found',
        )
    pod["spec"]["priority"] = classes[name]


def qos_class(spec: dict[str, Any]) -> str:
    """Kubernetes' QoS class of a pod (``GetPodQOS``), after requests are defaulted from limits."""
    guaranteed, anything = True, False
    for container in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
        resources = container.get("resources") or {}
        limits = {k: v for k, v in (resources.get("limits") or {}).items() if k in ("cpu", "memory")}
        requests = {k: v for k, v in (resources.get("requests") or {}).items() if k in ("cpu", "memory")}
        requests = {**limits, **requests}  # a missing request is its limit (core defaulting)
        anything = anything or bool(limits or requests)
        from torchjob.spec.units import parse_quantity

        if set(limits) != {"cpu", "memory"} or any(
            parse_quantity(requests[k]) != parse_quantity(limits[k]) for k in limits
        ):
            guaranteed = False
    if not anything:
        return "BestEffort"
    return "Guaranteed" if guaranteed else "Burstable"
