"""Pod templates are checked against Kubernetes' pod template schema (from the Volcano Job CRD)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from torchjob.errors import Issue, SpecError
from torchjob.jobs import load_jobs_from_text
from torchjob.spec import podschema
from torchjob.spec.podschema import check_template

REPO = Path(__file__).resolve().parent.parent
CRD = REPO.parent / "shared" / "crds" / "batch.volcano.sh_jobs.yaml"
T = "spec.tasks[0].template"

JOB = """\
apiVersion: batch.volcano.sh/v1alpha1
kind: Job
metadata:
  name: demo
spec:
  tasks:
    - name: worker
      replicas: {replicas}
      template:
{template}"""

# A template using much of the pod schema: every value is one the API server accepts.
RICH = """\
metadata:
  labels: {app: train}
  annotations: {note: x}
spec:
  restartPolicy: OnFailure
  terminationGracePeriodSeconds: 30
  nodeSelector: {disk: ssd}
  tolerations: [{key: gpu, operator: Exists, effect: NoSchedule}]
  affinity:
    nodeAffinity:
      requiredDuringSchedulingIgnoredDuringExecution:
        nodeSelectorTerms:
          - matchExpressions: [{key: zone, operator: In, values: [a, b]}]
  securityContext: {runAsUser: 1000, fsGroup: 2000}
  volumes:
    - {name: data, emptyDir: {sizeLimit: 1Gi}}
    - {name: cfg, configMap: {name: cfg, items: [{key: a, path: a}]}}
  initContainers:
    - {name: init, image: busybox:1.36.1, command: ["true"], restartPolicy: Always}
  containers:
    - name: main
      image: busybox:1.36.1
      imagePullPolicy: IfNotPresent
      command: [python, train.py]
      args: ["--lr", "0.1"]
      workingDir: /work
      env:
        - {name: A, value: "1"}
        - name: CPUS
          valueFrom: {resourceFieldRef: {resource: limits.cpu, divisor: 1m}}
      envFrom: [{configMapRef: {name: cfg, optional: true}}]
      ports: [{containerPort: 23456, protocol: TCP, name: dist}]
      resources:
        limits: {cpu: 2, memory: 4Gi, nvidia.com/gpu: 1}
        requests: {cpu: 500m, memory: "1e9"}
      livenessProbe:
        httpGet: {path: /healthz, port: http}
        periodSeconds: 10
      readinessProbe: {tcpSocket: {port: 23456}}
      volumeMounts: [{name: data, mountPath: /data, readOnly: true}]
      tty: false
"""


def template_of(text: str) -> Any:
    return yaml.safe_load(text)


def issues(text: str) -> list[tuple[str, str]]:
    return check_template(template_of(text), T)


def test_a_rich_valid_template_has_no_problem() -> None:
    assert issues(RICH) == []
    [loaded] = load_jobs_from_text(JOB.format(replicas=2, template=_indent(RICH)), "job.yaml")
    assert loaded.job.spec.tasks[0].replicas == 2


def _indent(text: str) -> str:
    return "".join(" " * 8 + line + "\n" for line in text.splitlines())


@pytest.mark.parametrize(
    ("where", "typo", "meant"),
    [
        ("containers[0]", "comand", "command"),
        ("containers[0]", "evn", "env"),
        ("containers[0]", "Command", "command"),
        ("containers[0]", "workdir", "workingDir"),
        ("containers[0].resources", "limts", "limits"),
        ("", "restartPolcy", "restartPolicy"),
        ("", "container", "containers"),
        ("", "nodeselector", "nodeSelector"),
    ],
)
def test_a_typo_gets_a_did_you_mean(where: str, typo: str, meant: str) -> None:
    template: dict[str, Any] = template_of(RICH)
    node = template["spec"]
    for part in where.replace("[0]", ".0").split(".") if where else []:
        node = node[int(part)] if part.isdigit() else node[part]
    node[typo] = "x"
    path = f"{T}.spec." + (f"{where}." if where else "") + typo
    assert check_template(template, T) == [Issue(path, f"unknown field {typo!r}; did you mean {meant!r}?")]


def test_an_unknown_field_with_nothing_close_says_where_to_look() -> None:
    template = template_of(RICH)
    template["spec"]["containers"][0]["frobnicate"] = 1
    template["spec"]["volumes"][0]["emptyDir"]["zzz"] = 1
    assert {i.path: i.message for i in check_template(template, T)} == {
        f"{T}.spec.containers[0].frobnicate": (
            "unknown field 'frobnicate'; 'kubectl explain pod.spec.containers' lists the fields"
        ),
        f"{T}.spec.volumes[0].emptyDir.zzz": "unknown field 'zzz'; expected one of medium, sizeLimit",
    }


def test_types_enums_ranges_and_quantities() -> None:
    template = template_of(RICH)
    spec = template["spec"]
    spec["restartPolicy"] = "Sometimes"
    spec["activeDeadlineSeconds"] = 2**63
    spec["hostNetwork"] = "yes"
    spec["tolerations"] = {"key": "gpu"}
    main = spec["containers"][0]
    main["args"] = ["--epochs", 3]
    main["ports"][0]["protocol"] = "tcp"
    main["resources"]["limits"] = {"cpu": 0.5, "memory": "4 GB", "nvidia.com/gpu": True}
    main["livenessProbe"]["httpGet"]["port"] = 8.5
    assert {i.path: i.message for i in check_template(template, T)} == {
        f"{T}.spec.restartPolicy": "expected one of Always, OnFailure, Never, got 'Sometimes'",
        f"{T}.spec.activeDeadlineSeconds": f"expected an int64 integer, got {2**63}",
        f"{T}.spec.hostNetwork": "expected true or false, got string 'yes'",
        f"{T}.spec.tolerations": "expected a list, got mapping",
        f"{T}.spec.containers[0].args[1]": "expected a string (quote it), got integer 3",
        f"{T}.spec.containers[0].ports[0].protocol": (
            "expected one of TCP, UDP, SCTP, got 'tcp'; did you mean 'TCP'?"
        ),
        f"{T}.spec.containers[0].resources.limits.cpu": (
            "expected an integer or a string, got number 0.5; quote it: '0.5'"
        ),
        f"{T}.spec.containers[0].resources.limits.memory": (
            "expected a quantity such as 2, 500m or 4Gi, got '4 GB'"
        ),
        f'{T}.spec.containers[0].resources.limits["nvidia.com/gpu"]': (
            "expected an integer or a string, got boolean True"
        ),
        f"{T}.spec.containers[0].livenessProbe.httpGet.port": (
            "expected an integer or a string, got number 8.5"
        ),
    }


def test_required_fields_and_null_as_unset() -> None:
    template = template_of(RICH)
    template["spec"]["volumes"][0] = {"emptyDir": {}}
    template["spec"]["nodeSelector"] = None
    template["spec"]["containers"][0]["env"][0]["value"] = None
    assert check_template(template, T) == [Issue(f"{T}.spec.volumes[0].name", "required field is missing")]


def test_a_field_parsing_reported_is_not_reported_again() -> None:
    """``env: 5`` is parsing's to report; the schema check stays silent about it."""
    template = template_of(RICH)
    template["spec"]["containers"][0].update(env=5, tty="maybe")
    text = JOB.format(replicas=1, template=_indent(yaml.safe_dump(template)))
    with pytest.raises(SpecError) as caught:
        load_jobs_from_text(text, "job.yaml")
    lines = [p.format() for p in caught.value.problems]
    assert sum(".env:" in line for line in lines) == 1, lines
    assert any(".tty: expected true or false" in line for line in lines), lines


