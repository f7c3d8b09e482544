"""Jobs of which only what they left remains on the cluster (their object and pods gone; a
ConfigMap, Service, claim, ... still labelled as theirs): the listing and ``wait``.

The real CLI and client over HTTP against the fake API server (kubeapi.py); what a job left is put
there as a cut-short creation or an orphaning delete leaves it, or made by a real ``submit``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("kubernetes")

from kube_fixtures import JOB_LABEL, demo_job
from kubeapi import FakeKubeAPI, now_iso
from test_kubernetes_commands import submitted
from torchjob.cli import main

pytestmark = pytest.mark.timeout(120)

JOB = demo_job(workers=2, min_available=2)
OLD = 3600.0  # seconds ago
LABELLED_KINDS = {
    "ConfigMap": "v1",
    "Service": "v1",
    "NetworkPolicy": "networking.k8s.io/v1",
    "PodGroup": "scheduling.volcano.sh/v1beta1",
    "PersistentVolumeClaim": "v1",
}


def k8s(*args: str, kubeconfig: str) -> list[str]:
    return [*args, "--engine", "kubernetes", "--kubeconfig", kubeconfig]


def leave(api: FakeKubeAPI, job: str, age: float, kinds: tuple[str, ...] = ("ConfigMap", "Service")) -> None:
    """What a `pods` job whose creation was cut short leaves (its ConfigMap and Service, by
    default), made ``age`` seconds ago."""
    for kind in kinds:
        name = f"{job}-svc" if kind == "ConfigMap" else job
        meta = {"name": name, "labels": {JOB_LABEL: job}, "creationTimestamp": now_iso(-age)}
        api.put({"apiVersion": LABELLED_KINDS[kind], "kind": kind, "metadata": meta, "spec": {}})


def labelled(api: FakeKubeAPI) -> dict[str, str]:
    """Every object labelled as some job's, ``kind/name`` -> uid."""
    with api.lock:
        return {
            f"{o['kind'].lower()}/{o['metadata']['name']}": o["metadata"]["uid"]
            for o in api.objects.values()
            if JOB_LABEL in (o["metadata"].get("labels") or {})
        }


# ---------------------------------------------------------------------- the listing


def test_the_listing_says_briefly_what_a_job_left_and_keeps_its_columns(
    api: FakeKubeAPI, job_file: Path, kubeconfig: str, capsys: pytest.CaptureFixture[str]
) -> None:
    submitted(api, job_file, kubeconfig, end="Completed")
    leave(api, "cut", OLD)
    leave(api, "big", OLD, tuple(LABELLED_KINDS))
    capsys.readouterr()
    assert main(k8s("status", kubeconfig=kubeconfig)) == 0
    header, *rows = capsys.readouterr().out.splitlines()
    by_job = {row.split()[0]: row for row in rows}
    assert sorted(by_job) == ["default/big", "default/cut", "default/demo"], rows
    pods_at, retries_at = header.index("PODS"), header.index("RETRIES")
    pods = {job: row[pods_at:retries_at].rstrip() for job, row in by_job.items()}
    assert pods == {
        "default/demo": "3 pods: 3 succeeded",
        "default/cut": "0 pods: only leftovers: configmap/cut-svc, service/cut",
        "default/big": "0 pods: only leftovers: configmap/big-svc, service/big, +3 more",
    }
    for row in rows:  # every column starts where its header does
        for column in ("PHASE", "PODS", "RETRIES", "PORTS", "STARTED"):
            at = header.index(column)
            assert row[at - 2 : at] == "  " and row[at] != " ", (column, row)
    assert main(k8s("status", "-o", "json", kubeconfig=kubeconfig)) == 0
    items = {i["name"]: i for i in json.loads(capsys.readouterr().out)["items"]}
    assert items["cut"]["leftovers"] == ["configmap/cut-svc", "service/cut"]
    assert len(items["big"]["leftovers"]) == 5
    assert "leftovers" not in items["demo"]  # a job that is there: its JSON as before
    assert main(k8s("status", "cut", "-o", "json", kubeconfig=kubeconfig)) == 0
    assert json.loads(capsys.readouterr().out)["leftovers"] == ["configmap/cut-svc", "service/cut"]


# ---------------------------------------------------------------------- wait


def test_wait_on_a_job_of_which_only_leftovers_remain_ends_at_once_saying_so(
    api: FakeKubeAPI, kubeconfig: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Nothing of it runs, nor ever will: one line, exit 1 as for any job nobody runs any more
    (phase Unknown), without following it."""
    leave(api, "demo", 0.0)
    assert main(k8s("wait", "demo", kubeconfig=kubeconfig)) == 1
    out, err = capsys.readouterr()
    assert out == (
        "default/demo Unknown: its object and pods are gone; only what it left remains: "
        "configmap/demo-svc, service/demo; "
        "remove them with: torchjob delete default/demo --engine kubernetes\n"
    ), err
    assert err == ""
    assert not [path for _, path, query in api.requests if "watch" in query], "it was followed"
    assert main(k8s("wait", "demo", "--timeout", "30", kubeconfig=kubeconfig)) == 1
    assert capsys.readouterr().out == out
