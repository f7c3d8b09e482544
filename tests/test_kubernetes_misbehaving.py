"""The kubernetes engine against an API server that misbehaves: real client, real HTTP, kubeapi.py's knobs.

Pages that are not JSON, 410 Gone, watches that end at once or stall, 429 with Retry-After,
outages, no RBAC for pods/log, endless logs, credentials that must never be printed, credential
plugins that fail or hang, and interrupts while a job's objects are being created.
"""

from __future__ import annotations

import json
import math
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

from kube_fixtures import TERMINAL_STATUS, demo_job, make_pod, running, terminated
from kubeapi import TOKEN, FakeKubeAPI
from support import read_until
from torchjob.cli import main
from torchjob.engine_api.base import EngineError, LogQuery, StartOptions
from torchjob.engine_api.registry import get_engine
from torchjob.jobs import load_jobs_from_text

pytestmark = pytest.mark.timeout(120)

VOLCANO = "batch.volcano.sh/v1alpha1"
JOB = demo_job()


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
    engine.start(engine.plan(the_job(), StartOptions(detach=True, target="volcano")))
    # Until play's thread has made the pods and given the job its phase: under load it may lag
    # behind the start by seconds, and a test that begins sooner would see a job still Pending.
    deadline = time.monotonic() + 60
    while not (len(api.objects_of("v1", "Pod")) >= 2 and job_phase(api)):
        assert time.monotonic() < deadline, "the fake cluster never ran the job"
        time.sleep(0.05)
    return engine


def job_phase(api: FakeKubeAPI) -> str | None:
    top = api.get(VOLCANO, "Job", "demo")
    return ((top or {}).get("status") or {}).get("state", {}).get("phase")


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
    assert err.startswith(f"torchjob: cannot reach the Kubernetes API server at http://127.0.0.1:{port}: "), (
        err
    )
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
    [
        ["status"],
        ["status", "demo"],
        ["logs", "demo"],
        ["delete", "demo"],
        ["wait", "demo"],
        ["run"],
        ["submit"],
    ],
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
    # The job was created and runs on: said, with how to follow it again (issue 33).
    assert last.endswith(
        "and is not stopped by this: follow it again with: torchjob logs default/demo -f --engine kubernetes"
    )


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


