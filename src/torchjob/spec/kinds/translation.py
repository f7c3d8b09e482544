"""A kind's document as the Volcano Job torchjob runs, told in the kind's own terms.

A reader (``pytorchjob.py``, ``jobset.py``, ``trainjob.py``) fills a :class:`Translation`: the
Volcano Job manifest, the routes from its field paths back to the document it came from, what it
found wrong itself, and what the kind says beyond a Volcano Job. The manifest is then checked like
any Volcano Job (``jobs.check_document``), and every problem found there is told at the path and
line of the kind's document: ``spec.tasks[1].template.spec.containers[0].image`` of the Job is
``spec.pytorchReplicaSpecs.Worker.template.spec.containers[0].image`` of the PyTorchJob.
"""

from __future__ import annotations

from torchjob.errors import Issue, Problem
from torchjob.records import field, record
from torchjob.spec.model import JobRunPolicy, KindInfo, wait_for_completions
from torchjob.spec.source import Document
from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any

    from torchjob.spec.model import Job


@record(frozen=True)
class Route:
    """Paths of the Job under ``job_path`` are ``source_path`` in ``document``."""

    job_path: str
    document: Document
    source_path: str
    whole: bool = False  # every path under job_path is source_path itself


def _under(path: str, prefix: str) -> bool:
    return not prefix or path == prefix or path.startswith((prefix + ".", prefix + "["))


@record
class Translation:
    source: Document
    kind: str
    api_version: str
    target: str
    data: dict[str, Any] = field(default_factory=dict)  # the Volcano Job manifest
    routes: list[Route] = field(default_factory=list)
    issues: list[Issue] = field(default_factory=list)  # found in the kind's document, its paths
    run_policy: JobRunPolicy | None = None
    here: list[Issue] = field(default_factory=list)  # warnings of a run here, the kind's paths
    # Problems found in another document (a runtime of another file): told there, as they are.
    elsewhere: list[Problem] = field(default_factory=list)
    typed: list[str] = field(default_factory=list)  # paths the schema refused
    complete: bool = True  # False: no Volcano Job could be made (a TrainJob's runtime is missing)
    runtimes: Any = None  # those it was read with: the document changed (--set) is read with them
    # task -> the tasks it waits for to complete (JobSet's dependsOn status Complete), which the
    # Volcano Job cannot say: given to the checked job's dependsOn by ``finish``
    completes: dict[str, list[str]] = field(default_factory=dict)

    # --------------------------------------------------------------- building

    def route(
        self, job_path: str, source_path: str, document: Document | None = None, *, whole: bool = False
    ) -> None:
        self.routes.append(Route(job_path, document or self.source, source_path, whole))

    def add(self, path: str, message: str) -> None:
        self.issues.append(Issue(path, message))

    def warn(self, path: str, message: str) -> None:
        """Something the kind's controller does that a run here does not (``validate --local``)."""
        self.here.append(Issue(path, message, "warning"))

    def schema(self, issues: list[Issue]) -> None:
        """The schema's problems of the document: nothing under these paths is told again."""
        self.issues += issues
        self.typed += [issue.path for issue in issues]

    def broken(self, path: str) -> bool:
        """A problem was already found at ``path`` or above it (no second message there)."""
        return any(_under(path, issue.path) for issue in self.issues)

    # --------------------------------------------------------------- telling

    def locate(self, path: str) -> tuple[Document, str]:
        """The document and path a path of the Job stands for; a path of no route is the kind's own."""
        best: Route | None = None
        for route in self.routes:
            if _under(path, route.job_path) and (best is None or len(route.job_path) > len(best.job_path)):
                best = route
        if best is None:
            return self.source, path
        if best.whole:
            return best.document, best.source_path
        return best.document, best.source_path + path[len(best.job_path) :]

    def problem(self, path: str, message: str) -> Problem:
        from torchjob.spec.kinds.words import say

        path, message = say(self, path, message)  # the Volcano Job's words as the kind's
        document, where = self.locate(path)
        return document.problem(where, message)

    def document(self) -> Document:
        """The Volcano Job to check, speaking of itself in the kind's terms."""
        return Document(
            data=self.data,
            file=self.source.file,
            index=self.source.index,
            total=self.source.total,
            problems=list(self.source.problems),
            origin=self,
        )

    def finish(self, job: Job, document: Document) -> None:
        """Give the job checked from ``document`` (this translation's Volcano Job, or one changed
        from it) what the kind says beyond a Volcano Job; the object as read only while the Job is
        still this translation's own."""
        job.run_policy = self.run_policy
        wait_for_completions(job, self.completes)
        own = document.data is self.data and isinstance(self.source.data, dict)
        source = self.source.data if own else None
        job.kind = KindInfo(self.kind, self.api_version, self.target, source, list(self.here), document)
