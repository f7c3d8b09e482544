"""From a file name to checked jobs: load, parse, default, validate, check plugins.

This is the one entry every command uses, so a job is judged the same way whether it is
validated, rendered, run or submitted. YAML and JSON only: an SDK task reference
(``path/to/file.py:task``) is read by :mod:`torchjob.cli.sources`, above both this and the SDK.
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

_TASK_NAME = r"spec\.tasks\[\d+\]\.name"  # compiled only when a job has problems


@record
class LoadedJob:
    job: Job
    document: Document

    @property
    def file(self) -> str:
        return self.document.file


def check_document(document: Document) -> tuple[Job | None, list[Problem]]:
    """Parse, default and validate one document; returns the job and every problem found.

    A job with type problems is still defaulted and validated, so one run reports every mistake;
    rules that would read a broken field are skipped rather than reporting follow-on errors.
    """
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


def check_jobs(documents: list[Document], file: str) -> list[LoadedJob]:
    if not documents:
        raise SpecError(
            [Problem("", "no Job document found; expected a batch.volcano.sh/v1alpha1 Job", file)]
        )
    loaded: list[LoadedJob] = []
    problems: list[Problem] = []
    names: dict[tuple[str, str], int] = {}
    for document in documents:
        job, found = check_document(document)
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
        loaded.append(LoadedJob(job, document))
    if problems:
        raise SpecError(problems)
    return loaded


def load_jobs(file: str) -> list[LoadedJob]:
    """Every job in a YAML/JSON file (``-`` for stdin)."""
    return check_jobs(load_documents(file), file)


def load_jobs_from_text(text: str, file: str = "<text>") -> list[LoadedJob]:
    return check_jobs(parse_documents(text, file), file)
