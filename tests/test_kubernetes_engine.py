"""The kubernetes engine over real HTTP: the official client against the fake API server in kubeapi.py.

Nothing of the client is patched: each test writes a kubeconfig pointing at a server on 127.0.0.1
and the engine talks to it as to a cluster. The test plays the controller (kube_fixtures).
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from support import plan_and_start

pytest.importorskip("kubernetes")

from kube_fixtures import (
    API,
    JOB_LABEL,
    TERMINAL_STATUS,
    demo_job,
    install_stand_in,
    make_pod,
    running,
    terminated,
    unschedulable,
    waiting,
)
from kubeapi import GROUP_RESOURCES, FakeKubeAPI
from torchjob.engine_api.base import EngineError, JobReport, LogQuery, StartOptions
from torchjob.engine_api.registry import get_engine
from torchjob.jobs import load_jobs_from_text

pytestmark = pytest.mark.timeout(120)


def a_job(name: str = "demo", workers: int = 2) -> Any:
    return load_jobs_from_text(demo_job(name, workers=workers, pytorch=False), "job.yaml")[0].job


@pytest.fixture(autouse=True)
def renderer(monkeypatch: pytest.MonkeyPatch) -> None:
    install_stand_in(monkeypatch)


@pytest.fixture
def kubeconfig(api: FakeKubeAPI, tmp_path: Path) -> Path:
    return api.kubeconfig(tmp_path / "kubeconfig", namespace="team")


def engine_for(kubeconfig: Path, **settings: Any) -> Any:
    return get_engine("kubernetes", kubeconfig=str(kubeconfig), **settings)


def controller(api: FakeKubeAPI, script: Callable[[dict[str, Any]], None]) -> list[threading.Thread]:
    """Run ``script(top object)`` in a thread when a job's top-level object is created."""
    threads: list[threading.Thread] = []
    tops = {kind for _, kind in API.values()}

    def on_create(obj: dict[str, Any]) -> None:
        if obj["kind"] in tops:
            thread = threading.Thread(target=script, args=(obj,), daemon=True)
            threads.append(thread)
            thread.start()

    api.on_create = on_create
    return threads


def pods_of(api: FakeKubeAPI, top: dict[str, Any], target: str, workers: int = 2) -> list[dict[str, Any]]:
    name, ns = top["metadata"]["name"], top["metadata"]["namespace"]
    if target == "trainjob":
        return [make_pod(name, "node", i, target=target, owner=top, namespace=ns) for i in range(workers + 1)]
    pods = [make_pod(name, "master", 0, target=target, owner=top, namespace=ns, rank=0)]
    pods += [
        make_pod(name, "worker", i, target=target, owner=top, namespace=ns, rank=i + 1)
        for i in range(workers)
    ]
    return pods


# ---------------------------------------------------------------------- submitting


def test_detached_start_creates_the_object_in_the_contexts_namespace(
    api: FakeKubeAPI, kubeconfig: Path
) -> None:
    report = plan_and_start(engine_for(kubeconfig), a_job(), StartOptions(detach=True, target="volcano"))
    assert (report.id, report.target, report.engine) == ("team/demo", "volcano", "kubernetes")
    obj = api.get("batch.volcano.sh/v1alpha1", "Job", "demo", namespace="team")
    assert obj is not None and obj["metadata"]["labels"][JOB_LABEL] == "demo"


def test_namespace_flag_wins_over_the_context(api: FakeKubeAPI, kubeconfig: Path) -> None:
    plan_and_start(
        engine_for(kubeconfig, namespace="other"), a_job(), StartOptions(detach=True, target="volcano")
    )
    assert api.get("batch.volcano.sh/v1alpha1", "Job", "demo", namespace="other") is not None


def test_without_a_target_the_first_kind_the_cluster_has_is_used(tmp_path: Path) -> None:
    server = FakeKubeAPI(groups=("jobset.x-k8s.io/v1alpha2", "trainer.kubeflow.org/v1alpha1")).start()
    try:
        config = server.kubeconfig(tmp_path / "kc")
        report = plan_and_start(engine_for(config), a_job(), StartOptions(detach=True))
        assert report.target == "jobset"
        assert server.get("jobset.x-k8s.io/v1alpha2", "JobSet", "demo") is not None
    finally:
        server.stop()


