"""The job spec: loading (YAML, JSON, stdin, several documents), line numbers, webhook defaults."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from support import Ran
from torchjob.errors import Problem, SpecError
from torchjob.expand import expand
from torchjob.jobs import load_jobs, load_jobs_from_text
from torchjob.spec.model import Job
from torchjob.spec.source import child, parse_documents

JOB = """\
apiVersion: batch.volcano.sh/v1alpha1
kind: Job
metadata:
  name: {name}
spec:
{spec}  tasks:
    - name: master
      replicas: 1
      template:
        spec:
          containers:
            - name: main
              image: busybox:1.36.1
    - name: worker
      replicas: 3
      template:
        spec:
          containers:
            - name: main
              image: busybox:1.36.1
"""


def job_text(spec: str = "", name: str = "demo") -> str:
    return JOB.format(name=name, spec=spec)


def load_one(text: str) -> Job:
    [loaded] = load_jobs_from_text(text, "job.yaml")
    return loaded.job


def problems(text: str, file: str = "job.yaml") -> list[Problem]:
    with pytest.raises(SpecError) as caught:
        load_jobs_from_text(text, file)
    return caught.value.problems


def formatted(text: str) -> list[str]:
    return [p.format() for p in problems(text)]


# --- defaults, as Volcano's mutating webhook applies them


def test_job_level_defaults() -> None:
    job = load_one(job_text())
    assert job.spec.queue == "default"
    assert job.spec.scheduler_name == "volcano"
    assert job.spec.max_retry == 3
    assert job.metadata.namespace == "default"


def test_explicit_values_are_kept() -> None:
    job = load_one(job_text("  queue: research\n  schedulerName: other\n  maxRetry: 5\n  minAvailable: 2\n"))
    assert (job.spec.queue, job.spec.scheduler_name, job.spec.max_retry) == ("research", "other", 5)
    assert job.spec.min_available == 2


def test_an_explicit_max_retry_of_zero_becomes_three() -> None:
    """The webhook cannot tell 0 from unset, so Volcano turns an explicit 0 into 3 as well."""
    assert load_one(job_text("  maxRetry: 0\n")).spec.max_retry == 3


def test_task_defaults() -> None:
    text = (
        job_text()
        .replace("    - name: master\n", "    - maxRetry: 2\n")
        .replace("    - name: worker\n", "    - ")
    )
    text = text.replace("      replicas: 3\n", "replicas: 3\n      minAvailable: 2\n", 1)
    job = load_one(text)
    assert [t.name for t in job.spec.tasks] == ["default0", "default1"]
    assert [t.min_available for t in job.spec.tasks] == [1, 2]
    assert [t.max_retry for t in job.spec.tasks] == [2, 3]
    # The job's minAvailable is the sum of the (defaulted) task values, not of the replicas.
    assert job.spec.min_available == 3


def test_job_min_available_defaults_to_the_sum_of_replicas() -> None:
    assert load_one(job_text()).spec.min_available == 4


def test_partition_policy_sets_task_min_available() -> None:
    text = job_text().replace(
        "      replicas: 3\n",
        "      replicas: 4\n"
        "      partitionPolicy: {totalPartitions: 2, partitionSize: 2, minPartitions: 1}\n",
    )
    assert load_one(text).spec.tasks[1].min_available == 2


def test_pytorch_turns_svc_on() -> None:
    job = load_one(job_text("  plugins:\n    pytorch: []\n"))
    assert job.spec.plugins == {"pytorch": [], "svc": []}


def test_pytorch_keeps_existing_svc_flags() -> None:
    job = load_one(
        job_text('  plugins:\n    pytorch: ["--port=1234"]\n    svc: ["--disable-network-policy"]\n')
    )
    assert job.spec.plugins == {"pytorch": ["--port=1234"], "svc": ["--disable-network-policy"]}


def test_no_framework_plugin_no_svc() -> None:
    assert load_one(job_text("  plugins:\n    env: []\n")).spec.plugins == {"env": []}
    assert load_one(job_text()).spec.plugins == {}


def test_defaults_reach_the_pods() -> None:
    pod = expand(load_one(job_text())).pods[0].manifest
    assert pod["spec"]["schedulerName"] == "volcano"
    assert pod["metadata"]["labels"]["volcano.sh/queue-name"] == "default"


# --- line numbers point at the offending field


def test_line_of_a_wrong_value() -> None:
    text = job_text().replace("      replicas: 3", "      replicas: three")
    assert formatted(text) == ["job.yaml:15: spec.tasks[1].replicas: expected an integer, got string 'three'"]


def test_line_of_an_unknown_key_is_the_key() -> None:
    text = job_text("  queue: a\n  priority: 5\n")
    [line] = formatted(text)
    assert line.startswith("job.yaml:7: spec.priority: unknown field 'priority'")


def test_line_of_a_missing_field_is_its_parent() -> None:
    text = job_text().replace("      replicas: 3\n", "")
    assert formatted(text) == [
        "job.yaml:14: spec.tasks[1].replicas: required field is missing: expected an integer"
    ]


def test_line_of_a_field_whose_value_starts_below_it() -> None:
    """A nested value is reported at its key, not at the first line of the value."""
    text = job_text().replace(
        "          containers:\n            - name: main\n              image: busybox:1.36.1\n",
        "          containers:\n            []\n",
        1,
    )
    assert formatted(text) == [
        "job.yaml:11: spec.tasks[0].template.spec.containers: expected at least one container"
    ]


def test_line_of_a_list_item() -> None:
    text = job_text('  plugins:\n    svc:\n      - "--publish-not-ready-addresses"\n      - 7\n')
    assert formatted(text) == ["job.yaml:9: spec.plugins.svc[1]: expected a string (quote it), got integer 7"]


def test_line_and_path_of_a_key_with_dots() -> None:
    text = job_text().replace(
        "  name: demo\n",
        "  name: demo\n  labels:\n    app.kubernetes.io/name: x\n    app.kubernetes.io/part-of: 5\n",
    )
    assert formatted(text) == [
        'job.yaml:7: metadata.labels["app.kubernetes.io/part-of"]: '
        "expected a string value (quote it), got integer 5"
    ]


def test_lines_in_a_flow_mapping() -> None:
    text = job_text().replace(
        "            - name: main\n              image: busybox:1.36.1\n",
        "            - {name: main,\n               image: 42}\n",
        1,
    )
    assert formatted(text) == [
        "job.yaml:13: spec.tasks[0].template.spec.containers[0].image: expected a string, got integer 42"
    ]


def test_lines_of_cross_field_problems() -> None:
    text = job_text("  minAvailable: 9\n").replace(
        "      replicas: 3\n", "      replicas: 3\n      minAvailable: 4\n"
    )
    assert formatted(text) == [
        "job.yaml:6: spec.minAvailable: expected at most the total replicas of all tasks (4), got 9",
        "job.yaml:17: spec.tasks[1].minAvailable: expected at most replicas (3), got 4",
    ]


def test_syntax_error_line_and_column() -> None:
    [line] = formatted("apiVersion: v1\nkind: [Job\nmetadata: {}\n")
    assert line.startswith("job.yaml:3: invalid YAML or JSON: ")
    assert "(column" in line


def test_a_control_character_is_located_in_characters_not_bytes() -> None:
    assert formatted("a: ééé\nb: x\x07\n") == [
        "job.yaml:2: invalid YAML or JSON: character '\\x07' is not allowed (column 5)"
    ]


def test_path_quoting() -> None:
    assert child("spec", "tasks") == "spec.tasks"
    assert child("spec.tasks", 2) == "spec.tasks[2]"
    assert child("", "metadata") == "metadata"
    assert child("metadata.labels", "a.b/c") == 'metadata.labels["a.b/c"]'
    assert child("x", "a\nb") == 'x["a\\nb"]'


# --- documents: several per file, JSON, stdin


def test_several_documents_give_several_jobs() -> None:
    text = "---\n" + job_text(name="one") + "---\n" + job_text(name="two") + "---\n"
    loaded = load_jobs_from_text(text, "jobs.yaml")
    assert [item.job.name for item in loaded] == ["one", "two"]
    assert [item.document.index for item in loaded] == [0, 1]


def test_the_bad_document_of_several_is_named() -> None:
    text = job_text(name="one") + "---\n" + job_text(name="two").replace("replicas: 3", "replicas: -3")
    assert formatted(text) == [
        "job.yaml:36: spec.tasks[1].replicas: expected an integer >= 0, got -3 (in document 2)"
    ]


def test_empty_documents_are_skipped() -> None:
    assert [item.job.name for item in load_jobs_from_text("---\n---\n" + job_text() + "...\n---\n")] == [
        "demo"
    ]


def as_json(text: str) -> str:
    return json.dumps(yaml.safe_load(text), indent=2)


def test_json_input() -> None:
    assert load_one(as_json(job_text())).name == "demo"


def test_json_line_numbers() -> None:
    text = as_json(job_text().replace("replicas: 3", "replicas: '3'"))
    [problem] = problems(text)
    assert problem.path == "spec.tasks[1].replicas"
    assert problem.line is not None
    assert '"replicas": "3"' in text.splitlines()[problem.line - 1]


def test_json_file(tmp_path: Path) -> None:
    path = tmp_path / "job.json"
    path.write_text(as_json(job_text()))
    [loaded] = load_jobs(str(path))
    assert loaded.job.name == "demo" and loaded.file == str(path)


@pytest.mark.timeout(60)
def test_stdin_validate_and_render(run_main: Callable[..., Ran]) -> None:
    result = run_main("validate", "-", stdin=job_text())
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("-: job demo: valid; 4 pods")
    result = run_main("render", "-", "-o", "json", stdin=job_text())
    assert result.returncode == 0, result.stderr
    names = [item["metadata"]["name"] for item in json.loads(result.stdout)["items"] if item["kind"] == "Pod"]
    assert names == ["demo-master-0", "demo-worker-0", "demo-worker-1", "demo-worker-2"]


@pytest.mark.timeout(60)
def test_stdin_errors_are_named_dash(run_main: Callable[..., Ran]) -> None:
    result = run_main("validate", "-", stdin=job_text().replace("replicas: 3", "replicas: x"))
    assert result.returncode == 2
    assert result.stderr == "-:15: spec.tasks[1].replicas: expected an integer, got string 'x'\n"


# --- what the loader keeps and what it refuses


def test_the_pod_template_survives_untouched() -> None:
    extra = (
        "          nodeSelector: {disk: ssd}\n"
        "          tolerations: [{key: gpu, operator: Exists}]\n"
        "          containers:\n"
        "            - name: main\n"
        "              image: busybox:1.36.1\n"
        "              resources: {limits: {cpu: '0.5', memory: 1Gi}}\n"
        "              readinessProbe: {exec: {command: ['true']}}\n"
    )
    text = job_text().replace(
        "          containers:\n            - name: main\n              image: busybox:1.36.1\n", extra, 1
    )
    spec: dict[str, Any] = expand(load_one(text)).pods[0].manifest["spec"]
    assert spec["nodeSelector"] == {"disk": "ssd"}
    assert spec["tolerations"] == [{"key": "gpu", "operator": "Exists"}]
    assert spec["containers"][0]["resources"] == {"limits": {"cpu": "0.5", "memory": "1Gi"}}


def test_timestamps_stay_text() -> None:
    """kubectl reads an unquoted date as a string; so does torchjob (json output must not crash)."""
    text = job_text().replace("  name: demo\n", "  name: demo\n  annotations: {since: 2024-01-31}\n")
    assert load_one(text).metadata.annotations == {"since": "2024-01-31"}


def test_null_lists_mean_unset() -> None:
    text = job_text().replace(
        "          containers:\n",
        "          initContainers: null\n          volumes: ~\n          containers:\n",
        1,
    )
    text = text.replace("  tasks:", "  plugins: {pytorch: [], env: null}\n  tasks:")
    pods = expand(load_one(text)).pods
    for pod in pods:
        assert "initContainers" not in pod.manifest["spec"]
        assert [v["name"] for v in pod.manifest["spec"]["volumes"]] == ["demo-svc"]


def test_a_null_env_value_means_empty() -> None:
    text = job_text().replace(
        "              image: busybox:1.36.1\n",
        "              image: busybox:1.36.1\n              env: [{name: A, value: null}]\n",
        1,
    )
    env = expand(load_one(text)).pods[0].manifest["spec"]["containers"][0]["env"]
    assert env == [{"name": "A"}]


def test_anchors_and_merge_keys_work() -> None:
    text = """\
