"""``run``, ``status``, ``logs`` and ``delete`` with ``--engine kubernetes``, through the real CLI.

The real kubernetes client talks over real HTTP to the fake API server (kubeapi.py); jobs are
rendered by the real ``torchjob.targets``. The test plays the cluster's controller.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

pytest.importorskip("kubernetes")

from kube_fixtures import JOB_LABEL, TERMINAL_STATUS, demo_job, make_pod, running, terminated
from kubeapi import FakeKubeAPI
from support import read_until
from torchjob.cli import main

pytestmark = pytest.mark.timeout(120)

JOB = demo_job(workers=2, min_available=2)
VOLCANO = "batch.volcano.sh/v1alpha1"


def volcano_pods(top: dict[str, Any]) -> list[dict[str, Any]]:
    """The pods Volcano's controller makes for the demo job (a literal RANK in each, as its plugin writes)."""
    pods = [make_pod("demo", "master", 0, owner=top, rank=0)]
    return pods + [make_pod("demo", "worker", i, owner=top, rank=i + 1) for i in range(2)]


def play_volcano(api: FakeKubeAPI, end: str | None, exit_code: int = 0) -> threading.Event:
    """When the Volcano Job appears its pods run and log; with ``end``, they finish and the job ends."""
    logged = threading.Event()

    def script(top: dict[str, Any]) -> None:
        pods = volcano_pods(top)
        for pod in pods:  # a running container has a log, if only an empty one: logged first
            api.log(pod["metadata"]["name"], pod["spec"]["containers"][0]["name"], "epoch 1")
            api.put(running(pod))
        api.set_status(VOLCANO, "Job", "demo", {"state": {"phase": "Running"}})
        logged.set()
        if end is None:
            return
        time.sleep(0.5)
        for i, pod in enumerate(pods):
            api.end_log(pod["metadata"]["name"], pod["spec"]["containers"][0]["name"])
            api.put(terminated(pod, exit_code if i == 2 else 0))
        api.set_status(VOLCANO, "Job", "demo", TERMINAL_STATUS["volcano"][end])

    def on_create(obj: dict[str, Any]) -> None:
        if obj["kind"] == "Job":
            threading.Thread(target=script, args=(obj,), daemon=True).start()

    api.on_create = on_create
    return logged


def k8s(*args: str, kubeconfig: str) -> list[str]:
    return [*args, "--engine", "kubernetes", "--kubeconfig", kubeconfig]


# ---------------------------------------------------------------------- run


@pytest.mark.parametrize(("end", "code"), [("Completed", 0), ("Failed", 1)])
def test_run_submits_follows_and_exits_by_the_final_phase(
    api: FakeKubeAPI,
    job_file: Path,
    kubeconfig: str,
    capsys: pytest.CaptureFixture[str],
    end: str,
    code: int,
) -> None:
    play_volcano(api, end, exit_code=0 if end == "Completed" else 3)
    assert main(k8s("run", str(job_file), "--target", "volcano", kubeconfig=kubeconfig)) == code
    out, err = capsys.readouterr()
    assert sorted(out.splitlines()) == [
        "master-0 r0 | epoch 1",
        "worker-0 r1 | epoch 1",
        "worker-1 r2 | epoch 1",
    ]
    last = err.splitlines()[-2 if end == "Failed" else -1]
    if end == "Completed":
        assert last == "torchjob: job demo Completed: test Completed"
    else:
        assert (
            last == "torchjob: job demo Failed: first failure: worker-1 (rank 2) exited with code 3 (Error)"
        )
        assert err.splitlines()[-1] == "  worker-1 | epoch 1"
    top = api.get(VOLCANO, "Job", "demo")
    assert top is not None and top["metadata"]["labels"][JOB_LABEL] == "demo"
    assert top["spec"]["tasks"][0]["template"]["metadata"]["labels"][JOB_LABEL] == "demo"  # real render


def test_run_replace_and_its_absence(
    api: FakeKubeAPI, job_file: Path, kubeconfig: str, capsys: pytest.CaptureFixture[str]
) -> None:
    args = k8s("run", "-d", str(job_file), "--target", "volcano", kubeconfig=kubeconfig)
    assert main(args) == 0
    assert capsys.readouterr().out == "default/demo\n"
    first = api.get(VOLCANO, "Job", "demo")
    assert main(args) == 2
    assert capsys.readouterr().err == (
        "torchjob: job demo already exists in namespace default (target volcano); "
        "use --replace to delete it and submit again\n"
    )
    assert main([*args, "--replace"]) == 0
    second = api.get(VOLCANO, "Job", "demo")
    assert first is not None and second is not None
    assert first["metadata"]["uid"] != second["metadata"]["uid"]


