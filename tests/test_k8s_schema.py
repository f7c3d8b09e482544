"""Every object ``torchjob render`` prints is valid for the Kubernetes API (strict schema).

Pods, Services, ConfigMaps and NetworkPolicies, plus the PersistentVolumeClaims of job volumes.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

kubernetes_validate = pytest.importorskip(
    "kubernetes_validate", reason="kubernetes-validate is not installed"
)

pytestmark = pytest.mark.timeout(120)

SEED = Path(__file__).resolve().parent.parent.parent / "shared" / "seeds" / "000_0d2fbf9b8108d20a.txt"
_FENCE = re.compile(r"^```ya?ml[ \t]*\n(.*?)^```", re.MULTILINE | re.DOTALL)

CONTAINER = """
            - name: main
              image: python:3.11
              command: ["python", "-m", "train"]
              ports: [{name: metrics, containerPort: 9090}]
              resources: {limits: {cpu: "1", memory: 1Gi}}
"""

ALL_FLAGS = f"""\
apiVersion: batch.volcano.sh/v1alpha1
kind: Job
metadata:
  name: every-flag
  namespace: research
  annotations: {{volcano.sh/preemptable: "true", volcano.sh/jdb-min-available: "1"}}
spec:
  queue: gpu
  priorityClassName: high
  volumes:
    - {{mountPath: /data, volumeClaimName: datasets}}
    - mountPath: /ckpt
      volumeClaim: {{accessModes: [ReadWriteOnce], resources: {{requests: {{storage: 1Gi}}}}}}
  plugins:
    pytorch: ["--master=chief", "--worker=trainer", "--port=29500", "--wait-master-enabled=true",
              "--wait-master-timeout=60", "--wait-master-image=busybox:1.36.1"]
    svc: ["--publish-not-ready-addresses=true", "--disable-network-policy=false", "--inject-hosts-env=true"]
    env: []
  tasks:
    - name: chief
      replicas: 1
      topologyPolicy: best-effort
      template:
        spec:
          hostname: chief
          subdomain: every-flag
          containers:{CONTAINER}
    - name: trainer
      replicas: 3
      template:
        spec:
          containers:{CONTAINER}
    - name: my-evaluator
      replicas: 2
      template:
        spec:
          containers:{CONTAINER}
"""

USER_INIT = f"""\
apiVersion: batch.volcano.sh/v1alpha1
kind: Job
metadata:
  name: with-init
spec:
  plugins:
    pytorch: ["--wait-master-enabled"]
    svc: ["--disable-network-policy", "--inject-hosts-env=false"]
  tasks:
    - name: master
      replicas: 1
      template:
        spec:
          initContainers:
            - {{name: fetch, image: "busybox:1.36.1", command: ["sh", "-c", "echo fetch"]}}
          containers:{CONTAINER}
    - name: worker
      replicas: 2
      template:
        spec:
          restartPolicy: OnFailure
          volumes: [{{name: scratch, emptyDir: {{}}}}]
          initContainers:
            - {{name: fetch, image: "busybox:1.36.1", command: ["sh", "-c", "echo fetch"]}}
            - name: unpack
              image: busybox:1.36.1
              command: ["true"]
              volumeMounts: [{{name: scratch, mountPath: /scratch}}]
          containers:{CONTAINER}
"""


def seed_text() -> str:
    if not SEED.exists():
        pytest.skip(f"{SEED} is not there")
    match = _FENCE.search(SEED.read_text(encoding="utf-8"))
    assert match, "the seed document has no YAML block"
    return match.group(1)


def render(text: str, tmp_path: Path) -> list[dict[str, Any]]:
    path = tmp_path / "job.yaml"
    path.write_text(text)
    result = subprocess.run(
        [sys.executable, "-m", "torchjob", "render", str(path), "-o", "json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    items: list[dict[str, Any]] = json.loads(result.stdout)["items"]
    return items


def validate(item: dict[str, Any]) -> None:
    version = kubernetes_validate.latest_version()
    try:
        kubernetes_validate.validate(item, version, strict=True)
    except kubernetes_validate.ValidationError as err:
        where = "/".join(str(p) for p in err.path)
        pytest.fail(f"{item['kind']} {item['metadata']['name']}: {where}: {err.message}")


@pytest.mark.parametrize("name", ["seed", "every-flag", "user-init"])
def test_rendered_objects_validate_against_the_kubernetes_schema(name: str, tmp_path: Path) -> None:
    text = seed_text() if name == "seed" else {"every-flag": ALL_FLAGS, "user-init": USER_INIT}[name]
    items = render(text, tmp_path)
    kinds = {i["kind"] for i in items}
    assert {"Pod", "Service", "ConfigMap"} <= kinds
    if name != "user-init":
        assert "NetworkPolicy" in kinds
    if name == "every-flag":
        assert "PersistentVolumeClaim" in kinds
    for item in items:
        validate(item)
    if name == "user-init":
        worker = next(i for i in items if i["metadata"]["name"] == "with-init-worker-0")
        assert [c["name"] for c in worker["spec"]["initContainers"]] == ["fetch", "unpack", "wait-for-master"]


def test_the_validator_catches_a_broken_pod(tmp_path: Path) -> None:
    """The schema check above can fail: a misspelt field is refused in strict mode."""
    pod = next(i for i in render(USER_INIT, tmp_path) if i["kind"] == "Pod")
    pod["spec"]["containers"][0]["imagePullPolicyy"] = "Always"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(pod, kubernetes_validate.latest_version(), strict=True)
