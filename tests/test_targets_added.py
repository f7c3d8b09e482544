"""One home per target: a target added in the tests (tests/relay.py, one registry line)
renders from the CLI and is submitted and followed by the kubernetes engine; and for every
target, ``torchjob render --target T -n NS -e K=V`` prints exactly the objects the engine sends
(``--as-sent`` without -n and -e)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from torchjob.targets import target_names

pytest.importorskip("kubernetes")

import kubeapi
from kube_fixtures import demo_job, running, terminated
from kubeapi import FakeKubeAPI
from torchjob.cli import main

pytestmark = pytest.mark.timeout(120)

JOB = demo_job(pytorch_defaults=True)  # the pytorch plugin without flags: Volcano's defaults
RELAY = "ml.example.com/v1"


@pytest.fixture
def relay(monkeypatch: pytest.MonkeyPatch) -> None:
    """The test target registered: the one line a new target adds to the registry."""
    import torchjob.targets

    monkeypatch.setattr(torchjob.targets, "MODULES", [*torchjob.targets.MODULES, "relay"])


@pytest.fixture
def relay_api(monkeypatch: pytest.MonkeyPatch, relay: None) -> Iterator[FakeKubeAPI]:
    """A fake API server that serves the Relay kind (as a cluster with its operator would)."""
    monkeypatch.setitem(kubeapi.GROUP_RESOURCES, RELAY, {"Relay": "relays"})
    server = FakeKubeAPI(groups=tuple(kubeapi.GROUP_RESOURCES)).start()
    yield server
    server.stop()


def sent(api: FakeKubeAPI, item: dict[str, Any]) -> dict[str, Any] | None:
    """The object as the engine sent it: the body of its create request (the server adds its own
    fields to what it stores: a uid, a claim's finalizer, a pod's QoS class)."""
    meta = item["metadata"]
    assert api.get(item["apiVersion"], item["kind"], meta["name"], namespace=meta["namespace"]), "not created"
    for body in api.posted:
        obj = json.loads(body)
        if (obj["apiVersion"], obj["kind"], obj["metadata"]["name"]) == (
            item["apiVersion"],
            item["kind"],
            meta["name"],
        ):
            return dict(obj)
    return None


def rendered(capsys: pytest.CaptureFixture[str], *args: str) -> list[dict[str, Any]]:
    capsys.readouterr()
    assert main(["render", *args, "-o", "json"]) == 0
    items: list[dict[str, Any]] = json.loads(capsys.readouterr().out)["items"]
    return items


@pytest.mark.parametrize("target", [*target_names(), "relay"])
def test_render_prints_what_the_engine_sends(
    relay_api: FakeKubeAPI, job_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], target: str
) -> None:
    config = str(relay_api.kubeconfig(tmp_path / "kubeconfig"))
    where = ["--target", target, "-n", "ml", "-e", "SEED=7", "-e", "MODE=fast"]
    assert main(["run", str(job_file), "--engine", "kubernetes", "-d", "--kubeconfig", config, *where]) == 0
    items = rendered(capsys, str(job_file), *where, "--as-sent")
    assert items, "render printed nothing"
    assert [sent(relay_api, item) for item in items] == items
    created = [o for o in relay_api.objects.values() if o["metadata"].get("namespace") == "ml"]
    assert len(created) == len(items)  # nothing sent that render does not show


@pytest.mark.parametrize("target", target_names())
@pytest.mark.parametrize("command", ["submit", "run"])
def test_render_with_a_namespace_prints_the_bytes_submit_sends(
    job_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], target: str, command: str
) -> None:
    """No --as-sent: ``render --target T -n NS [-e K=V]`` is, byte for byte, the List of the request
    bodies the kubernetes client POSTed (in order) for ``submit``, or ``run -d`` with the same -e."""
    from torchjob.render import dump, list_of

    api = FakeKubeAPI().start()
    try:
        config = str(api.kubeconfig(tmp_path / "kubeconfig"))
        where = ["--target", target, "-n", "ml"]
        env = ["-e", "SEED=7", "-e", "MODE=fast"] if command == "run" else []
        sending = ["submit", str(job_file)] if command == "submit" else ["run", str(job_file), "-d"]
        if command == "run":
            sending += ["--engine", "kubernetes"]
        assert main([*sending, "--kubeconfig", config, *where, *env]) == 0
        bodies = [json.loads(body) for body in api.posted]
    finally:
        api.stop()
    assert bodies and all(b["metadata"]["namespace"] == "ml" for b in bodies)
    for fmt in ("yaml", "json"):
        capsys.readouterr()
        assert main(["render", str(job_file), *where, *env, "-o", fmt]) == 0
        assert capsys.readouterr().out == dump(list_of(bodies), fmt)


def test_default_render_as_sent_is_the_pods_target_as_sent(
    relay_api: FakeKubeAPI, job_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = str(relay_api.kubeconfig(tmp_path / "kubeconfig"))
    assert main(["submit", str(job_file), "--target", "pods", "--kubeconfig", config]) == 0
    items = rendered(capsys, str(job_file), "--as-sent")
    labelled = [i for i in items if i["metadata"].get("labels", {}).get("torchjob.io/job-name") == "demo"]
    assert labelled == items and [sent(relay_api, item) for item in items] == items


def test_an_added_target_renders_from_the_cli(
    relay: None, job_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (relay_obj,) = rendered(capsys, str(job_file), "--target", "relay", "-n", "ml", "-e", "A=1")
    assert (relay_obj["kind"], relay_obj["metadata"]["namespace"]) == ("Relay", "ml")
    for task in relay_obj["spec"]["tasks"]:
        (container,) = task["template"]["spec"]["containers"]
        assert {"name": "A", "value": "1"} in container["env"]
    # Refusals name it among the targets that can (its capabilities are its own declaration).
    no_pytorch = job_file.with_name("plain.yaml")
    no_pytorch.write_text(demo_job(pytorch=False))
    assert main(["render", str(no_pytorch), "--target", "kubeflow"]) == 2
    assert "use --target pods or volcano or jobset or relay" in capsys.readouterr().err


def play_relay(api: FakeKubeAPI, end: str) -> None:
    """The Relay operator: each task's pods run, log and end, then the Relay says ``end``."""

    def script(top: dict[str, Any]) -> None:
        pods = []
        for task in top["spec"]["tasks"]:
            name = f"demo-{task['name']}-0"
            labels = {
                "torchjob.io/job-name": "demo",
                "ml.example.com/task": task["name"],
                "ml.example.com/index": "0",
            }
            pod = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name, "namespace": "default", "labels": labels},
                "spec": {"containers": task["template"]["spec"]["containers"]},
                "status": {"phase": "Pending"},
            }
            pods.append(pod)
            api.put(running(pod))
            api.log(name, task["name"], f"hello from {task['name']}")
        time.sleep(0.3)
        for pod in pods:
            api.end_log(pod["metadata"]["name"], pod["spec"]["containers"][0]["name"])
            api.put(terminated(pod, 0 if end == "Done" else 3))
        api.set_status(RELAY, "Relay", "demo", {"state": end})

    def on_create(obj: dict[str, Any]) -> None:
        if obj["kind"] == "Relay":
            threading.Thread(target=script, args=(obj,), daemon=True).start()

    api.on_create = on_create