def test_each_template_is_checked_once_whatever_the_replicas(monkeypatch: pytest.MonkeyPatch) -> None:
    import torchjob.spec.validate as validate

    calls: list[str] = []

    def counting(template: Any, path: str, skip: Any = None) -> list[tuple[str, str]]:
        calls.append(path)
        return check_template(template, path, skip)

    monkeypatch.setattr(validate, "check_template", counting)
    load_jobs_from_text(JOB.format(replicas=10_000, template=_indent(RICH)), "job.yaml")
    assert calls == [T]


def test_the_schema_is_read_only_when_a_template_is_checked() -> None:
    code = (
        "import torchjob.jobs, torchjob.spec.podschema as p\n"
        "assert p._load.cache_info().currsize == 0\n"
        "p.check_template({'spec': {'containers': []}}, 't')\n"
        "assert p._load.cache_info().currsize == 1\n"
    )
    import subprocess

    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def test_the_shipped_schema_is_package_data() -> None:
    spec = importlib.util.find_spec("torchjob")
    assert spec is not None
    data = json.loads(podschema.SCHEMA_FILE.read_text())
    assert "containers" in data["schema"]["properties"]["spec"]["properties"]
    pyproject = (REPO / "pyproject.toml").read_text()
    assert '"spec/schemas/*.json"' in pyproject


@pytest.mark.skipif(not CRD.exists(), reason=f"{CRD} is not there")
def test_the_shipped_schema_is_what_the_tool_makes_from_the_crd(tmp_path: Path) -> None:
    out = tmp_path / "podtemplate.json"
    tool = REPO / "tools" / "podtemplate_schema.py"
    import subprocess

    subprocess.run([sys.executable, str(tool), str(CRD), "-o", str(out)], check=True, timeout=120)
    assert out.read_text() == podschema.SCHEMA_FILE.read_text()


MUTATIONS = {
    "comand": lambda t: t["spec"]["containers"][0].update(comand=["x"]),
    "evn": lambda t: t["spec"]["containers"][0].update(evn=[{"name": "A", "value": "1"}]),
    "limts": lambda t: t["spec"]["containers"][0]["resources"].update(limts={"cpu": "1"}),
    "restartPolcy": lambda t: t["spec"].update(restartPolcy="Never"),
    "container": lambda t: t["spec"].update(container=t["spec"].pop("containers")),
    "label": lambda t: t["metadata"].update(label={"a": "b"}),
    "probe typo": lambda t: t["spec"]["containers"][0]["livenessProbe"].update(periodSecond=3),
    "tty string": lambda t: t["spec"]["containers"][0].update(tty="yes"),
    "deadline string": lambda t: t["spec"].update(activeDeadlineSeconds="soon"),
    "args integer": lambda t: t["spec"]["containers"][0].update(args=["--epochs", 3]),
    "volume without name": lambda t: t["spec"]["volumes"][0].pop("name"),
    "tolerations mapping": lambda t: t["spec"].update(tolerations={"key": "gpu"}),
}


@pytest.mark.parametrize("mutation", ["none", *MUTATIONS])
def test_the_verdict_agrees_with_kubernetes_own_pod_schema(mutation: str) -> None:
    """A template is refused exactly when Kubernetes' published Pod schema (strict) refuses it too.

    Enums and CRD-only rules (``cpu: 0.5``) are left out: the Pod schema carries neither.
    """
    kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate is missing")
    template = template_of(RICH)
    if mutation != "none":
        MUTATIONS[mutation](template)
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", **template["metadata"]}}
    pod["spec"] = template["spec"]
    try:
        kubernetes_validate.validate(pod, kubernetes_validate.latest_version(), strict=True)
        kubernetes_ok = True
    except kubernetes_validate.ValidationError:
        kubernetes_ok = False
    found = check_template(template, T)
    assert (found == []) == kubernetes_ok, found
    assert kubernetes_ok == (mutation == "none")