apiVersion: batch.volcano.sh/v1alpha1
kind: Job
metadata: {name: anchors}
spec:
  tasks:
    - name: a
      replicas: 1
      template: &pod
        spec:
          containers: [{name: main, image: "busybox:1.36.1"}]
    - <<: {name: b, replicas: 2}
      template: *pod
"""
    job = load_one(text)
    assert [(t.name, t.replicas) for t in job.spec.tasks] == [("a", 1), ("b", 2)]


MERGE = """\
apiVersion: batch.volcano.sh/v1alpha1
kind: Job
metadata: {name: merge}
spec:
  tasks:
    - &base
      name: a
      replicas: 1
      template:
        spec:
          containers: [{name: main, image: "busybox:1.36.1"}]
    - <<: [*base, {name: x, replicas: 5, maxRetry: 4}]
      name: b
      replicas: 2
"""


def test_a_merge_key_is_overridden_by_the_keys_written_after_it() -> None:
    """YAML 1.1's merge key: written keys win, and of several merged maps the first wins."""
    job = load_one(MERGE)
    assert [(t.name, t.replicas, t.max_retry) for t in job.spec.tasks] == [("a", 1, 3), ("b", 2, 4)]
    # The merged node is built once per alias; the second build must not see "duplicates" either.
    twice = MERGE + "    - &again\n      <<: *base\n      name: c\n    - <<: *again\n      name: d\n"
    assert [t.name for t in load_one(twice).spec.tasks] == ["a", "b", "c", "d"]


