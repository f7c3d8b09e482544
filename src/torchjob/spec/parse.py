"""Turn one loaded document into a :class:`Job`, noting every type problem with its field path.

Parsing checks shapes and types only (is ``replicas`` an integer, is ``tasks`` a list); rules that
relate fields to each other live in :mod:`torchjob.spec.validate`. Unknown fields are errors: a
typo such as ``replica:`` must not silently become a default.

A broken entry still yields a placeholder (a task, a policy) so later entries keep their index
and their paths stay right; validation is told which paths were broken and does not pile
follow-on errors on top of them.
"""

from __future__ import annotations

from torchjob.errors import Issue
from torchjob.spec import names
from torchjob.spec.model import (
    API_VERSION,
    KIND,
    DependsOn,
    Job,
    JobSpec,
    Metadata,
    PodTemplate,
    Policy,
    Task,
)
from torchjob.spec.source import child
from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any

Issues = list[Issue]

_ROOT_FIELDS = {"apiVersion", "kind", "metadata", "spec", "status"}
_SPEC_FIELDS = {
    "minAvailable", "minSuccess", "maxRetry", "queue", "schedulerName", "priorityClassName",
    "ttlSecondsAfterFinished", "policies", "plugins", "tasks", "volumes", "networkTopology",
    "runningEstimate",
}  # fmt: skip
_SPEC_PASSTHROUGH = ("volumes", "networkTopology", "runningEstimate")
_TASK_FIELDS = {
    "name", "replicas", "minAvailable", "maxRetry", "policies", "dependsOn", "template",
    "topologyPolicy", "partitionPolicy",
}  # fmt: skip
_TASK_PASSTHROUGH = ("topologyPolicy", "partitionPolicy")
_POLICY_FIELDS = {"event", "events", "action", "exitCode", "timeout"}
_METADATA_FIELDS = {
    "name", "namespace", "labels", "annotations", "generateName", "uid", "resourceVersion",
    "creationTimestamp", "generation", "ownerReferences", "finalizers", "managedFields",
    "deletionTimestamp", "deletionGracePeriodSeconds", "selfLink",
}  # fmt: skip
_INT32_MAX = 2**31 - 1
TOPOLOGY_POLICIES = ("none", "best-effort", "restricted", "single-numa-node")
# Pod spec and container fields torchjob or its plugins read or extend; a null one means "unset".
_POD_LIST_FIELDS = ("containers", "initContainers", "volumes")
_CONTAINER_LIST_FIELDS = ("env", "ports", "volumeMounts", "command", "args")


def type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "list"
    if isinstance(value, dict):
        return "mapping"
    return type(value).__name__


def number_text(value: int) -> str:
    """An integer for a message; Python refuses to print one of over 4,300 digits (the SDK can pass it)."""
    if value.bit_length() <= 256:
        return str(value)
    return f"{'-' if value < 0 else ''}<about {int(value.bit_length() * 0.30103)} digits>"


def _shown(value: Any) -> str:
    """A value for a message: its type, and the value itself when it is short."""
    if isinstance(value, dict | list):
        return type_name(value)
    text = number_text(value) if isinstance(value, int) else repr(value)
    return f"{type_name(value)} {text if len(text) <= 40 else text[:37] + '...'}"


