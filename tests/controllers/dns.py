"""The cluster's DNS (CoreDNS's kubernetes plugin) for the names a training process dials.

- ``<service>[.<namespace>[.svc[.cluster.local]]]``: a Service of that name; a headless one
  (``clusterIP: None``) answers with the pods its selector matches.
- ``<hostname>.<subdomain>[.<namespace>...]``: the pod whose ``spec.hostname`` and
  ``spec.subdomain`` are those, when a headless Service named after the subdomain selects it.

Readiness is not modelled: a pod that exists is answered (every target here publishes not-ready
addresses or starts its workers after the master). ``resolve`` returns the pods an address
reaches, none when it does not resolve.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from controllers import all_of

if TYPE_CHECKING:
    from kubeapi import FakeKubeAPI

SUFFIXES = (".svc.cluster.local", ".svc")


def _selects(service: dict[str, Any], pod: dict[str, Any]) -> bool:
    selector = (service.get("spec") or {}).get("selector") or {}
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def resolve(api: FakeKubeAPI, namespace: str, address: str) -> list[dict[str, Any]]:
    """The pods ``address`` reaches from a pod in ``namespace`` (none: it does not resolve)."""
    host = address.rstrip(".")
    for suffix in SUFFIXES:
        host = host.removesuffix(suffix)
    parts = host.split(".")
    services = {(s["metadata"]["namespace"], s["metadata"]["name"]): s for s in all_of(api, "v1", "Service")}
    pods = [p for p in all_of(api, "v1", "Pod") if not p["metadata"].get("deletionTimestamp")]
    candidates: list[tuple[str, str | None]] = []  # (service name, pod hostname or None), namespace
    if len(parts) == 1:
        candidates.append((parts[0], None))
    elif len(parts) == 2:
        candidates += [(parts[1], parts[0]), (parts[0], None)]  # host.subdomain, or service.namespace
    elif len(parts) == 3:
        candidates.append((parts[1], parts[0]))
    for service_name, hostname in candidates:
        ns = namespace
        if hostname is None and len(parts) == 2:
            ns = parts[1]
        elif hostname is not None and len(parts) == 3:
            ns = parts[2]
        service = services.get((ns, service_name))
        if service is None:
            continue
        selected = [p for p in pods if p["metadata"].get("namespace") == ns and _selects(service, p)]
        if hostname is None:
            return selected
        found = [
            p
            for p in selected
            if p["spec"].get("hostname") == hostname and p["spec"].get("subdomain") == service_name
        ]
        if found:
            return found
    return []