def test_run_target_and_runtime_reach_the_trainjob(
    api: FakeKubeAPI, job_file: Path, kubeconfig: str, capsys: pytest.CaptureFixture[str]
) -> None:
    args = k8s(
        "run", "-d", str(job_file), "--target", "trainjob", "--runtime", "my-rt", kubeconfig=kubeconfig
    )
    assert main([*args, "-n", "ml"]) == 0
    out, err = capsys.readouterr()
    assert out == "ml/demo\n"
    # Detached, what the target drops is still said.
    # At the file's line, as render says it.
    path = "spec.tasks[0].template.spec.restartPolicy"
    assert f"torchjob: {job_file}:16: {path}: warning: restartPolicy is dropped" in err, err
    train = api.get("trainer.kubeflow.org/v1alpha1", "TrainJob", "demo", namespace="ml")
    assert train is not None
    assert train["spec"]["runtimeRef"]["name"] == "my-rt"
    assert train["spec"]["trainer"]["numNodes"] == 3
    # The node pods the runtime makes carry the job label, through the runtime patch.
    patch = train["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]
    pod_template = patch["replicatedJobs"][0]["template"]["spec"]["template"]
    assert pod_template["metadata"]["labels"][JOB_LABEL] == "demo"


def test_run_a_target_refuses_names_the_file_line(
    api: FakeKubeAPI, tmp_path: Path, kubeconfig: str, capsys: pytest.CaptureFixture[str]
) -> None:
    different = tmp_path / "different.yaml"
    different.write_text(
        JOB.replace(
            '"echo hi"]}\n          restartPolicy: Never\n    - replicas: 2',
            '"echo master"]}\n          restartPolicy: Never\n    - replicas: 2',
        )
    )
    assert main(k8s("run", str(different), "--target", "trainjob", kubeconfig=kubeconfig)) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"{different}:") and "spec.tasks[1]" in err and "trainjob" in err
    assert api.count("POST") == 0


# ---------------------------------------------------------------------- engine flags


@pytest.mark.parametrize(
    ("argv", "flag", "engine", "chosen"),
    [
        (["run", "JOB", "--target", "volcano"], "--target", "kubernetes", "local"),
        (["run", "JOB", "--runtime", "rt"], "--runtime", "kubernetes", "local"),
        (["run", "JOB", "--replace"], "--replace", "kubernetes", "local"),
        (["status", "--namespace", "ml"], "--namespace", "kubernetes", "local"),
        (["logs", "demo", "--kubeconfig", "kc"], "--kubeconfig", "kubernetes", "local"),
        (["delete", "demo", "--context", "c"], "--context", "kubernetes", "local"),
        (["run", "JOB", "--engine", "kubernetes", "--state-dir", "SD"], "--state-dir", "local", "kubernetes"),
        (["status", "--engine", "kubernetes", "--state-dir", "SD"], "--state-dir", "local", "kubernetes"),
    ],
)
def test_a_flag_of_the_other_engine_is_one_line_and_starts_nothing(
    job_file: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    argv: list[str],
    flag: str,
    engine: str,
    chosen: str,
) -> None:
    state = tmp_path / "state"
    monkeypatch.setenv("TORCHJOB_HOME", str(state))
    argv = [str(job_file) if a == "JOB" else str(state) if a == "SD" else a for a in argv]
    assert main(argv) == 2
    message = f"<command line>: {flag}: applies only to --engine {engine}, not to --engine {chosen}"
    assert capsys.readouterr().err.splitlines() == [message]
    assert not state.exists()


# ---------------------------------------------------------------------- status, logs, delete


def submitted(api: FakeKubeAPI, job_file: Path, kubeconfig: str, end: str | None) -> None:
    """The demo job on the cluster, its pods running (and logged); ended with ``end``."""
    logged = play_volcano(api, end)
    assert main(["submit", str(job_file), "--target", "volcano", "--kubeconfig", kubeconfig]) == 0
    assert logged.wait(10)
    if end is not None:
        deadline = time.monotonic() + 10
        while "Running" in str((api.get(VOLCANO, "Job", "demo") or {}).get("status")):
            assert time.monotonic() < deadline
            time.sleep(0.05)