def test_a_credential_plugin_that_fails_to_renew_an_expired_token_is_one_clear_error(
    api: FakeKubeAPI, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """Cloud tokens expire (EKS: 15 min): the client runs the plugin again before a request."""
    runs = tmp_path / "runs"
    script = f"""
echo run >> {runs}
if [ "$(wc -l < {runs})" -gt 1 ]; then echo 'session expired: run sso login' >&2; exit 4; fi
soon=$(date -u -d @$(( $(date +%s) + 302 )) +%Y-%m-%dT%H:%M:%SZ)  # the client renews 5 min early
printf '{{"apiVersion": "client.authentication.k8s.io/v1beta1", "kind": "ExecCredential",
  "status": {{"token": "{TOKEN}", "expirationTimestamp": "%s"}}}}' "$soon"
"""
    config = plugin_kubeconfig(api, tmp_path, script)
    engine = get_engine("kubernetes", kubeconfig=config)
    assert engine.list_jobs() == []  # the first token works
    time.sleep(2.5)
    with pytest.raises(EngineError) as raised:
        engine.list_jobs()
    assert str(raised.value) == (
        f"cannot use kubeconfig {config} to renew the token: its credential plugin "
        f"({tmp_path / 'cred-plugin'}) failed: exec: process returned 4. session expired: run sso login"
    )
    assert "ERROR:root" not in capfd.readouterr().err


def test_a_hanging_credential_plugin_times_out_and_is_killed(
    api: FakeKubeAPI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from torchjob.engines.kubernetes import credentials

    monkeypatch.setattr(credentials, "EXEC_TIMEOUT", 1.0)
    pidfile = tmp_path / "plugin.pid"
    config = plugin_kubeconfig(api, tmp_path, f"echo $$ > {pidfile}\nexec sleep 120\n")
    started = time.monotonic()
    with pytest.raises(
        EngineError, match=r"its credential plugin \(.*cred-plugin\) did not answer within 1s"
    ):
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


# ---------------------------------------------------------------------- 7, 8: 410 Gone, stalled watches


def watch_requests(api: FakeKubeAPI) -> int:
    with api.lock:
        return sum(1 for _, _, q in api.requests if q.get("watch") == ["true"])


@pytest.mark.parametrize("misbehaviour", ["gone", "ends-at-once"])
def test_watches_that_fail_at_once_back_off(api: FakeKubeAPI, kubeconfig: str, misbehaviour: str) -> None:
    engine = submitted(api, kubeconfig)
    if misbehaviour == "gone":
        api.watch_gone = True  # every watch: 410 Gone
    else:
        api.watch_seconds_cap = 0  # every watch ends as soon as it starts
    before = len(api.requests)
    began = time.monotonic()
    report = engine.wait("demo", timeout=4)
    took = time.monotonic() - began
    assert report.phase == "Running"
    sent = len(api.requests) - before
    # One watch per resource (the job, its pods, and on Volcano its PodGroup), each listing and
    # watching again after at least 0.4 s, then 0.8 s, 1.6 s, ... (half of each doubled pause):
    # round k+1 starts 0.4 * (2**k - 1) s in at the soonest, so 4 rounds of 2 requests each in
    # 4 s (without back-off: hundreds). The rounds are counted in the time the wait took, which
    # a loaded machine stretches past its 4 s.
    rounds = 1 + int(math.log2(took / 0.4 + 1))
    with api.lock:
        watched = {path for _, path, q in api.requests if q.get("watch") == ["true"]}
    assert 2 <= len(watched) <= 3, watched
    assert sent <= len(watched) * rounds * 2 + 4, (sent, took)
    assert watch_requests(api) >= 2


def test_after_410_gone_the_watch_lists_again_and_sees_the_end(api: FakeKubeAPI, kubeconfig: str) -> None:
    engine = submitted(api, kubeconfig)
    api.watch_gone = True

    def later() -> None:
        time.sleep(1.0)
        finish(api, "Completed")

    threading.Thread(target=later, daemon=True).start()
    started = time.monotonic()
    assert engine.wait("demo", timeout=30).phase == "Completed"
    assert time.monotonic() - started < 10


def test_backoff_doubles_with_jitter_up_to_its_cap() -> None:
    import random

    from torchjob.engines.kubernetes.watch import Backoff

    backoff = Backoff(first=1.0, cap=8.0, rng=random.Random(7).random)
    delays = [backoff.next() for _ in range(8)]
    bases = [1, 2, 4, 8, 8, 8, 8, 8]
    assert all(0.5 * b <= d <= 1.5 * b for d, b in zip(delays, bases, strict=True)), delays
    assert len({round(d / b, 6) for d, b in zip(delays, bases, strict=True)}) == 8  # jittered
    backoff.reset()
    assert backoff.next() <= 1.5


def test_a_stalled_watch_does_not_hide_the_end_of_the_job(
    api: FakeKubeAPI, kubeconfig: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server (or a proxy) keeps the watch open and sends nothing: the job's end is seen anyway."""
    from torchjob.engines.kubernetes import watch

    monkeypatch.setattr(watch, "WATCH_SECONDS", 1)  # what the server is asked to end each watch after
    monkeypatch.setattr(watch, "STALL_SLACK", 1.0)
    engine = submitted(api, kubeconfig)
    api.stall_watches = True  # from now on every watch answers, then says nothing and never ends

    def later() -> None:
        time.sleep(0.5)
        finish(api, "Completed")

    threading.Thread(target=later, daemon=True).start()
    started = time.monotonic()
    report = engine.wait("demo", timeout=20)
    assert report.phase == "Completed"
    assert time.monotonic() - started < 8


# ---------------------------------------------------------------------- 9: transient API trouble


@pytest.mark.parametrize("mode", ["503", "drop"])
def test_following_goes_on_through_transient_api_errors(
    api: FakeKubeAPI, kubeconfig: str, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    from torchjob.engines.kubernetes import watch

    monkeypatch.setattr(watch, "BACKOFF_FIRST", 0.05)
    monkeypatch.setattr(watch, "BACKOFF_MAX", 0.2)
    engine = submitted(api, kubeconfig)

    def later() -> None:
        time.sleep(0.5)
        api.break_for(mode, requests=12)  # open watches cut, then 12 requests refused or dropped
        finish(api, "Completed")

    threading.Thread(target=later, daemon=True).start()
    report = engine.wait("demo", timeout=60)
    assert report.phase == "Completed"
    assert api.trouble is not None and api.trouble.left == 0


def test_a_log_stream_cut_by_an_outage_is_followed_on_without_losing_or_repeating_lines(
    api: FakeKubeAPI, kubeconfig: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from torchjob.engines.kubernetes import watch

    monkeypatch.setattr(watch, "BACKOFF_FIRST", 0.05)
    monkeypatch.setattr(watch, "BACKOFF_MAX", 0.2)
    engine = submitted(api, kubeconfig)
    got: list[str] = []

    def later() -> None:
        deadline = time.monotonic() + 10
        while not got and time.monotonic() < deadline:
            time.sleep(0.05)
        api.log("demo-worker-0", "worker", "epoch 2")
        time.sleep(0.3)
        api.break_for("drop", seconds=1.0)  # every open stream is cut, and requests dropped, for 1 s
        time.sleep(0.3)
        api.log("demo-worker-0", "worker", "epoch 3")  # written while the stream is down
        time.sleep(1.5)
        api.log("demo-worker-0", "worker", "epoch 4")
        time.sleep(0.3)
        finish(api, "Completed")

    threading.Thread(target=later, daemon=True).start()
    for line in engine.logs("demo", LogQuery(pod="worker-0", follow=True)):
        got.append(line.text)
    assert got == ["epoch 1", "epoch 2", "epoch 3", "epoch 4"]
    follows = [q for m, p, q in api.requests if p.endswith("/demo-worker-0/log")]
    assert len(follows) >= 2 and "sinceTime" in follows[-1], follows


def test_giving_up_after_the_patience_says_the_job_still_runs(
    api: FakeKubeAPI,
    kubeconfig: str,
    job_file: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from torchjob.engines.kubernetes import watch

    monkeypatch.setattr(watch, "BACKOFF_FIRST", 0.05)
    monkeypatch.setattr(watch, "BACKOFF_MAX", 0.2)
    monkeypatch.setattr(watch, "PATIENCE", 2.0)
    play(api, end=None)

    def later() -> None:
        deadline = time.monotonic() + 20
        while api.get(VOLCANO, "Job", "demo") is None and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)
        api.break_for("503", seconds=60)

    threading.Thread(target=later, daemon=True).start()
    started = time.monotonic()
    code = main(k8s("run", str(job_file), "--target", "volcano", kubeconfig=kubeconfig))
    err = capsys.readouterr().err
    assert code == 2, err
    assert time.monotonic() - started < 30
    last = err.splitlines()[-1]
    assert last.startswith(f"torchjob: lost contact with the Kubernetes API server at {api.url} for "), err
    assert last.endswith(
        "; job default/demo was Running then and is not stopped by this: "
        "follow it again with: torchjob logs default/demo -f --engine kubernetes"
    ), last
    assert "HTTP 503" in last


# ---------------------------------------------------------------------- 10: no RBAC for pods/log


def test_without_rbac_for_logs_a_failed_job_is_still_reported(
    api: FakeKubeAPI, kubeconfig: str, job_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    api.refuse(
        "GET",
        "pods",
        403,
        'pods "x" is forbidden: User "bob" cannot get resource "pods/log"',
        subresource="log",
    )
    play(api, end="Failed", exit_code=3, after=1.0)
    code = main(k8s("run", str(job_file), "--target", "volcano", kubeconfig=kubeconfig))
    err = capsys.readouterr().err
    assert code == 1, err
    warnings = [line for line in err.splitlines() if "warning:" in line]
    assert len(warnings) == 1, err
    assert 'cannot get resource "pods/log"' in warnings[0] and warnings[0].endswith("; going on without logs")
    assert err.splitlines()[-1] == (
        "torchjob: job demo Failed: first failure: worker-0 (rank 1) exited with code 3 (Error)"
    ), err
    code = main(k8s("status", "demo", kubeconfig=kubeconfig))
    out, err = capsys.readouterr()
    assert code == 0 and "Failed" in out, err
    assert err.count("warning:") == 1
    assert main(k8s("wait", "demo", kubeconfig=kubeconfig)) == 1


# ---------------------------------------------------------------------- 12: logs with bounded memory


def test_logs_without_follow_streams_an_endless_log(api: FakeKubeAPI, kubeconfig: str) -> None:
    engine = submitted(api, kubeconfig)
    api.endless_log("demo-master-0", "master")
    got: list[str] = []
    lines = engine.logs("demo", LogQuery(pod="master-0"))

    def read() -> None:
        for line in lines:
            got.append(line.text)
            if len(got) == 3:
                return

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(10)
    assert not reader.is_alive(), "the first lines of an endless log never came"
    assert got == ["epoch 1", "x" * 99, "x" * 99]
    time.sleep(1.0)  # a reader that stops reading: the server can send only what buffers hold
    assert api.log_bytes_sent < 32 * 1024 * 1024, api.log_bytes_sent
    lines.close()


@pytest.mark.parametrize("follow", [False, True])
def test_a_line_without_a_newline_comes_in_bounded_pieces(
    api: FakeKubeAPI, kubeconfig: str, follow: bool
) -> None:
    from torchjob.engines.kubernetes.client import MAX_LINE

    engine = submitted(api, kubeconfig)
    api.endless_log("demo-master-0", "master", line=b"y" * 4096)  # no newline, ever
    lines = iter(engine.logs("demo", LogQuery(pod="master-0", follow=follow)))
    got: list[str] = []

    def read() -> None:
        for line in lines:
            got.append(line.text)
            if len(got) == 3:
                return

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(10)
    assert not reader.is_alive(), got
    assert got[0] == "epoch 1"
    assert got[1:] == ["y" * MAX_LINE] * 2
    time.sleep(1.0)  # a reader that stops reading
    assert api.log_bytes_sent < 64 * 1024 * 1024, api.log_bytes_sent


def test_a_line_a_clean_end_cut_short_is_printed_when_its_pod_is_gone(
    api: FakeKubeAPI,
    kubeconfig: str,
    job_file: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The stream of a running container ends cleanly in the middle of a line, and the pod is
    deleted before its log can be read again: the beginning of that line, all there will ever
    be of it, is printed once, before the job's end."""
    from torchjob.engines.kubernetes import follow

    monkeypatch.setattr(follow, "LOG_GRACE_SECONDS", 120.0)  # a loaded machine: the stream's end waited for
    play(api, end=None)

    def cut_then_delete() -> None:
        deadline = time.monotonic() + 60
        while not [q for m, p, q in api.requests if p.endswith("/demo-worker-0/log") and q.get("follow")]:
            assert time.monotonic() < deadline, "no one follows the worker's log"
            time.sleep(0.02)
        api.log("demo-worker-0", "worker", "epoch 2")
        api.cut_log("demo-worker-0", "worker", partial="epoch 3 hal")
        api.delete("v1", "Pod", "demo-worker-0")
        top = api.get(VOLCANO, "Job", "demo")
        assert top is not None
        master = pods_of(top)[0]
        api.end_log("demo-master-0", "master")
        api.put(terminated(master, 0))
        api.set_status(VOLCANO, "Job", "demo", TERMINAL_STATUS["volcano"]["Completed"])

    threading.Thread(target=cut_then_delete, daemon=True).start()
    code = main(k8s("run", str(job_file), "--target", "volcano", kubeconfig=kubeconfig))
    out, err = capsys.readouterr()
    assert code == 0, err
    printed = [line for line in out.splitlines() if line.startswith("worker-0 r1 | ")]
    assert printed == ["worker-0 r1 | epoch 1", "worker-0 r1 | epoch 2", "worker-0 r1 | epoch 3 hal"], out


# ---------------------------------------------------------------------- 11, 14: Ctrl-C and SIGTERM


def _read_until(process: subprocess.Popen[str], wanted: str, timeout: float) -> str:
    assert process.stdout is not None
    seen = read_until(process.stdout, wanted, timeout)
    assert wanted in seen, f"no {wanted!r} in {seen!r}"
    return seen


def cli(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "torchjob", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "COLUMNS": "200"},
    )


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_an_interrupt_while_creating_deletes_what_was_created(
    api: FakeKubeAPI, kubeconfig: str, job_file: Path, sig: int, capsys: pytest.CaptureFixture[str]
) -> None:
    api.create_delay = 0.5  # each object is made, then answered for slowly
    process = cli(
        "run", str(job_file), "--engine", "kubernetes", "--target", "pods", "--kubeconfig", kubeconfig
    )
    try:
        deadline = time.monotonic() + 30
        while len(api.objects) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.1)  # the first object made and answered, the second made and not yet answered
        made = len(api.objects)
        process.send_signal(sig)
        _, err = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert made >= 2, made
    assert process.returncode == 130, err
    assert "Traceback" not in err
    assert (
        "torchjob: interrupted while creating the job's objects; those already created were deleted"
    ) in err.splitlines(), err
    assert api.objects == {}
    api.create_delay = 0
    code = main(k8s("run", str(job_file), "-d", "--target", "pods", "--replace", kubeconfig=kubeconfig))
    assert code == 0, capsys.readouterr().err


def test_what_an_interrupted_creation_left_is_found_by_status_delete_and_replace(
    api: FakeKubeAPI, kubeconfig: str, job_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A second Ctrl-C stopped the clean-up: the `pods` job's first objects, but no pod, remain."""
    label = {"torchjob.io/job-name": "demo"}
    api.put({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "demo-svc", "labels": label}})
    api.put({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "demo", "labels": label}})
    assert main(k8s("status", "demo", kubeconfig=kubeconfig)) == 0, capsys.readouterr().err
    assert main(k8s("run", str(job_file), "-d", "--target", "pods", kubeconfig=kubeconfig)) == 2
    assert "job demo already exists in namespace default (target pods)" in capsys.readouterr().err
    assert main(k8s("delete", "demo", kubeconfig=kubeconfig)) == 0, capsys.readouterr().err
    assert api.objects == {}
    api.put({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "demo-svc", "labels": label}})
    code = main(k8s("run", str(job_file), "-d", "--target", "pods", "--replace", kubeconfig=kubeconfig))
    assert code == 0, capsys.readouterr().err
    assert len(api.objects_of("v1", "Pod")) == 2


LEFTOVERS = {
    "Service": ("v1", "service"),
    "NetworkPolicy": ("networking.k8s.io/v1", "networkpolicy"),
    "PodGroup": ("scheduling.volcano.sh/v1beta1", "podgroup"),
}


@pytest.mark.parametrize("kind", list(LEFTOVERS))
def test_delete_finds_a_job_of_which_only_one_object_is_left_and_says_what_it_removed(
    api: FakeKubeAPI, kubeconfig: str, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    """A `pods` job's pods and ConfigMap are gone (deleted by hand, a clean-up cut short); one
    object of it, found by the job's label alone, is still there. A Volcano job's PodGroup
    carries the label too, so one left behind by its Job is found the same way."""
    api_version, said = LEFTOVERS[kind]
    label = {"torchjob.io/job-name": "demo"}
    api.put({"apiVersion": api_version, "kind": kind, "metadata": {"name": "demo", "labels": label}})
    api.put({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "other", "labels": {"app": "x"}}})
    assert main(k8s("delete", "demo", kubeconfig=kubeconfig)) == 0
    out, err = capsys.readouterr()
    assert out == "deleted default/demo\n", err
    assert f"removed {said}/demo" in err, err
    assert [o["metadata"]["name"] for o in api.objects.values()] == ["other"]


def test_status_lists_a_job_whose_claims_are_still_being_deleted_as_going_by_itself(
    api: FakeKubeAPI, kubeconfig: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Only a claim of the job is left, and it is being deleted (its protection finalizer waits
    for a pod that is going): listed, and said to go by itself, with no command to run."""
    meta = {
        "name": "demo-ckpt",
        "labels": {"torchjob.io/job-name": "demo"},
        "finalizers": ["kubernetes.io/pvc-protection"],
        "deletionTimestamp": "2026-01-01T00:00:00Z",
    }
    api.put({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": meta, "spec": {}})
    assert main(k8s("status", kubeconfig=kubeconfig)) == 0
    _header, *rows = capsys.readouterr().out.splitlines()
    assert [row.split()[:2] for row in rows] == [["default/demo", "Unknown"]], rows
    assert main(k8s("status", "demo", "-o", "json", kubeconfig=kubeconfig)) == 0
    reason = json.loads(capsys.readouterr().out)["reason"]
    assert reason == (
        "its object and pods are gone; what it left is being deleted: persistentvolumeclaim/demo-ckpt"
    )


def test_status_lists_the_jobs_when_a_kind_of_what_jobs_leave_may_not_be_listed(
    api: FakeKubeAPI, kubeconfig: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """No RBAC to list NetworkPolicies: the jobs are listed all the same, with what may be."""
    api.refuse("GET", "networkpolicies", 403, "networkpolicies is forbidden")
    label = {"torchjob.io/job-name": "demo"}
    api.put({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "demo", "labels": label}})
    assert main(k8s("status", kubeconfig=kubeconfig)) == 0, capsys.readouterr().err
    _header, *rows = capsys.readouterr().out.splitlines()
    assert [row.split()[:2] for row in rows] == [["default/demo", "Unknown"]], rows


def test_sigterm_while_following_leaves_the_job_running_with_the_note(
    api: FakeKubeAPI, kubeconfig: str, job_file: Path
) -> None:
    play(api, end=None)
    process = cli(
        "run", str(job_file), "--engine", "kubernetes", "--target", "volcano", "--kubeconfig", kubeconfig
    )
    try:
        _read_until(process, "worker-0 r1 | epoch 1", timeout=60)
        time.sleep(0.3)
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 130, err
    assert (
        "torchjob: stopped following; job default/demo keeps running on the cluster "
        "(delete it with: torchjob delete default/demo --engine kubernetes)"
    ) in err.splitlines(), err
    assert "Traceback" not in err
    assert api.get(VOLCANO, "Job", "demo") is not None
    assert api.count("DELETE") == 0


def test_status_of_a_job_whose_pods_are_all_pending_shows_no_1970(
    api: FakeKubeAPI, kubeconfig: str, job_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(k8s("run", str(job_file), "-d", "--target", "pods", kubeconfig=kubeconfig)) == 0
    capsys.readouterr()
    assert main(k8s("status", kubeconfig=kubeconfig)) == 0
    out = capsys.readouterr().out
    assert "default/demo" in out and "Pending" in out, out
    assert "1970" not in out, out
