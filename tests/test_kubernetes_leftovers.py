"""Jobs of which only what they left remains on the cluster (their object and pods gone; a
ConfigMap, Service, claim, ... still labelled as theirs): the listing, ``wait`` and ``prune``.

The real CLI and client over HTTP against the fake API server (kubeapi.py); what a job left is put
there as a cut-short creation or an orphaning delete leaves it, or made by a real ``submit``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest

pytest.importorskip("kubernetes")

from kube_fixtures import JOB_LABEL, demo_job
from kubeapi import FakeKubeAPI, now_iso
from test_kubernetes_commands import submitted
from torchjob.cli import main
from torchjob.engines.kubernetes.removal import SETTLE_AGE

pytestmark = pytest.mark.timeout(120)

JOB = demo_job(workers=2, min_available=2)
OLD = 2 * SETTLE_AGE  # seconds: what a job left this long ago is no submission under way
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


# ---------------------------------------------------------------------- wait, logs


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


@pytest.mark.parametrize("follow", [[], ["-f"]], ids=["now", "follow"])
def test_logs_of_a_job_of_which_only_leftovers_remain_say_so_in_one_line(
    api: FakeKubeAPI, kubeconfig: str, capsys: pytest.CaptureFixture[str], follow: list[str]
) -> None:
    """No pod, nor any to come: one line and exit 2, as for a local job with no log to show."""
    leave(api, "demo", 0.0)
    assert main(k8s("logs", "demo", *follow, kubeconfig=kubeconfig)) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err == (
        "torchjob: job default/demo has no log to show: its object and pods are gone; only what it "
        "left remains: configmap/demo-svc, service/demo; "
        "remove them with: torchjob delete default/demo --engine kubernetes\n"
    )


# ---------------------------------------------------------------------- prune


def test_prune_removes_what_a_gone_job_left_once_it_is_old_enough(
    api: FakeKubeAPI, kubeconfig: str, capsys: pytest.CaptureFixture[str]
) -> None:
    leave(api, "old", OLD, tuple(LABELLED_KINDS))
    leave(api, "new", 1.0)  # as a job being submitted has them for a moment
    api.put({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "theirs", "labels": {"app": "x"}}})
    assert main(k8s("prune", "--older-than", f"{3 * OLD:g}s", kubeconfig=kubeconfig)) == 0
    out, err = capsys.readouterr()
    assert out == "no finished jobs to remove\n", err
    assert len(labelled(api)) == 7
    assert main(k8s("prune", kubeconfig=kubeconfig)) == 0
    out, err = capsys.readouterr()
    assert out == "deleted default/old\n", err
    assert (
        "torchjob: job default/old had no pods left; removed configmap/old-svc, service/old, "
        "networkpolicy/old, podgroup/old, persistentvolumeclaim/old"
    ) in err.splitlines(), err
    kept = [line for line in err.splitlines() if "default/new" in line]
    assert len(kept) == 1 and kept[0].startswith("torchjob: kept default/new: only leftovers"), err
    assert kept[0].endswith("remove them with: torchjob delete default/new --engine kubernetes"), err
    # the claim waits for its protection finalizer (no pod uses it: the controller would remove it)
    claim = api.get("v1", "PersistentVolumeClaim", "old")
    assert claim is not None and claim["metadata"].get("deletionTimestamp")
    assert sorted(k for k in labelled(api) if "old" not in k) == ["configmap/new-svc", "service/new"]
    assert api.get("v1", "Service", "theirs") is not None
    assert main(k8s("status", "old", "-o", "json", kubeconfig=kubeconfig)) == 0
    assert "what it left is being deleted" in json.loads(capsys.readouterr().out)["reason"]
    assert main(k8s("prune", kubeconfig=kubeconfig)) == 0  # being deleted: not again, not listed
    out, err = capsys.readouterr()
    assert out == "no finished jobs to remove\n" and "default/old" not in err, err


def _submit(kubeconfig: str, job: Path, target: str) -> subprocess.Popen[str]:
    command = ["submit", str(job), "--target", target]
    return subprocess.Popen(
        [sys.executable, "-m", "torchjob", *k8s(*command, kubeconfig=kubeconfig)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "COLUMNS": "200"},
    )


@pytest.mark.parametrize(
    ("target", "held"),
    [("kubeflow", r"/pytorchjobs$"), ("pods", r"/pods$")],
    ids=["claim-before-object", "side-objects-before-pods"],
)
def test_prune_while_a_job_is_being_submitted_leaves_what_it_made_so_far(
    api: FakeKubeAPI,
    kubeconfig: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    target: str,
    held: str,
) -> None:
    """submit makes a job's claims (and a `pods` job's ConfigMap, Service, NetworkPolicy) before
    its object or first pod: caught between, they are all of the job there is. prune leaves them."""
    job = tmp_path / "job.yaml"
    job.write_text(demo_job(volume=True))
    with api.hold("POST", held) as hold:
        process = _submit(kubeconfig, job, target)
        try:
            assert hold.wait_arrived(60), "the submission did not get to its object"
            made = labelled(api)
            assert any(k.startswith("persistentvolumeclaim/") for k in made), made
            assert main(k8s("prune", kubeconfig=kubeconfig)) == 0
            out, err = capsys.readouterr()
            assert out == "no finished jobs to remove\n", err
            assert "torchjob: kept default/demo: only leftovers" in err, err
            assert labelled(api) == made
            assert api.count("DELETE") == 0
        finally:
            hold.release()
            out, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    after = labelled(api)
    assert made.items() <= after.items(), (made, after)
    assert main(k8s("status", kubeconfig=kubeconfig)) == 0
    _header, *rows = capsys.readouterr().out.splitlines()
    assert [row.split()[:2] for row in rows] == [["default/demo", "Pending"]], rows


def test_prune_keeps_an_object_made_again_under_a_leftovers_name_since_it_listed_them(
    api: FakeKubeAPI, kubeconfig: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Between prune's listing and its delete, the leftovers were replaced (a `submit --replace`
    of the job): the delete names the uid it listed, so the new objects stay."""
    leave(api, "demo", OLD)
    result: list[int] = []
    with api.hold("DELETE", r"/configmaps/demo-svc$") as hold:
        pruning = threading.Thread(target=lambda: result.append(main(k8s("prune", kubeconfig=kubeconfig))))
        pruning.start()
        try:
            assert hold.wait_arrived(60), "prune deleted nothing"
            for kind in ("ConfigMap", "Service"):
                api.delete("v1", kind, "demo-svc" if kind == "ConfigMap" else "demo")
            leave(api, "demo", 0.0)
            new = labelled(api)
        finally:
            hold.release()
            pruning.join(60)
    assert result == [0]
    out, err = capsys.readouterr()
    assert out == "no finished jobs to remove\n", err
    assert "torchjob: kept default/demo: configmap/demo-svc, service/demo made again since" in err, err
    assert labelled(api) == new


@pytest.mark.parametrize("skew", [-OLD, OLD], ids=["server-behind", "server-ahead"])
def test_prune_measures_the_age_of_leftovers_on_the_servers_clock(
    api: FakeKubeAPI, kubeconfig: str, capsys: pytest.CaptureFixture[str], skew: float
) -> None:
    """Creation times are the server's: on a machine whose clock runs ahead of it, objects a
    submission made a moment ago would look old enough to prune; behind it, old ones never would."""
    api.clock_skew = skew
    leave(api, "fresh", 1.0 - skew)  # made a second ago by the server's clock
    leave(api, "stale", OLD - skew)  # made long ago by the server's clock
    assert main(k8s("prune", kubeconfig=kubeconfig)) == 0
    out, err = capsys.readouterr()
    assert out == "deleted default/stale\n", err
    kept = re.search(r"torchjob: kept default/fresh: only leftovers, the newest made (\d+)s ago", err)
    assert kept and int(kept[1]) < 60, err  # a second and the test's own time, not the skew
    removed = "torchjob: job default/stale had no pods left; removed configmap/stale-svc, service/stale"
    assert removed in err.splitlines(), err
    assert sorted(labelled(api)) == ["configmap/fresh-svc", "service/fresh"]
