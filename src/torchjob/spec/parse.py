"""Turn one loaded document into a :class:`Job`, noting every type problem with its field path.

Parsing checks shapes and types only (is ``replicas`` an integer, is ``tasks`` a list); rules that
relate fields to each other live in :mod:`torchjob.spec.validate`. Unknown fields are errors: a
typo such as ``replica:`` must not silently become a default.
"""

from __future__ import annotations

from typing import Any

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

Issues = list[tuple[str, str]]  # (field path, message)

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
}  # fmt: skip
_INT32_MAX = 2**31 - 1


def _type_name(value: Any) -> str:
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


class _Reader:
    def __init__(self) -> None:
        self.issues: Issues = []

    def add(self, path: str, message: str) -> None:
        self.issues.append((path, message))

    def mapping(self, value: Any, path: str, *, required: bool = True) -> dict[Any, Any] | None:
        if value is None and not required:
            return None
        if not isinstance(value, dict):
            self.add(path, f"expected a mapping, got {_type_name(value)}")
            return None
        return value

    def unknown(self, data: dict[Any, Any], allowed: set[str], path: str) -> None:
        for key in data:
            if key not in allowed:
                self.add(f"{path}.{key}", f"unknown field {key!r}; expected one of {', '.join(sorted(allowed))}")

    def integer(
        self, data: dict[Any, Any], key: str, path: str, *, minimum: int | None = 0, required: bool = False
    ) -> int | None:
        if key not in data or data[key] is None:
            if required:
                self.add(f"{path}.{key}", "required field is missing: expected an integer")
            return None
        value = data[key]
        if isinstance(value, bool) or not isinstance(value, int):
            self.add(f"{path}.{key}", f"expected an integer, got {_type_name(value)} {value!r}")
            return None
        if minimum is not None and value < minimum:
            self.add(f"{path}.{key}", f"expected an integer >= {minimum}, got {value}")
            return None
        if value > _INT32_MAX:
            self.add(f"{path}.{key}", f"expected a 32-bit integer, got {value}")
            return None
        return value

    def string(self, data: dict[Any, Any], key: str, path: str, *, required: bool = False) -> str | None:
        if key not in data or data[key] is None:
            if required:
                self.add(f"{path}.{key}", "required field is missing: expected a string")
            return None
        value = data[key]
        if not isinstance(value, str):
            self.add(f"{path}.{key}", f"expected a string, got {_type_name(value)} {value!r}")
            return None
        return value

    def string_map(self, data: dict[Any, Any], key: str, path: str) -> dict[str, str]:
        value = data.get(key)
        if value is None:
            return {}
        if not isinstance(value, dict):
            self.add(f"{path}.{key}", f"expected a mapping of strings, got {_type_name(value)}")
            return {}
        out: dict[str, str] = {}
        for k, v in value.items():
            if not isinstance(v, str):
                self.add(f"{path}.{key}.{k}", f"expected a string value (quote it), got {_type_name(v)} {v!r}")
            else:
                out[str(k)] = v
        return out

    def string_list(self, value: Any, path: str) -> list[str]:
        if value is None:
            return []
        if not isinstance(value, list):
            self.add(path, f"expected a list of strings, got {_type_name(value)}")
            return []
        out: list[str] = []
        for i, item in enumerate(value):
            if not isinstance(item, str):
                self.add(f"{path}[{i}]", f"expected a string, got {_type_name(item)} {item!r}")
            else:
                out.append(item)
        return out

    def policies(self, value: Any, path: str) -> list[Policy]:
        if value is None:
            return []
        if not isinstance(value, list):
            self.add(path, f"expected a list of policies, got {_type_name(value)}")
            return []
        out: list[Policy] = []
        for i, raw in enumerate(value):
            p = f"{path}[{i}]"
            data = self.mapping(raw, p)
            if data is None:
                continue
            self.unknown(data, _POLICY_FIELDS, p)
            events: list[str] = []
            event = self.string(data, "event", p)
            if event is not None:
                events.append(event)
            events += self.string_list(data.get("events"), f"{p}.events")
            exit_code = self.integer(data, "exitCode", p, minimum=None)
            action = self.string(data, "action", p, required=True) or ""
            timeout = self.string(data, "timeout", p)
            out.append(Policy(action=action, events=events, exit_code=exit_code, timeout=timeout))
        return out

    def plugins(self, value: Any, path: str) -> dict[str, list[str]]:
        if value is None:
            return {}
        if not isinstance(value, dict):
            self.add(path, f"expected a mapping of plugin name to a list of flags, got {_type_name(value)}")
            return {}
        out: dict[str, list[str]] = {}
        for name, args in value.items():
            out[str(name)] = self.string_list(args, f"{path}.{name}")
        return out

    def template(self, value: Any, path: str) -> PodTemplate:
        data = self.mapping(value, path)
        if data is None:
            return PodTemplate({})
        spec = self.mapping(data.get("spec"), f"{path}.spec")
        if spec is None:
            return PodTemplate(data)
        for key in ("initContainers", "containers"):
            containers = spec.get(key)
            cpath = f"{path}.spec.{key}"
            if containers is None:
                if key == "containers":
                    self.add(cpath, "required field is missing: expected a list of containers")
                continue
            if not isinstance(containers, list):
                self.add(cpath, f"expected a list of containers, got {_type_name(containers)}")
                continue
            if key == "containers" and not containers:
                self.add(cpath, "expected at least one container")
            for i, c in enumerate(containers):
                self.container(c, f"{cpath}[{i}]")
        for key in ("hostname", "subdomain", "restartPolicy"):
            self.string(spec, key, f"{path}.spec")
        return PodTemplate(data)

    def container(self, value: Any, path: str) -> None:
        data = self.mapping(value, path)
        if data is None:
            return
        self.string(data, "name", path, required=True)
        self.string(data, "image", path, required=True)
        self.string(data, "workingDir", path)
        for key in ("command", "args"):
            self.string_list(data.get(key), f"{path}.{key}")
        env = data.get("env")
        if env is not None:
            if not isinstance(env, list):
                self.add(f"{path}.env", f"expected a list of name/value entries, got {_type_name(env)}")
            else:
                for i, var in enumerate(env):
                    vpath = f"{path}.env[{i}]"
                    item = self.mapping(var, vpath)
                    if item is None:
                        continue
                    self.string(item, "name", vpath, required=True)
                    self.string(item, "value", vpath)
        ports = data.get("ports")
        if ports is not None:
            if not isinstance(ports, list):
                self.add(f"{path}.ports", f"expected a list of ports, got {_type_name(ports)}")
            else:
                for i, port in enumerate(ports):
                    ppath = f"{path}.ports[{i}]"
                    item = self.mapping(port, ppath)
                    if item is None:
                        continue
                    number = self.integer(item, "containerPort", ppath, minimum=1, required=True)
                    if number is not None and number > 65535:
                        self.add(f"{ppath}.containerPort", f"expected a port from 1 to 65535, got {number}")

    def depends_on(self, value: Any, path: str) -> DependsOn | None:
        data = self.mapping(value, path, required=False)
        if data is None:
            return None
        self.unknown(data, {"name", "iteration"}, path)
        names = self.string_list(data.get("name"), f"{path}.name")
        iteration = self.string(data, "iteration", path) or "any"
        if iteration not in ("any", "all"):
            self.add(f"{path}.iteration", f"expected 'any' or 'all', got {iteration!r}")
        return DependsOn(names=names, iteration=iteration)

    def task(self, value: Any, path: str) -> Task | None:
        data = self.mapping(value, path)
        if data is None:
            return None
        self.unknown(data, _TASK_FIELDS, path)
        name = self.string(data, "name", path) or ""
        replicas = self.integer(data, "replicas", path, required=True)
        if "template" not in data:
            self.add(f"{path}.template", "required field is missing: expected a pod template")
            template = PodTemplate({})
        else:
            template = self.template(data["template"], f"{path}.template")
        return Task(
            name=name,
            replicas=replicas if replicas is not None else 0,
            template=template,
            min_available=self.integer(data, "minAvailable", path),
            max_retry=self.integer(data, "maxRetry", path) or 0,
            policies=self.policies(data.get("policies"), f"{path}.policies"),
            depends_on=self.depends_on(data.get("dependsOn"), f"{path}.dependsOn"),
            extra={k: data[k] for k in _TASK_PASSTHROUGH if k in data},
        )


