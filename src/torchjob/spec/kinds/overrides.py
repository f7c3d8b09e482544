"""``run --set NAME.FIELD=VALUE`` on a PyTorchJob, TrainJob or JobSet, in the kind's own words.

The names a user of the kind knows, and the fields of the kind they set:

- a PyTorchJob's replica types, in any case as the operator reads them: ``Worker.replicas=4``;
- a JobSet's replicated jobs: ``workers.replicas=2`` (its Jobs), ``.parallelism``, ``.completions``;
- a TrainJob's trainer: ``trainer.numNodes=4``, ``trainer.numProcPerNode=2``; its nodes' task
  (``node-0.replicas``, the Volcano Job's word for them) is its ``numNodes`` too.

Such a change is made to the kind's document, which is then read again (torchjob/overrides.py),
so the pods, their env and the job's size follow it as they follow the file. The tasks of the
Volcano Job the kind became still take ``replicas``, ``minAvailable`` and ``maxRetry``
(``workers-0.maxRetry``), and a replica type names its task there (``Worker.maxRetry``).
"""

from __future__ import annotations

import itertools

from torchjob.spec.kinds.common import at, items, mapping, text
from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from torchjob.spec.kinds.translation import Translation

    Keys = tuple[str | int, ...]

REPLICA_FIELDS = ("replicas",)
RJOB_FIELDS = ("replicas", "parallelism", "completions")
TRAINER_FIELDS = ("numNodes", "numProcPerNode")
TASK_FIELDS = ("replicas", "minAvailable", "maxRetry")  # the Volcano Job's (torchjob/overrides.py)


def _replica_types(tr: Translation) -> dict[str, str]:
    """A PyTorchJob's replica types as written, by their task's name (``worker``: ``Worker``)."""
    specs = mapping(at(tr.source.data, "spec", "pytorchReplicaSpecs"))
    return {str(key).lower(): str(key) for key in specs}


def _rjobs(tr: Translation) -> dict[str, int]:
    """A JobSet's replicated jobs by name: their index in the list."""
    found: dict[str, int] = {}
    for r, rjob in enumerate(items(at(tr.source.data, "spec", "replicatedJobs"))):
        found.setdefault(text(mapping(rjob).get("name")), r)
    return found


def _node_task(tr: Translation) -> str:
    """The Volcano task of a TrainJob's nodes (the trainer plugin's ``--node``)."""
    for flag in items(at(tr.data, "spec", "plugins", "trainer")):
        if isinstance(flag, str) and flag.startswith("--node="):
            return flag.partition("=")[2]
    return ""


def kind_field(tr: Translation, name: str, field: str) -> Keys | None:
    """The keys in the kind's document that ``--set NAME.FIELD`` writes; None where NAME.FIELD is
    not one of the kind's own (the Volcano Job's tasks are tried then)."""
    if tr.kind == "PyTorchJob":
        key = _replica_types(tr).get(name.lower())
        if key is not None and field in REPLICA_FIELDS:
            return ("spec", "pytorchReplicaSpecs", key, field)
    elif tr.kind == "JobSet":
        index = _rjobs(tr).get(name)
        if index is not None and field == "replicas":
            return ("spec", "replicatedJobs", index, field)
        if index is not None and field in RJOB_FIELDS:
            return ("spec", "replicatedJobs", index, "template", "spec", field)
    elif tr.kind == "TrainJob":
        if name == "trainer" and field in TRAINER_FIELDS:
            return ("spec", "trainer", field)
        if name and name == _node_task(tr) and field == "replicas":
            return ("spec", "trainer", "numNodes")
    return None


def task_name(tr: Translation, name: str) -> str:
    """The Volcano task ``NAME`` stands for: a PyTorchJob's replica type names its task."""
    if tr.kind == "PyTorchJob" and name.lower() in _replica_types(tr):
        return name.lower()
    return name


def path_of(keys: Keys) -> str:
    return "".join(f"[{k}]" if isinstance(k, int) else f".{k}" for k in keys).lstrip(".")


def put(data: object, keys: Keys, value: object) -> None:
    """``value`` at ``keys`` of the document, the mappings on the way made where missing."""
    for key, following in itertools.pairwise(keys):
        if isinstance(data, list) and isinstance(key, int):
            data = data[key]
        elif isinstance(data, dict):
            if not isinstance(data.get(key), (dict, list)):
                data[key] = [] if isinstance(following, int) else {}
            data = data[key]
    if isinstance(data, dict):
        data[keys[-1]] = value


def no_such(tr: Translation, name: str, field: str, tasks: list[str]) -> str:
    """Why ``--set NAME.FIELD`` sets nothing, in the kind's words."""
    if tr.kind == "PyTorchJob":
        if name.lower() in _replica_types(tr) or name in tasks:
            return f"{field!r}: the fields of a replica type that can be set are {', '.join(TASK_FIELDS)}"
        have = ", ".join(_replica_types(tr).values()) or "none"
        return f"the PyTorchJob has no replica type {name!r} (it has {have})"
    if tr.kind == "JobSet":
        if name in _rjobs(tr):
            return f"{field!r}: the fields of a replicated job that can be set are {', '.join(RJOB_FIELDS)}"
        if name in tasks:  # one Job of a replicated job: the Volcano Job's task
            return f"{field!r}: the fields of a Job that can be set are {', '.join(TASK_FIELDS)}"
        have = ", ".join(_rjobs(tr)) or "none"
        return f"the JobSet has no replicated job {name!r} (it has {have})"
    fields = ", ".join(f"trainer.{f}" for f in TRAINER_FIELDS)
    return f"'{name}.{field}' is not a field of the TrainJob that can be set; it takes {fields}"
