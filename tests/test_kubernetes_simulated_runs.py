"""``run --engine kubernetes`` through the controller simulations: restarts, clean-up, claims, deadlines.

Each test runs the real CLI with the real client over HTTP against the fake API server, where the
simulations of tests/controllers/ act as each target's controllers act: Volcano restarts a job by
recreating its pods under the same names, the training operator recreates an evicted pod under
its name, JobSet recreates its Jobs; claims carry the protection finalizer and go with their
owner; an object with a field its CRD lacks is refused (``fieldValidation=Strict``). What each test
checks is what the job does on the cluster: how often it restarts, which pods still run after
it ended, whether it can be submitted again, which lines of which attempt were printed.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("kubernetes")

import crds
from controllers import ControlPlane
from controllers.cluster import for_target
from controllers.kubelet import Kubelet
from controllers.scheduler import Scheduler
from kubeapi import FakeKubeAPI
from test_kubernetes_controllers import TOP, job_file, run, who
from torchjob.cli import main

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(not crds.available(), reason=f"the CRD schemas are not in {crds.CRDS}"),
]

RESTART = "maxRetry: 3\npolicies: [{event: PodFailed, action: RestartJob}]"


def cli(kubeconfig: str, *args: str) -> int:
    return main([*args, "--engine", "kubernetes", "--kubeconfig", kubeconfig])


def status(kubeconfig: str, capsys: pytest.CaptureFixture[str], name: str = "demo") -> dict[str, Any]:
    capsys.readouterr()
    assert cli(kubeconfig, "status", name, "-o", "json") == 0
    report: dict[str, Any] = json.loads(capsys.readouterr().out)
    return report


def wait_for(what: str, check: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"{what} within {timeout:g}s"
        time.sleep(0.05)


# ---------------------------------------------------------------------- attempts and their logs


@pytest.mark.parametrize("target", ["volcano", "jobset"])
def test_every_line_of_a_restarted_job_is_printed(
    api: FakeKubeAPI, kubeconfig: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], target: str
) -> None:
    """A failed worker restarts the whole job: Volcano makes its pods again under the same names
    (restartCount 0), JobSet its Jobs. Every line of the second attempt is printed."""
    failing = who(target, "worker", 1)
    # JobSet deletes the first attempt's pods the moment the worker fails, as they would be on a
    # cluster: the log of a pod gone before its stream opened is lost there too. Each attempt runs
    # 2 s so that the follower opens every stream in time on a loaded machine (0.5 s missed one
    # pod's lines at a load of 9 on 2 cores).
    kubelet = Kubelet(api, {failing: [3, 0]}, seconds=2.0, lines=6)
    with ControlPlane(api, *for_target(api, target), kubelet):
        code = run(kubeconfig, job_file(tmp_path, RESTART), target)
    out, err = capsys.readouterr()
    assert code == 0, err
    if target == "volcano":  # the same pods again: the kubelet numbers the pods of a name
        for task, index in (("master", 0), ("worker", 0), ("worker", 1)):
            name = who(target, task, index)
            lines = [f"{name} pod #2 attempt 0: training"] + [
                f"{name} pod #2 attempt 0: training {k}" for k in range(1, 6)
            ]
            assert all(line in out for line in lines), (name, out)
    else:
        assert out.count("attempt 0: training 5") == 6  # three pods, two attempts
    assert status(kubeconfig, capsys)["retryCount"] == 1


def test_a_pod_the_operator_makes_again_under_its_name_is_followed(
    api: FakeKubeAPI, kubeconfig: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An evicted worker of a PyTorchJob (restartPolicy OnFailure) is made again by the operator
    under the same name, its restart count back at 0: its lines are printed too."""
    durations = {"demo-master-0": 3.0}  # the master's end ends the job: it outlives the eviction
    kubelet = Kubelet(api, evictions={"demo-worker-0": 1}, seconds=0.5, durations=durations, lines=6)
    path = Path(job_file(tmp_path))  # OnFailure: the operator makes a failed pod again
    path.write_text(path.read_text().replace("restartPolicy: Never", "restartPolicy: OnFailure"))
    with ControlPlane(api, *for_target(api, "kubeflow"), kubelet):
        code = run(kubeconfig, str(path), "kubeflow")
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "worker-0 r1 | demo-worker-0 attempt 0: evicted" in out
    for k in range(1, 6):
        assert f"worker-0 r1 | demo-worker-0 pod #2 attempt 0: training {k}" in out


