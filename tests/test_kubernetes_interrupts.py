"""Ctrl-C and SIGTERM on the kubernetes engine, sent while a chosen request is in flight.

kubeapi.py's ``hold`` keeps a request unanswered until the test releases it, so a signal lands
exactly there: after every object of a job is made, in a command's first request, between a
submit and its wait, in a delete. The clean-ups torchjob does after an interrupted or refused
creation, after ``--timeout`` and for ``--replace`` are bounded as a whole: a server that holds
their requests gets, within that bound, a note of what may be left and the command removing it.

Timing allowances are wide (tests run four at a time on two cores): what takes milliseconds
quietly gets 15 s or more, and a bound is asserted only where the server holds requests on
purpose, with 30 s of margin over it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("kubernetes")

from kube_fixtures import TERMINAL_STATUS, demo_job, make_pod, running, terminated
from kubeapi import FakeKubeAPI
from torchjob.cli import main

pytestmark = pytest.mark.timeout(240)

VOLCANO = "batch.volcano.sh/v1alpha1"
KUBEFLOW = "kubeflow.org/v1"
QUICK = 15.0  # seconds for what takes milliseconds on a quiet machine
MARGIN = 30.0  # seconds over a bound that the command may take to give up under load
SIGNALS = pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
JOB = demo_job(volume=True)


def cli(*args: str, kubeconfig: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "torchjob", *args, "--engine", "kubernetes", "--kubeconfig", kubeconfig],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "COLUMNS": "200"},
    )


def k8s(*args: str, kubeconfig: str) -> list[str]:
    return [*args, "--engine", "kubernetes", "--kubeconfig", kubeconfig]


def signalled(process: subprocess.Popen[str], sig: int, timeout: float) -> tuple[str, str, float]:
    """Send ``sig``; the process's output and how long it took to end after it."""
    sent = time.monotonic()
    process.send_signal(sig)
    try:
        out, err = process.communicate(timeout=timeout)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    return out, err, time.monotonic() - sent


def arrived(api: FakeKubeAPI, held: Any, process: subprocess.Popen[str]) -> None:
    """Wait until the held request reached the server (the command is then inside it)."""
    if not held.wait_arrived(60):
        process.kill()
        out, err = process.communicate()
        pytest.fail(f"the held request never came; requests: {api.requests[-5:]}\n{out}\n{err}")


def named(tmp_path: Path, name: str) -> str:
    path = tmp_path / f"{name}.yaml"
    path.write_text(JOB.replace("name: demo", f"name: {name}"))
    return str(path)


def play(api: FakeKubeAPI) -> None:
    """A Volcano controller of one step: the Job's pods run, log a line and complete."""

    def script(top: dict[str, Any]) -> None:
        name = top["metadata"]["name"]
        pods = [
            make_pod(name, "master", 0, owner=top, rank=0),
            make_pod(name, "worker", 0, owner=top, rank=1),
        ]
        for pod in pods:
            api.log(pod["metadata"]["name"], pod["spec"]["containers"][0]["name"], "epoch 1")
            api.put(running(pod))
        time.sleep(0.5)
        for pod in pods:
            api.end_log(pod["metadata"]["name"], pod["spec"]["containers"][0]["name"])
            api.put(terminated(pod, 0))
        api.set_status(VOLCANO, "Job", name, TERMINAL_STATUS["volcano"]["Completed"])

    def on_create(obj: dict[str, Any]) -> None:
        if obj["kind"] == "Job":
            threading.Thread(target=script, args=(obj,), daemon=True).start()

    api.on_create = on_create


# ---------------------------------------------------------------- after every object is made


@SIGNALS
@pytest.mark.parametrize("command", ["run", "submit"])
def test_an_interrupt_after_every_object_is_made_says_the_job_keeps_running(
    api: FakeKubeAPI, kubeconfig: str, job_file: Path, sig: int, command: str
) -> None:
    """The claim is given to the PyTorchJob (a PATCH) once both are made: an interrupt then leaves
    the job running, says so and names the delete that removes it, which does."""
    with api.hold("PATCH", r"/persistentvolumeclaims/") as held:
        process = cli(command, str(job_file), "--target", "kubeflow", kubeconfig=kubeconfig)
        arrived(api, held, process)
        _, err, _ = signalled(process, sig, QUICK + MARGIN)
    assert process.returncode == 130, err
    assert "Traceback" not in err, err
    assert (
        "torchjob: interrupted; job default/demo (kubeflow.org/v1 PyTorchJob) keeps running on the "
        "cluster (delete it with: torchjob delete default/demo --engine kubernetes)"
    ) in err.splitlines(), err
    assert api.get(KUBEFLOW, "PyTorchJob", "demo") is not None
    assert len(api.objects_of("v1", "PersistentVolumeClaim")) == 1
    assert api.count("DELETE") == 0
    assert main(k8s("delete", "default/demo", kubeconfig=kubeconfig)) == 0
    assert api.get(KUBEFLOW, "PyTorchJob", "demo") is None
    claims = api.objects_of("v1", "PersistentVolumeClaim")  # held by their protection finalizer
    assert [c["metadata"].get("deletionTimestamp") is not None for c in claims] == [True], claims


