"""A job read from a PyTorchJob, TrainJob or JobSet, rendered for a target: the migration between stacks.

For its own kind's target (``kubeflow`` for a PyTorchJob, ...) the object is sent as it was read,
with torchjob's label on it and on its pod templates: what the user wrote is what the cluster
gets, and reading that back and rendering it again gives the same bytes. For any other target the
job is first said in the terms every target reads, a Volcano Job with the ``pytorch`` plugin
(its master task and its workers, one rank per pod, and the restart and success rules targets
understand), and that target renders it; each thing the target expresses otherwise is a warning.

- Roles: a PyTorchJob's Master and Worker; a TrainJob's nodes (node 0 the master); a JobSet's
  pods when their env points ``MASTER_ADDR`` at one of them (the set's first pod, or a one-pod
  replicated job, whose workers' Jobs are one task where that changes no pod: setworkers.py);
  other JobSets have no master, and the targets that need one say so.
- The launch: a PyTorchJob or TrainJob gives torchrun its rendezvous through ``PET_*``; where the
  target sets none, a torchrun command gets those settings as its flags (target_api/torchrun.py);
  a TrainJob runs torchrun itself, so for ``trainjob`` the command is the program torchrun starts.
- Lifecycle: the kind's rules become the ones every target reads: a failed pod ends the job
  (``PodFailed -> TerminateJob``) or restarts it (``RestartJob``, ``maxRetry``), the master's
  completion ends it; per-Job restart limits (``backoffLimit``) are warned about.
"""

from __future__ import annotations

from typing import Any

from torchjob.errors import Problem, SpecError
from torchjob.spec.model import ORIGIN, ElasticPolicy, Job, JobRunPolicy
from torchjob.target_api.common import copy
from torchjob.targets import JOB_LABEL, TargetRender

CONTROLLERS = ("kubeflow", "trainer", "jobset")


def is_converted(job: Job) -> bool:
    """The job was read from another kind (or names a controller's plugin itself)."""
    return job.kind is not None or any(name in job.spec.plugins for name in CONTROLLERS)


def render_kind(job: Job, target: str, runtime: str | None) -> TargetRender:
    """``job`` (read from a kind) as ``target``'s objects, with the conversion's warnings."""
    from torchjob.target_api.names import check
    from torchjob.targets import get_target

    if job.kind is not None and job.kind.target == target and job.kind.source is not None:
        return as_read(job)
    _refuse_completions(job, target)
    conversion = Conversion(job, target)
    canonical = conversion.job()
    try:
        check(canonical, target)
        rendered = get_target(target).render(canonical, runtime)
    except SpecError as err:
        raise SpecError(
            [Problem(conversion.path(p.path), p.message, p.file, p.line) for p in err.problems]
        ) from None
    said = [(conversion.path(path), message) for path, message in conversion.notes + rendered.warnings]
    rendered.warnings = list(dict.fromkeys(said))  # a task split in two is told about once
    return rendered


def _refuse_completions(job: Job, target: str) -> None:
    """A task that starts once others completed (JobSet's ``dependsOn`` status Complete) keeps that
    only in the kind's own object: every target a job is converted for would start it while they
    still run (Volcano's dependsOn waits for running pods; the others start every pod at once)."""
    problems = []
    for t, task in enumerate(job.spec.tasks):
        depends = task.depends_on
        if depends is None or not depends.complete:
            continue
        own = job.kind.target if job.kind is not None else ""
        hint = (
            f"use --target {own}, which sends the {job.kind.kind} as written"
            if job.kind is not None and own != target
            else "render the file as written, without --set on a task's fields"
        )
        problems.append(
            Problem(
                f"spec.tasks[{t}].dependsOn",
                f"a start once {', '.join(depends.complete)} completed (dependsOn status Complete) "
                f"cannot be expressed by target {target!r}: these pods would start while those still "
                f"run; {hint}",
            )
        )
    if problems:
        raise SpecError(problems)


# ------------------------------------------------------------------------------ as read


def as_read(job: Job) -> TargetRender:
    """The kind's object as it was read, labelled for torchjob (the pods' templates too)."""
    assert job.kind is not None and job.kind.source is not None
    kind = job.kind
    obj = copy(kind.source)
    obj.pop("status", None)
    given = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
    meta: dict[str, Any] = {k: given[k] for k in ("name", "generateName") if k in given}
    meta["namespace"] = job.metadata.namespace
    meta["labels"] = {**(given.get("labels") or {}), JOB_LABEL: job.name}
    if given.get("annotations"):
        meta["annotations"] = given["annotations"]
    obj["metadata"] = meta
    spec = obj.get("spec") if isinstance(obj.get("spec"), dict) else {}
    for template in _templates(kind.kind, spec):
        own = template.pop("metadata", None)
        own = own if isinstance(own, dict) else {}
        own["labels"] = {**(own.get("labels") or {}), JOB_LABEL: job.name}
        rest = dict(template)
        template.clear()
        template.update({"metadata": own, **rest})  # metadata first, as kubectl prints it
    if kind.kind == "TrainJob":
        _label_trainjob(job, spec)
    return TargetRender(kind.kind, kind.api_version, [obj], [])