def test_logs_attempt_reaches_the_pods_of_that_attempt(
    api: FakeKubeAPI, kubeconfig: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """After a restart, `logs --attempt 1` prints the recreated pods' lines; attempt 0's pods are
    gone with their logs, which is said, not answered with another attempt's lines."""
    kubelet = Kubelet(api, {"demo-worker-1": [3, 0]}, seconds=0.5, lines=2)
    with ControlPlane(api, *for_target(api, "volcano"), kubelet):
        assert run(kubeconfig, job_file(tmp_path, RESTART), "volcano") == 0
        capsys.readouterr()
        assert cli(kubeconfig, "logs", "demo", "--attempt", "1") == 0
        out = capsys.readouterr().out
        assert "worker-1 r2 | demo-worker-1 pod #2 attempt 0: training 1" in out
        assert "pod #" in out and all("pod #2" in line for line in out.splitlines() if "|" in line)
        assert cli(kubeconfig, "logs", "demo", "--attempt", "0") == 2
        err = capsys.readouterr().err
        assert "job demo has no pod of attempt 0" in err and "master-0: 1" in err


# ---------------------------------------------------------------------- how many restarts


@pytest.mark.parametrize("target", ["volcano", "jobset", "kubeflow"])
@pytest.mark.parametrize(("codes", "ends"), [([3, 3, 0], 0), ([3, 3, 3], 1)])
def test_maxretry_gives_as_many_restarts_as_on_volcano(
    api: FakeKubeAPI,
    kubeconfig: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    target: str,
    codes: list[int],
    ends: int,
) -> None:
    """maxRetry 3 with RestartJob: two restarts (Volcano counts runs). A worker failing twice then
    succeeding completes; failing three times fails the job."""
    failing = who(target, "worker", 1)
    kubelet = Kubelet(api, {failing: codes}, seconds=3.0, durations={failing: 0.3})
    with ControlPlane(api, *for_target(api, target), kubelet):
        code = run(kubeconfig, job_file(tmp_path, RESTART), target)
    assert code == ends, capsys.readouterr().err


def test_an_sdk_backoff_limit_is_that_many_restarts_on_jobset(
    api: FakeKubeAPI, kubeconfig: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """RunPolicy(backoff_limit=1): one restart, as on the local engine (maxRetry 2)."""
    ref = sdk_task(tmp_path, "backoff_limit=1")
    kubelet = Kubelet(api, {"train-worker-0-0": [3, 0]}, seconds=0.3)
    with ControlPlane(api, *for_target(api, "jobset"), kubelet):
        code = cli(kubeconfig, "run", ref, "--target", "jobset")
    assert code == 0, capsys.readouterr().err
    assert status(kubeconfig, capsys, "train")["retryCount"] == 1


@pytest.mark.parametrize("target", ["volcano", "jobset", "kubeflow"])
def test_a_pod_restarting_in_place_is_never_failed_for_it(
    api: FakeKubeAPI, kubeconfig: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], target: str
) -> None:
    """restartPolicy OnFailure: a worker crashing 7 times restarts in place without limit, as
    under Volcano (a Kubernetes Job's default backoffLimit of 6 would fail the job)."""
    failing = who(target, "worker", 1)
    kubelet = Kubelet(api, {failing: [3] * 7 + [0]}, seconds=0.6, durations={failing: 0.1})
    path = Path(job_file(tmp_path))
    path.write_text(path.read_text().replace("restartPolicy: Never", "restartPolicy: OnFailure"))
    with ControlPlane(api, *for_target(api, target), kubelet):
        code = run(kubeconfig, str(path), target)
    assert code == 0, capsys.readouterr().err


# ---------------------------------------------------------------------- the end of a job


@pytest.mark.parametrize("target", ["volcano", "kubeflow", "jobset"])
def test_no_pod_runs_on_once_the_master_ended_the_job(
    api: FakeKubeAPI, kubeconfig: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], target: str
) -> None:
    """The master's completion ends the job (TaskCompleted -> CompleteJob): Volcano kills the
    workers still running, and so must every target, or they hold their nodes for ever."""
    path = Path(job_file(tmp_path))
    text = path.read_text().replace(
        "      name: master\n",
        "      name: master\n      policies: [{event: TaskCompleted, action: CompleteJob}]\n",
    )
    path.write_text(text)
    durations = {who(target, "worker", i): 3600.0 for i in (0, 1)}
    with ControlPlane(api, *for_target(api, target), Kubelet(api, seconds=0.5, durations=durations)):
        code = run(kubeconfig, str(path), target)
        assert code == 0, capsys.readouterr().err
        wait_for(
            "the workers stopped",
            lambda: not [p for p in api.objects_of("v1", "Pod") if p["status"]["phase"] == "Running"],
        )