# ---------------------------------------------------------------- SIGTERM from the first request


@pytest.mark.parametrize("command", [["wait"], ["logs", "-f"]], ids=["wait", "logs-f"])
def test_sigterm_in_the_first_request_of_wait_and_logs_follow_is_taken_as_ctrl_c(
    api: FakeKubeAPI, kubeconfig: str, job_file: Path, command: list[str]
) -> None:
    """The job's lookup comes first (the cluster's API groups): SIGTERM there ends with 130 and a
    word, not with -15 and none."""
    assert main(k8s("submit", str(job_file), "--target", "volcano", kubeconfig=kubeconfig)) == 0
    with api.hold("GET", r"^/apis$") as held:
        process = cli(*command, "default/demo", kubeconfig=kubeconfig)
        arrived(api, held, process)
        _, err, _ = signalled(process, signal.SIGTERM, QUICK + MARGIN)
    assert process.returncode == 130, err
    assert "torchjob: interrupted" in err.splitlines(), err
    assert "Traceback" not in err, err
    assert api.get(VOLCANO, "Job", "demo") is not None


def test_sigterm_as_logs_follow_reads_how_the_job_ended_is_taken_as_ctrl_c(
    api: FakeKubeAPI, kubeconfig: str, job_file: Path
) -> None:
    """After the logs, `logs -f` looks the job up once more for its exit code: SIGTERM in that
    last request ends with 130 and a word too."""
    play(api)
    assert main(k8s("submit", str(job_file), "--target", "volcano", "--wait", kubeconfig=kubeconfig)) == 0
    path = r"^/apis/batch\.volcano\.sh/v1alpha1/namespaces/default/jobs/demo$"
    with api.hold("GET", path, skip=1) as held:  # the first: the lookup before following
        process = cli("logs", "default/demo", "-f", kubeconfig=kubeconfig)
        arrived(api, held, process)
        out, err, _ = signalled(process, signal.SIGTERM, QUICK + MARGIN)
    assert process.returncode == 130, err
    assert "torchjob: interrupted" in err.splitlines(), err
    assert "Traceback" not in err, err
    assert "master-0 r0 | epoch 1" in out.splitlines(), out  # it was past the following


@pytest.mark.parametrize("flag", ["--wait", "--follow"])
def test_sigterm_as_submit_starts_waiting_leaves_the_job_running_with_the_note(
    api: FakeKubeAPI, kubeconfig: str, job_file: Path, flag: str
) -> None:
    """The wait's own lookup of the job, the request after the submit's last: SIGTERM there."""
    path = r"^/apis/batch\.volcano\.sh/v1alpha1/namespaces/default/jobs/demo$"
    with api.hold("GET", path, skip=1) as held:  # the first: the submit's look for a job of that name
        process = cli("submit", str(job_file), "--target", "volcano", flag, kubeconfig=kubeconfig)
        arrived(api, held, process)
        out, err, _ = signalled(process, signal.SIGTERM, QUICK + MARGIN)
    assert process.returncode == 130, err
    assert out.splitlines()[0] == "demo", out
    assert (
        "torchjob: stopped following; job default/demo keeps running on the cluster "
        "(delete it with: torchjob delete default/demo --engine kubernetes)"
    ) in err.splitlines(), err
    assert "Traceback" not in err, err
    assert api.get(VOLCANO, "Job", "demo") is not None


