"""Types and ranges of the pod-template fields an engine reads, as the Kubernetes API checks them.

The pod template stays a plain dictionary that torchjob passes on (see :mod:`torchjob.spec.model`),
but the local engine reads a good part of it to start processes: env sources, resources, volumes,
the grace period. Every such value is checked here, so that what ``validate`` accepts an engine
can start or refuse cleanly, and so that what Kubernetes would refuse is refused before a submit.
Parsing (:mod:`torchjob.spec.parse`) has already reported the basic types (strings, lists of
mappings); these checks skip a value of the wrong shape rather than report it twice.
"""

from __future__ import annotations

from torchjob.errors import Issue
from torchjob.spec.names import is_env_name
from torchjob.spec.parse import number_text, type_name
from torchjob.spec.source import INT64_MAX, child
from torchjob.spec.units import parse_quantity
from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any

Issues = list[Issue]

# Linux's MAX_ARG_STRLEN: execve refuses (E2BIG, a container exit 126) any argument or
# ``NAME=value`` environment string longer than this, counting its final NUL byte.
MAX_EXEC_STRING = 32 * 4096
# The API server's limit on the total size of an object's annotations (keys and values).
MAX_ANNOTATIONS = 256 * 1024

# The downward API fields an env var may read through ``fieldRef`` (the engine resolves each).
FIELD_PATHS = (
    "metadata.name", "metadata.namespace", "metadata.uid", "spec.nodeName", "spec.serviceAccountName",
    "status.hostIP", "status.hostIPs", "status.podIP", "status.podIPs",
)  # fmt: skip
_FIELD_MAPS = ("metadata.labels", "metadata.annotations")
# ``resourceFieldRef``: which resources, and the divisors Kubernetes allows for each.
_RESOURCES = ("cpu", "memory", "ephemeral-storage")
_CPU_DIVISORS = (1.0, 1e-3)
_SIZE_DIVISORS = (1.0, 1e3, 1e6, 1e9, 1e12, 1e15, 1e18, 2.0**10, 2.0**20, 2.0**30, 2.0**40, 2.0**50, 2.0**60)
_VALUE_SOURCES = ("fieldRef", "resourceFieldRef", "configMapKeyRef", "secretKeyRef")
_ENV_FROM_SOURCES = ("configMapRef", "secretRef")


def check_annotations(annotations: Any, path: str) -> Issues:
    """Kubernetes' limit on the total size of ``annotations`` (a mapping; anything else is skipped)."""
    if not isinstance(annotations, dict):
        return []
    size = sum(len(str(k).encode("utf-8", "replace")) for k in annotations)
    size += sum(len(v.encode("utf-8", "replace")) for v in annotations.values() if isinstance(v, str))
    if size > MAX_ANNOTATIONS:
        return [
            Issue(
                child(path, "annotations"),
                f"annotations take {size} bytes in all; Kubernetes allows at most {MAX_ANNOTATIONS}",
            )
        ]
    return []


def check_nul(value: Any, path: str) -> Issues:
    """Every text (key or value) under ``value`` with a NUL character, which no process can be given."""
    issues: Issues = []
    stack: list[tuple[str, Any]] = [(path, value)]
    while stack:  # iterative: the depth is bounded by the loader, but this costs nothing
        where, item = stack.pop()
        if isinstance(item, str):
            if "\0" in item:
                issues.append(
                    Issue(
                        where,
                        "contains a NUL character, which no argument, environment variable or path can hold",
                    )
                )
        elif isinstance(item, dict):
            for key, inner in item.items():
                stack.append((child(where, str(key)), inner))
                if isinstance(key, str) and "\0" in key:
                    issues.append(Issue(child(where, key), "the key contains a NUL character"))
        elif isinstance(item, list):
            stack.extend((child(where, i), inner) for i, inner in enumerate(item))
    issues.reverse()  # in the order they were written
    return issues


def check_template(template: Any, path: str) -> Issues:
    """Every value of a pod template an engine reads, checked for type and range."""
    if not isinstance(template, dict):
        return []
    issues = check_nul(template, path)
    meta = template.get("metadata")
    if isinstance(meta, dict):
        issues += check_annotations(meta.get("annotations"), child(path, "metadata"))
    spec = template.get("spec")
    if not isinstance(spec, dict):
        return issues
    spath = child(path, "spec")
    issues += _grace_period(spec, spath)
    issues += _string(spec, "serviceAccountName", spath)
    volumes = spec.get("volumes")
    if isinstance(volumes, list):
        for i, volume in enumerate(volumes):
            if isinstance(volume, dict):
                issues += _volume(volume, child(child(spath, "volumes"), i))
    for key in ("initContainers", "containers"):
        containers = spec.get(key)
        if isinstance(containers, list):
            for i, container in enumerate(containers):
                if isinstance(container, dict):
                    issues += _container(container, child(child(spath, key), i))
    return issues


