"""``run --engine kubernetes`` end to end, per target, against controllers that act as upstream's do.

The real CLI renders the job with the real targets and sends it with the real client over HTTP to
the fake API server (kubeapi.py), where the simulations of tests/controllers/ do what each
cluster's controllers would: Volcano makes a PodGroup and pods only once it is admitted, the
training operator makes a pod and a Service per replica, JobSet makes child Jobs whose Job
controller makes the pods, a TrainJob becomes a JobSet; a scheduler binds only its own pods and a
kubelet runs them as each test says.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from torchjob.targets import target_names

pytest.importorskip("kubernetes")

from controllers import Controller, ControlPlane
from controllers.cluster import for_target
from controllers.kubelet import Kubelet
from controllers.scheduler import Scheduler, VolcanoScheduler
from controllers.storage import ClaimProtection
from kube_fixtures import demo_job
from kubeapi import GROUP_RESOURCES, FakeKubeAPI
from test_kubernetes_commands import _read_until
from torchjob.cli import main

pytestmark = pytest.mark.timeout(120)

TARGETS = target_names()  # every target, whichever exist: a new one needs its controllers below
TOP = {
    "volcano": ("batch.volcano.sh/v1alpha1", "Job"),
    "kubeflow": ("kubeflow.org/v1", "PyTorchJob"),
    "jobset": ("jobset.x-k8s.io/v1alpha2", "JobSet"),
    "trainjob": ("trainer.kubeflow.org/v1alpha1", "TrainJob"),
}
WITHOUT_VOLCANO = tuple(
    g for g in GROUP_RESOURCES if not g.startswith(("batch.volcano.sh", "scheduling.volcano"))
)


def job_file(tmp_path: Path, extra: str = "") -> str:
    path = tmp_path / "job.yaml"
    path.write_text(demo_job(workers=2, extra=extra))
    return str(path)


def who(target: str, task: str, index: int) -> str:
    """The name the kubelet knows a pod by (its hostname for Indexed Jobs) for a task's pod."""
    if target == "jobset":
        return f"demo-{task}-{index}-0"
    if target == "trainjob":
        rank = index + 1 if task == "worker" else index
        return f"demo-node-0-{rank}"
    return f"demo-{task}-{index}"


def controllers(api: FakeKubeAPI, target: str, slots: int | None = None) -> list[Controller]:
    """The controllers a cluster of ``target`` runs (``pods``: a plain cluster, no Volcano)."""
    return for_target(api, target, slots)


def run(kubeconfig: str, file: str, target: str, *flags: str) -> int:
    args = ["run", file, "--engine", "kubernetes", "--kubeconfig", kubeconfig, "--target", target]
    return main([*args, *flags])


@pytest.fixture
def plain(tmp_path: Path) -> Any:
    """A cluster without Volcano's API groups (what `--target pods` must run on)."""
    server = FakeKubeAPI(groups=WITHOUT_VOLCANO).start()
    yield server, str(server.kubeconfig(tmp_path / "plain-kubeconfig"))
    server.stop()


def cluster_for(target: str, api: FakeKubeAPI, kubeconfig: str, plain: Any) -> tuple[FakeKubeAPI, str]:
    return plain if target == "pods" else (api, kubeconfig)


# ---------------------------------------------------------------------- completion


@pytest.mark.parametrize("target", TARGETS)
def test_a_job_completes_through_its_controllers(
    api: FakeKubeAPI,
    kubeconfig: str,
    plain: Any,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    target: str,
) -> None:
    server, config = cluster_for(target, api, kubeconfig, plain)
    with ControlPlane(server, *controllers(server, target), Kubelet(server)):
        code = run(config, job_file(tmp_path), target)
    out, err = capsys.readouterr()
    assert code == 0, err
    assert err.splitlines()[-1].startswith("torchjob: job demo Completed")
    shorts = ["node-0", "node-1", "node-2"] if target == "trainjob" else ["master-0", "worker-0", "worker-1"]
    for rank, short in enumerate(shorts):
        assert (
            f"{short} r{rank} | {who(target, short.split('-')[0], int(short[-1]))} attempt 0: training" in out
        )