def test_status_of_one_job_human_json_and_yaml(
    api: FakeKubeAPI, job_file: Path, kubeconfig: str, capsys: pytest.CaptureFixture[str]
) -> None:
    submitted(api, job_file, kubeconfig, end=None)
    capsys.readouterr()
    assert main(k8s("status", "demo", kubeconfig=kubeconfig)) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("job default/demo: Running")
    rows = [line.split() for line in lines[2:5]]
    assert [(r[0], r[1], r[3]) for r in rows] == [
        ("master-0", "0", "Running"),
        ("worker-0", "1", "Running"),
        ("worker-1", "2", "Running"),
    ]
    assert "context: fake-context" in lines
    assert main(k8s("status", "demo", "-o", "json", kubeconfig=kubeconfig)) == 0
    data = json.loads(capsys.readouterr().out)
    assert (data["engine"], data["id"], data["phase"], data["target"]) == (
        "kubernetes",
        "default/demo",
        "Running",
        "volcano",
    )
    assert [(p["short"], p["rank"]) for p in data["pods"]] == [
        ("master-0", 0),
        ("worker-0", 1),
        ("worker-1", 2),
    ]
    assert main(k8s("status", "default/demo", "-o", "yaml", kubeconfig=kubeconfig)) == 0
    assert yaml.safe_load(capsys.readouterr().out) == data


def test_status_without_a_name_lists_torchjobs_jobs_in_the_namespace(
    api: FakeKubeAPI, job_file: Path, kubeconfig: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(k8s("status", "-n", "ml", kubeconfig=kubeconfig)) == 0
    assert capsys.readouterr().out == "no kubernetes jobs in namespace ml\n"
    submitted(api, job_file, kubeconfig, end="Completed")
    # Not torchjob's: no label, so not listed.
    api.put({"apiVersion": VOLCANO, "kind": "Job", "metadata": {"name": "someone-elses"}, "spec": {}})
    capsys.readouterr()
    assert main(k8s("status", kubeconfig=kubeconfig)) == 0
    header, *rows = capsys.readouterr().out.splitlines()
    assert header.split() == ["JOB", "PHASE", "PODS", "RETRIES", "PORTS", "STARTED"]
    assert [row.split()[:2] for row in rows] == [["default/demo", "Completed"]]
    assert "3 pods: 3 succeeded" in rows[0]
    assert main(k8s("status", "-o", "json", kubeconfig=kubeconfig)) == 0
    assert [i["name"] for i in json.loads(capsys.readouterr().out)["items"]] == ["demo"]


def test_status_of_an_unknown_job_is_one_line(
    api: FakeKubeAPI, kubeconfig: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(k8s("status", "nope", kubeconfig=kubeconfig)) == 2
    assert capsys.readouterr().err == "torchjob: no job 'nope' in namespace default of context fake-context\n"


def test_logs_of_every_pod_one_pod_and_following(
    api: FakeKubeAPI, job_file: Path, kubeconfig: str, capsys: pytest.CaptureFixture[str]
) -> None:
    submitted(api, job_file, kubeconfig, end=None)
    capsys.readouterr()
    assert main(k8s("logs", "demo", kubeconfig=kubeconfig)) == 0
    assert capsys.readouterr().out.splitlines() == [
        "master-0 r0 | epoch 1",
        "worker-0 r1 | epoch 1",
        "worker-1 r2 | epoch 1",
    ]
    assert main(k8s("logs", "demo", "worker-1", kubeconfig=kubeconfig)) == 0
    assert capsys.readouterr().out == "worker-1 r2 | epoch 1\n"
    assert main(k8s("logs", "demo", "worker-7", kubeconfig=kubeconfig)) == 2
    assert capsys.readouterr().err == "torchjob: job demo has no pod 'worker-7'\n"

    def finish_later() -> None:
        time.sleep(1.0)
        api.log("demo-worker-0", "worker", "epoch 2")
        time.sleep(0.3)
        for pod in volcano_pods(api.get(VOLCANO, "Job", "demo") or {}):
            api.end_log(pod["metadata"]["name"], pod["spec"]["containers"][0]["name"])
            api.put(terminated(pod, 0))
        api.set_status(VOLCANO, "Job", "demo", TERMINAL_STATUS["volcano"]["Completed"])

    threading.Thread(target=finish_later, daemon=True).start()
    assert main(k8s("logs", "demo", "worker-0", "-f", kubeconfig=kubeconfig)) == 0
    assert capsys.readouterr().out.splitlines() == ["worker-0 r1 | epoch 1", "worker-0 r1 | epoch 2"]


def test_delete_removes_the_job_and_a_typo_deletes_nothing(
    api: FakeKubeAPI, job_file: Path, kubeconfig: str, capsys: pytest.CaptureFixture[str]
) -> None:
    submitted(api, job_file, kubeconfig, end="Completed")
    capsys.readouterr()
    assert main(k8s("delete", "demo", "dmeo", kubeconfig=kubeconfig)) == 2
    assert capsys.readouterr().err == "torchjob: no job 'dmeo' in namespace default of context fake-context\n"
    assert api.get(VOLCANO, "Job", "demo") is not None
    assert main(k8s("delete", "demo", kubeconfig=kubeconfig)) == 0
    assert capsys.readouterr().out == "deleted default/demo\n"
    assert api.get(VOLCANO, "Job", "demo") is None
    assert api.objects_of("v1", "Pod") == []  # its pods went with it (owner references)


# ---------------------------------------------------------------------- Ctrl-C


def _read_until(process: subprocess.Popen[str], wanted: str, timeout: float) -> str:
    assert process.stdout is not None
    seen = read_until(process.stdout, wanted, timeout)
    if wanted not in seen:
        process.kill()
        _, err = process.communicate()
        pytest.fail(f"no {wanted!r} in {seen!r}; stderr: {err}")
    return seen


@pytest.mark.parametrize("command", ["run", "submit --follow", "submit --wait"])
def test_ctrl_c_stops_following_and_leaves_the_job_running(
    api: FakeKubeAPI, job_file: Path, kubeconfig: str, command: str
) -> None:
    play_volcano(api, end=None)  # the job runs until deleted
    verb, *flags = command.split()
    argv = [sys.executable, "-m", "torchjob", verb, str(job_file), *flags, "--target", "volcano"]
    argv += ["--kubeconfig", kubeconfig] + (["--engine", "kubernetes"] if verb == "run" else [])
    process = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "COLUMNS": "200"}
    )
    try:
        try:
            _read_until(
                process, "demo" if command == "submit --wait" else "worker-1 r2 | epoch 1", timeout=60
            )
        except BaseException:
            print([(m, path) for m, path, _ in api.requests])
            raise
        time.sleep(0.3)  # inside the watch
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
    assert api.get(VOLCANO, "Job", "demo") is not None
    assert api.count("DELETE") == 0