def test_an_existing_job_is_an_error_without_replace(api: FakeKubeAPI, kubeconfig: Path) -> None:
    engine = engine_for(kubeconfig)
    engine.start(engine.plan(a_job(), StartOptions(detach=True, target="volcano")))
    with pytest.raises(EngineError, match=r"job demo already exists in namespace team .*--replace") as err:
        engine.start(engine.plan(a_job(), StartOptions(detach=True, target="volcano")))
    assert err.value.exit_code == 2


def test_replace_deletes_the_old_job_and_creates_a_new_one(api: FakeKubeAPI, kubeconfig: Path) -> None:
    engine = engine_for(kubeconfig)
    engine.start(engine.plan(a_job(), StartOptions(detach=True, target="volcano")))
    old = api.get("batch.volcano.sh/v1alpha1", "Job", "demo", namespace="team")
    assert old is not None
    # Its pods, as Volcano made them: they go with the job (owner references).
    for pod in pods_of(api, old, "volcano"):
        api.put(pod)
    engine.start(engine.plan(a_job(), StartOptions(detach=True, target="volcano", replace=True)))
    new = api.get("batch.volcano.sh/v1alpha1", "Job", "demo", namespace="team")
    assert new is not None and new["metadata"]["uid"] != old["metadata"]["uid"]
    assert api.objects_of("v1", "Pod", "team") == []
    assert api.count("DELETE", "/jobs/demo") == 1


def test_replace_works_across_targets(api: FakeKubeAPI, kubeconfig: Path) -> None:
    engine = engine_for(kubeconfig)
    engine.start(engine.plan(a_job(), StartOptions(detach=True, target="volcano")))
    engine.start(engine.plan(a_job(), StartOptions(detach=True, target="kubeflow", replace=True)))
    assert api.get("batch.volcano.sh/v1alpha1", "Job", "demo", namespace="team") is None
    assert api.get("kubeflow.org/v1", "PyTorchJob", "demo", namespace="team") is not None


def test_pods_target_creates_every_object_and_delete_removes_them(api: FakeKubeAPI, kubeconfig: Path) -> None:
    engine = engine_for(kubeconfig)
    engine.start(engine.plan(a_job(), StartOptions(detach=True, target="pods")))
    assert len(api.objects_of("v1", "Pod", "team")) == 3
    assert engine.status("demo").target == "pods"
    assert engine.delete(["demo"]) == ["team/demo"]
    assert api.objects_of("v1", "Pod", "team") == [] and api.objects_of("v1", "ConfigMap", "team") == []


def test_a_missing_crd_names_the_kind_and_a_target_the_cluster_has(tmp_path: Path) -> None:
    server = FakeKubeAPI(groups=("jobset.x-k8s.io/v1alpha2",)).start()
    try:
        engine = engine_for(server.kubeconfig(tmp_path / "kc"))
        with pytest.raises(EngineError) as err:
            engine.start(engine.plan(a_job(), StartOptions(detach=True, target="volcano")))
        assert str(err.value) == (
            "this cluster has no batch.volcano.sh/v1alpha1 Job: install Volcano or use --target jobset"
        )
        assert err.value.exit_code == 2
        assert server.count("POST") == 0
    finally:
        server.stop()


def test_a_cluster_without_any_training_stack_is_told_about_pods(tmp_path: Path) -> None:
    server = FakeKubeAPI(groups=()).start()
    try:
        engine = engine_for(server.kubeconfig(tmp_path / "kc"))
        with pytest.raises(EngineError, match=r"^this cluster has none of .*or use --target pods$"):
            engine.start(engine.plan(a_job(), StartOptions(detach=True)))
        with pytest.raises(
            EngineError, match=r"no batch.volcano.sh/v1alpha1 Job: install Volcano or use --target pods"
        ):
            engine.start(engine.plan(a_job(), StartOptions(detach=True, target="volcano")))
    finally:
        server.stop()


