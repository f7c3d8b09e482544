"""Changes to a loaded job given on the command line, so a run need not edit its YAML.

* ``--set TASK.FIELD=VALUE`` / ``--set FIELD=VALUE``: a task's ``replicas``, ``minAvailable`` or
  ``maxRetry``, or the job's ``minAvailable``, ``maxRetry`` or ``queue``. Values are read as YAML
  scalars (``4`` is a number) and the job is then checked like any file. A PyTorchJob, TrainJob or
  JobSet also takes its own names and fields (``Worker.replicas=4``, ``workers.replicas=2``,
  ``trainer.numNodes=4``: spec/kinds/overrides.py), set in its document, which is read again.
* ``--workdir DIR``: the working directory of every container that has none.
* ``--workdir CONTAINER_DIR=DIR`` (CONTAINER_DIR absolute): as if DIR were mounted there; a
  ``workingDir`` at or below CONTAINER_DIR, and each ``command``/``args`` item that names a path
  there, are read in DIR instead (``--workdir /workspace=.`` for a cluster job's ``/workspace``).
* ``-e NAME=VALUE``: also replaces an env entry ``NAME`` that reads a Secret or a ConfigMap
  (``secretKeyRef``/``configMapKeyRef``), which the local engine cannot read.
* program arguments (after ``--``): appended to every main container's ``args``.

The changes are made to the job's document as written (before defaults), then the document is
checked again: a job's defaults (``minAvailable`` from the replicas) follow the new values.
"""

from __future__ import annotations

import contextlib
import copy
import os
from typing import Any

from torchjob.errors import Problem, SpecError
from torchjob.jobs import LoadedJob, check_document
from torchjob.records import field, record, replace
from torchjob.spec.units import parse_int
from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from torchjob.spec.kinds.overrides import Keys
    from torchjob.spec.kinds.translation import Translation

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
    """VALUE as a YAML scalar, but a whole number only in ASCII decimal (spec/units.py), as the
    other numbers on the command line: YAML 1.1 reads 010 as 8, 0x10 as 16, 1:00 as 60 and 1_0 as
    10; such spellings stay text, which the job's check refuses where a number is expected."""
    import yaml

    with contextlib.suppress(ValueError):
        return parse_int(text.strip())
    try:
        value = yaml.safe_load(text) if text.strip() else text
    except yaml.YAMLError:
        return text
    if isinstance(value, int) and not isinstance(value, bool):
        return text
    return value if isinstance(value, (str, int, float, bool)) else text


def _containers(spec: dict[str, Any], kinds: tuple[str, ...]) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    for task in spec.get("tasks") or []:
        pod = ((task or {}).get("template") or {}).get("spec") or {} if isinstance(task, dict) else {}
        for kind in kinds:
            found += [c for c in pod.get(kind) or [] if isinstance(c, dict)]
    return found


def _split(assignment: str) -> tuple[str | None, str, str]:
    """``--set NAME.FIELD=VALUE`` as (NAME, FIELD, VALUE); NAME is None for a job's field."""
    target, sep, text = assignment.partition("=")
    if not sep or not target:
        raise _bad("--set", f"expected TASK.FIELD=VALUE or FIELD=VALUE, got {assignment!r}")
    task_name, dot, name = target.rpartition(".")
    return (task_name if dot else None), name, text


