"""What the kinds' readers share: plain-data access that never fails on bad input, the Volcano
Job's metadata and tasks, and the lifecycle policies the controllers' rules become."""

from __future__ import annotations

from torchjob.spec import names
from torchjob.spec.model import API_VERSION, KIND, ORIGIN, pod_name
from torchjob.spec.source import child
from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any

    from torchjob.spec.kinds.translation import Translation

INT32_MAX = 2**31 - 1
# The most processes torchrun may start on one node (nprocPerNode, numProcPerNode): upstream sets
# no bound; one process per CPU of the largest machine a stock Linux kernel runs (CONFIG_NR_CPUS
# of the common distributions' kernels). It keeps a world size (nodes times this) within int32.
MAX_PROCS_PER_NODE = 8192
# Kubernetes' exit code of a container killed by a signal is 128 + the signal: the training
# operator's ExitCode policy retries those (and fails on 1-127, the program's own errors).
RETRYABLE_EXIT_CODES = range(128, 256)


def too_many_procs(count: int) -> str:
    return (
        f"expected at most {MAX_PROCS_PER_NODE} processes per node, one per CPU of the largest "
        f"machine Linux runs, got {count}"
    )


def copy(value: Any) -> Any:
    """A deep copy of plain YAML data: the Volcano Job never shares a value with the document."""
    if isinstance(value, dict):
        return {k: copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [copy(v) for v in value]
    return value


def mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def items(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def integer(value: Any, default: int | None = None) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def text(value: Any, default: str = "") -> str:
    return value if isinstance(value, str) else default


def at(data: Any, *path: str | int) -> Any:
    """``data[path[0]][path[1]]...``, or None where the document has no such value."""
    for key in path:
        if isinstance(key, int):
            data = data[key] if isinstance(data, list) and 0 <= key < len(data) else None
        else:
            data = data.get(key) if isinstance(data, dict) else None
    return data


def start(tr: Translation) -> tuple[dict[str, Any], dict[str, Any]]:
    """The Volcano Job's skeleton with the kind's metadata; returns (its spec, the document's spec)."""
    from torchjob.spec.kinds import ORIGINS

    document = mapping(tr.source.data)
    meta = copy(mapping(document.get("metadata")))
    annotations = meta.get("annotations")
    meta["annotations"] = {**(annotations if isinstance(annotations, dict) else {}), ORIGIN: ORIGINS[tr.kind]}
    spec: dict[str, Any] = {}
    tr.data.update(apiVersion=API_VERSION, kind=KIND, metadata=meta, spec=spec)
    tr.route("metadata.annotations", "metadata.annotations")
    tr.route("metadata", "metadata")
    tr.route("spec", "spec")
    if "metadata" not in document:
        tr.add("metadata", "required field is missing: expected a mapping with the job's name")
    elif isinstance(document["metadata"], dict) and isinstance(meta.get("name"), str):
        name = meta["name"]
        if names.is_dns1123_label(name) and not names.is_dns1035_label(name):
            why = "it names the Services of the job's pods"
            tr.add("metadata.name", f"{name!r} must start with a letter: {why} (a DNS-1035 label)")
    return spec, mapping(document.get("spec"))


def add_task(
    tr: Translation, spec: dict[str, Any], name: str, replicas: int, template: Any, source: str, **fields: Any
) -> dict[str, Any]:
    """Append a task made from the pod template at ``source``/template (copied); the task's field
    paths are told as ``source``'s, its template's as the template's."""
    index = len(spec.setdefault("tasks", []))
    task: dict[str, Any] = {"name": name, "replicas": replicas, **fields}
    task["template"] = copy(template) if isinstance(template, dict) else {}
    spec["tasks"].append(task)
    path = child("spec.tasks", index)
    tr.route(path, source)
    tr.route(f"{path}.template", f"{source}.template")
    return task


def fail_on(event: str) -> dict[str, str]:
    """The job fails at this event of the task's pods (told as such: the job is not Volcano's)."""
    return {"event": event, "action": "TerminateJob"}


def restart_job_on(event: str) -> dict[str, str]:
    return {"event": event, "action": "RestartJob"}


def retry_exit_codes() -> list[dict[str, Any]]:
    """A failed pod whose exit code says it was killed (128 and above) is made again."""
    return [{"exitCode": code, "action": "RestartPod"} for code in RETRYABLE_EXIT_CODES]


def pod_restart_policy(template: Any) -> str | None:
    value = at(template, "spec", "restartPolicy")
    return value if isinstance(value, str) else None


def pod_names_fit(tr: Translation, spec: dict[str, Any], whose: str) -> None:
    """The longest pod name the tasks make, told once at ``metadata.name``: the Volcano Job's
    check tells it per task, at the task's name, which a PyTorchJob or TrainJob does not have."""
    name = text(at(tr.data, "metadata", "name"))
    if not names.is_dns1123_label(name):
        return  # told as the name's own problem
    made = [
        pod_name(name, str(task["name"]), task["replicas"] - 1)
        for task in spec.get("tasks", [])
        if task["replicas"] > 0 and not at(task, "template", "spec", "hostname")
    ]
    longest = max(made, key=len, default="")
    if len(longest) > names.DNS1123_LABEL_MAX:
        tr.add(
            "metadata.name",
            f"pod name {longest!r} is {len(longest)} characters; a pod's hostname allows at most "
            f"{names.DNS1123_LABEL_MAX}: shorten the {whose}'s name",
        )