class _Reader:
    def __init__(self) -> None:
        self.issues: Issues = []

    def add(self, path: str, message: str) -> None:
        self.issues.append(Issue(path, message))

    def mapping(
        self, value: Any, path: str, *, required: bool = True, what: str = "a mapping"
    ) -> dict[str, Any] | None:
        if value is None:
            if required:
                self.add(path, f"required field is missing: expected {what}")
            return None
        if not isinstance(value, dict):
            self.add(path, f"expected {what}, got {_shown(value)}")
            return None
        return value

    def unknown(self, data: dict[str, Any], allowed: set[str], path: str) -> None:
        for key in data:
            if key not in allowed:
                import difflib  # only for a mistake: not on every start-up

                # The same words as a pod template's unknown field (spec/podschema.py).
                close = difflib.get_close_matches(key, allowed, n=1)
                listed = f"expected one of {', '.join(sorted(allowed))}"
                hint = f"did you mean {close[0]!r}?" if close else listed
                self.add(child(path, key), f"unknown field {key!r}; {hint}")

    def integer(
        self, data: dict[str, Any], key: str, path: str, *, minimum: int | None = 0, required: bool = False
    ) -> int | None:
        fpath = child(path, key)
        value = data.get(key)
        if value is None:
            if required:
                self.add(fpath, "required field is missing: expected an integer")
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            self.add(fpath, f"expected an integer, got {_shown(value)}")
            return None
        if minimum is not None and value < minimum:
            self.add(fpath, f"expected an integer >= {minimum}, got {number_text(value)}")
            return None
        if value > _INT32_MAX:
            self.add(fpath, f"expected a 32-bit integer (at most {_INT32_MAX}), got {number_text(value)}")
            return None
        return value

    def string(self, data: dict[str, Any], key: str, path: str, *, required: bool = False) -> str | None:
        fpath = child(path, key)
        value = data.get(key)
        if value is None:
            if required:
                self.add(fpath, "required field is missing: expected a string")
            return None
        if not isinstance(value, str):
            self.add(fpath, f"expected a string, got {_shown(value)}")
            return None
        return value

    def string_map(self, data: dict[str, Any], key: str, path: str) -> dict[str, str]:
        fpath = child(path, key)
        value = data.get(key)
        if value is None:
            return {}
        if not isinstance(value, dict):
            self.add(fpath, f"expected a mapping of strings, got {_shown(value)}")
            return {}
        out: dict[str, str] = {}
        for k, v in value.items():
            if not isinstance(v, str):
                self.add(child(fpath, k), f"expected a string value (quote it), got {_shown(v)}")
            else:
                out[k] = v
        return out

    def string_list(self, value: Any, path: str) -> list[str]:
        if value is None:
            return []
        if not isinstance(value, list):
            self.add(path, f"expected a list of strings, got {_shown(value)}")
            return []
        out: list[str] = []
        for i, item in enumerate(value):
            if not isinstance(item, str):
                self.add(child(path, i), f"expected a string (quote it), got {_shown(item)}")
            else:
                out.append(item)
        return out

    def mapping_list(
        self, data: dict[str, Any], key: str, path: str, what: str
    ) -> list[tuple[str, dict[str, Any]]]:
        """The entries of a list of mappings with their paths; a null list means unset and is dropped."""
        fpath = child(path, key)
        if key in data and data[key] is None:
            del data[key]
        value = data.get(key)
        if value is None:
            return []
        if not isinstance(value, list):
            self.add(fpath, f"expected a list of {what}, got {_shown(value)}")
            return []
        out: list[tuple[str, dict[str, Any]]] = []
        for i, item in enumerate(value):
            entry = self.mapping(item, child(fpath, i), what=f"a mapping (one of the {what})")
            if entry is not None:
                out.append((child(fpath, i), entry))
        return out

    def policies(self, value: Any, path: str) -> list[Policy]:
        if value is None:
            return []
        if not isinstance(value, list):
            self.add(path, f"expected a list of policies, got {_shown(value)}")
            return []
        out: list[Policy] = []
        for i, raw in enumerate(value):
            p = child(path, i)
            data = self.mapping(raw, p, what="a policy mapping")
            if data is None:
                out.append(Policy(action=""))  # placeholder: keeps the later indexes right
                continue
            self.unknown(data, _POLICY_FIELDS, p)
            events: list[str] = []
            keys: list[str] = []
            event = self.string(data, "event", p)
            if event is not None:
                events.append(event)
                keys.append("event")
            raw_events = data.get("events")
            for k, item in enumerate(self.string_list(raw_events, child(p, "events"))):
                events.append(item)
                keys.append(child("events", k))
            exit_code = self.integer(data, "exitCode", p, minimum=None)
            action = self.string(data, "action", p, required=True) or ""
            timeout = self.string(data, "timeout", p)
            out.append(Policy(action, events, exit_code, timeout, event_keys=keys))
        return out

    def plugins(self, value: Any, path: str) -> dict[str, list[str]]:
        if value is None:
            return {}
        if not isinstance(value, dict):
            self.add(path, f"expected a mapping of plugin name to a list of flags, got {_shown(value)}")
            return {}
        out: dict[str, list[str]] = {}
        for name, args in value.items():
            out[name] = self.string_list(args, child(path, name))
        return out

    def template(self, value: Any, path: str) -> PodTemplate:
        data = self.mapping(value, path, what="a pod template")
        if data is None:
            return PodTemplate({})
        meta = self.mapping(data.get("metadata"), child(path, "metadata"), required=False)
        if meta is not None:
            for key in ("labels", "annotations"):
                self.string_map(meta, key, child(path, "metadata"))
            self.string(meta, "name", child(path, "metadata"))
        spath = child(path, "spec")
        spec = self.mapping(data.get("spec"), spath, what="a pod spec")
        if spec is None:
            return PodTemplate(data)
        for key in ("initContainers", "containers"):
            if key == "containers" and spec.get(key) is None:
                self.add(child(spath, key), "required field is missing: expected a list of containers")
                continue
            if key == "containers" and spec.get(key) == []:
                self.add(child(spath, key), "expected at least one container")
            for cpath, container in self.mapping_list(spec, key, spath, "containers"):
                self.container(container, cpath)
        for vpath, volume in self.mapping_list(spec, "volumes", spath, "volumes"):
            self.string(volume, "name", vpath, required=True)
        for key in ("hostname", "subdomain", "restartPolicy", "schedulerName", "priorityClassName"):
            self.string(spec, key, spath)
        return PodTemplate(data)

    def container(self, data: dict[str, Any], path: str) -> None:
        for key in _CONTAINER_LIST_FIELDS:
            if key in data and data[key] is None:
                del data[key]
        self.string(data, "name", path, required=True)
        self.string(data, "image", path, required=True)
        self.string(data, "workingDir", path)
        for key in ("command", "args"):
            self.string_list(data.get(key), child(path, key))
        for vpath, var in self.mapping_list(data, "env", path, "name/value entries"):
            self.string(var, "name", vpath, required=True)
            if "value" in var and var["value"] is None:
                del var["value"]  # null means unset (an empty value), as the API server reads it
            self.string(var, "value", vpath)
        for ppath, port in self.mapping_list(data, "ports", path, "ports"):
            number = self.integer(port, "containerPort", ppath, minimum=1, required=True)
            if number is not None and number > 65535:
                self.add(child(ppath, "containerPort"), f"expected a port from 1 to 65535, got {number}")
            self.string(port, "name", ppath)
        for mpath, mount in self.mapping_list(data, "volumeMounts", path, "volume mounts"):
            self.string(mount, "name", mpath, required=True)
            self.string(mount, "mountPath", mpath, required=True)

    def depends_on(self, value: Any, path: str) -> DependsOn | None:
        data = self.mapping(value, path, required=False)
        if data is None:
            return None
        self.unknown(data, {"name", "iteration"}, path)
        names = self.string_list(data.get("name"), child(path, "name"))
        iteration = self.string(data, "iteration", path) or "any"
        if iteration not in ("any", "all"):
            self.add(child(path, "iteration"), f"expected 'any' or 'all', got {iteration!r}")
        return DependsOn(names=names, iteration=iteration)

    def task(self, value: Any, path: str) -> Task:
        data = self.mapping(value, path, what="a task mapping")
        if data is None:  # placeholder: keeps the later indexes right
            return Task(name="", replicas=0, template=PodTemplate({}))
        self.unknown(data, _TASK_FIELDS, path)
        name = self.string(data, "name", path) or ""
        replicas = self.integer(data, "replicas", path, required=True)
        if data.get("template") is None:
            self.add(child(path, "template"), "required field is missing: expected a pod template")
            template = PodTemplate({})
        else:
            template = self.template(data["template"], child(path, "template"))
        self.topology_policy(data, path)
        self.partition_policy(data.get("partitionPolicy"), child(path, "partitionPolicy"))
        return Task(
            name=name,
            replicas=replicas if replicas is not None else 0,
            template=template,
            min_available=self.integer(data, "minAvailable", path),
            max_retry=self.integer(data, "maxRetry", path) or 0,
            policies=self.policies(data.get("policies"), child(path, "policies")),
            depends_on=self.depends_on(data.get("dependsOn"), child(path, "dependsOn")),
            extra={k: data[k] for k in _TASK_PASSTHROUGH if k in data},
        )

    def topology_policy(self, data: dict[str, Any], path: str) -> None:
        policy = self.string(data, "topologyPolicy", path)
        if policy is not None and policy not in TOPOLOGY_POLICIES:
            choices = ", ".join(TOPOLOGY_POLICIES)
            self.add(child(path, "topologyPolicy"), f"expected one of {choices}, got {policy!r}")

    def partition_policy(self, value: Any, path: str) -> None:
        data = self.mapping(value, path, required=False)
        if data is None:
            return
        self.unknown(data, {"totalPartitions", "partitionSize", "minPartitions", "networkTopology"}, path)
        self.integer(data, "totalPartitions", path, minimum=1, required=True)
        self.integer(data, "partitionSize", path, minimum=1, required=True)
        self.integer(data, "minPartitions", path)
        self.mapping(data.get("networkTopology"), child(path, "networkTopology"), required=False)

    def job_volumes(self, spec: dict[str, Any]) -> None:
        """``spec.volumes``: claims Volcano mounts into every pod (the webhook's rules)."""
        mounts: dict[str, str] = {}
        for vpath, volume in self.mapping_list(spec, "volumes", "spec", "volumes"):
            self.unknown(volume, {"mountPath", "volumeClaim", "volumeClaimName"}, vpath)
            mount = self.string(volume, "mountPath", vpath, required=True)
            if mount is not None and (not mount.startswith("/") or ":" in mount):
                self.add(child(vpath, "mountPath"), f"expected an absolute path without ':', got {mount!r}")
            elif mount is not None and mount in mounts:
                self.add(child(vpath, "mountPath"), f"duplicate mountPath {mount!r} (also {mounts[mount]})")
            elif mount is not None:
                mounts[mount] = vpath
            claim = self.string(volume, "volumeClaimName", vpath)
            claim_spec = self.mapping(volume.get("volumeClaim"), child(vpath, "volumeClaim"), required=False)
            if claim is not None and not names.is_dns1123_subdomain(claim):
                self.add(
                    child(vpath, "volumeClaimName"),
                    f"{claim!r} is not a valid claim name (DNS-1123 subdomain)",
                )
            if claim is None and claim_spec is None and "volumeClaim" not in volume:
                self.add(vpath, "expected volumeClaimName (an existing claim) or volumeClaim (a new one)")
            elif claim is not None and claim_spec is not None:
                self.add(
                    vpath,
                    "give either volumeClaimName (an existing claim) or volumeClaim (a new one), not both",
                )

    def tasks(self, spec: dict[str, Any]) -> list[Task]:
        raw_tasks = spec.get("tasks")
        if raw_tasks is None or raw_tasks == []:
            self.add("spec.tasks", "expected at least one task")
            return []
        if not isinstance(raw_tasks, list):
            self.add("spec.tasks", f"expected a list of tasks, got {_shown(raw_tasks)}")
            return []
        return [self.task(raw, child("spec.tasks", i)) for i, raw in enumerate(raw_tasks)]

    def exact(self, root: dict[str, Any], key: str, expected: str) -> None:
        value = root.get(key)
        if value is None:
            self.add(key, f"required field is missing: expected {expected!r}")
        elif value != expected:
            self.add(key, f"expected {expected!r}, got {_shown(value)}")