def parse_job(data: Any) -> tuple[Job | None, Issues]:
    """Build a Job from one document; returns the Job (None if unusable) and the type problems."""
    r = _Reader()
    root = r.mapping(data, "")
    if root is None:
        return None, [("", f"expected a Job mapping, got {_type_name(data)}")]
    api_version = root.get("apiVersion")
    if api_version != API_VERSION:
        r.add("apiVersion", f"expected {API_VERSION!r}, got {api_version!r}")
    if root.get("kind") != KIND:
        r.add("kind", f"expected {KIND!r}, got {root.get('kind')!r}")
    r.unknown(root, {"apiVersion", "kind", "metadata", "spec", "status"}, "")
    meta = r.mapping(root.get("metadata"), "metadata") or {}
    r.unknown(meta, _METADATA_FIELDS, "metadata")
    name = r.string(meta, "name", "metadata", required=True) or ""
    metadata = Metadata(
        name=name,
        namespace=r.string(meta, "namespace", "metadata") or "default",
        labels=r.string_map(meta, "labels", "metadata"),
        annotations=r.string_map(meta, "annotations", "metadata"),
    )
    spec = r.mapping(root.get("spec"), "spec")
    if spec is None:
        return None, r.issues
    r.unknown(spec, _SPEC_FIELDS, "spec")
    raw_tasks = spec.get("tasks")
    tasks: list[Task] = []
    if raw_tasks is None or raw_tasks == []:
        r.add("spec.tasks", "expected at least one task")
    elif not isinstance(raw_tasks, list):
        r.add("spec.tasks", f"expected a list of tasks, got {_type_name(raw_tasks)}")
    else:
        for i, raw in enumerate(raw_tasks):
            task = r.task(raw, f"spec.tasks[{i}]")
            if task is not None:
                tasks.append(task)
    job_spec = JobSpec(
        tasks=tasks,
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
