"""Changes to a loaded job given on the command line, so a run need not edit its YAML.

* ``--set TASK.FIELD=VALUE`` / ``--set FIELD=VALUE``: a task's ``replicas``, ``minAvailable`` or
  ``maxRetry``, or the job's ``minAvailable``, ``maxRetry`` or ``queue``. Values are read as YAML
  scalars (``4`` is a number) and the job is then checked like any file.
* ``--workdir DIR``: the working directory of every container that has none.
* ``-e NAME=VALUE``: also replaces an env entry ``NAME`` that reads a Secret or a ConfigMap
  (``secretKeyRef``/``configMapKeyRef``), which the local engine cannot read.
* program arguments (after ``--``): appended to every main container's ``args``.

The changes are made to the job's document as written (before defaults), then the document is
checked again: a job's defaults (``minAvailable`` from the replicas) follow the new values.
"""

from __future__ import annotations

import copy
import os
from typing import Any

from torchjob.errors import Problem, SpecError
from torchjob.jobs import LoadedJob, check_document
from torchjob.records import field, record
from torchjob.spec.source import Document

COMMAND_LINE = "<command line>"
TASK_FIELDS = ("replicas", "minAvailable", "maxRetry")
JOB_FIELDS = ("minAvailable", "maxRetry", "queue")


@record
class Overrides:
    sets: list[str] = field(default_factory=list)  # TASK.FIELD=VALUE or FIELD=VALUE
    workdir: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    program_args: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.sets or self.workdir is not None or self.env or self.program_args)


def _bad(option: str, message: str) -> SpecError:
    return SpecError([Problem(option, message, COMMAND_LINE)])


def _scalar(text: str) -> Any:
    import yaml

    try:
        value = yaml.safe_load(text) if text.strip() else text
    except yaml.YAMLError:
        return text
    return value if isinstance(value, (str, int, float, bool)) else text


def _containers(spec: dict[str, Any], kinds: tuple[str, ...]) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    for task in spec.get("tasks") or []:
        pod = ((task or {}).get("template") or {}).get("spec") or {} if isinstance(task, dict) else {}
        for kind in kinds:
            found += [c for c in pod.get(kind) or [] if isinstance(c, dict)]
    return found


def _apply_set(spec: dict[str, Any], assignment: str) -> tuple[str, str]:
    """One ``--set``; returns the field path it wrote and the option as given."""
    option = f"--set {assignment}"
    target, sep, text = assignment.partition("=")
    if not sep or not target:
        raise _bad("--set", f"expected TASK.FIELD=VALUE or FIELD=VALUE, got {assignment!r}")
    task_name, dot, name = target.rpartition(".")
    value = _scalar(text)
    if not dot:
        if name not in JOB_FIELDS:
            raise _bad("--set", f"{name!r}: the job fields that can be set are {', '.join(JOB_FIELDS)}")
        spec[name] = value
        return f"spec.{name}", option
    if name not in TASK_FIELDS:
        raise _bad("--set", f"{name!r}: the task fields that can be set are {', '.join(TASK_FIELDS)}")
    tasks = [t for t in spec.get("tasks") or [] if isinstance(t, dict)]
    for index, task in enumerate(spec.get("tasks") or []):
        if isinstance(task, dict) and task.get("name") == task_name:
            task[name] = value
            return f"spec.tasks[{index}].{name}", option
    names = ", ".join(str(t.get("name")) for t in tasks) or "none"
    raise _bad("--set", f"the job has no task {task_name!r} (tasks: {names})")


def _apply_env(spec: dict[str, Any], env: dict[str, str]) -> None:
    for container in _containers(spec, ("initContainers", "containers")):
        for i, var in enumerate(container.get("env") or []):
            if not isinstance(var, dict) or var.get("name") not in env:
                continue
            source = var.get("valueFrom")
            if isinstance(source, dict) and ("secretKeyRef" in source or "configMapKeyRef" in source):
                container["env"][i] = {"name": var["name"], "value": env[str(var["name"])]}


def apply(loaded: LoadedJob, overrides: Overrides) -> LoadedJob:
    """``loaded`` with the overrides made and checked again; SpecError naming the option at fault."""
    if not overrides:
        return loaded
    data = copy.deepcopy(loaded.document.data)
    spec = data.setdefault("spec", {}) if isinstance(data, dict) else {}
    written: dict[str, str] = {}
    for assignment in overrides.sets:
        path, option = _apply_set(spec, assignment)
        written[path] = option
    if overrides.workdir is not None:
        workdir = os.path.abspath(overrides.workdir)
        if not os.path.isdir(workdir):
            raise _bad("--workdir", f"{overrides.workdir!r} is not a directory")
        for container in _containers(spec, ("initContainers", "containers")):
            container.setdefault("workingDir", workdir)
    _apply_env(spec, overrides.env)
    if overrides.program_args:
        for container in _containers(spec, ("containers",)):
            # Kubernetes expands $(VAR) in args; what was typed on the command line is meant literally.
            literal = [arg.replace("$", "$$") for arg in overrides.program_args]
            container["args"] = [*(container.get("args") or []), *literal]
    before = loaded.document
    document = Document(
        data=data, file=before.file, lines=before.lines, index=before.index, total=before.total
    )
    job, problems = check_document(document)
    if job is None:
        # The file was valid before: every problem is the options' doing. One in a field a --set
        # wrote is the option's; another (a task's minAvailable above the replicas set) says which.
        options = ", ".join(written.values()) or "the command line's changes"
        after = f" (after {options})"
        raise SpecError(
            Problem(p.path, f"{written[p.path]}: {p.message}", COMMAND_LINE)
            if p.path in written
            else Problem(p.path, p.message + after, p.file, p.line)
            for p in problems
        )
    return LoadedJob(job, document)