def test_a_quiet_log_stream_is_not_cut_off(
    api: FakeKubeAPI, job_file: Path, kubeconfig: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A training step that prints nothing for longer than the connect timeout keeps its stream."""
    from torchjob.engine_api.base import LogQuery
    from torchjob.engine_api.registry import get_engine
    from torchjob.engines.kubernetes import client

    monkeypatch.setattr(client, "CONNECT_TIMEOUT", 0.5)
    submitted(api, job_file, kubeconfig, end=None)

    def later() -> None:
        time.sleep(2.0)
        api.log("demo-worker-0", "worker", "after a quiet while")
        time.sleep(0.3)
        for pod in volcano_pods(api.get(VOLCANO, "Job", "demo") or {}):
            api.end_log(pod["metadata"]["name"], pod["spec"]["containers"][0]["name"])
            api.put(terminated(pod, 0))
        api.set_status(VOLCANO, "Job", "demo", TERMINAL_STATUS["volcano"]["Completed"])

    threading.Thread(target=later, daemon=True).start()
    engine = get_engine("kubernetes", kubeconfig=kubeconfig)
    texts = [line.text for line in engine.logs("demo", LogQuery(pod="worker-0", follow=True))]
    assert texts == ["epoch 1", "after a quiet while"]


# ---------------------------------------------------------------------- pods of the real targets


def test_jobset_pods_get_their_index_and_rank_from_what_the_target_rendered(
    api: FakeKubeAPI, job_file: Path, kubeconfig: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Workers read RANK from JobSet's global index (a fieldRef): status resolves it on each pod."""
    assert main(k8s("run", "-d", str(job_file), "--target", "jobset", kubeconfig=kubeconfig)) == 0
    jobset = api.get("jobset.x-k8s.io/v1alpha2", "JobSet", "demo")
    assert jobset is not None
    global_index = 0
    for replicated in jobset["spec"]["replicatedJobs"]:  # as JobSet's controller makes the pods
        for i in range(replicated["replicas"]):
            template = replicated["template"]["spec"]["template"]
            meta = template["metadata"]
            labels = {
                **meta["labels"],
                "jobset.sigs.k8s.io/replicatedjob-name": replicated["name"],
                "jobset.sigs.k8s.io/job-index": str(i),
                "batch.kubernetes.io/job-completion-index": "0",
            }
            annotations = {
                "jobset.sigs.k8s.io/job-index": str(i),
                "jobset.sigs.k8s.io/job-global-index": str(global_index),
            }
            pod = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": f"demo-{replicated['name']}-{i}-0-x{global_index}abc",
                    "labels": labels,
                    "annotations": annotations,
                },
                "spec": template["spec"],
            }
            api.put(running(pod))
            global_index += 1
    capsys.readouterr()
    assert main(k8s("status", "demo", "-o", "json", kubeconfig=kubeconfig)) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["target"] == "jobset"
    assert [(p["short"], p["rank"]) for p in data["pods"]] == [
        ("master-0", 0),
        ("worker-0", 1),
        ("worker-1", 2),
    ]