@pytest.mark.parametrize("flag", ["--wait", "--follow"])
def test_submit_and_wait_take_sigterm_as_ctrl_c_in_one_scope(
    api: FakeKubeAPI,
    kubeconfig: str,
    job_file: Path,
    flag: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """SIGTERM's handler is set once, before the first request, and kept to the end: no moment
    between the submit and the wait where a SIGTERM would kill torchjob without a word."""
    play(api)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # as in the torchjob program (restored by conftest)
    events: list[tuple[str, Any]] = []  # SIGTERM's handler set, and as each request came, in order
    order = threading.Lock()  # a request's look and a change of the handler do not cross
    real = signal.signal

    def recording(signum: int, handler: Any) -> Any:
        with order:
            if signum == signal.SIGTERM:
                events.append(("set", handler))
            return real(signum, handler)

    def requested(method: str, path: str) -> None:
        with order:
            events.append(("request", signal.getsignal(signal.SIGTERM)))

    monkeypatch.setattr(signal, "signal", recording)
    api.on_request = requested
    code = main(k8s("submit", str(job_file), "--target", "volcano", flag, kubeconfig=kubeconfig))
    api.on_request = None
    assert code == 0, capsys.readouterr().err
    sets = [handler for what, handler in events if what == "set"]
    assert len(sets) == 2 and sets[1] is signal.SIG_DFL, sets  # set once, restored once
    assert events[0] == ("set", sets[0]), events[:3]  # before the first request
    restored = events.index(("set", signal.SIG_DFL))
    during = [handler for what, handler in events[:restored] if what == "request"]
    assert len(during) > 5 and all(handler is sets[0] for handler in during), during


# ---------------------------------------------------------------------------------- delete


@SIGNALS
def test_an_interrupted_delete_says_what_was_deleted_and_what_was_not(
    api: FakeKubeAPI, kubeconfig: str, tmp_path: Path, sig: int, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in ("alpha", "beta"):
        code = main(k8s("submit", named(tmp_path, name), "--target", "volcano", kubeconfig=kubeconfig))
        assert code == 0, capsys.readouterr().err
    with api.hold("DELETE", r"/jobs/beta$") as held:
        process = cli("delete", "default/alpha", "default/beta", kubeconfig=kubeconfig)
        arrived(api, held, process)
        _, err, _ = signalled(process, sig, QUICK + MARGIN)
        assert api.get(VOLCANO, "Job", "beta") is not None  # before the held delete is let through
    assert process.returncode == 130, err
    assert err.splitlines() == [
        "torchjob: interrupted; deleted default/alpha; not deleted (or only in part): default/beta; "
        "delete it with: torchjob delete default/beta --engine kubernetes"
    ], err
    assert api.get(VOLCANO, "Job", "alpha") is None


# ------------------------------------------------------------------ clean-ups, bounded as a whole


def test_an_interrupted_creation_gives_up_its_clean_up_within_the_bound(
    api: FakeKubeAPI, kubeconfig: str, job_file: Path
) -> None:
    """The Service's create and every delete unanswered: after Ctrl-C torchjob waits 30 s in all
    (not 70 s for the create and two minutes a delete), then names what may be left. The create
    under way takes at most half of it, so the deletes of what was made are sent all the same."""
    with api.hold("POST", r"/services$") as create, api.hold("DELETE", r"") as delete:
        process = cli("run", str(job_file), "--target", "pods", kubeconfig=kubeconfig)
        arrived(api, create, process)
        _, err, took = signalled(process, signal.SIGINT, 30 + MARGIN)
        assert delete.held >= 1, err  # the clean-up did try
        left = sorted(o["kind"] for o in api.objects.values())
    assert process.returncode == 130, err
    assert "Traceback" not in err, err
    note = next((line for line in err.splitlines() if "not deleted within 30s" in line), "")
    assert note.startswith("torchjob: interrupted while creating the job's objects; not deleted"), err
    assert "/api/v1/namespaces/default/persistentvolumeclaims/demo-volume-" in note, note
    assert "/api/v1/namespaces/default/configmaps/demo-svc" in note, note
    assert "/api/v1/namespaces/default/services/demo (its create was still under way)" in note, note
    assert note.endswith("remove them with: torchjob delete default/demo --engine kubernetes"), note
    assert left == ["ConfigMap", "PersistentVolumeClaim"], left  # the Service was never made
    assert took < 30 + MARGIN


def test_a_refused_creation_gives_up_its_clean_up_within_the_bound(
    api: FakeKubeAPI,
    kubeconfig: str,
    job_file: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from torchjob.engines.kubernetes import bounded

    monkeypatch.setattr(bounded, "CLEANUP_TIMEOUT", 2.0)
    api.refuse("POST", "services", 403, "services is forbidden: cannot {verb} services")
    with api.hold("DELETE", r"") as delete:
        started = time.monotonic()
        code = main(k8s("run", str(job_file), "--target", "pods", kubeconfig=kubeconfig))
        took = time.monotonic() - started
        assert delete.held >= 1
        assert api.get("v1", "ConfigMap", "demo-svc") is not None
    err = capsys.readouterr().err
    assert code == 2, err  # refused: nothing was started
    assert took < 2 + MARGIN, took
    assert (
        "torchjob: the job was not created; not deleted within 2s (each carries the label "
        "torchjob.io/job-name=demo): /api/v1/namespaces/default/configmaps/demo-svc, "
    ) in err, err
    assert "remove them with: torchjob delete default/demo --engine kubernetes" in err, err
    assert "services is forbidden" in err.splitlines()[-1], err


def test_the_delete_after_timeout_is_bounded_and_names_what_may_be_left(
    api: FakeKubeAPI,
    kubeconfig: str,
    job_file: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from torchjob.engines.kubernetes import bounded

    monkeypatch.setattr(bounded, "CLEANUP_TIMEOUT", 2.0)
    with api.hold("DELETE", r"") as delete:
        started = time.monotonic()
        code = main(k8s("run", str(job_file), "--target", "volcano", "--timeout", "1", kubeconfig=kubeconfig))
        took = time.monotonic() - started
        assert delete.held >= 1
    err = capsys.readouterr().err
    assert code == 1, err
    assert took < 1 + 2 + MARGIN, took
    assert (
        "timed out after 1s; its delete had no answer within 2s; its batch.volcano.sh/v1alpha1 Job "
        "and the objects labelled torchjob.io/job-name=demo in namespace default may remain: remove "
        "them with torchjob delete default/demo --engine kubernetes"
    ) in err, err


def test_replace_waits_for_the_old_job_within_the_bound(
    api: FakeKubeAPI,
    kubeconfig: str,
    job_file: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The old job is deleted, and the look whether it went is not answered: --replace gives up
    within its bound, having created nothing."""
    from torchjob.engines.kubernetes import removal

    assert main(k8s("submit", str(job_file), "--target", "volcano", kubeconfig=kubeconfig)) == 0
    monkeypatch.setattr(removal, "GONE_TIMEOUT", 2.0)
    path = r"^/apis/batch\.volcano\.sh/v1alpha1/namespaces/default/jobs/demo$"
    with api.hold("GET", path, skip=1) as lookup:
        started = time.monotonic()
        code = main(k8s("submit", str(job_file), "--target", "volcano", "--replace", kubeconfig=kubeconfig))
        took = time.monotonic() - started
        assert lookup.held >= 1
    err = capsys.readouterr().err
    assert code == 2, err  # nothing was started
    assert took < 2 + MARGIN, took
    assert (
        "torchjob: job demo is in the way of the new one: it was deleted but is still there after 2s; "
        "nothing new was created; its batch.volcano.sh/v1alpha1 Job and the objects labelled "
        "torchjob.io/job-name=demo in namespace default may remain: remove them with torchjob delete "
        "default/demo --engine kubernetes, then submit again"
    ) in err.splitlines(), err
    assert api.get(VOLCANO, "Job", "demo") is None
    assert api.count("POST") == 1  # the first submit's only


def test_an_interrupted_replace_says_the_old_job_may_be_deleted_in_part(
    api: FakeKubeAPI, kubeconfig: str, job_file: Path
) -> None:
    assert main(k8s("submit", str(job_file), "--target", "volcano", kubeconfig=kubeconfig)) == 0
    with api.hold("DELETE", r"/jobs/demo$") as held:
        process = cli("submit", str(job_file), "--target", "volcano", "--replace", kubeconfig=kubeconfig)
        arrived(api, held, process)
        _, err, _ = signalled(process, signal.SIGINT, QUICK + MARGIN)
    assert process.returncode == 130, err
    assert err.splitlines() == [
        "torchjob: interrupted while replacing job default/demo; nothing new was created; its "
        "batch.volcano.sh/v1alpha1 Job and the objects labelled torchjob.io/job-name=demo in namespace "
        "default may remain, deleted in part: remove them with torchjob delete default/demo --engine "
        "kubernetes"
    ], err
    assert api.count("POST") == 1  # the first submit's only