def test_no_kubeconfig_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(
        EngineError, match=r"^no kubeconfig: .*absent does not exist; set KUBECONFIG or pass --kubeconfig"
    ):
        get_engine("kubernetes").status("demo")


def test_kubeconfig_from_the_environment_and_an_unknown_context(
    api: FakeKubeAPI, kubeconfig: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    plan_and_start(get_engine("kubernetes"), a_job(), StartOptions(detach=True, target="volcano"))
    assert api.get("batch.volcano.sh/v1alpha1", "Job", "demo", namespace="team") is not None
    with pytest.raises(EngineError, match=r"no context 'nope' in .* \(contexts: fake-context\)"):
        get_engine("kubernetes", context="nope").status("demo")


def test_an_unreachable_server_is_one_line(tmp_path: Path) -> None:
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = FakeKubeAPI()
    config = server.kubeconfig(tmp_path / "kc")
    server.server.server_close()
    config.write_text(config.read_text().replace(server.url, f"http://127.0.0.1:{port}"))
    engine = engine_for(config)
    started = time.monotonic()
    with pytest.raises(
        EngineError, match=rf"^cannot reach the Kubernetes API server at http://127.0.0.1:{port}: "
    ):
        engine.status("demo")
    assert time.monotonic() - started < 30


def test_wrong_credentials_are_one_line(api: FakeKubeAPI, tmp_path: Path) -> None:
    engine = engine_for(api.kubeconfig(tmp_path / "kc", token="wrong"))
    with pytest.raises(EngineError, match=r"did not accept your credentials"):
        engine.status("demo")


def test_rbac_refusal_shows_the_servers_message(api: FakeKubeAPI, kubeconfig: Path) -> None:
    api.refuse(
        "POST",
        "jobs",
        403,
        'jobs.batch.volcano.sh is forbidden: User "alice" cannot {verb} resource "jobs" '
        'in the namespace "team"',
    )
    with pytest.raises(EngineError) as err:
        plan_and_start(engine_for(kubeconfig), a_job(), StartOptions(detach=True, target="volcano"))
    assert str(err.value) == (
        "the cluster refused to create batch.volcano.sh/v1alpha1 Job demo (RBAC): jobs.batch.volcano.sh is "
        'forbidden: User "alice" cannot create resource "jobs" in the namespace "team"'
    )
    assert err.value.exit_code == 2


def test_an_object_the_server_refuses_shows_its_message_and_nothing_stays(
    api: FakeKubeAPI, kubeconfig: Path
) -> None:
    message = 'Pod "demo-worker-1" is invalid: spec.containers[0].image: Required value'
    api.refuse("POST", "pods", 422, message, name=None)
    with pytest.raises(EngineError) as err:
        plan_and_start(engine_for(kubeconfig), a_job(), StartOptions(detach=True, target="pods"))
    assert str(err.value) == f"the cluster rejected v1 Pod demo-master-0: {message}"
    # The ConfigMap made before the refused pod was taken back.
    assert api.count("POST", "/configmaps") == 1
    assert api.objects_of("v1", "ConfigMap", "team") == []


# ---------------------------------------------------------------------- status and waiting


@pytest.mark.parametrize(
    ("target", "phase"),
    [(t, p) for t, phases in TERMINAL_STATUS.items() for p in phases],
)
def test_wait_ends_in_each_terminal_phase(
    api: FakeKubeAPI, kubeconfig: Path, target: str, phase: str
) -> None:
    engine = engine_for(kubeconfig)
    engine.start(engine.plan(a_job(), StartOptions(detach=True, target=target)))
    api_version, kind = API[target]
    top = api.get(api_version, kind, "demo", namespace="team")
    assert top is not None
    for pod in pods_of(api, top, target):
        api.put(running(pod))

    def finish() -> None:
        time.sleep(0.5)
        for i, pod in enumerate(pods_of(api, top, target)):
            code = 3 if phase != "Completed" and i == 1 else 0
            api.put(terminated(pod, code))
        api.set_status(api_version, kind, "demo", TERMINAL_STATUS[target][phase], namespace="team")

    threading.Thread(target=finish, daemon=True).start()
    report = engine.wait("demo", timeout=30)
    assert report.phase == phase
    assert report.terminal and report.ok == (phase == "Completed")
    assert report.target == target and len(report.pods) == 3
    if phase != "Completed":
        assert report.first_failure is not None and report.first_failure.exit_code == 3


def test_status_maps_running_and_pending(api: FakeKubeAPI, kubeconfig: Path) -> None:
    engine = engine_for(kubeconfig)
    engine.start(engine.plan(a_job(), StartOptions(detach=True, target="jobset")))
    top = api.get("jobset.x-k8s.io/v1alpha2", "JobSet", "demo", namespace="team")
    assert top is not None
    pods = pods_of(api, top, "jobset")
    for pod in pods:
        api.put(pod)
    report = engine.status("team/demo")
    assert report.phase == "Pending"
    assert [(p.short, p.rank, p.phase) for p in report.pods] == [
        ("master-0", 0, "Pending"),
        ("worker-0", 1, "Pending"),
        ("worker-1", 2, "Pending"),
    ]
    api.put(running(pods[0]))
    assert engine.status("demo").phase == "Running"


def test_wait_times_out_with_the_latest_report(api: FakeKubeAPI, kubeconfig: Path) -> None:
    engine = engine_for(kubeconfig)
    engine.start(engine.plan(a_job(), StartOptions(detach=True, target="volcano")))
    api.set_status(
        "batch.volcano.sh/v1alpha1", "Job", "demo", {"state": {"phase": "Running"}}, namespace="team"
    )
    started = time.monotonic()
    report = engine.wait("demo", timeout=1.0)
    assert report.phase == "Running" and not report.terminal
    assert time.monotonic() - started < 5


def test_the_first_failed_pod_comes_with_its_exit_code_and_log_tail(
    api: FakeKubeAPI, kubeconfig: Path
) -> None:
    engine = engine_for(kubeconfig)
    engine.start(engine.plan(a_job(), StartOptions(detach=True, target="volcano")))
    top = api.get("batch.volcano.sh/v1alpha1", "Job", "demo", namespace="team")
    assert top is not None
    master, worker0, worker1 = pods_of(api, top, "volcano")
    api.put(terminated(master, 137, finished="2026-01-01T00:05:00Z"))
    api.put(terminated(worker0, 0))
    api.put(terminated(worker1, 3, finished="2026-01-01T00:02:00Z"))
    api.log("demo-worker-1", "worker", *[f"step {i}" for i in range(30)], "Traceback: boom")
    api.set_status(
        "batch.volcano.sh/v1alpha1", "Job", "demo", TERMINAL_STATUS["volcano"]["Failed"], namespace="team"
    )
    report = engine.status("demo")
    failure = report.first_failure
    assert failure is not None
    assert (failure.short, failure.exit_code, failure.rank, failure.reason) == ("worker-1", 3, 2, "Error")
    assert failure.log_tail == [f"step {i}" for i in range(11, 30)] + ["Traceback: boom"]


def test_an_image_that_cannot_be_pulled_fails_fast_naming_it(api: FakeKubeAPI, kubeconfig: Path) -> None:
    engine = engine_for(kubeconfig)
    engine.start(engine.plan(a_job(), StartOptions(detach=True, target="volcano")))
    top = api.get("batch.volcano.sh/v1alpha1", "Job", "demo", namespace="team")
    assert top is not None
    pods = pods_of(api, top, "volcano")
    pods[2]["spec"]["containers"][0]["image"] = "registry.example/nope:1"
    api.put(waiting(pods[2], "ImagePullBackOff", 'Back-off pulling image "registry.example/nope:1"'))
    started = time.monotonic()
    with pytest.raises(EngineError) as err:
        engine.wait("demo", timeout=60)
    assert time.monotonic() - started < 10
    assert str(err.value).startswith(
        "job demo: pod worker-1 cannot pull image 'registry.example/nope:1' "
        "(ImagePullBackOff: Back-off pulling"
    )
    (pod,) = engine.status("demo").pods
    assert (pod.short, pod.reason) == (
        "worker-1",
        "ImagePullBackOff: cannot pull image registry.example/nope:1",
    )


@pytest.mark.parametrize("reason", ["ErrImagePull", "InvalidImageName"])
def test_other_image_errors_fail_fast_too(api: FakeKubeAPI, kubeconfig: Path, reason: str) -> None:
    engine = engine_for(kubeconfig)
    engine.start(engine.plan(a_job(), StartOptions(detach=True, target="kubeflow")))
    top = api.get("kubeflow.org/v1", "PyTorchJob", "demo", namespace="team")
    assert top is not None
    api.put(waiting(pods_of(api, top, "kubeflow")[0], reason))
    with pytest.raises(EngineError, match=rf"pod master-0 cannot pull image 'busybox:1.36' \({reason}\)"):
        engine.wait("demo", timeout=60)


def test_a_pod_stuck_pending_is_reported_with_the_schedulers_message(
    api: FakeKubeAPI, kubeconfig: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    engine = engine_for(kubeconfig, pending_timeout=1.0)
    engine.start(engine.plan(a_job(), StartOptions(detach=True, target="volcano")))
    top = api.get("batch.volcano.sh/v1alpha1", "Job", "demo", namespace="team")
    assert top is not None
    message = "0/3 nodes are available: 3 Insufficient nvidia.com/gpu. preemption: 0/3 nodes are available."
    api.put(unschedulable(pods_of(api, top, "volcano")[0], message))
    with pytest.raises(EngineError) as err:
        engine.wait("demo", timeout=60)
    assert str(err.value).startswith("job demo: pod master-0 is stuck Pending for ")
    assert str(err.value).endswith(f"the scheduler says: {message}")
    assert f"pod master-0 is Pending: Unschedulable: {message}" in capsys.readouterr().err
    assert engine.status("demo").pods[0].reason == f"Unschedulable: {message}"


# ---------------------------------------------------------------------- listing, logs, deleting


def test_list_jobs_finds_every_target_by_its_label(api: FakeKubeAPI, kubeconfig: Path) -> None:
    engine = engine_for(kubeconfig)
    for name, target in (
        ("a", "volcano"),
        ("b", "kubeflow"),
        ("c", "jobset"),
        ("d", "trainjob"),
        ("e", "pods"),
    ):
        engine.start(engine.plan(a_job(name), StartOptions(detach=True, target=target)))
    # Something of someone else's, without the label: not ours.
    api.put(
        {
            "apiVersion": "batch.volcano.sh/v1alpha1",
            "kind": "Job",
            "metadata": {"name": "x", "namespace": "team"},
        }
    )
    jobs = {r.name: r.target for r in engine.list_jobs()}
    assert jobs == {"a": "volcano", "b": "kubeflow", "c": "jobset", "d": "trainjob", "e": "pods"}
    with pytest.raises(EngineError, match=r"^no job 'x' in namespace team of context fake-context$"):
        engine.status("x")


def test_delete_resolves_every_ref_before_deleting_any(api: FakeKubeAPI, kubeconfig: Path) -> None:
    engine = engine_for(kubeconfig)
    engine.start(engine.plan(a_job("one"), StartOptions(detach=True, target="volcano")))
    engine.start(engine.plan(a_job("two"), StartOptions(detach=True, target="trainjob")))
    with pytest.raises(EngineError, match="no job 'typo'"):
        engine.delete(["one", "typo"])
    assert api.count("DELETE") == 0
    assert engine.delete(["one", "team/two"]) == ["team/one", "team/two"]
    assert api.objects_of("batch.volcano.sh/v1alpha1", "Job", "team") == []
    assert api.objects_of("trainer.kubeflow.org/v1alpha1", "TrainJob", "team") == []


def _started(
    api: FakeKubeAPI, target: str = "volcano", workers: int = 2
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    api_version, kind = API[target]
    top = api.get(api_version, kind, "demo", namespace="team")
    assert top is not None
    pods = pods_of(api, top, target, workers)
    for pod in pods:
        api.put(running(pod))
    return top, pods


def test_logs_of_every_pod_with_the_local_prefixes(api: FakeKubeAPI, kubeconfig: Path) -> None:
    engine = engine_for(kubeconfig)
    engine.start(engine.plan(a_job(), StartOptions(detach=True, target="volcano")))
    _, pods = _started(api)
    for pod in pods:
        name = pod["metadata"]["name"]
        api.log(name, pod["spec"]["containers"][0]["name"], f"hello from {name}", "bye")
    lines = [(line.prefix, line.text) for line in engine.logs("demo", LogQuery())]
    assert lines == [
        ("master-0 r0", "hello from demo-master-0"),
        ("master-0 r0", "bye"),
        ("worker-0 r1", "hello from demo-worker-0"),
        ("worker-0 r1", "bye"),
        ("worker-1 r2", "hello from demo-worker-1"),
        ("worker-1 r2", "bye"),
    ]
    only = [(line.prefix, line.text) for line in engine.logs("demo", LogQuery(pod="worker-1"))]
    assert only == [("worker-1 r2", "hello from demo-worker-1"), ("worker-1 r2", "bye")]
    with pytest.raises(EngineError, match="has no pod 'worker-9'"):
        list(engine.logs("demo", LogQuery(pod="worker-9")))


def test_following_logs_streams_every_pod_until_the_job_ends(api: FakeKubeAPI, kubeconfig: Path) -> None:
    engine = engine_for(kubeconfig)
    engine.start(engine.plan(a_job(), StartOptions(detach=True, target="volcano")))
    _, pods = _started(api)
    for pod in pods:
        api.log(pod["metadata"]["name"], pod["spec"]["containers"][0]["name"], "first")

    def later() -> None:
        time.sleep(0.5)
        for pod in pods:
            name, container = pod["metadata"]["name"], pod["spec"]["containers"][0]["name"]
            api.log(name, container, "second")
            api.end_log(name, container)
            api.put(terminated(pod, 0))
        api.set_status(
            "batch.volcano.sh/v1alpha1",
            "Job",
            "demo",
            TERMINAL_STATUS["volcano"]["Completed"],
            namespace="team",
        )

    threading.Thread(target=later, daemon=True).start()
    seen = [(line.prefix, line.text) for line in engine.logs("demo", LogQuery(follow=True))]
    for prefix in ("master-0 r0", "worker-0 r1", "worker-1 r2"):
        assert [t for p, t in seen if p == prefix] == ["first", "second"]
    assert api.count("GET", "/log") == 3  # one stream per container, no polling


def test_attached_start_follows_logs_and_returns_the_final_report(
    api: FakeKubeAPI, kubeconfig: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def script(top: dict[str, Any]) -> None:
        pods = pods_of(api, top, "volcano")
        for pod in pods:
            api.put(running(pod))
            api.log(pod["metadata"]["name"], pod["spec"]["containers"][0]["name"], "training")
        time.sleep(0.3)
        for pod in pods:
            api.end_log(pod["metadata"]["name"], pod["spec"]["containers"][0]["name"])
            api.put(terminated(pod, 0))
        api.set_status(
            "batch.volcano.sh/v1alpha1",
            "Job",
            "demo",
            TERMINAL_STATUS["volcano"]["Completed"],
            namespace="team",
        )

    controller(api, script)
    report: JobReport = plan_and_start(
        engine_for(kubeconfig), a_job(), StartOptions(target="volcano", timeout=30)
    )
    assert report.phase == "Completed"
    out = capsys.readouterr().out.splitlines()
    assert sorted(out) == ["master-0 r0 | training", "worker-0 r1 | training", "worker-1 r2 | training"]


class ListSink:
    """A caller's sink (issue 20): what the engine says arrives here, nothing on the console."""

    stream = None

    def __init__(self) -> None:
        self.logs: list[str] = []
        self.notices: list[str] = []
        self.reports: list[str] = []

    def log(self, line: Any) -> None:
        self.logs.append(f"{line.prefix} | {line.text}")

    def notice(self, text: str) -> None:
        self.notices.append(text)

    def report(self, text: str) -> None:
        self.reports.append(text)


def test_attached_start_and_wait_report_to_the_callers_sink(
    api: FakeKubeAPI, kubeconfig: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def script(top: dict[str, Any]) -> None:
        if top["metadata"]["name"] != "demo":
            return
        for pod in pods_of(api, top, "volcano"):
            api.put(running(pod))
            api.log(pod["metadata"]["name"], pod["spec"]["containers"][0]["name"], "training")
            api.end_log(pod["metadata"]["name"], pod["spec"]["containers"][0]["name"])
            api.put(terminated(pod, 0))
        status = TERMINAL_STATUS["volcano"]["Completed"]
        api.set_status("batch.volcano.sh/v1alpha1", "Job", "demo", status, namespace="team")

    controller(api, script)
    sink = ListSink()
    report = plan_and_start(
        engine_for(kubeconfig), a_job(), StartOptions(target="volcano", timeout=30, sink=sink)
    )
    assert report.phase == "Completed"
    assert sorted(sink.logs) == ["master-0 r0 | training", "worker-0 r1 | training", "worker-1 r2 | training"]
    assert capsys.readouterr() == ("", "")

    engine = engine_for(kubeconfig, pending_timeout=1.0)
    engine.start(engine.plan(a_job("stuck"), StartOptions(detach=True, target="volcano")))
    top = api.get("batch.volcano.sh/v1alpha1", "Job", "stuck", namespace="team")
    assert top is not None
    api.put(unschedulable(pods_of(api, top, "volcano")[0], "0/3 nodes are available"))
    with pytest.raises(EngineError):
        engine.wait("stuck", timeout=60, sink=sink)
    assert any("pod master-0 is Pending: Unschedulable: 0/3 nodes are available" in n for n in sink.notices)
    assert capsys.readouterr() == ("", "")


def test_attached_start_past_its_timeout_deletes_the_job(api: FakeKubeAPI, kubeconfig: Path) -> None:
    report = plan_and_start(
        engine_for(kubeconfig), a_job(), StartOptions(target="volcano", timeout=1.0, quiet=True)
    )
    assert report.phase == "Terminated" and "timed out" in report.reason
    assert api.get("batch.volcano.sh/v1alpha1", "Job", "demo", namespace="team") is None


# ---------------------------------------------------------------------- watches


def _requests_to_follow(tmp_path: Path, workers: int) -> tuple[int, JobReport]:
    server = FakeKubeAPI().start()
    try:
        engine = engine_for(server.kubeconfig(tmp_path / f"kc{workers}"))
        engine.start(engine.plan(a_job("big", workers), StartOptions(detach=True, target="volcano")))
        top = server.get("batch.volcano.sh/v1alpha1", "Job", "big")
        assert top is not None
        pods = [make_pod("big", "master", 0, owner=top)]
        pods += [make_pod("big", "worker", i, owner=top) for i in range(workers)]
        server.put_many(pods)
        before = len(server.requests)
        result: list[JobReport] = []
        follower = threading.Thread(target=lambda: result.append(engine.wait("big", timeout=120)))
        follower.start()
        time.sleep(0.5)
        for pod in pods:  # every pod moves twice while the job is followed
            server.put(running(pod))
        for pod in pods:
            server.put(terminated(pod, 0))
        server.set_status("batch.volcano.sh/v1alpha1", "Job", "big", TERMINAL_STATUS["volcano"]["Completed"])
        follower.join(timeout=120)
        assert result, "wait did not return"
        return len(server.requests) - before, result[0]
    finally:
        server.stop()


@pytest.mark.slow
def test_following_a_1000_pod_job_makes_as_many_requests_as_a_3_pod_job(tmp_path: Path) -> None:
    small, _ = _requests_to_follow(tmp_path, 2)
    big, report = _requests_to_follow(tmp_path, 999)
    assert report.phase == "Completed" and len(report.pods) == 1000
    assert all(p.phase == "Succeeded" for p in report.pods)
    assert big == small
    assert big <= 12  # lists and watches of the job, its pods and its PodGroup, and a few gets


def test_a_watch_the_server_ends_resumes_without_losing_events(
    api: FakeKubeAPI, kubeconfig: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from torchjob.engines.kubernetes import watch

    monkeypatch.setattr(watch, "SHORT_WATCH", 0.1)  # a 0.3 s watch is a healthy one here
    api.watch_seconds_cap = 0.3  # the server closes every watch after 0.3 s
    engine = engine_for(kubeconfig)
    engine.start(engine.plan(a_job(), StartOptions(detach=True, target="volcano")))

    def later() -> None:
        time.sleep(1.2)
        api.set_status(
            "batch.volcano.sh/v1alpha1",
            "Job",
            "demo",
            TERMINAL_STATUS["volcano"]["Aborted"],
            namespace="team",
        )

    threading.Thread(target=later, daemon=True).start()
    report = engine.wait("demo", timeout=30)
    assert report.phase == "Aborted"
    watches = [q for m, path, q in api.requests if q.get("watch") == ["true"]]
    assert len(watches) >= 4
    assert all(q.get("resourceVersion") for q in watches)


def test_groups_cover_every_target() -> None:
    assert {v for v, _ in API.values()} <= set(GROUP_RESOURCES)


def test_a_watch_told_410_gone_lists_again(api: FakeKubeAPI, kubeconfig: Path) -> None:
    api.watch_seconds_cap = 0.3
    engine = engine_for(kubeconfig)
    engine.start(engine.plan(a_job(), StartOptions(detach=True, target="volcano")))

    def later() -> None:
        time.sleep(0.5)
        api.compact()  # the versions the watches resume from are gone
        time.sleep(0.8)  # each watch ends, is told 410 Gone when it resumes, and lists again
        api.set_status(
            "batch.volcano.sh/v1alpha1",
            "Job",
            "demo",
            TERMINAL_STATUS["volcano"]["Completed"],
            namespace="team",
        )

    threading.Thread(target=later, daemon=True).start()
    assert engine.wait("demo", timeout=30).phase == "Completed"
    lists = [
        path for m, path, q in api.requests if m == "GET" and "watch" not in q and path.endswith("/jobs")
    ]
    assert len(lists) >= 2  # the first list, and the list after 410


def test_replace_never_deletes_an_object_torchjob_did_not_make(api: FakeKubeAPI, kubeconfig: Path) -> None:
    theirs = {
        "apiVersion": "batch.volcano.sh/v1alpha1",
        "kind": "Job",
        "metadata": {"name": "demo", "namespace": "team"},
    }
    api.put(theirs)
    with pytest.raises(EngineError) as err:
        plan_and_start(
            engine_for(kubeconfig), a_job(), StartOptions(detach=True, target="volcano", replace=True)
        )
    assert str(err.value) == (
        'cannot create batch.volcano.sh/v1alpha1 Job demo: jobs.batch.volcano.sh "demo" already exists'
    )
    assert api.count("DELETE") == 0


@pytest.mark.parametrize(
    ("target", "conditions", "phase"),
    [
        ("kubeflow", ["Created"], "Pending"),
        ("kubeflow", ["Created", "Running"], "Running"),
        ("kubeflow", ["Created", "Running", "Restarting"], "Restarting"),
        ("kubeflow", ["Created", "Running", "Succeeded"], "Completed"),
        ("jobset", ["Suspended"], "Pending"),
        ("trainjob", [], "Pending"),
        ("trainjob", ["Failed", "Complete"], "Failed"),
    ],
)
def test_condition_targets_map_to_volcano_phases(target: str, conditions: list[str], phase: str) -> None:
    from torchjob.engines.kubernetes.phase import job_phase

    top = {"status": {"conditions": [{"type": c, "status": "True"} for c in conditions]}}
    assert job_phase(target, top, []).phase == phase


def test_kubeconfig_lists_several_files_like_kubectl(
    api: FakeKubeAPI, kubeconfig: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUBECONFIG", f"{tmp_path / 'absent'}:{kubeconfig}")
    engine = get_engine("kubernetes")
    engine.start(engine.plan(a_job(), StartOptions(detach=True, target="volcano")))
    assert engine.status("demo").id == "team/demo"
