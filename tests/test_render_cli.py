"""``torchjob render`` and ``torchjob validate`` from the command line, and the output writers."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import torchjob.render as render_module
from support import Ran, torchjob
from torchjob.expand import expand
from torchjob.jobs import load_jobs
from torchjob.render import dump, dump_json, dump_yaml, list_of, write_list

pytestmark = pytest.mark.timeout(120)

JOB = """\
apiVersion: batch.volcano.sh/v1alpha1
kind: Job
metadata:
  name: {name}
  annotations:
    note: "yes"
spec:
  plugins:
    pytorch: ["--wait-master-enabled=true"]
    env: []
  tasks:
    - name: master
      replicas: 1
      template:
        metadata:
          labels: {{app: "on", version: "1.10"}}
        spec:
          containers:
            - name: main
              image: python:3.11
              command: ["python", "-c", "print('hi: there # not a comment')"]
              env:
                - {{name: EMPTY, value: ""}}
                - {{name: MULTI, value: "line one\\nline two\\n"}}
                - {{name: NUMBERISH, value: "1e3"}}
                - {{name: UNICODE, value: "caf\\u00e9 \\u2028 done"}}
    - name: worker
      replicas: {workers}
      template:
        spec:
          containers:
            - name: main
              image: python:3.11
"""


@pytest.fixture
def job_file(tmp_path: Path) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(JOB.format(name="demo", workers=2))
    return path


def test_render_prints_a_kubernetes_list(job_file: Path, run_main: Callable[..., Ran]) -> None:
    result = run_main("render", str(job_file))
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert result.stdout.startswith("apiVersion: v1\nkind: List\nitems:\n")
    out = yaml.safe_load(result.stdout)
    assert set(out) == {"apiVersion", "kind", "items"}
    kinds = [i["kind"] for i in out["items"]]
    # The ConfigMap and Service come before the pods that use them.
    assert kinds == ["ConfigMap", "Service", "NetworkPolicy", "Pod", "Pod", "Pod"]
    assert run_main("render", str(job_file), "-o", "yaml").stdout == result.stdout


def test_render_is_byte_identical_across_runs(job_file: Path) -> None:
    outputs = {  # processes of their own: each with another hash seed
        fmt: {
            torchjob(
                "render", str(job_file), "-o", fmt, env={**os.environ, "PYTHONHASHSEED": str(seed)}
            ).stdout
            for seed in (1, 2, 3)
        }
        for fmt in ("yaml", "json")
    }
    for fmt, texts in outputs.items():
        assert len(texts) == 1, fmt
        assert next(iter(texts))


def test_json_and_yaml_parse_to_the_same_object(job_file: Path, run_main: Callable[..., Ran]) -> None:
    as_yaml = yaml.safe_load(run_main("render", str(job_file), "-o", "yaml").stdout)
    as_json = json.loads(run_main("render", str(job_file), "-o", "json").stdout)
    assert as_yaml == as_json
    master = as_json["items"][3]
    env = {e["name"]: e.get("value") for e in master["spec"]["containers"][0]["env"]}
    # Strings that look like other types stay strings.
    assert env["EMPTY"] == "" and env["NUMBERISH"] == "1e3" and env["MULTI"] == "line one\nline two\n"
    assert env["UNICODE"] == "caf\u00e9 \u2028 done"
    assert master["metadata"]["labels"]["app"] == "on"
    assert master["metadata"]["labels"]["version"] == "1.10"
    assert master["spec"]["containers"][0]["command"][2] == "print('hi: there # not a comment')"


def test_multi_document_input_renders_every_job(tmp_path: Path, run_main: Callable[..., Ran]) -> None:
    path = tmp_path / "two.yaml"
    path.write_text(JOB.format(name="first", workers=1) + "---\n" + JOB.format(name="second", workers=3))
    result = run_main("render", str(path), "-o", "json")
    assert result.returncode == 0, result.stderr
    items = json.loads(result.stdout)["items"]
    pods = [i["metadata"]["name"] for i in items if i["kind"] == "Pod"]
    assert pods == [
        "first-master-0",
        "first-worker-0",
        "second-master-0",
        "second-worker-0",
        "second-worker-1",
        "second-worker-2",
    ]
    services = [i["metadata"]["name"] for i in items if i["kind"] == "Service"]
    assert services == ["first", "second"]


def test_dash_reads_stdin(job_file: Path, run_main: Callable[..., Ran]) -> None:
    text = job_file.read_text()
    from_stdin = run_main("render", "-", stdin=text)
    assert from_stdin.returncode == 0, from_stdin.stderr
    assert from_stdin.stdout == run_main("render", str(job_file)).stdout
    validated = run_main("validate", "-", stdin=text)
    assert validated.returncode == 0
    assert validated.stdout.startswith("-: job demo: valid")


def test_validate_prints_one_summary_line_per_job(
    tmp_path: Path, job_file: Path, run_main: Callable[..., Ran]
) -> None:
    two = tmp_path / "two.yaml"
    two.write_text(JOB.format(name="first", workers=1) + "---\n" + JOB.format(name="second", workers=3))
    result = run_main("validate", str(two), str(job_file))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 3
    assert lines[0].startswith(f"{two}: job first: valid; 2 pods")
    assert lines[1].startswith(f"{two}: job second: valid; 4 pods")
    assert lines[2].startswith(f"{job_file}: job demo: valid; 3 pods")
    assert "master" in lines[1] and "worker" in lines[1] and "pytorch" in lines[1]


def test_bad_input_gives_exit_2_and_one_line_per_problem(
    tmp_path: Path, run_main: Callable[..., Ran]
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(JOB.format(name="Bad_Name", workers=-1))
    for command in ("validate", "render"):
        result = run_main(command, str(bad))
        assert result.returncode == 2
        assert result.stdout == ""
        assert "Traceback" not in result.stderr
        lines = result.stderr.splitlines()
        assert any(line.startswith(f"{bad}:4: metadata.name:") for line in lines), lines
        assert any("spec.tasks[1].replicas" in line for line in lines), lines


def test_missing_file_is_a_clean_error(tmp_path: Path, run_main: Callable[..., Ran]) -> None:
    result = run_main("render", str(tmp_path / "nope.yaml"))
    assert result.returncode == 2
    assert "nope.yaml" in result.stderr and "Traceback" not in result.stderr


# -------------------------------------------------------------------------------- the writers

# Strings a YAML 1.1 reader could take for something else, or that need escaping.
TRICKY = [
    "", " ", "~", "null", "Null", "NULL", "true", "False", "yes", "No", "on", "OFF", "y", "Y", "n", "N",
    "1", "-1", "+1", "0x1F", "0o17", "017", "0b101", "1_000", "1e3", "1E-3", ".5", "5.", "1.0", ".inf",
    "-.Inf", ".nan", "12:30", "1:20:30.5", "2024-01-01", "2024-01-01T10:00:00Z", "=", "<<", "-", "--", "---",
    "...", "- x", "? x", ": x", "a: b", "a:", "a #b", "#x", "&a", "*a", "!t", "%p", "@x", "`x", "{a}", "[a]",
    "a,b", "|", ">", "'", '"', "\\", "'q'", '"dq"', " lead", "trail ", "tab\there", "\t", "x\ny", "x\n",
    "x\n\n", "\nx", "\n", "line\r\nbreak", "caf\u00e9", "\u2028", "\x85", "\ufeff", "\x00", "\x1b[0m",
    "emoji \U0001f600", "http://example.com/a?b=c#d", "registry:5000/img:tag", "a" * 2000,
]  # fmt: skip
# What Go's YAML reader (behind kubectl) takes as non-strings but PyYAML does not.
GO_ONLY = ["y", "Y", "n", "N", "1e3"]


def test_tricky_strings_round_trip() -> None:
    data = {"items": TRICKY, "keyed": {s: s for s in TRICKY if s}, "nested": [[s] for s in TRICKY]}
    assert yaml.safe_load(dump_yaml(data)) == data
    assert json.loads(dump_json(data)) == data


@pytest.mark.parametrize("text", GO_ONLY)
def test_strings_go_would_misread_are_quoted(text: str) -> None:
    assert dump_yaml({"v": text}) != f"v: {text}\n"


def test_plain_data_layout() -> None:
    data = {"a": 1, "b": [1, {"c": None, "d": True}, [], {}], "e": {}, "f": 2.5, "g": "x\ny"}
    assert dump_yaml(data) == (
        "a: 1\nb:\n- 1\n- c: null\n  d: true\n- []\n- {}\ne: {}\nf: 2.5\ng: |-\n  x\n  y\n"
    )


# Multi-line strings with leading blanks, blank lines and trailing newlines test the block styles.
block_texts = st.sampled_from(["\n", "a\n", "\n\n", " a\n b", "a\n\n", "a\n \n", "x\n\t", "\tx\ny", "a\r\nb"])
json_scalars = (
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text() | block_texts
)
plain_data = st.recursive(
    json_scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(), children, max_size=4),
    max_leaves=25,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(plain_data)
def test_yaml_writer_round_trips_any_plain_data(data: Any) -> None:
    assert yaml.safe_load(dump_yaml(data)) == data


@settings(max_examples=300, deadline=None)
@given(plain_data)
def test_json_writer_matches_the_standard_library(data: Any) -> None:
    assert dump_json(data) == json.dumps(data, indent=2, ensure_ascii=False) + "\n"


def test_two_jobs_with_one_name_in_a_file_are_refused(tmp_path: Path, run_main: Callable[..., Ran]) -> None:
    path = tmp_path / "twice.yaml"
    path.write_text(JOB.format(name="same", workers=1) + "---\n" + JOB.format(name="same", workers=2))
    second_name_line = JOB.count("\n") + 1 + 4  # the '---' line, then line 4 of the second document
    for command in ("validate", "render"):
        result = run_main(command, str(path))
        assert result.returncode == 2
        assert result.stdout == ""
        [line] = result.stderr.splitlines()
        assert line.startswith(f"{path}:{second_name_line}: metadata.name: job 'same'")


def test_json_input_renders_like_the_same_job_in_yaml(
    tmp_path: Path, job_file: Path, run_main: Callable[..., Ran]
) -> None:
    as_json = tmp_path / "job.json"
    as_json.write_text(json.dumps(yaml.safe_load(job_file.read_text()), indent=1))
    result = run_main("render", str(as_json))
    assert result.returncode == 0, result.stderr
    assert result.stdout == run_main("render", str(job_file)).stdout


# ---------------------------------------------------------------------- read back by kubectl


class _FakeApiServer(BaseHTTPRequestHandler):
    """Just enough of the Kubernetes API for ``kubectl apply --dry-run=client``: discovery, and
    404 for every object (so each one would be created)."""

    def _resources(group_version: str, kinds: list[tuple[str, str]]) -> dict[str, Any]:  # type: ignore[misc]
        verbs = ["create", "delete", "get", "list", "patch", "update", "watch"]
        return {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": group_version,
            "resources": [
                {
                    "name": plural,
                    "singularName": kind.lower(),
                    "namespaced": True,
                    "kind": kind,
                    "verbs": verbs,
                }
                for plural, kind in kinds
            ],
        }

    core: ClassVar[list[tuple[str, str]]] = [
        ("pods", "Pod"),
        ("services", "Service"),
        ("configmaps", "ConfigMap"),
        ("persistentvolumeclaims", "PersistentVolumeClaim"),
    ]
    networking: ClassVar[dict[str, str]] = {"groupVersion": "networking.k8s.io/v1", "version": "v1"}
    routes: ClassVar[dict[str, Any]] = {
        "/api": {"kind": "APIVersions", "versions": ["v1"]},
        "/api/v1": _resources("v1", core),
        "/apis": {
            "kind": "APIGroupList",
            "apiVersion": "v1",
            "groups": [
                {"name": "networking.k8s.io", "versions": [networking], "preferredVersion": networking}
            ],
        },
        "/apis/networking.k8s.io/v1": _resources(
            "networking.k8s.io/v1", [("networkpolicies", "NetworkPolicy")]
        ),
    }

    def do_GET(self) -> None:
        body = self.routes.get(self.path.split("?")[0])
        code = 200 if body is not None else 404
        if body is None:
            body = {
                "kind": "Status",
                "apiVersion": "v1",
                "status": "Failure",
                "reason": "NotFound",
                "code": 404,
            }
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def fake_api_server() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FakeApiServer)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def tricky_job(tmp_path: Path) -> Path:
    doc = yaml.safe_load(JOB.format(name="tricky", workers=1))
    main = doc["spec"]["tasks"][0]["template"]["spec"]["containers"][0]
    main["env"] = [{"name": f"V{i}", "value": text} for i, text in enumerate(TRICKY) if "\x00" not in text]
    doc["spec"]["tasks"][0]["template"]["metadata"]["annotations"] = {
        f"example.com/k{i}": text for i, text in enumerate(TRICKY) if "\x00" not in text
    }
    path = tmp_path / "tricky.yaml"
    path.write_text(json.dumps(doc, ensure_ascii=False), encoding="utf-8")
    return path


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
def test_kubectl_reads_the_yaml_as_the_same_objects(
    tmp_path: Path, fake_api_server: str, run_main: Callable[..., Ran]
) -> None:
    """Go's YAML reader (kubectl's) must see exactly the objects torchjob meant, strings included."""
    rendered = run_main("render", str(tricky_job(tmp_path)))
    assert rendered.returncode == 0, rendered.stderr
    out = tmp_path / "out.yaml"
    out.write_text(rendered.stdout)
    kubectl = ["kubectl", f"--server={fake_api_server}", "apply", "--dry-run=client", "--validate=false"]
    applied = subprocess.run(
        [*kubectl, "-f", str(out), "-o", "json"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "KUBECONFIG": str(tmp_path / "no-kubeconfig")},
    )
    assert applied.returncode == 0, applied.stderr
    seen = json.loads(applied.stdout)["items"]
    for item in seen:  # kubectl adds its own bookkeeping annotation
        annotations = item["metadata"].get("annotations", {})
        annotations.pop("kubectl.kubernetes.io/last-applied-configuration", None)
        if not annotations:
            item["metadata"].pop("annotations", None)
    assert seen == yaml.safe_load(rendered.stdout)["items"]


def streamed(items: list[dict[str, Any]], fmt: str) -> str:
    chunks: list[str] = []
    write_list(iter(items), fmt, chunks.append)
    return "".join(chunks)


@pytest.mark.parametrize("flush_at", [1, 100, 1 << 20])
@pytest.mark.parametrize("fmt", ["yaml", "json"])
def test_streamed_output_is_byte_identical_to_the_whole_dump(
    fmt: str, flush_at: int, job_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(render_module, "_FLUSH_AT", flush_at)
    [loaded] = load_jobs(str(job_file))
    state = expand(loaded.job)
    items = [*state.objects, *(p.manifest for p in state.pods)]
    assert streamed(items, fmt) == dump(list_of(items), fmt)
    assert streamed([], fmt) == dump(list_of([]), fmt)
    assert streamed(items[:1], fmt) == dump(list_of(items[:1]), fmt)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.dictionaries(st.text(), plain_data, max_size=3), max_size=3))
def test_streamed_output_matches_for_any_items(items: list[dict[str, Any]]) -> None:
    for fmt in ("yaml", "json"):
        assert streamed(items, fmt) == dump(list_of(items), fmt)


# The writer decides itself which plain strings YAML 1.1 reads as other types (render.py does not
# import PyYAML); here it is held to PyYAML's own resolver, on text built from the characters that
# make the difference: digits, signs, the letters of words and timestamps, dots, colons.
_RESOLVER = yaml.resolver.Resolver()
_YAMLISH_CHARACTERS = "0123456789-+.:_eExXoObBtTzZ nNyYuUlLsSfFaAiIrR~=<"
yamlish = st.text(alphabet=_YAMLISH_CHARACTERS, max_size=32) | st.sampled_from(
    [
        "2001-12-14t21:59:43.10-05:00", "2001-12-14T21:59:43Z", "2001-1-4T1:59:43",
        "2024-01-01T10:00:00+05:30", ".inf", ".Inf", ".NaN", "Yes", "yEs", "NULL", "nULL", "Off", "oFF",
        "On", "0x1F", "1:20:30.5",
    ]
)  # fmt: skip


@settings(max_examples=2000, deadline=None)
@given(yamlish)
def test_the_writers_quoting_agrees_with_pyyaml_resolver(text: str) -> None:
    from torchjob.render import _GO_BOOLS, _NUMBERISH, _PLAIN, _needs_quotes

    plain_for_pyyaml = _RESOLVER.resolve(yaml.ScalarNode, text, (True, False)) == "tag:yaml.org,2002:str"
    writer_own_rules = (
        not _PLAIN.match(text) or text.endswith(":") or text in _GO_BOOLS or _NUMBERISH.match(text)
    )
    assert _needs_quotes(text) == (bool(writer_own_rules) or not plain_for_pyyaml)


@pytest.mark.parametrize(
    "value", [1e17, 1e-5, 2.5, -0.0, 1e300, 5e-324, float("inf"), float("-inf"), 0.1 + 0.2]
)
def test_floats_are_written_as_pyyaml_writes_them(value: float) -> None:
    from torchjob.render import dump_yaml

    assert dump_yaml({"v": value}) == yaml.safe_dump({"v": value})


def test_writing_yaml_imports_no_yaml_parser() -> None:
    """`torchjob run` writes its records while its first pods start: PyYAML's import is 13 ms."""
    code = (
        "import sys; from torchjob.render import dump; dump({'a': ['x', 1.5, None, 'yes']}, 'yaml');"
        "print('yaml' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "False"