def test_pods_run_on_the_default_scheduler_unless_the_job_names_one(
    plain: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    server, config = plain
    with ControlPlane(server, Scheduler(server), Kubelet(server)):
        assert run(config, job_file(tmp_path), "pods") == 0
    pods = [o for o in server.events if o[2] == "ADDED" and o[1][1] == "pods"]
    assert pods and all("schedulerName" not in obj["spec"] for *_, obj in pods)
    assert all("scheduling.k8s.io/group-name" not in obj["metadata"]["annotations"] for *_, obj in pods)


def test_pods_that_name_volcano_get_its_podgroup_and_are_gang_scheduled(
    api: FakeKubeAPI, kubeconfig: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with ControlPlane(api, VolcanoScheduler(api), Kubelet(api)):
        assert run(kubeconfig, job_file(tmp_path, "schedulerName: volcano"), "pods") == 0
    group = api.get("scheduling.volcano.sh/v1beta1", "PodGroup", "demo")
    assert group is not None and group["spec"]["minMember"] == 3 and group["status"]["phase"] == "Running"


# ---------------------------------------------------------------------- a failed rank


@pytest.mark.parametrize("target", TARGETS)
def test_a_failed_rank_fails_the_job_and_is_named(
    api: FakeKubeAPI,
    kubeconfig: str,
    plain: Any,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    target: str,
) -> None:
    server, config = cluster_for(target, api, kubeconfig, plain)
    failing = who(target, "worker", 1)
    kubelet = Kubelet(server, {failing: [3]}, seconds=1.5, durations={failing: 0.3})
    with ControlPlane(server, *controllers(server, target), kubelet):
        code = run(config, job_file(tmp_path), target)
    _, err = capsys.readouterr()
    assert code == 1, err
    short = "node-2" if target == "trainjob" else "worker-1"
    assert f"torchjob: job demo Failed: first failure: {short} (rank 2) exited with code 3 (Error)" in err


# ---------------------------------------------------------------------- an unschedulable gang


@pytest.mark.parametrize("target", TARGETS)
def test_a_gang_that_does_not_fit_ends_the_wait_with_the_schedulers_reason(
    api: FakeKubeAPI,
    kubeconfig: str,
    plain: Any,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    target: str,
) -> None:
    server, config = cluster_for(target, api, kubeconfig, plain)
    with ControlPlane(server, *controllers(server, target, slots=1), Kubelet(server, seconds=3600)):
        code = run(config, job_file(tmp_path), target, "--pending-timeout", "1.5")
    _, err = capsys.readouterr()
    assert code == 2, err
    final = err.splitlines()[-1]
    if target == "volcano":
        assert server.objects_of("v1", "Pod") == []  # Volcano made no pod for a PodGroup not admitted
        assert final.startswith("torchjob: job demo: PodGroup demo-")
        assert (
            "is stuck Pending for 2s and no pod is created until it is admitted; Volcano's scheduler says: "
            in final
        )
        assert final.endswith(
            "NotEnoughResources: 3/0 tasks in gang unschedulable: 0/1 nodes are available: "
            "1 Too many pods (the node holds 1)."
        )
    else:
        assert (
            " is stuck Pending for 2s waiting for scheduler 'default-scheduler'; the scheduler says: "
            in final
        )
        assert final.endswith("0/1 nodes are available: 1 Too many pods (the node holds 1).")


def test_status_shows_the_podgroup_that_holds_a_volcano_job(
    api: FakeKubeAPI, kubeconfig: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with ControlPlane(api, *controllers(api, "volcano", slots=1)):
        assert run(kubeconfig, job_file(tmp_path), "volcano", "-d") == 0
        deadline = time.monotonic() + 30
        while not any(
            (g.get("status") or {}).get("conditions")
            for g in api.objects_of("scheduling.volcano.sh/v1beta1", "PodGroup")
        ):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        capsys.readouterr()
        assert (
            main(["status", "demo", "--engine", "kubernetes", "--kubeconfig", kubeconfig, "-o", "json"]) == 0
        )
    report = json.loads(capsys.readouterr().out)
    assert report["phase"] == "Pending"
    assert report["reason"].startswith(
        "PodGroup Pending: NotEnoughResources: 3/0 tasks in gang unschedulable"
    )


def test_a_pod_no_scheduler_binds_ends_the_wait_naming_the_scheduler(
    plain: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    server, config = plain
    with ControlPlane(server, Scheduler(server), Kubelet(server)):
        code = run(
            config, job_file(tmp_path, "schedulerName: my-scheduler"), "pods", "--pending-timeout", "1"
        )
    _, err = capsys.readouterr()
    assert code == 2, err
    final = err.splitlines()[-1]
    assert re.match(r"torchjob: job demo: pod (master-0|worker-0|worker-1) is stuck Pending for 1s: ", final)
    assert final.endswith(
        "no scheduler has bound it to a node; it waits for scheduler 'my-scheduler' "
        "(is that scheduler running on this cluster?)"
    )


@pytest.mark.parametrize("target", ["kubeflow", "jobset", "trainjob"])
def test_a_job_whose_controller_makes_no_pod_ends_the_wait(
    api: FakeKubeAPI, kubeconfig: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], target: str
) -> None:
    with ControlPlane(api, Scheduler(api), Kubelet(api)):  # the CRD is there, its controller is not
        code = run(kubeconfig, job_file(tmp_path), target, "--pending-timeout", "1")
    _, err = capsys.readouterr()
    assert code == 2, err
    assert err.splitlines()[-1] == (
        f"torchjob: job demo: no pod was created in 1s; is the controller of --target {target} "
        "running on this cluster?"
    )


# ---------------------------------------------------------------------- TTL and deletion


@pytest.mark.parametrize("target", ["volcano", "kubeflow", "jobset"])
@pytest.mark.parametrize("fails", [False, True])
def test_a_job_its_ttl_deletes_at_once_ends_with_its_final_phase(
    api: FakeKubeAPI,
    kubeconfig: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    target: str,
    fails: bool,
) -> None:
    failing = who(target, "worker", 1)
    kubelet = Kubelet(api, {failing: [3] if fails else [0]}, seconds=1.0, durations={failing: 0.3})
    with ControlPlane(api, *controllers(api, target), kubelet):
        code = run(kubeconfig, job_file(tmp_path, "ttlSecondsAfterFinished: 0"), target)
    _, err = capsys.readouterr()
    assert code == (1 if fails else 0), err
    assert api.get(*TOP[target], "demo") is None, "the TTL did not delete the job"
    if fails:
        assert "torchjob: job demo Failed: first failure: worker-1 (rank 2) exited with code 3 (Error)" in err
        # Its pod is gone with the job: the log tail is what was streamed from it.
        assert err.splitlines()[-1] == f"  worker-1 | {failing} attempt 0: exit 3"
    else:
        assert err.splitlines()[-1].startswith("torchjob: job demo Completed")


@pytest.mark.parametrize("target", ["volcano", "kubeflow", "jobset"])
def test_a_failed_job_its_ttl_deletes_names_its_failure_when_the_pods_watch_lags(
    api: FakeKubeAPI, kubeconfig: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], target: str
) -> None:
    """The job's watch tells of the end (and of the deletion) before the pods' watch tells of the
    failed pod: two streams with no order between them. The failure still names its pod."""
    failing = who(target, "worker", 1)
    api.watch_lag["pods"] = 1.0
    kubelet = Kubelet(api, {failing: [3]}, seconds=1.0, durations={failing: 0.3})
    started = time.monotonic()
    with ControlPlane(api, *controllers(api, target), kubelet):
        code = run(kubeconfig, job_file(tmp_path, "ttlSecondsAfterFinished: 0"), target)
    _, err = capsys.readouterr()
    assert code == 1, err
    assert api.get(*TOP[target], "demo") is None, "the TTL did not delete the job"
    assert "torchjob: job demo Failed: first failure: worker-1 (rank 2) exited with code 3 (Error)" in err
    assert time.monotonic() - started < 15


@pytest.mark.parametrize(("target", "after"), [*((t, 1.0) for t in TARGETS), ("volcano", 0.0), ("pods", 0.0)])
def test_a_job_deleted_before_it_ended_is_reported_deleted_at_once(
    api: FakeKubeAPI,
    kubeconfig: str,
    plain: Any,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    target: str,
    after: float,
) -> None:
    """Deleted while followed (``after`` 1 s of running), or before the first list (``after`` 0)."""
    server, config = cluster_for(target, api, kubeconfig, plain)

    class Deleter(Controller):
        """Someone deletes the job once its pods have run ``after`` seconds."""

        running: float | None = None

        def reconcile(self) -> None:
            if not any(p["status"]["phase"] == "Running" for p in self.api.objects_of("v1", "Pod")):
                return
            self.running = self.running or time.monotonic()
            if time.monotonic() - self.running < after:
                return
            if target == "pods":
                for pod in self.api.objects_of("v1", "Pod"):
                    self.api.delete("v1", "Pod", pod["metadata"]["name"])
            else:
                self.api.delete(*TOP[target], "demo")

    started = time.monotonic()
    with ControlPlane(server, *controllers(server, target), Kubelet(server, seconds=3600), Deleter(server)):
        code = run(config, job_file(tmp_path), target, "--timeout", "60")
    _, err = capsys.readouterr()
    assert code == 1, err
    assert time.monotonic() - started < 20
    what = "its pods were" if target == "pods" else "its object was"
    assert err.splitlines()[-1] == f"torchjob: job demo Terminated: {what} deleted before it ended"


# ---------------------------------------------------------------------- Ctrl-C


@pytest.mark.parametrize("target", TARGETS)
def test_ctrl_c_leaves_the_job_running_under_its_controllers(
    api: FakeKubeAPI, kubeconfig: str, plain: Any, tmp_path: Path, target: str
) -> None:
    server, config = cluster_for(target, api, kubeconfig, plain)
    argv = [sys.executable, "-m", "torchjob", "run", job_file(tmp_path), "--engine", "kubernetes"]
    argv += ["--kubeconfig", config, "--target", target]
    with ControlPlane(server, *controllers(server, target), Kubelet(server, seconds=3600)):
        process = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "COLUMNS": "200"},
        )
        try:
            _read_until(process, "r2 | ", timeout=60)
            time.sleep(0.3)
            process.send_signal(signal.SIGINT)
            _, err = process.communicate(timeout=30)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
        assert process.returncode == 130, err
        assert (
            "torchjob: stopped following; job default/demo keeps running on the cluster "
            "(delete it with: torchjob delete default/demo --engine kubernetes)"
        ) in err.splitlines()
        assert "Traceback" not in err
        running = [p for p in server.objects_of("v1", "Pod") if p["status"]["phase"] == "Running"]
        assert len(running) == 3
        if target != "pods":
            assert server.get(*TOP[target], "demo") is not None