def test_a_key_written_twice_next_to_a_merge_key_is_still_a_duplicate() -> None:
    text = MERGE.replace("      replicas: 2\n", "      replicas: 2\n      replicas: 3\n")
    assert formatted(text) == ["job.yaml:15: spec.tasks[1].replicas: duplicate key 'replicas'"]


def test_json_escapes_of_a_character_beyond_the_basic_plane() -> None:
    """JSON writes U+1F600 as a surrogate pair of escapes; libyaml alone refuses them."""
    data = yaml.safe_load(job_text())
    data["spec"]["tasks"][0]["template"]["metadata"] = {"annotations": {"mood": "\U0001f600 ok"}}
    text = json.dumps(data)
    assert "\\ud83d\\ude00" in text
    job = load_one(text)
    assert job.spec.tasks[0].template.metadata["annotations"]["mood"] == "\U0001f600 ok"
    [line] = formatted(text.replace("\\ude00", ""))
    assert "spec.tasks[0].template.metadata.annotations.mood: a \\u escape of half a UTF-16" in line


@pytest.mark.parametrize(
    ("snippet", "message"),
    [
        ("!!binary aGVsbG8=", "binary data is not allowed here"),
        ("!!python/name:os.system", "unsupported YAML tag '!!python/name:os.system'"),
        ("!custom {a: 1}", "unsupported YAML tag '!custom'"),
        (".nan", "expected a finite number"),
        ("-.inf", "expected a finite number"),
        ("9" * 5000, "integer of 5000 characters is too large; expected a 64-bit integer"),
        (str(2**63), f"integer {2**63} is too large; expected a 64-bit integer"),
        (str(-(2**63) - 1), "is too large; expected a 64-bit integer"),
    ],
)
def test_values_a_kubernetes_object_cannot_hold(snippet: str, message: str) -> None:
    text = job_text().replace("  name: demo\n", f"  name: demo\n  annotations: {{x: {snippet} }}\n")
    [line] = formatted(text)
    assert line.startswith("job.yaml:5: metadata.annotations.x: ") and message in line