def _apply_set(spec: dict[str, Any], assignment: str, kind: Translation | None) -> tuple[str, str]:
    """One ``--set``; returns the field path it wrote and the option as given. ``kind``: the
    PyTorchJob, TrainJob or JobSet the job was read from, whose names its tasks answer to."""
    option = f"--set {assignment}"
    task_name, name, text = _split(assignment)
    value = _scalar(text)
    if task_name is None:
        if name not in JOB_FIELDS:
            raise _bad("--set", f"{name!r}: the job fields that can be set are {', '.join(JOB_FIELDS)}")
        spec[name] = value
        return f"spec.{name}", option
    tasks = [t for t in spec.get("tasks") or [] if isinstance(t, dict)]
    names = [str(t.get("name")) for t in tasks]
    if kind is not None:
        from torchjob.spec.kinds import overrides as kind_words

        wanted = kind_words.task_name(kind, task_name)
        if name not in TASK_FIELDS or wanted not in names:
            raise _bad("--set", kind_words.no_such(kind, task_name, name, names))
        task_name = wanted
    if name not in TASK_FIELDS:
        raise _bad("--set", f"{name!r}: the task fields that can be set are {', '.join(TASK_FIELDS)}")
    for index, task in enumerate(spec.get("tasks") or []):
        if isinstance(task, dict) and task.get("name") == task_name:
            task[name] = value
            return f"spec.tasks[{index}].{name}", option
    raise _bad("--set", f"the job has no task {task_name!r} (tasks: {', '.join(names) or 'none'})")


def _apply_kind_words(loaded: LoadedJob, sets: list[str]) -> tuple[LoadedJob, list[str]]:
    """The ``--set``s of a kind's own fields (spec/kinds/overrides.py), made in its document, which is
    read again; returns the job and the other ``--set``s, for the Volcano Job it became."""
    from torchjob.spec.kinds.overrides import kind_field, path_of, put

    kind: Translation = loaded.document.origin
    own: list[tuple[Keys, str]] = []
    rest: list[str] = []
    for assignment in sets:
        task_name, name, _ = _split(assignment)
        keys = kind_field(kind, task_name, name) if task_name is not None else None
        if keys is None:
            rest.append(assignment)
        else:
            own.append((keys, assignment))
    if not own:
        return loaded, sets
    source = kind.source
    data = copy.deepcopy(source.data)
    for keys, assignment in own:
        put(data, keys, _scalar(_split(assignment)[2]))
    # The kind's own document read again with the values set (its earlier problems were told);
    # no origin: it is no translation.
    document = replace(source, data=data, problems=[], origin=None)
    job, problems = check_document(document, kind.runtimes)
    if job is None or job.kind is None or job.kind.document is None:
        written = {document.problem(path_of(keys), "").path: f"--set {a}" for keys, a in own}
        options = ", ".join(written.values())
        raise SpecError(_blame(p, written, {}, options) for p in problems)
    return LoadedJob(job, job.kind.document), rest


def _apply_workdir(spec: dict[str, Any], text: str) -> None:
    inside, sep, local = text.partition("=")
    mapped = bool(sep) and inside.startswith("/")
    workdir = os.path.abspath(local if mapped else text)
    if not os.path.isdir(workdir):
        raise _bad("--workdir", f"{local if mapped else text!r} is not a directory")
    containers = _containers(spec, ("initContainers", "containers"))
    if not mapped:
        for container in containers:
            container.setdefault("workingDir", workdir)
        return
    inside = os.path.normpath(inside)

    def moved(path: str) -> str:
        if path == inside or path.startswith(inside.rstrip("/") + "/"):
            return workdir + path[len(inside) :] if inside != "/" else os.path.join(workdir, path[1:])
        return path

    for container in containers:
        if isinstance(container.get("workingDir"), str):
            container["workingDir"] = moved(os.path.normpath(container["workingDir"]))
        for key in ("command", "args"):
            if isinstance(container.get(key), list):
                container[key] = [moved(item) if isinstance(item, str) else item for item in container[key]]


def _apply_env(spec: dict[str, Any], env: dict[str, str]) -> None:
    for container in _containers(spec, ("initContainers", "containers")):
        for i, var in enumerate(container.get("env") or []):
            if not isinstance(var, dict) or var.get("name") not in env:
                continue
            source = var.get("valueFrom")
            if isinstance(source, dict) and ("secretKeyRef" in source or "configMapKeyRef" in source):
                container["env"][i] = {"name": var["name"], "value": env[str(var["name"])]}