def _grace_period(spec: dict[str, Any], path: str) -> Issues:
    key = "terminationGracePeriodSeconds"
    value = spec.get(key)
    if value is None:
        return []
    if isinstance(value, bool) or not isinstance(value, int):
        return [Issue(child(path, key), f"expected a whole number of seconds, got {_kind(value)}")]
    if not 0 <= value <= INT64_MAX:
        return [
            Issue(
                child(path, key), f"expected a number of seconds from 0 to {INT64_MAX}, got {_shown(value)}"
            )
        ]
    return []


def _volume(volume: dict[str, Any], path: str) -> Issues:
    issues: Issues = []
    for key in ("configMap", "emptyDir", "hostPath"):
        if key in volume and volume[key] is not None and not isinstance(volume[key], dict):
            issues.append(Issue(child(path, key), f"expected a mapping, got {_kind(volume[key])}"))
    config_map = volume.get("configMap")
    if isinstance(config_map, dict):
        issues += _string(config_map, "name", child(path, "configMap"))
        issues += _boolean(config_map, "optional", child(path, "configMap"))
    host_path = volume.get("hostPath")
    if "hostPath" in volume and host_path is None:
        issues.append(Issue(child(path, "hostPath"), "expected a mapping with a path, got null"))
    elif isinstance(host_path, dict):
        hpath = child(path, "hostPath")
        value = host_path.get("path")
        if not isinstance(value, str) or not value:
            issues.append(Issue(child(hpath, "path"), f"expected a non-empty path, got {_kind(value)}"))
        issues += _string(host_path, "type", hpath)
    return issues


def _container(container: dict[str, Any], path: str) -> Issues:
    issues: Issues = []
    for key in ("command", "args"):
        items = container.get(key)
        if isinstance(items, list):
            for i, item in enumerate(items):
                if isinstance(item, str):
                    issues += _exec_string(item, child(child(path, key), i), "an argument")
    env = container.get("env")
    if isinstance(env, list):
        for i, var in enumerate(env):
            if isinstance(var, dict):
                issues += _env_var(var, child(child(path, "env"), i))
    issues += _env_from(container.get("envFrom"), child(path, "envFrom"))
    issues += _resources(container.get("resources"), child(path, "resources"))
    mounts = container.get("volumeMounts")
    if isinstance(mounts, list):
        for i, mount in enumerate(mounts):
            if isinstance(mount, dict):
                mpath = child(child(path, "volumeMounts"), i)
                issues += _string(mount, "subPath", mpath) + _boolean(mount, "readOnly", mpath)
                issues += _sub_path(mount.get("subPath"), child(mpath, "subPath"))
    return issues


def _sub_path(value: Any, path: str) -> Issues:
    """Kubernetes refuses a subPath that is absolute or has a '..' part (it would leave the volume)."""
    if not isinstance(value, str) or not value:
        return []
    if value.startswith("/") or ".." in value.split("/"):
        return [Issue(path, f"{value!r} must be a relative path without '..' (as Kubernetes requires)")]
    return []


def _exec_string(text: str, path: str, what: str) -> Issues:
    size = len(text.encode("utf-8", "replace")) + 1
    if size <= MAX_EXEC_STRING:
        return []
    return [
        Issue(
            path,
            f"{text[:20]!r}... is {size} bytes; Linux gives a process {what} of at most "
            f"{MAX_EXEC_STRING} bytes (128 KiB), so the container could not start",
        )
    ]


def _env_var(var: dict[str, Any], path: str) -> Issues:
    name, value = var.get("name"), var.get("value")
    issues: Issues = []
    if isinstance(name, str):
        text = f"{name}={value if isinstance(value, str) else ''}"
        issues += _exec_string(text, child(path, "value" if value else "name"), "an environment string")
    if "valueFrom" not in var:
        return issues
    vpath = child(path, "valueFrom")
    source = var["valueFrom"]
    if not isinstance(source, dict):
        return [
            *issues,
            Issue(vpath, f"expected a mapping with one of {', '.join(_VALUE_SOURCES)}, got {_kind(source)}"),
        ]
    if value:
        issues.append(Issue(vpath, "give either value or valueFrom, not both"))
    given = [key for key in _VALUE_SOURCES if key in source]
    if len(given) != 1:
        what = "only one" if given else "one"
        return [*issues, Issue(vpath, f"expected {what} of {', '.join(_VALUE_SOURCES)}, got {_keys(source)}")]
    key = given[0]
    ref = source[key]
    rpath = child(vpath, key)
    if not isinstance(ref, dict):
        return [*issues, Issue(rpath, f"expected a mapping, got {_kind(ref)}")]
    if key == "fieldRef":
        return issues + _field_ref(ref, rpath)
    if key == "resourceFieldRef":
        return issues + _resource_ref(ref, rpath)
    issues += _string(ref, "name", rpath) + _boolean(ref, "optional", rpath)
    if not isinstance(ref.get("key"), str) or not ref["key"]:
        issues.append(Issue(child(rpath, "key"), f"expected the key to read, got {_kind(ref.get('key'))}"))
    return issues