def test_deep_nesting_is_refused_cleanly() -> None:
    text = job_text().replace("  name: demo\n", "  name: demo\n  labels: " + "[" * 150 + "]" * 150 + "\n")
    [line] = formatted(text)
    assert "nested more than 100 levels" in line


def test_one_mistake_gives_one_message() -> None:
    """A broken field must not produce follow-on errors (minAvailable, pytorch's replica rule)."""
    text = job_text("  plugins:\n    pytorch: []\n").replace(
        "      replicas: 1\n", "      replicas: one\n", 1
    )
    assert len(formatted(text)) == 1
    text = job_text().replace("  name: demo\n", "  namespace: demo\n")
    assert formatted(text) == ["job.yaml:3: metadata.name: required field is missing: expected a string"]


def test_non_mapping_task_keeps_later_indexes() -> None:
    text = job_text().replace("    - name: master\n", "    - just-a-string\n    - name: master\n", 1)
    lines = formatted(text)
    assert lines[0] == "job.yaml:7: spec.tasks[0]: expected a task mapping, got string 'just-a-string'"
    # The worker is now tasks[2] and is otherwise fine: nothing else is reported.
    assert len(lines) == 1


def test_parse_documents_keeps_index_and_lines() -> None:
    [doc] = parse_documents("# c\n---\na:\n  b: [1, 2]\n", "x.yaml")
    assert doc.data == {"a": {"b": [1, 2]}}
    assert doc.lines["a.b[1]"] == 4
    assert doc.line_of("a.b[7].c") == 4


