"""A pod template's rules that the API server and Volcano's webhook enforce beyond its schema.

Label and annotation keys and label values (the job's metadata too); ``hostname`` and
``subdomain``; ``hostAliases`` (IP addresses and DNS-1123 hostnames: lines of a pod's hosts file
are made of them); volume names (DNS-1123 labels, unique: a name also becomes a directory
locally); container names (unique in the pod), images, volume mount and env names. Field names,
types and value sets are the schema's (:mod:`.podschema`).
"""

from __future__ import annotations

from torchjob.errors import Issue
from torchjob.spec import names
from torchjob.spec.source import child

Issues = list[Issue]


def check_metadata(labels: dict[str, str], annotations: dict[str, str], path: str) -> Issues:
    """Label and annotation keys and label values the API server accepts."""
    issues: Issues = []
    for key, value in labels.items():
        if not names.is_qualified_name(key):
            issues.append(Issue(child(child(path, "labels"), key), f"{key!r} is not a valid label key"))
        elif not names.is_label_value(value):
            issues.append(
                Issue(
                    child(child(path, "labels"), key),
                    f"{value!r} is not a valid label value: at most 63 of letters, digits, '-', '_' and '.', "
                    "starting and ending with a letter or digit",
                )
            )
    for key in annotations:
        if not names.is_qualified_name(key):
            issues.append(
                Issue(child(child(path, "annotations"), key), f"{key!r} is not a valid annotation key")
            )
    return issues


def _validate_host_aliases(aliases: object, path: str) -> Issues:
    """Kubernetes' rules: each ``ip`` an IP address, each hostname a DNS-1123 subdomain (lines of
    the pod's hosts file are made of them: no space or newline may slip in)."""
    if not isinstance(aliases, list) or not aliases:
        return []
    import ipaddress  # here: only a template with hostAliases needs it

    issues: Issues = []
    for i, alias in enumerate(aliases):
        if not isinstance(alias, dict):
            continue  # the schema says what it should be
        ip = alias.get("ip")
        if isinstance(ip, str):
            try:
                ipaddress.ip_address(ip)
            except ValueError:
                issues.append(Issue(f"{path}[{i}].ip", f"{ip!r} is not an IP address"))
        hostnames = alias.get("hostnames")
        for j, name in enumerate(hostnames if isinstance(hostnames, list) else []):
            if isinstance(name, str) and not names.is_dns1123_subdomain(name):
                issues.append(
                    Issue(
                        f"{path}[{i}].hostnames[{j}]",
                        f"{name!r} is not a DNS-1123 subdomain: lower-case letters, digits, '-' and '.'",
                    )
                )
    return issues


def check_template_names(template: dict[str, object], path: str) -> Issues:
    issues = _check_template_metadata(template.get("metadata"), f"{path}.metadata")
    spec = template.get("spec")
    if not isinstance(spec, dict):
        return issues
    # Field names, types and value sets (restartPolicy, ...) are the schema's: podschema.check_template.
    for key in ("hostname", "subdomain"):
        value = spec.get(key)
        if isinstance(value, str) and value and not names.is_dns1123_label(value):
            issues.append(Issue(f"{path}.spec.{key}", names.label_problem(value)))
    issues += _validate_host_aliases(spec.get("hostAliases"), f"{path}.spec.hostAliases")
    issues += _validate_volume_names(spec, path)
    container_names: dict[str, str] = {}
    for key in ("initContainers", "containers"):
        containers = spec.get(key)
        for i, container in enumerate(containers if isinstance(containers, list) else []):
            if isinstance(container, dict):
                issues += _check_container(container, f"{path}.spec.{key}[{i}]", container_names)
    return issues


def _check_template_metadata(meta: object, path: str) -> Issues:
    if not isinstance(meta, dict):
        return []
    labels, annotations = meta.get("labels"), meta.get("annotations")
    return check_metadata(_strings(labels), _strings(annotations), path)


def _strings(mapping: object) -> dict[str, str]:
    """The string values of a mapping (the schema reports the others)."""
    return {k: v for k, v in mapping.items() if isinstance(v, str)} if isinstance(mapping, dict) else {}


def _check_container(container: dict[str, object], cpath: str, seen: dict[str, str]) -> Issues:
    """One container's names and image; ``seen`` gathers container names across the pod."""
    issues = _check_container_name(container.get("name"), cpath, seen)
    image = container.get("image")
    if isinstance(image, str) and not names.is_image_reference(image):
        issues.append(Issue(f"{cpath}.image", names.image_problem(image)))
    issues += _check_mount_names(container.get("volumeMounts"), cpath)
    issues += _check_env_names(container.get("env"), cpath)
    return issues


def _check_container_name(name: object, cpath: str, seen: dict[str, str]) -> Issues:
    if not isinstance(name, str):
        return []
    issues: Issues = []
    if not names.is_dns1123_label(name):
        issues.append(Issue(f"{cpath}.name", names.label_problem(name)))
    elif name in seen:
        issues.append(Issue(f"{cpath}.name", f"duplicate container name {name!r} (also {seen[name]})"))
    seen.setdefault(name, cpath)
    return issues


def _check_mount_names(mounts: object, cpath: str) -> Issues:
    issues: Issues = []
    for j, mount in enumerate(mounts if isinstance(mounts, list) else []):
        name = mount.get("name") if isinstance(mount, dict) else None
        if isinstance(name, str) and not names.is_dns1123_label(name):
            issues.append(Issue(f"{cpath}.volumeMounts[{j}].name", names.label_problem(name)))
    return issues


def _check_env_names(env: object, cpath: str) -> Issues:
    issues: Issues = []
    for j, var in enumerate(env if isinstance(env, list) else []):
        name = var.get("name") if isinstance(var, dict) else None
        if isinstance(name, str) and not names.is_env_name(name):
            issues.append(
                Issue(f"{cpath}.env[{j}].name", f"{name!r} is not a valid environment variable name")
            )
    return issues


def _validate_volume_names(spec: dict[str, object], path: str) -> Issues:
    """Volume names are DNS-1123 labels, unique in the pod: a name also becomes a directory locally."""
    volumes = spec.get("volumes")
    issues: Issues = []
    seen: dict[str, str] = {}
    for i, volume in enumerate(volumes if isinstance(volumes, list) else []):
        name = volume.get("name") if isinstance(volume, dict) else None
        if not isinstance(name, str):
            continue  # parsing has reported it
        vpath = f"{path}.spec.volumes[{i}].name"
        if not names.is_dns1123_label(name):
            issues.append(Issue(vpath, names.label_problem(name)))
        elif name in seen:
            issues.append(Issue(vpath, f"duplicate volume name {name!r} (also {seen[name]})"))
        seen.setdefault(name, f"{path}.spec.volumes[{i}]")
    return issues