WORKLOADS = {"Pod", "Job", "JobSet", "PyTorchJob", "TrainJob"}  # what runs the job, or makes what does


@pytest.mark.parametrize("target", TARGETS)
def test_status_and_delete_all_find_a_job_of_which_only_leftovers_remain(
    api: FakeKubeAPI,
    kubeconfig: str,
    plain: Any,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    target: str,
) -> None:
    """The job's object is deleted leaving its dependents (``kubectl delete --cascade=orphan``),
    then its pods by hand: what its controllers and torchjob made beside them stays, labelled as
    the job's (a PodGroup, a Service, a ConfigMap, claims). ``status`` lists the job, saying only
    that remains and how to remove it; ``delete --all`` removes it all."""
    server, config = cluster_for(target, api, kubeconfig, plain)
    path = tmp_path / "job.yaml"
    path.write_text(demo_job(volume=True))
    k8s = ["--engine", "kubernetes", "--kubeconfig", config]
    with ControlPlane(server, *controllers(server, target), Kubelet(server, seconds=3600.0)):
        assert run(config, str(path), target, "-d") == 0, capsys.readouterr().err
        deadline = time.monotonic() + 60
        while len(server.objects_of("v1", "Pod")) < 2:
            assert time.monotonic() < deadline, "the controllers made no pods"
            time.sleep(0.05)
    capsys.readouterr()
    assert main(["status", *k8s]) == 0
    assert [line.split()[0] for line in capsys.readouterr().out.splitlines()[1:]] == ["default/demo"]
    for obj in list(server.objects.values()):  # orphaned: the garbage collector deletes no dependent
        obj["metadata"].pop("ownerReferences", None)
        server.put(obj)
    for (api_version, _, _, name), obj in list(server.objects.items()):
        if obj["kind"] in WORKLOADS:
            server.delete(api_version, obj["kind"], name)
    left = sorted(
        f"{o['kind'].lower()}/{o['metadata']['name']}"
        for o in server.objects.values()
        if o["metadata"].get("labels", {}).get("torchjob.io/job-name") == "demo"
    )
    assert left, "nothing labelled as the job's was left"
    assert main(["status", *k8s]) == 0
    _header, *rows = capsys.readouterr().out.splitlines()
    assert [row.split()[:3] for row in rows] == [["default/demo", "Unknown", "0"]], rows
    shown = rows[0].split("0 pods: only leftovers: ", 1)[1].split("  ", 1)[0].split(", ")
    if len(left) <= 3:  # what it left, briefly: all of it, or two and how many more
        assert sorted(shown) == left, rows
    else:
        assert set(shown[:2]) <= set(left) and shown[2:] == [f"+{len(left) - 2} more"], rows
    assert main(["prune", *k8s]) == 0  # made a moment ago: as a job being submitted, kept
    out, err = capsys.readouterr()
    assert out == "no finished jobs to remove\n" and "torchjob: kept default/demo" in err, err
    assert main(["status", "demo", *k8s, "-o", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["phase"] == "Unknown"
    named = report["reason"].split("only what it left remains: ", 1)[1].split("; ", 1)[0]
    assert sorted(named.split(", ")) == left, report["reason"]
    assert report["reason"].endswith("with: torchjob delete default/demo --engine kubernetes")
    with ControlPlane(server, ClaimProtection(server)):  # a claim no pod uses goes once deleted
        assert main(["delete", "--all", *k8s]) == 0
        out, err = capsys.readouterr()
        assert out == "deleted default/demo\n", err
        deadline = time.monotonic() + 60
        while any("torchjob.io/job-name" in o["metadata"].get("labels", {}) for o in server.objects.values()):
            assert time.monotonic() < deadline, f"still there: {list(server.objects)}"
            time.sleep(0.05)
    assert main(["status", *k8s]) == 0
    assert capsys.readouterr().out.startswith("no kubernetes jobs")