def test_huge_integers_from_the_sdk_are_refused_without_printing_them() -> None:
    """Python cannot print an integer of over 4,300 digits; the SDK hands values over unparsed."""
    from torchjob.jobs import check_document
    from torchjob.spec.source import Document

    data = yaml.safe_load(job_text())
    data["spec"]["minAvailable"] = -(10**5000)
    data["spec"]["tasks"][0]["replicas"] = 10**5000
    pod = data["spec"]["tasks"][0]["template"]["spec"]
    pod["terminationGracePeriodSeconds"] = 10**5000
    pod["containers"][0]["args"] = [10**5000]
    pod["containers"][0]["resources"] = {"limits": {"cpu": 10**5000}}
    job, found = check_document(Document(data=data, file="sdk"))
    assert job is None
    messages = {p.path: p.message for p in found}
    base = "spec.tasks[0].template.spec"
    assert messages == {
        "spec.minAvailable": "expected an integer >= 0, got -<about 5000 digits>",
        "spec.tasks[0].replicas": "expected a 32-bit integer (at most 2147483647), got <about 5000 digits>",
        f"{base}.terminationGracePeriodSeconds": (
            "expected a number of seconds from 0 to 9223372036854775807, got <about 5000 digits>"
        ),
        f"{base}.containers[0].args[0]": "expected a string (quote it), got integer <about 5000 digits>",
        f"{base}.containers[0].resources.limits.cpu": "quantity is too large; expected at most 9.22e+18",
    }


def test_a_duplicate_key_is_reported_with_every_other_problem() -> None:
    """The last value of a key written twice is read on, so the job's own mistakes show too."""
    text = MERGE.replace("      replicas: 2\n", "      replicas: 2\n      replicas: 3\n")
    text = text.replace("name: b", "name: B_bad")
    found = formatted(text)
    assert "job.yaml:15: spec.tasks[1].replicas: duplicate key 'replicas'" in found
    assert any("spec.tasks[1].name" in line for line in found), found