def _min_available_hint(problem: Problem, written: dict[str, str], spec: dict[str, Any]) -> Problem:
    """A file's ``minAvailable`` that a ``--set ...replicas`` made too large: the ``--set`` that fixes it."""
    import re

    lowered = [option for path, option in written.items() if path.endswith(".replicas")]
    found = re.fullmatch(r"spec(?:\.tasks\[(\d+)\])?\.minAvailable", problem.path)
    if problem.path in written or not lowered or found is None:
        return problem
    tasks = [t if isinstance(t, dict) else {} for t in spec.get("tasks") or []]
    counts = [t.get("replicas") for t in tasks]
    value: object
    if found.group(1) is None:
        option, value = "minAvailable", sum(c for c in counts if isinstance(c, int))
    else:
        index = int(found.group(1))
        option, value = f"{tasks[index].get('name')}.minAvailable", counts[index]
    hint = f"; with {', '.join(lowered)}, add --set {option}={value} (or lower)"
    return Problem(problem.path, problem.message + hint, problem.file, problem.line)


def _blame(problem: Problem, written: dict[str, str], spec: dict[str, Any], options: str) -> Problem:
    if problem.path in written:
        return Problem(problem.path, f"{written[problem.path]}: {problem.message}", COMMAND_LINE)
    hinted = _min_available_hint(problem, written, spec)
    if hinted is not problem:  # a minAvailable a --set ...replicas broke: the --set that mends it
        return hinted
    return Problem(problem.path, f"{problem.message} (after {options})", problem.file, problem.line)


def apply(loaded: LoadedJob, overrides: Overrides) -> LoadedJob:
    """``loaded`` with the overrides made and checked again; SpecError naming the option at fault."""
    if not overrides:
        return loaded
    sets = overrides.sets
    kind = loaded.document.origin
    if kind is not None and sets:
        loaded, sets = _apply_kind_words(loaded, sets)
        kind = loaded.document.origin
        if not (sets or overrides.workdir is not None or overrides.env or overrides.program_args):
            return loaded  # still the kind's own object, as read with the changes
    data = copy.deepcopy(loaded.document.data)
    spec = data.setdefault("spec", {}) if isinstance(data, dict) else {}
    written: dict[str, str] = {}
    for assignment in sets:
        path, option = _apply_set(spec, assignment, kind)
        written[path] = option
    if (
        kind is not None
        and any(p.endswith(".replicas") for p in written)
        and "spec.minAvailable" not in written
    ):
        # the kind's minAvailable is torchjob's (all its pods), not the user's: it follows the tasks
        spec.pop("minAvailable", None)
    if overrides.workdir is not None:
        _apply_workdir(spec, overrides.workdir)
    _apply_env(spec, overrides.env)
    if overrides.program_args:
        for container in _containers(spec, ("containers",)):
            # Kubernetes expands $(VAR) in args; what was typed on the command line is meant literally.
            literal = [arg.replace("$", "$$") for arg in overrides.program_args]
            container["args"] = [*(container.get("args") or []), *literal]
    # The job's document read again with the changes: its file, lines, place in a List and origin
    # (a PyTorchJob's, TrainJob's or JobSet's problems told in its terms); its earlier problems were told.
    document = replace(loaded.document, data=data, problems=[])
    job, problems = check_document(document)
    if job is None:
        # The file was valid before: every problem is the options' doing. One in a field a --set
        # wrote is the option's; a minAvailable that a --set ...replicas broke names the --set that
        # fixes it; any other says which options it follows.
        options = ", ".join(written.values()) or "the command line's changes"
        if kind is not None:  # a kind's problems are told at its own paths
            written = {document.problem(path, "").path: option for path, option in written.items()}
        raise SpecError(_blame(p, written, spec, options) for p in problems)
    return LoadedJob(job, document)
