"""The Issue record: what validation, plugins and engines report, with a severity."""

from __future__ import annotations

import pickle
from typing import Any

from torchjob.engines.local import check_job
from torchjob.engines.local.engine import LocalEngine
from torchjob.errors import Issue, Problem, warning
from torchjob.expand import expand
from torchjob.jobs import load_jobs_from_text
from torchjob.spec.defaults import apply_defaults
from torchjob.spec.parse import parse_job
from torchjob.spec.validate import validate_job

JOB = """
apiVersion: batch.volcano.sh/v1alpha1
kind: Job
metadata: {name: demo}
spec:
  plugins: {pytorch: ["--master=master", "--worker=worker"]}
  tasks:
    - name: master
      replicas: 1
      template:
        spec:
          containers:
            - name: main
              image: busybox
              command: ["true"]
              env: [{name: RANK, value: "7"}, {name: TORCHJOB_JOB_DIR, value: /x}]
    - name: worker
      replicas: 1
      template:
        spec:
          containers: [{name: main, image: busybox, command: ["true"]}]
"""


def test_an_issue_is_a_plain_record_with_named_fields() -> None:
    issue = Issue("spec.tasks[0].name", "bad name")
    assert (issue.path, issue.message, issue.severity) == ("spec.tasks[0].name", "bad name", "error")
    assert issue.is_error
    assert issue != ("spec.tasks[0].name", "bad name")  # a record, not a pair
    note = warning("spec.queue", "dropped")
    assert note.severity == "warning" and not note.is_error
    # Same place and words but another severity is another issue; duplicates fold.
    assert note != Issue("spec.queue", "dropped")
    assert list(dict.fromkeys([note, warning("spec.queue", "dropped")])) == [note]
    assert repr(note) == "Issue(path='spec.queue', message='dropped', severity='warning')"
    copied = pickle.loads(pickle.dumps(note))  # checks travel between processes as any record does
    assert (copied, copied.severity) == (note, "warning")


def test_a_problem_is_an_issue_with_its_file_and_line() -> None:
    problem = Problem.of(Issue("metadata.name", "too long"), "job.yaml", 3)
    assert problem == Problem("metadata.name", "too long", "job.yaml", 3)
    assert problem.format() == "job.yaml:3: metadata.name: too long"


def _job_data() -> Any:
    import yaml

    return yaml.safe_load(JOB)


def test_validation_returns_error_issues() -> None:
    data = _job_data()
    data["metadata"]["name"] = "Demo"
    data["spec"]["tasks"][0]["replicas"] = "two"
    job, parsed = parse_job(data)
    assert job is not None
    apply_defaults(job)
    assert parsed and all(isinstance(i, Issue) and i.is_error for i in parsed)
    found = validate_job(job)
    assert [i.path for i in found] == ["metadata.name"]
    assert all(isinstance(i, Issue) and i.is_error for i in found)


def test_plugin_and_local_engine_warnings_are_warnings() -> None:
    job = load_jobs_from_text(JOB, "job.yaml")[0].job
    plugin_notes = expand(job).warnings
    assert [i.path for i in plugin_notes] == ["spec.tasks[0].template.spec.containers[0].env[0]"]
    assert all(isinstance(i, Issue) and i.severity == "warning" for i in plugin_notes)
    local_notes = LocalEngine().warnings(job)  # what validate --local prints
    assert [i.path for i in local_notes] == ["spec.tasks[0].template.spec.containers[0].env[1].name"]
    assert all(isinstance(i, Issue) and i.severity == "warning" for i in local_notes)
    assert check_job(job) == []


def test_engine_check_returns_error_issues() -> None:
    empty = """
apiVersion: batch.volcano.sh/v1alpha1
kind: Job
metadata: {name: empty}
spec:
  tasks: [{name: a, replicas: 0, template: {spec: {containers: [{name: c, image: busybox}]}}}]
"""
    job = load_jobs_from_text(empty, "job.yaml")[0].job
    found = check_job(job)
    assert found == [Issue("spec.tasks", "every task has 0 replicas: there is no pod to run")]
    assert all(isinstance(i, Issue) and i.is_error for i in found)
