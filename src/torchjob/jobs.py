"""From a file name to checked jobs: load, parse, default, validate, check plugins.

This is the one entry every command uses, so a job is judged the same way whether it is
validated, rendered, run or submitted. YAML and JSON only: an SDK task reference
(``path/to/file.py:task``) is read by :mod:`torchjob.cli.sources`, above both this and the SDK.

A PyTorchJob, TrainJob or JobSet document is first translated into the Volcano Job that runs as
its controller would (:mod:`torchjob.spec.kinds`); that Job is then checked like any other, and
its problems are told in the document's own terms. A file's TrainingRuntimes and
ClusterTrainingRuntimes (and those of ``--runtime FILE``) are the runtimes its TrainJobs use.
"""

from __future__ import annotations

import re

from torchjob.errors import Problem, SpecError
from torchjob.plugins import check_plugins
from torchjob.records import record
from torchjob.spec.defaults import apply_defaults
from torchjob.spec.model import Job
from torchjob.spec.parse import parse_job
from torchjob.spec.source import Document, load_documents, parse_documents
from torchjob.spec.validate import Broken, validate_job
from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from torchjob.spec.kinds.runtimes import Runtimes

_TASK_NAME = r"spec\.tasks\[\d+\]\.name"  # compiled only when a job has problems


@record
class LoadedJob:
    job: Job
    document: Document

    @property
    def file(self) -> str:
        return self.document.file


def check_document(document: Document, runtimes: Runtimes | None = None) -> tuple[Job | None, list[Problem]]:
    """Parse, default and validate one document; returns the job and every problem found.

    A job with type problems is still defaulted and validated, so one run reports every mistake;
    rules that would read a broken field are skipped rather than reporting follow-on errors.
    A PyTorchJob, TrainJob or JobSet is checked as the Volcano Job it becomes (``runtimes``: the
    TrainingRuntimes its TrainJob may name).
    """
    from torchjob.spec.kinds import is_job_kind, unknown_kind

    if document.origin is None and is_job_kind(document.data):
        return _check_kind(document, runtimes)
    unknown = unknown_kind(document.data)
    if unknown is not None:
        return None, [document.problem(issue.path, issue.message) for issue in unknown]
    job, problems = _check_volcano(document)
    if job is not None and document.origin is not None:
        document.origin.finish(job, document)  # a translated job, changed (--set, ...)
    return job, problems


def _check_kind(document: Document, runtimes: Runtimes | None) -> tuple[Job | None, list[Problem]]:
    """A kind's document: its own problems, then those of the Volcano Job it becomes, in its terms."""
    from torchjob.spec.kinds import translate

    translation = translate(document, runtimes)
    translated = translation.document()
    job, found = _check_volcano(translated) if translation.complete else (None, [])
    own = [document.problem(issue.path, issue.message) for issue in translation.issues]
    # One mistake, one message: not again for what the Volcano Job made of a field already refused
    # (at that path, or under a value of the wrong type).
    said = {(p.file, p.path) for p in own + translation.elsewhere}
    typed = [document.problem(path, "").path for path in translation.typed]

    def new(p: Problem) -> bool:
        under = any(p.path.startswith((path + ".", path + "[")) for path in typed if p.file == document.file)
        return (p.file, p.path) not in said and not under and not _follows(p, own, document)

    # Tasks made from one template (a JobSet's Jobs of a replicated job) share its paths here:
    # its mistake is told once, not once per Job.
    found = list(dict.fromkeys(p for p in found if new(p)))
    problems = sorted(own + found, key=lambda p: p.line or 0) + translation.elsewhere
    if job is None or problems:
        return None, problems
    translation.finish(job, translated)
    return job, []


def _follows(p: Problem, own: list[Problem], document: Document) -> bool:
    """A problem of the Volcano Job that follows from one the kind's own checks told: at a field of
    the Job the kind does not have (``spec.minAvailable`` from refused replicas), or at a field
    under which a mistake was told (``spec.replicatedJobs``: no task, its replicas refused)."""
    if not own or p.file != document.file:
        return False
    top = re.match(r"spec\.[^.\[]+", p.path)
    if top is not None and top[0] not in document.lines:
        return True
    return any(o.file == p.file and o.path.startswith((p.path + ".", p.path + "[")) for o in own)


def _check_volcano(document: Document) -> tuple[Job | None, list[Problem]]:
    job, issues = parse_job(document.data)
    if job is not None:
        broken = Broken(issue.path for issue in issues)
        apply_defaults(job)
        found = validate_job(job, broken)
        # Plugin checks read the tasks (names, replicas, containers); they wait until the tasks parse
        # and their names are valid, or a bad name would also show up as "no such task".
        tasks_ok = not broken.under("spec.tasks") and not any(
            re.match(_TASK_NAME, issue.path) for issue in found
        )
        issues = issues + found + check_plugins(job, tasks_ok=tasks_ok)
    problems = [document.problem(issue.path, issue.message) for issue in issues]
    for duplicate in document.problems:  # a duplicate key: on the line of its second writing
        found_at = document.problem(duplicate.path, duplicate.message)
        problems.append(Problem(found_at.path, found_at.message, found_at.file, duplicate.line))
    problems.sort(key=lambda p: p.line or 0)  # in file order; sort is stable for equal lines
    return (job if not problems else None), problems


def check_jobs(documents: list[Document], file: str, runtimes: Runtimes | None = None) -> list[LoadedJob]:
    """The checked jobs of a file's documents (its runtimes are read too, not run)."""
    from torchjob.spec.kinds import is_runtime, readable

    problems: list[Problem] = []
    if any(is_runtime(d.data) for d in documents):
        from torchjob.spec.kinds.runtimes import Runtimes

        runtimes = runtimes.copy() if runtimes is not None else Runtimes()
        for document in documents:
            if is_runtime(document.data):
                problems += runtimes.add(document)
        documents = [d for d in documents if not is_runtime(d.data)]
    if not documents:
        what = " (only runtimes)" if problems or runtimes is not None else ""
        raise SpecError([*problems, Problem("", f"no Job document found{what}; expected {readable()}", file)])
    loaded: list[LoadedJob] = []
    names: dict[tuple[str, str], int] = {}
    for document in documents:
        job, found = check_document(document, runtimes)
        problems += found
        if job is None:
            continue
        key = (job.metadata.namespace, job.name)
        if key in names:
            # Both jobs would render to the same pods, Service and ConfigMap.
            message = (
                f"job {job.name!r} in namespace {key[0]!r} is already defined in document {names[key]}; "
                "give each job its own name"
            )
            problems.append(document.problem("metadata.name", message))
            continue
        names[key] = document.index + 1
        # A translated job's document is its Volcano Job, which tells paths in the kind's terms.
        checked = job.kind.document if job.kind is not None and job.kind.document is not None else document
        loaded.append(LoadedJob(job, checked))
    if problems:
        raise SpecError(problems)
    return loaded


def load_jobs(file: str, runtimes: Runtimes | None = None) -> list[LoadedJob]:
    """Every job in a YAML/JSON file (``-`` for stdin)."""
    return check_jobs(load_documents(file), file, runtimes)


def load_jobs_from_text(text: str, file: str = "<text>", runtimes: Runtimes | None = None) -> list[LoadedJob]:
    return check_jobs(parse_documents(text, file), file, runtimes)