def _field_ref(ref: dict[str, Any], path: str) -> Issues:
    issues = _string(ref, "apiVersion", path)
    field_path = ref.get("fieldPath")
    if not isinstance(field_path, str):
        return [
            *issues,
            Issue(
                child(path, "fieldPath"),
                f"expected a field path such as 'metadata.name', got {_kind(field_path)}",
            ),
        ]
    prefix, bracket, rest = field_path.partition("['")
    keyed = prefix in _FIELD_MAPS and bracket and rest.endswith("']") and len(rest) > 2
    if field_path not in FIELD_PATHS and not keyed:
        supported = ", ".join([*FIELD_PATHS, "metadata.labels['KEY']", "metadata.annotations['KEY']"])
        issues.append(
            Issue(
                child(path, "fieldPath"),
                f"{field_path!r} is not a field an env var can read; expected one of {supported}",
            )
        )
    return issues


def _resource_ref(ref: dict[str, Any], path: str) -> Issues:
    issues = _string(ref, "containerName", path)
    resource = ref.get("resource")
    kind, _, name = resource.partition(".") if isinstance(resource, str) else ("", "", "")
    known = kind in ("limits", "requests") and (name in _RESOURCES or name.startswith("hugepages-"))
    if not known:
        choices = ", ".join(f"{k}.{r}" for k in ("limits", "requests") for r in _RESOURCES)
        issues.append(Issue(child(path, "resource"), f"expected one of {choices}, got {_kind(resource)}"))
    if "divisor" not in ref or ref["divisor"] is None:
        return issues
    try:
        divisor = parse_quantity(ref["divisor"])
    except ValueError as err:
        return [*issues, Issue(child(path, "divisor"), str(err))]
    allowed = _CPU_DIVISORS if name == "cpu" else _SIZE_DIVISORS
    if known and not any(abs(divisor - d) <= d * 1e-9 for d in allowed):
        good = "1m or 1" if name == "cpu" else "1, 1k, 1M, 1G, 1T, 1P, 1E, 1Ki, 1Mi, 1Gi, 1Ti, 1Pi or 1Ei"
        issues.append(Issue(child(path, "divisor"), f"expected {good} for {name}, got {ref['divisor']!r}"))
    return issues


def _env_from(value: Any, path: str) -> Issues:
    if value is None:
        return []
    if not isinstance(value, list):
        return [Issue(path, f"expected a list of sources (configMapRef or secretRef), got {_kind(value)}")]
    issues: Issues = []
    for i, source in enumerate(value):
        spath = child(path, i)
        if not isinstance(source, dict):
            issues.append(
                Issue(spath, f"expected a mapping with configMapRef or secretRef, got {_kind(source)}")
            )
            continue
        issues += _string(source, "prefix", spath)
        prefix = source.get("prefix")
        if isinstance(prefix, str) and prefix and not is_env_name(prefix):  # Kubernetes checks it so
            issues.append(
                Issue(child(spath, "prefix"), f"{prefix!r} is not a valid environment variable name")
            )
        given = [key for key in _ENV_FROM_SOURCES if key in source]
        if len(given) != 1:
            what = "only one" if given else "one"
            issues.append(Issue(spath, f"expected {what} of configMapRef, secretRef, got {_keys(source)}"))
            continue
        ref = source[given[0]]
        rpath = child(spath, given[0])
        if not isinstance(ref, dict):
            issues.append(Issue(rpath, f"expected a mapping with a name, got {_kind(ref)}"))
            continue
        issues += _string(ref, "name", rpath) + _boolean(ref, "optional", rpath)
    return issues


def _resources(value: Any, path: str) -> Issues:
    if value is None:
        return []
    if not isinstance(value, dict):
        return [Issue(path, f"expected a mapping of limits and requests, got {_kind(value)}")]
    issues: Issues = []
    for key in ("limits", "requests"):
        amounts = value.get(key)
        kpath = child(path, key)
        if amounts is None:
            continue
        if not isinstance(amounts, dict):
            issues.append(
                Issue(kpath, f"expected a mapping of resource name to quantity, got {_kind(amounts)}")
            )
            continue
        for name, amount in amounts.items():
            try:
                number = parse_quantity(amount)
            except ValueError as err:
                issues.append(Issue(child(kpath, name), str(err)))
                continue
            if number < 0:
                issues.append(Issue(child(kpath, name), f"expected a quantity of at least 0, got {amount!r}"))
    return issues


def _string(data: dict[str, Any], key: str, path: str) -> Issues:
    value = data.get(key)
    if value is None or isinstance(value, str):
        return []
    return [Issue(child(path, key), f"expected a string, got {_kind(value)}")]


def _boolean(data: dict[str, Any], key: str, path: str) -> Issues:
    value = data.get(key)
    if value is None or isinstance(value, bool):
        return []
    return [Issue(child(path, key), f"expected true or false, got {_kind(value)}")]


def _kind(value: Any) -> str:
    """A value for a message, in the parser's words: its type, and the value itself when short."""
    if value is None or isinstance(value, dict | list):
        return type_name(value)
    return f"{type_name(value)} {_shown(value)}"


def _shown(value: Any) -> str:
    text = number_text(value) if isinstance(value, int) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _keys(data: dict[str, Any]) -> str:
    return ", ".join(map(str, data)) if data else "an empty mapping"