@pytest.mark.parametrize(("end", "code"), [("Done", 0), ("Broken", 1)])
def test_the_engine_submits_and_follows_an_added_target(
    relay_api: FakeKubeAPI,
    job_file: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    end: str,
    code: int,
) -> None:
    config = str(relay_api.kubeconfig(tmp_path / "kubeconfig"))
    play_relay(relay_api, end)
    assert main(["submit", str(job_file), "--follow", "--kubeconfig", config, "--target", "relay"]) == code
    out, err = capsys.readouterr()
    assert "master-0 r0 | hello from master" in out and "worker-0 r1 | hello from worker" in out
    assert f"job demo {'Completed' if code == 0 else 'Failed'}" in err
    # Found again by name among the cluster's kinds (the Relay's among them), read by its rules.
    assert main(["status", "demo", "--engine", "kubernetes", "--kubeconfig", config]) == 0
    assert f"reason: {end}\n" in capsys.readouterr().out


def test_start_sends_the_plan_it_was_given_rendering_once(
    relay_api: FakeKubeAPI, job_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import yaml

    import torchjob.targets
    from torchjob.engine_api.base import StartOptions
    from torchjob.engine_api.registry import get_engine
    from torchjob.jobs import load_jobs_from_text

    renders: list[str] = []
    real = torchjob.targets.render_target

    def counted(job: Any, target: str, **kwargs: Any) -> Any:
        renders.append(target)
        return real(job, target, **kwargs)

    monkeypatch.setattr(torchjob.targets, "render_target", counted)
    job = load_jobs_from_text(JOB, "job.yaml")[0].job
    engine = get_engine("kubernetes", kubeconfig=str(relay_api.kubeconfig(tmp_path / "kubeconfig")))
    options = StartOptions(detach=True, quiet=True, target="kubeflow", extra_env={"SEED": "7"})
    plan = engine.plan(job, options)
    assert renders == ["kubeflow"]
    assert engine.start(plan).name == "demo"
    assert renders == ["kubeflow"]  # the plan's objects were sent, not rendered again
    shown = yaml.safe_load(plan.text.split("\n", 1)[1])["items"]
    assert [sent(relay_api, item) for item in shown] == shown
    engine.delete(["default/demo"])
    assert engine.start(engine.plan(job, options)).name == "demo"  # a new plan: rendered again, once
    assert renders == ["kubeflow", "kubeflow"]
