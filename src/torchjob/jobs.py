"""From a file name to checked jobs: load, parse, default, validate, check plugins.

This is the one entry every command uses, so a job is judged the same way whether it is
validated, rendered, run or submitted. A reference ``path/to/file.py:task`` is an SDK task.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from torchjob.errors import Problem, SpecError
from torchjob.plugins import check_plugins
from torchjob.spec.defaults import apply_defaults
from torchjob.spec.model import Job
from torchjob.spec.parse import parse_job
from torchjob.spec.source import Document, load_documents, parse_documents
from torchjob.spec.validate import validate_job

_SDK_REF = re.compile(r"^(?P<path>.+\.py):(?P<name>[A-Za-z_][A-Za-z0-9_]*)$")


@dataclass
class LoadedJob:
    job: Job
    document: Document

    @property
    def file(self) -> str:
        return self.document.file


def check_document(document: Document) -> tuple[Job | None, list[Problem]]:
    """Parse, default and validate one document; returns the job and every problem found."""
    job, issues = parse_job(document.data)
    if job is not None:
        apply_defaults(job)
        issues = issues + validate_job(job) + check_plugins(job)
    problems = [document.problem(path, message) for path, message in issues]
    return (job if not problems else None), problems


def check_jobs(documents: list[Document], file: str) -> list[LoadedJob]:
    if not documents:
        raise SpecError([Problem("", "no Job document found", file)])
    loaded: list[LoadedJob] = []
    problems: list[Problem] = []
    for document in documents:
        job, found = check_document(document)
        problems += found
        if job is not None:
            loaded.append(LoadedJob(job, document))
    if problems:
        raise SpecError(problems)
    return loaded


def load_jobs(ref: str) -> list[LoadedJob]:
    """Every job in a YAML/JSON file (``-`` for stdin) or the job of an SDK task reference."""
    match = _SDK_REF.match(ref)
    if match:
        from torchjob.sdk.loader import load_task_job  # lazy: only SDK references need it

        return [load_task_job(match["path"], match["name"])]
    return check_jobs(load_documents(ref), ref)


def load_jobs_from_text(text: str, file: str = "<text>") -> list[LoadedJob]:
    return check_jobs(parse_documents(text, file), file)
