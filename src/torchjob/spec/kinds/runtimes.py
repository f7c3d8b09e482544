"""Kubeflow Trainer's runtimes: the ``TrainingRuntime`` or ``ClusterTrainingRuntime`` a TrainJob names.

A TrainJob's pods are its runtime's JobSet with the TrainJob's trainer put in; the runtime comes
from the TrainJob's file, from ``--runtime FILE``, or is one Trainer installs itself
(``torch-distributed``, kept in ``schemas/kinds.json``). A ``TrainingRuntime`` is found in the
TrainJob's namespace, a ``ClusterTrainingRuntime`` anywhere.
"""

from __future__ import annotations

from torchjob.errors import Problem, SpecError
from torchjob.records import record
from torchjob.spec.kinds.common import at, mapping, text
from torchjob.spec.parse import type_name
from torchjob.spec.podschema import check_kind, installed_runtimes
from torchjob.spec.source import Document
from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any

    from torchjob.spec.kinds.translation import Translation

CLUSTER = "ClusterTrainingRuntime"
NAMESPACED = "TrainingRuntime"
POLICIES = ("torch", "mpi", "jax", "xgboost", "flux")


@record
class Runtime:
    name: str
    kind: str
    namespace: str  # "" for a ClusterTrainingRuntime
    data: dict[str, Any]
    document: Document  # where it was written (Trainer's own: torchjob's copy)
    installed: bool = False  # one Trainer installs (not in the file)

    @property
    def where(self) -> str:
        return f"{self.kind} {self.name!r}" + ("" if self.installed else f" of {self.document.file}")


class Runtimes:
    """The runtimes a file's TrainJobs may name."""

    def __init__(self, found: dict[tuple[str, str, str], Runtime] | None = None) -> None:
        self.found: dict[tuple[str, str, str], Runtime] = dict(found or {})

    def copy(self) -> Runtimes:
        return Runtimes(self.found)

    def add(self, document: Document) -> list[Problem]:
        """Check a runtime document and keep it; its problems (at its own paths and lines)."""
        data = document.data
        kind = text(data.get("kind"))
        issues = check_kind(data, kind)
        problems = [document.problem(i.path, i.message) for i in issues]
        name = text(at(data, "metadata", "name"))
        if not name and not any(p.path.startswith("metadata") for p in problems):
            problems.append(
                document.problem("metadata.name", "required field is missing: the runtime's name")
            )
        given = [p for p in POLICIES if at(data, "spec", "mlPolicy", p) is not None]
        if len(given) > 1:
            problems.append(
                document.problem(
                    "spec.mlPolicy", f"give one of {', '.join(POLICIES)}, not {' and '.join(given)}"
                )
            )
        namespace = "" if kind == CLUSTER else text(at(data, "metadata", "namespace"), "default")
        key = (kind, name, namespace)
        if key in self.found and not self.found[key].installed:
            before = self.found[key].document
            problems.append(
                document.problem(
                    "metadata.name",
                    f"{kind} {name!r} is already defined in {before.file} (document {before.index + 1})",
                )
            )
        if not problems:
            self.found[key] = Runtime(name, kind, namespace, data, document)
        return problems

    def find(self, kind: str, name: str, namespace: str) -> Runtime | None:
        found = self.found.get((kind, name, namespace if kind == NAMESPACED else ""))
        if found is None and kind == CLUSTER and name in installed_runtimes():
            data = installed_runtimes()[name]
            document = Document(data=data, file=f"<{name}, installed by Kubeflow Trainer>")
            found = Runtime(name, CLUSTER, "", data, document, installed=True)
        return found

    def known(self, kind: str) -> list[str]:
        names = [r.name for (k, _, _), r in self.found.items() if k == kind]
        return sorted({*names, *(installed_runtimes() if kind == CLUSTER else ())})


def load_runtimes(file: str) -> Runtimes:
    """The runtimes of ``--runtime FILE``: every document must be one."""
    from torchjob.spec.kinds import is_runtime
    from torchjob.spec.source import load_documents

    runtimes = Runtimes()
    problems: list[Problem] = []
    documents = load_documents(file)
    for document in documents:
        if is_runtime(document.data):
            problems += runtimes.add(document)
        else:
            kind = text(mapping(document.data).get("kind"))
            message = f"expected a TrainingRuntime or ClusterTrainingRuntime, got {kind or 'no kind'}"
            problems.append(document.problem("kind", message))
    if not documents:
        problems.append(
            Problem("", "no runtime found; expected a TrainingRuntime or ClusterTrainingRuntime", file)
        )
    if problems:
        raise SpecError(problems)
    return runtimes


def trainer_pod_spec(
    tr: Translation, runtime: Runtime, rjob: dict[str, Any], node: int, nodes: int | None
) -> dict[str, Any] | None:
    """The pod spec of the runtime's trainer job ``rjob`` (a copy), its Job sized to ``nodes``; None,
    told at the runtime's field, where a level is not a mapping or its containers not a list (the
    schema skips pod templates)."""
    level: dict[str, Any] = rjob
    where = f"spec.template.spec.replicatedJobs[{node}]"
    for depth, key in enumerate(("template", "spec", "template", "spec")):
        value = level.get(key)
        where += f".{key}"
        if value is None:
            value = level[key] = {}
        elif not isinstance(value, dict):
            tr.elsewhere.append(
                runtime.document.problem(where, f"expected a mapping, got {type_name(value)}")
            )
            return None
        level = value
        if depth == 1:  # the Job's spec: one pod per node
            level["parallelism"] = level["completions"] = nodes
    if not isinstance(level.get("containers"), list | None):
        got = type_name(level["containers"])
        tr.elsewhere.append(
            runtime.document.problem(f"{where}.containers", f"expected a list of containers, got {got}")
        )
        return None
    return level