@pytest.mark.parametrize("target", ["kubeflow", "jobset", "pods"])
def test_the_jobs_scheduler_and_priority_reach_its_pods(
    api: FakeKubeAPI, kubeconfig: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], target: str
) -> None:
    """The job's schedulerName and priorityClassName, as Volcano puts them into its pods: only the
    named scheduler runs here, and the class sets the pods' priority."""
    api.priority_classes = {"high": 1000}
    controllers = [c for c in for_target(api, target) if not isinstance(c, Scheduler)]
    extra = "schedulerName: my-scheduler\npriorityClassName: high"
    with ControlPlane(api, *controllers, Scheduler(api, "my-scheduler"), Kubelet(api)):
        code = run(kubeconfig, job_file(tmp_path, extra), target, "--pending-timeout", "5")
    assert code == 0, capsys.readouterr().err
    pods = api.objects_of("v1", "Pod")
    assert pods and {p["spec"].get("priority") for p in pods} == {1000}


# ---------------------------------------------------------------------- deadlines


def sdk_task(tmp_path: Path, run_policy: str) -> str:
    path = tmp_path / "tasks.py"
    path.write_text(
        "from torchjob import PyTorch, RunPolicy, Worker, task\n\n\n"
        f"@task(task_config=PyTorch(worker=Worker(replicas=1), run_policy=RunPolicy({run_policy})))\n"
        "def train() -> None:\n    pass\n"
    )
    return f"{path}:train"


@pytest.mark.parametrize("target", ["jobset", "trainjob", "kubeflow"])
def test_an_sdk_deadline_ends_the_job_when_it_passes(
    api: FakeKubeAPI, kubeconfig: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], target: str
) -> None:
    """active_deadline_seconds with backoff_limit: the job fails once the deadline passes, as
    DeadlineExceeded, not restarted with a fresh deadline each time until its restarts run out."""
    ref = sdk_task(tmp_path, "active_deadline_seconds=2, backoff_limit=2")
    started = time.monotonic()
    with ControlPlane(api, *for_target(api, target), Kubelet(api, seconds=3600)):
        code = cli(kubeconfig, "run", ref, "--target", target)
    err = capsys.readouterr().err
    assert code == 1, err
    assert "DeadlineExceeded" in err.splitlines()[-1] or "deadline" in err.splitlines()[-1], err
    assert time.monotonic() - started < 30  # (its pods may run on: their logs drain, 10 s at most)
    if target == "jobset":
        js = api.get(*TOP["jobset"], "train")
        assert js is not None and not (js.get("status") or {}).get("restarts"), js


# ---------------------------------------------------------------------- claims


CLAIM = """\
volumes:
  - mountPath: /ckpt
    volumeClaim: {accessModes: [ReadWriteOnce], resources: {requests: {storage: 1Gi}}}"""


def _left(api: FakeKubeAPI) -> list[str]:
    return [
        f"{o['kind']} {o['metadata']['name']}"
        for o in list(api.objects.values())
        if o["kind"]
        in ("PersistentVolumeClaim", "Pod", "ConfigMap", "Service", *(k for _, k in TOP.values()))
    ]


