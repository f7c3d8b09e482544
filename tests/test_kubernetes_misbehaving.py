"""The kubernetes engine against an API server that misbehaves: real client, real HTTP, kubeapi.py's knobs.

Pages that are not JSON, 410 Gone, watches that end at once or stall, 429 with Retry-After,
outages, no RBAC for pods/log, endless logs, credentials that must never be printed, credential
plugins that fail or hang, and interrupts while a job's objects are being created.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("kubernetes")

from kube_fixtures import TERMINAL_STATUS, make_pod, running, terminated
from kubeapi import TOKEN, FakeKubeAPI
from torchjob.cli import main
from torchjob.engines.base import EngineError, LogQuery, StartOptions
from torchjob.engines.registry import get_engine
from torchjob.jobs import load_jobs_from_text

pytestmark = pytest.mark.timeout(120)

VOLCANO = "batch.volcano.sh/v1alpha1"
JOB = """\
apiVersion: batch.volcano.sh/v1alpha1
kind: Job
metadata:
  name: demo
spec:
  minAvailable: 2
  plugins:
    pytorch: ["--master=master", "--worker=worker", "--port=23456"]
  tasks:
    - replicas: 1
      name: master
      template:
        spec:
          containers:
            - {name: master, image: busybox:1.36, command: [sh, -c, "echo hi"]}
          restartPolicy: Never
    - replicas: 1
      name: worker
      template:
        spec:
          containers:
            - {name: worker, image: busybox:1.36, command: [sh, -c, "echo hi"]}
          restartPolicy: Never
"""


@pytest.fixture
def job_file(tmp_path: Path) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(JOB)
    return path


def the_job() -> Any:
    return load_jobs_from_text(JOB, "job.yaml")[0].job


def pods_of(top: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        make_pod("demo", "master", 0, owner=top, rank=0),
        make_pod("demo", "worker", 0, owner=top, rank=1),
    ]


def play(api: FakeKubeAPI, end: str | None = "Completed", exit_code: int = 0, after: float = 0.5) -> None:
    """When the Volcano Job appears its pods run and log; with ``end``, they finish ``after`` s later."""

    def script(top: dict[str, Any]) -> None:
        pods = pods_of(top)
        for pod in pods:
            api.log(pod["metadata"]["name"], pod["spec"]["containers"][0]["name"], "epoch 1")
            api.put(running(pod))
        api.set_status(VOLCANO, "Job", "demo", {"state": {"phase": "Running"}})
        if end is None:
            return
        time.sleep(after)
        finish(api, end, exit_code)

    def on_create(obj: dict[str, Any]) -> None:
        if obj["kind"] == "Job":
            threading.Thread(target=script, args=(obj,), daemon=True).start()

    api.on_create = on_create


def finish(api: FakeKubeAPI, end: str, exit_code: int = 0) -> None:
    top = api.get(VOLCANO, "Job", "demo")
    assert top is not None
    for pod in pods_of(top):
        name, container = pod["metadata"]["name"], pod["spec"]["containers"][0]["name"]
        api.end_log(name, container)
        api.put(terminated(pod, exit_code if pod["metadata"]["name"].endswith("worker-0") else 0))
    api.set_status(VOLCANO, "Job", "demo", TERMINAL_STATUS["volcano"][end])


def submitted(api: FakeKubeAPI, kubeconfig: str, end: str | None = None) -> Any:
    """The demo job on the (fake) cluster, running; the engine that submitted it."""
    play(api, end)
    engine = get_engine("kubernetes", kubeconfig=kubeconfig)
    engine.start(the_job(), StartOptions(detach=True, target="volcano"))
    deadline = time.monotonic() + 10
    while len(api.objects_of("v1", "Pod")) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    return engine


def k8s(*args: str, kubeconfig: str) -> list[str]:
    return [*args, "--engine", "kubernetes", "--kubeconfig", kubeconfig]


# ---------------------------------------------------------------------- 4: credentials never printed


def test_credentials_in_the_server_url_are_never_printed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = FakeKubeAPI()
    config = server.kubeconfig(tmp_path / "kc")
    server.server.server_close()
    config.write_text(config.read_text().replace(server.url, f"http://alice:s3cr3t-pw@127.0.0.1:{port}"))
    code = main(["status", "demo", "--engine", "kubernetes", "--kubeconfig", str(config)])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith(f"torchjob: cannot reach the Kubernetes API server at http://127.0.0.1:{port}: "), err
    assert "s3cr3t" not in err and "alice" not in err


def test_a_token_the_server_echoes_is_never_printed(
    api: FakeKubeAPI, kubeconfig: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A proxy that puts the request's Authorization header into its error message."""
    api.refuse("GET", "pods", 403, f"denied for 'Authorization: Bearer {TOKEN}'")
    code = main(k8s("status", kubeconfig=kubeconfig))
    err = capsys.readouterr().err
    assert code == 2 and "(RBAC)" in err, err
    assert TOKEN not in err
    assert "denied for 'Authorization: ***'" in err


