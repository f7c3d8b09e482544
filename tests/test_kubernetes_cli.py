"""``torchjob submit`` end to end: the real CLI and the real kubernetes client against the fake API server.

The job is rendered by the real ``torchjob.targets``.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

pytest.importorskip("kubernetes")

from kube_fixtures import (
    TERMINAL_STATUS,
    demo_job,
    make_pod,
    running,
    terminated,
    unschedulable,
)
from kubeapi import FakeKubeAPI
from torchjob.cli import main

pytestmark = pytest.mark.timeout(120)

JOB = demo_job(pytorch=False)
VOLCANO = "batch.volcano.sh/v1alpha1"


def play_controller(api: FakeKubeAPI, end: str, exit_code: int = 0) -> None:
    """When the Volcano Job appears: its pods run, log, end with ``exit_code``; then the job ``end``s."""

    def script(top: dict[str, Any]) -> None:
        pods = [
            make_pod("demo", "master", 0, owner=top, rank=0),
            make_pod("demo", "worker", 0, owner=top, rank=1),
        ]
        for pod in pods:
            api.put(running(pod))
            api.log(pod["metadata"]["name"], pod["spec"]["containers"][0]["name"], "epoch 1", "epoch 2")
        time.sleep(0.5)
        for pod, code in zip(pods, (0, exit_code), strict=True):
            api.end_log(pod["metadata"]["name"], pod["spec"]["containers"][0]["name"])
            api.put(terminated(pod, code))
        api.set_status(VOLCANO, "Job", "demo", TERMINAL_STATUS["volcano"][end])

    def on_create(obj: dict[str, Any]) -> None:
        if obj["kind"] == "Job":
            threading.Thread(target=script, args=(obj,), daemon=True).start()

    api.on_create = on_create


def test_submit_prints_the_name_and_returns(
    api: FakeKubeAPI, job_file: Path, kubeconfig: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["submit", str(job_file), "--target", "volcano", "--kubeconfig", kubeconfig])
    assert (code, capsys.readouterr().out) == (0, "demo\n")
    job = api.get(VOLCANO, "Job", "demo")
    assert job is not None and job["metadata"]["labels"]["torchjob.io/job-name"] == "demo"


def test_submit_twice_needs_replace(
    api: FakeKubeAPI, job_file: Path, kubeconfig: str, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["submit", str(job_file), "--target", "volcano", "--kubeconfig", kubeconfig, "-n", "ml"]
    assert main(args) == 0
    first = api.get(VOLCANO, "Job", "demo", namespace="ml")
    capsys.readouterr()
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err == (
        "torchjob: job demo already exists in namespace ml (target volcano); "
        "use --replace to delete it and submit again\n"
    )
    assert main([*args, "--replace"]) == 0
    second = api.get(VOLCANO, "Job", "demo", namespace="ml")
    assert first is not None and second is not None
    assert first["metadata"]["uid"] != second["metadata"]["uid"]


@pytest.mark.parametrize(
    ("end", "expected"), [("Completed", 0), ("Failed", 1), ("Aborted", 1), ("Terminated", 1)]
)
def test_submit_wait_exits_by_the_final_phase(
    api: FakeKubeAPI,
    job_file: Path,
    kubeconfig: str,
    capsys: pytest.CaptureFixture[str],
    end: str,
    expected: int,
) -> None:
    play_controller(api, end, exit_code=0 if end == "Completed" else 7)
    code = main(["submit", str(job_file), "--target", "volcano", "--wait", "--kubeconfig", kubeconfig])
    out, err = capsys.readouterr()
    assert (code, out) == (expected, "demo\n")
    if end == "Completed":
        assert err == "torchjob: job demo Completed: test Completed\n"
    else:
        first, *tail = err.splitlines()
        assert (
            first == f"torchjob: job demo {end}: first failure: worker-0 (rank 1) exited with code 7 (Error)"
        )
        assert tail == ["  worker-0 | epoch 1", "  worker-0 | epoch 2"]


def test_submit_follow_streams_every_pod(
    api: FakeKubeAPI, job_file: Path, kubeconfig: str, capsys: pytest.CaptureFixture[str]
) -> None:
    play_controller(api, "Completed")
    code = main(["submit", str(job_file), "--target", "volcano", "--follow", "--kubeconfig", kubeconfig])
    out = capsys.readouterr().out.splitlines()
    assert code == 0
    assert out[0] == "demo"
    assert sorted(out[1:]) == [
        "master-0 r0 | epoch 1",
        "master-0 r0 | epoch 2",
        "worker-0 r1 | epoch 1",
        "worker-0 r1 | epoch 2",
    ]


def test_submit_to_a_cluster_without_the_crd_is_one_line(
    job_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    server = FakeKubeAPI(groups=("jobset.x-k8s.io/v1alpha2",)).start()
    try:
        config = str(server.kubeconfig(tmp_path / "kc"))
        assert main(["submit", str(job_file), "--target", "volcano", "--kubeconfig", config]) == 2
        assert capsys.readouterr().err == (
            "torchjob: this cluster has no batch.volcano.sh/v1alpha1 Job: "
            "install Volcano or use --target jobset\n"
        )
    finally:
        server.stop()


def test_submit_without_a_kubeconfig_is_one_line(
    job_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    missing = tmp_path / "nope"
    assert main(["submit", str(job_file), "--kubeconfig", str(missing)]) == 2
    # The file was named: no advice to name one.
    assert capsys.readouterr().err == f"torchjob: no kubeconfig: {missing} does not exist\n"


def test_submit_of_a_bad_file_starts_nothing(
    api: FakeKubeAPI, tmp_path: Path, kubeconfig: str, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(JOB.replace("replicas: 1\n      name: worker", "replicas: -1\n      name: worker"))
    assert main(["submit", str(bad), "--kubeconfig", kubeconfig]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"{bad}:") and "spec.tasks[1].replicas" in err
    assert api.requests == []


def test_submit_wait_gives_up_on_a_pod_the_scheduler_cannot_place(
    api: FakeKubeAPI, job_file: Path, kubeconfig: str, capsys: pytest.CaptureFixture[str]
) -> None:
    message = "0/2 nodes are available: 2 node(s) had untolerated taint {gpu: true}."

    def on_create(obj: dict[str, Any]) -> None:
        if obj["kind"] == "Job":
            api.put(unschedulable(make_pod("demo", "master", 0, owner=obj), message))

    api.on_create = on_create
    args = ["submit", str(job_file), "--target", "volcano", "--wait", "--pending-timeout", "0.5"]
    assert main([*args, "--kubeconfig", kubeconfig]) == 2
    out, err = capsys.readouterr()
    assert out == "demo\n"
    note, final = err.splitlines()
    assert note == f"torchjob: pod master-0 is Pending: Unschedulable: {message}"
    assert final.startswith("torchjob: job demo: pod master-0 is stuck Pending for ")
    assert final.endswith(f"; the scheduler says: {message}")


@pytest.mark.parametrize(("end", "expected"), [("Completed", 0), ("Failed", 1)])
def test_wait_for_a_cluster_job_exits_by_its_final_phase(
    api: FakeKubeAPI,
    job_file: Path,
    kubeconfig: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    end: str,
    expected: int,
) -> None:
    play_controller(api, end, exit_code=0 if end == "Completed" else 7)
    assert main(["submit", str(job_file), "--target", "volcano", "--kubeconfig", kubeconfig]) == 0
    capsys.readouterr()
    monkeypatch.setenv("KUBECONFIG", kubeconfig)  # `wait` finds the cluster as kubectl does
    code = main(["wait", "demo", "--engine", "kubernetes", "--timeout", "60"])
    out = capsys.readouterr().out
    assert code == expected, out
    assert out.startswith(f"default/demo {end}") or out.startswith(f"demo {end}"), out
    if end == "Failed":
        assert "root cause: worker-0 (rank 1), exit code 7" in out, out


def test_submit_takes_an_sdk_task_as_kubeflow_does(
    api: FakeKubeAPI, kubeconfig: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`submit FILE.py:TASK` as `run` and `render` take it: the task's PyTorchJob, labelled."""
    task = Path(__file__).resolve().parent.parent / "examples" / "sdk" / "allreduce.py"
    code = main(["submit", f"{task}:allreduce", "--target", "kubeflow", "--kubeconfig", kubeconfig])
    out = capsys.readouterr()
    assert code == 0, out.err
    name = out.out.strip()
    job = api.get("kubeflow.org/v1", "PyTorchJob", name)
    assert job is not None and job["metadata"]["labels"]["torchjob.io/job-name"] == name
    assert set(job["spec"]["pytorchReplicaSpecs"]) <= {"Master", "Worker"}