def _templates(kind: str, spec: dict[str, Any]) -> list[dict[str, Any]]:
    """The pod templates (and a JobSet's Job templates) of a kind's spec, to label."""
    found: list[dict[str, Any]] = []
    if kind == "PyTorchJob":
        for replica in (spec.get("pytorchReplicaSpecs") or {}).values():
            if isinstance(replica, dict) and isinstance(replica.get("template"), dict):
                found.append(replica["template"])
    elif kind == "JobSet":
        for rjob in spec.get("replicatedJobs") or []:
            job_template = rjob.get("template") if isinstance(rjob, dict) else None
            if isinstance(job_template, dict):
                found.append(job_template)
                pod = (job_template.get("spec") or {}).get("template")
                if isinstance(pod, dict):
                    found.append(pod)
    return found


def _label_trainjob(job: Job, spec: dict[str, Any]) -> None:
    """A TrainJob's pods come from its runtime: the label goes in torchjob's runtime patch (the
    trainjob target's), replacing an earlier one of torchjob's."""
    from torchjob.plugins.trainer import TrainerPlugin
    from torchjob.target_api.common import PATCH_MANAGER as manager

    labels = {"metadata": {"labels": {JOB_LABEL: job.name}}}
    # the runtime's replicated job of the trainer's nodes, as read: "node" in Trainer's own runtimes
    task = str(TrainerPlugin(job.spec.plugins.get("trainer", [])).values["node"])
    name = task.rpartition("-")[0] or "node"
    node = {"name": name, "template": {**copy(labels), "spec": {"template": copy(labels)}}}
    patch = {
        "manager": manager,
        "trainingRuntimeSpec": {"template": {**copy(labels), "spec": {"replicatedJobs": [node]}}},
    }
    patches = [
        p
        for p in spec.get("runtimePatches") or []
        if not (isinstance(p, dict) and p.get("manager") == manager)
    ]
    spec["runtimePatches"] = [*patches, patch]


# ------------------------------------------------------------------------------ conversion


class Conversion:
    """One job said as a Volcano Job with the pytorch plugin, for ``target``."""

    def __init__(self, job: Job, target: str) -> None:
        from torchjob.spec.manifest import job_manifest

        self.source = job
        self.target = target
        self.data = job_manifest(job)
        self.spec: dict[str, Any] = self.data["spec"]
        if job.spec.scheduler_defaulted:
            self.spec.pop("schedulerName", None)  # Volcano's default, not the user's choice
        annotations = self.data["metadata"].get("annotations") or {}
        annotations.pop(ORIGIN, None)
        if not annotations:
            self.data["metadata"].pop("annotations", None)
        self.notes: list[tuple[str, str]] = []
        self.index: dict[int, int] = {}  # a task of the converted job -> the job's own task
        self.elastic: ElasticPolicy | None = None
        self.run_policy: JobRunPolicy | None = job.run_policy
        self.plugins = dict(self.spec.get("plugins") or {})

    def note(self, path: str, message: str) -> None:
        self.notes.append((path, f"target {self.target!r}: {message}"))

    def path(self, path: str) -> str:
        """A path of the converted job as the job's own (its task indexes)."""
        import re

        found = re.match(r"spec\.tasks\[(\d+)\]", path)
        if found and int(found[1]) in self.index:
            return f"spec.tasks[{self.index[int(found[1])]}]" + path[found.end() :]
        return path

    def job(self) -> Job:
        from torchjob.jobs import check_document
        from torchjob.spec.source import Document
        from torchjob.target_api import convert_roles

        self.index = {i: i for i in range(len(self.spec.get("tasks") or []))}
        convert_roles.convert(self)
        for name in CONTROLLERS:
            self.spec.get("plugins", {}).pop(name, None)
        if not self.spec.get("plugins"):
            self.spec.pop("plugins", None)
        job, problems = check_document(Document(data=self.data, file="<converted>"))
        if job is None:  # a bug of the conversion, not the user's: say what it made
            said = "; ".join(f"{p.path}: {p.message}" for p in problems)
            raise SpecError(
                [Problem("", f"torchjob could not convert the job for target {self.target!r}: {said}")]
            )
        job.run_policy = self.run_policy
        job.elastic = self.elastic
        return job

    # ------------------------------------------------------------ pieces the kinds use

    def tasks(self) -> list[dict[str, Any]]:
        tasks: list[dict[str, Any]] = self.spec.setdefault("tasks", [])
        return tasks

    def split(self, position: int, first: str, rest: str) -> None:
        """Task ``position`` as a one-pod task ``first`` and a task ``rest`` of its other pods."""
        tasks = self.tasks()
        task = tasks[position]
        old = task["name"]
        head = {**copy(task), "name": first, "replicas": 1}
        head.pop("minAvailable", None)
        tail = {**copy(task), "name": rest, "replicas": task["replicas"] - 1}
        tail.pop("minAvailable", None)
        new = [head] + ([tail] if tail["replicas"] > 0 else [])
        tasks[position : position + 1] = new
        own = self.index[position]
        self.index = {
            i: (
                self.index[i]
                if i < position
                else own
                if i < position + len(new)
                else self.index[i - len(new) + 1]
            )
            for i in range(len(tasks))
        }
        for other in tasks:
            depends = other.get("dependsOn")
            if isinstance(depends, dict) and old in depends.get("name", []):
                depends["name"] = [n for n in depends["name"] if n != old] + [t["name"] for t in new]