# ---------------------------------------------------------------------- 6: a 2xx answer that is not JSON


@pytest.mark.parametrize(
    "command",
    [["status"], ["status", "demo"], ["logs", "demo"], ["delete", "demo"], ["wait", "demo"], ["run"], ["submit"]],
    ids=lambda c: "-".join(c),
)
def test_a_page_that_is_not_json_is_one_line_for_every_command(
    api: FakeKubeAPI, kubeconfig: str, job_file: Path, capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    api.not_json = lambda method, path, query: True  # a proxy's sign-in page, with 200 OK
    if command[0] in ("run", "submit"):
        argv = [command[0], str(job_file), "--target", "volcano", "--kubeconfig", kubeconfig]
        argv += ["--engine", "kubernetes"] if command[0] == "run" else []
    else:
        argv = k8s(*command, kubeconfig=kubeconfig)
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"torchjob: the Kubernetes API server at {api.url} answered "), err
    assert "a text/html body that is not a Kubernetes object: '<html><head><title>Sign in" in err, err


def test_a_watch_that_answers_a_page_is_one_line(
    api: FakeKubeAPI, kubeconfig: str, job_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    play(api, end=None)
    api.not_json = lambda method, path, query: query.get("watch") == ["true"]
    code = main(k8s("run", str(job_file), "--target", "volcano", kubeconfig=kubeconfig))
    err = capsys.readouterr().err
    assert code == 2, err
    last = err.splitlines()[-1]
    assert "Traceback" not in err
    assert last.startswith(f"torchjob: the Kubernetes API server at {api.url} answered 'watch "), err
    assert "text/html" in last and "Sign in" in last


# ---------------------------------------------------------------------- 13: 429, credential plugins


def test_429_with_retry_after_is_retried(api: FakeKubeAPI, kubeconfig: str) -> None:
    engine = submitted(api, kubeconfig)
    api.break_for("429", requests=2, retry_after=1)
    started = time.monotonic()
    report = engine.status("demo")
    assert report.phase == "Running"
    assert time.monotonic() - started >= 2.0  # it waited as asked, twice


def test_429_that_does_not_end_is_an_error_after_a_few_tries(api: FakeKubeAPI, kubeconfig: str) -> None:
    engine = submitted(api, kubeconfig)
    before = len(api.requests)
    api.break_for("429", seconds=60, retry_after=0)
    with pytest.raises(EngineError, match=r"HTTP 429: try again later"):
        engine.status("demo")
    assert len(api.requests) - before == 5


def plugin_kubeconfig(api: FakeKubeAPI, tmp_path: Path, script: str) -> str:
    plugin = tmp_path / "cred-plugin"
    plugin.write_text("#!/bin/sh\n" + script)
    plugin.chmod(0o700)
    config = api.kubeconfig(tmp_path / "kubeconfig")
    text = config.read_text().replace(
        f'{{"token": "{TOKEN}"}}',
        f'{{"exec": {{"apiVersion": "client.authentication.k8s.io/v1beta1", "command": "{plugin}"}}}}',
    )
    assert "exec" in text
    config.write_text(text)
    return str(config)


def test_a_failing_credential_plugin_is_one_clear_error(
    api: FakeKubeAPI, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    config = plugin_kubeconfig(api, tmp_path, "echo 'token expired: run sso login' >&2\nexit 3\n")
    code = main(k8s("status", kubeconfig=config))
    err = capfd.readouterr().err
    assert code == 2
    assert err.splitlines() == [
        f"torchjob: cannot use kubeconfig {config}: its credential plugin ({tmp_path / 'cred-plugin'}) "
        "failed: exec: process returned 3. token expired: run sso login"
    ]
    assert not any(m == "GET" and p != "/" for m, p, _ in api.requests)  # nothing sent without credentials


def test_a_hanging_credential_plugin_times_out_and_is_killed(
    api: FakeKubeAPI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from torchjob.engines.kubernetes import credentials

    monkeypatch.setattr(credentials, "EXEC_TIMEOUT", 1.0)
    pidfile = tmp_path / "plugin.pid"
    config = plugin_kubeconfig(api, tmp_path, f"echo $$ > {pidfile}\nexec sleep 120\n")
    started = time.monotonic()
    with pytest.raises(EngineError, match=r"its credential plugin \(.*cred-plugin\) did not answer within 1s"):
        get_engine("kubernetes", kubeconfig=config).status("demo")
    assert time.monotonic() - started < 10
    pid = int(pidfile.read_text())
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            os.waitpid(pid, os.WNOHANG)
            os.kill(pid, 0)
        except (ChildProcessError, ProcessLookupError):
            break
        time.sleep(0.05)
    else:
        pytest.fail(f"the plugin {pid} still runs")