def parse_job(data: Any) -> tuple[Job | None, Issues]:
    """Build a Job from one document; returns the Job (None if unusable) and the type problems."""
    r = _Reader()
    if not isinstance(data, dict):
        return None, [Issue("", f"expected a Job mapping, got {_shown(data)}")]
    root: dict[str, Any] = data
    r.exact(root, "apiVersion", API_VERSION)
    r.exact(root, "kind", KIND)
    r.unknown(root, _ROOT_FIELDS, "")
    given = r.mapping(root.get("metadata"), "metadata")
    meta = given or {}
    r.unknown(meta, _METADATA_FIELDS, "metadata")
    metadata = Metadata(
        name=r.string(meta, "name", "metadata", required=given is not None) or "",
        namespace=r.string(meta, "namespace", "metadata") or "default",
        labels=r.string_map(meta, "labels", "metadata"),
        annotations=r.string_map(meta, "annotations", "metadata"),
    )
    spec = r.mapping(root.get("spec"), "spec")
    if spec is None:
        return None, r.issues
    r.unknown(spec, _SPEC_FIELDS, "spec")
    r.job_volumes(spec)
    job_spec = JobSpec(
        tasks=r.tasks(spec),
        min_available=r.integer(spec, "minAvailable", "spec") or 0,
        min_success=r.integer(spec, "minSuccess", "spec", minimum=1),
        max_retry=r.integer(spec, "maxRetry", "spec") or 0,
        queue=r.string(spec, "queue", "spec") or "",
        scheduler_name=r.string(spec, "schedulerName", "spec") or "",
        priority_class_name=r.string(spec, "priorityClassName", "spec") or "",
        ttl_seconds_after_finished=r.integer(spec, "ttlSecondsAfterFinished", "spec"),
        policies=r.policies(spec.get("policies"), "spec.policies"),
        plugins=r.plugins(spec.get("plugins"), "spec.plugins"),
        extra={k: spec[k] for k in _SPEC_PASSTHROUGH if k in spec},
    )
    return Job(metadata=metadata, spec=job_spec), r.issues