@pytest.mark.parametrize("target", ["pods", "kubeflow", "jobset", "trainjob"])
def test_a_jobs_claims_go_with_it_and_it_can_be_sent_again(
    api: FakeKubeAPI,
    kubeconfig: str,
    plain: Any,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    target: str,
) -> None:
    """The claims made for the job's volumes go when the job is deleted (once no pod uses them),
    so the same job runs again, and --replace works while the first still runs."""
    server, config = plain if target == "pods" else (api, kubeconfig)
    file = job_file(tmp_path, CLAIM)
    with ControlPlane(server, *for_target(server, target), Kubelet(server)):
        assert run(config, file, target) == 0, capsys.readouterr().err
        assert server.objects_of("v1", "PersistentVolumeClaim")
        assert cli(config, "delete", "demo") == 0, capsys.readouterr().err
        assert run(config, file, target) == 0, capsys.readouterr().err  # at once: no 409
        assert cli(config, "delete", "demo") == 0
        wait_for("everything gone", lambda: not _left(server))
    with ControlPlane(server, *for_target(server, target), Kubelet(server, seconds=3600)):
        assert run(config, file, target, "-d") == 0, capsys.readouterr().err
        wait_for(
            "pods running",
            lambda: any(p["status"].get("phase") == "Running" for p in server.objects_of("v1", "Pod")),
        )
        assert run(config, file, target, "-d", "--replace") == 0, capsys.readouterr().err


@pytest.fixture
def plain(tmp_path: Path) -> Any:
    from test_kubernetes_controllers import WITHOUT_VOLCANO

    server = FakeKubeAPI(groups=WITHOUT_VOLCANO).start()
    yield server, str(server.kubeconfig(tmp_path / "plain-kubeconfig"))
    server.stop()


# ---------------------------------------------------------------------- an older controller's CRD


OLDER = [
    pytest.param(
        "trainjob",
        ("spec.runtimePatches", "spec.activeDeadlineSeconds"),
        "",
        "spec.runtimePatches",
        "Kubeflow Trainer v2.2",
        id="trainer-2.1",
    ),
    pytest.param(
        "trainjob",
        (
            "spec.runtimePatches[].trainingRuntimeSpec.template.spec.replicatedJobs[].template.spec.template"
            ".spec.terminationGracePeriodSeconds",
        ),
        "terminationGracePeriodSeconds: 30",
        "terminationGracePeriodSeconds",
        "Kubeflow Trainer v2.3",
        id="trainer-2.2",
    ),
    pytest.param(
        "jobset",
        ("spec.network.publishNotReadyAddresses",),
        "",
        "spec.network.publishNotReadyAddresses",
        "JobSet v0.6",
        id="jobset-0.5",
    ),
    pytest.param(
        "kubeflow",
        ("spec.nprocPerNode",),
        "",
        "spec.nprocPerNode",
        "training operator v1.7",
        id="operator-1.6",
    ),
]


@pytest.mark.parametrize(("target", "missing", "pod_field", "field", "needs"), OLDER)
def test_a_field_an_older_controller_lacks_is_one_line_naming_the_version(
    api: FakeKubeAPI,
    kubeconfig: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    target: str,
    missing: tuple[str, ...],
    pod_field: str,
    field: str,
    needs: str,
) -> None:
    """Created without strict validation, an older CRD prunes what it lacks (a TrainJob without its
    runtime patch has pods without torchjob's label: "no pod was created" while it runs). Strictly,
    the server refuses it; torchjob says which field and which version, and leaves nothing."""
    api_version, kind = TOP[target]
    api.schemas[(api_version, kind)] = crds.older(api_version, kind, *missing)
    file = job_file(tmp_path, CLAIM)
    if pod_field:
        path = Path(file)
        path.write_text(
            path.read_text().replace(
                "          restartPolicy: Never\n", f"          restartPolicy: Never\n          {pod_field}\n"
            )
        )
    with ControlPlane(api, *for_target(api, target), Kubelet(api)):
        code = run(kubeconfig, file, target, "--pending-timeout", "3")
    err = capsys.readouterr().err
    assert code == 2, err
    last = err.splitlines()[-1]
    assert last.startswith("torchjob: ") and field in last and needs in last, last
    assert not _left(api), _left(api)


def test_a_webhook_that_denies_the_job_is_its_reason_not_rbac(
    api: FakeKubeAPI, kubeconfig: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A controller's admission webhook refuses the object (403): the webhook's reason, one line."""
    with ControlPlane(api, *for_target(api, "jobset"), Kubelet(api)):
        api.webhooks[TOP["jobset"]].append(lambda js: "spec.replicatedJobs: over the team's quota")
        code = run(kubeconfig, job_file(tmp_path), "jobset")
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.splitlines()[-1] == (
        "torchjob: the cluster refused to create jobset.x-k8s.io/v1alpha2 JobSet demo: admission webhook "
        "denied the request: spec.replicatedJobs: over the team's quota"
    )