def test_trainjob_node_pods_are_found_by_the_label_the_runtime_patch_gives_them(
    api: FakeKubeAPI, job_file: Path, kubeconfig: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(k8s("run", "-d", str(job_file), "--target", "trainjob", kubeconfig=kubeconfig)) == 0
    train = api.get("trainer.kubeflow.org/v1alpha1", "TrainJob", "demo")
    assert train is not None
    patch = train["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]
    labels = patch["replicatedJobs"][0]["template"]["spec"]["template"]["metadata"]["labels"]
    for i in range(train["spec"]["trainer"]["numNodes"]):  # as the runtime's JobSet makes them
        env = [
            {"name": "PET_NPROC_PER_NODE", "value": "1"},
            {
                "name": "PET_NODE_RANK",
                "valueFrom": {
                    "fieldRef": {
                        "fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"
                    }
                },
            },
        ]
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": f"demo-node-0-{i}-abcde",
                "labels": {
                    **labels,
                    "jobset.sigs.k8s.io/replicatedjob-name": "node",
                    "jobset.sigs.k8s.io/job-index": "0",
                    "batch.kubernetes.io/job-completion-index": str(i),
                },
            },
            "spec": {"containers": [{"name": "node", "image": "busybox:1.36", "env": env}]},
        }
        api.put(running(pod))
    capsys.readouterr()
    assert main(k8s("status", "demo", "-o", "json", kubeconfig=kubeconfig)) == 0
    data = json.loads(capsys.readouterr().out)
    assert [(p["short"], p["rank"]) for p in data["pods"]] == [("node-0", 0), ("node-1", 1), ("node-2", 2)]


def test_a_workflow_runs_here_so_the_cluster_engine_is_refused_for_it(
    api: FakeKubeAPI, kubeconfig: str, capsys: pytest.CaptureFixture[str]
) -> None:
    example = Path(__file__).resolve().parent.parent / "examples" / "sdk" / "adaptive_training.py"
    assert main(k8s("run", f"{example}:adaptive_training", kubeconfig=kubeconfig)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--engine kubernetes: not for a workflow" in err, err
    assert api.requests == []


def test_prune_older_than_counts_on_the_clusters_clock(
    api: FakeKubeAPI, job_file: Path, kubeconfig: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A job's end is the cluster's time (its pods' finishedAt): --older-than is measured on the API
    server's clock, not on this machine's, which may run far ahead of it."""
    import datetime

    submitted(api, job_file, kubeconfig, end="Completed")  # its pods finished at 2026-01-01T00:01:00Z
    ended = datetime.datetime(2026, 1, 1, 0, 1, tzinfo=datetime.timezone.utc).timestamp()
    api.clock_skew = ended + 120 - time.time()  # the server's clock: two minutes after the job ended
    capsys.readouterr()
    assert main(k8s("prune", "--older-than", "10m", kubeconfig=kubeconfig)) == 0
    out, err = capsys.readouterr()
    assert out == "no finished jobs to remove\n", err
    assert api.get(VOLCANO, "Job", "demo") is not None
    assert main(k8s("prune", "--older-than", "1m", kubeconfig=kubeconfig)) == 0
    assert capsys.readouterr().out == "deleted default/demo\n"