def test_submit_takes_a_script_in_quick_mode_with_its_image_and_arguments(
    api: FakeKubeAPI,
    kubeconfig: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`submit -j 2x2 --image IMG train.py ARGS`: the job a cluster runs, nothing of this machine's."""
    (tmp_path / "train.py").write_text("print('hi')\n")
    monkeypatch.chdir(tmp_path)
    args = ["submit", "--target", "volcano", "--kubeconfig", kubeconfig, "-j", "2x2", "--image", "reg.io/t:1"]
    code = main([*args, "train.py", "--steps", "5"])
    out = capsys.readouterr()
    assert (code, out.out) == (0, "train\n"), out.err
    assert "warning" not in out.err
    job = api.get(VOLCANO, "Job", "train")
    assert job is not None
    containers = [t["template"]["spec"]["containers"][0] for t in job["spec"]["tasks"]]
    assert [c["image"] for c in containers] == ["reg.io/t:1", "reg.io/t:1"]
    assert all(c["args"] == ["train.py", "--steps", "5"] and "workingDir" not in c for c in containers)


@pytest.mark.parametrize("command", ["submit", "run"])
def test_a_script_sent_to_a_cluster_without_image_is_refused(
    api: FakeKubeAPI,
    kubeconfig: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    command: str,
) -> None:
    """The default image holds neither the script nor its files: a job on it cannot start. One
    line naming --image, exit 2, nothing sent (render still shows it, with a warning)."""
    (tmp_path / "train.py").write_text("print('hi')\n")
    monkeypatch.chdir(tmp_path)
    engine = ["--engine", "kubernetes"] if command == "run" else []
    where = ["--target", "volcano", "--kubeconfig", kubeconfig]
    code = main([command, *engine, *where, "-j", "2x2", "train.py"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert (
        err.startswith("<command line>: --image: a script sent to a cluster needs an image")
        and err.count("\n") == 1
    )
    assert api.count("POST") == 0


@pytest.mark.parametrize(
    ("source", "target", "api_version", "kind"),
    [
        ("pytorchjob.yaml", "kubeflow", "kubeflow.org/v1", "PyTorchJob"),
        ("trainjob.yaml", "trainjob", "trainer.kubeflow.org/v1alpha1", "TrainJob"),
        ("jobset.yaml", "jobset", "jobset.x-k8s.io/v1alpha2", "JobSet"),
        ("pytorchjob.yaml", "trainjob", "trainer.kubeflow.org/v1alpha1", "TrainJob"),  # the migration
    ],
)
def test_submit_takes_the_clusters_own_kinds(
    api: FakeKubeAPI,
    kubeconfig: str,
    capsys: pytest.CaptureFixture[str],
    source: str,
    target: str,
    api_version: str,
    kind: str,
) -> None:
    """`submit` reads a PyTorchJob, TrainJob or JobSet file as `run` and `render` do: to its own
    target the object goes as written, labelled; to another, converted."""
    path = Path(__file__).resolve().parent.parent / "examples" / "kinds" / source
    written = yaml.safe_load(path.read_text())
    code = main(["submit", str(path), "--target", target, "--kubeconfig", kubeconfig])
    out = capsys.readouterr()
    name = written["metadata"]["name"]
    assert (code, out.out) == (0, f"{name}\n"), out.err
    created = api.get(api_version, kind, name)
    assert created is not None and created["metadata"]["labels"]["torchjob.io/job-name"] == name
    assert main(["render", str(path), "--target", target]) == 0
    (rendered,) = [o for o in yaml.safe_load(capsys.readouterr().out)["items"] if o["kind"] == kind]
    assert created["spec"] == rendered["spec"]  # what render showed is what the cluster got
    if written["kind"] == kind:  # as written, torchjob's label added to its pods
        assert _containers(created) == _containers(written)
    else:
        assert created["spec"]["trainer"]["numNodes"] == 3, created["spec"]
        # What the target says otherwise, at the PyTorchJob's own fields and lines, as render says it.
        source = f"torchjob: {path}:16: spec.pytorchReplicaSpecs.Master.restartPolicy: warning: "
        assert f"{source}restartPolicy is dropped" in out.err, out.err
        assert f"torchjob: {path}:13: spec.pytorchReplicaSpecs: warning: a TrainJob has no restart" in out.err


def _containers(obj: Any) -> list[Any]:
    """Every container list in ``obj``, in order."""
    if isinstance(obj, dict):
        found = [obj["containers"]] if "containers" in obj else []
        return found + [c for k, v in obj.items() if k != "containers" for c in _containers(v)]
    if isinstance(obj, list):
        return [c for v in obj for c in _containers(v)]
    return []
