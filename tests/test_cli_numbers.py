"""Numbers typed on the command line are read as Go and the shell read them (docs/validation.md).

Python's ``int()`` and ``float()`` also take other scripts' digits (``int('٣') == 3``), ``1_0``,
surrounding spaces, ``nan`` and ``inf``; every numeric option refuses those in one line, exit 2,
before anything starts. Runs the real CLI's ``main``; the Kubernetes commands talk to the fake API
server (tests/kubeapi.py), which must see no request.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from kubeapi import FakeKubeAPI
from support import Ran

pytestmark = pytest.mark.timeout(60)

JOB = """\
apiVersion: batch.volcano.sh/v1alpha1
kind: Job
metadata: {name: numbers}
spec:
  tasks:
    - name: main
      replicas: 1
      template:
        spec:
          restartPolicy: Never
          containers: [{name: app, image: busybox:1.36, command: ["true"]}]
"""
HINT = " (only ASCII digits 0-9 are read)"
POSITIVE = "expected a positive, finite number of seconds"
SECONDS = "expected a non-negative, finite number of seconds"
RESTARTS = "expected a number of restarts of 0 or more"

# (command line before the value, the option named, what it expects); JOB is the job file's place.
OPTIONS = {
    "run --timeout": (["run", "--dry-run", "JOB", "--timeout"], "--timeout", POSITIVE),
    "run --max-restarts": (["run", "--dry-run", "JOB", "--max-restarts"], "--max-restarts", RESTARTS),
    "run --engine slurm --max-restarts": (
        ["run", "--dry-run", "--engine", "slurm", "JOB", "--max-restarts"],
        "--max-restarts",
        RESTARTS,
    ),
    "submit --engine slurm --max-restarts": (
        ["submit", "--engine", "slurm", "JOB", "--max-restarts"],
        "--max-restarts",
        RESTARTS,
    ),
    "run --hang-notice": (["run", "--dry-run", "JOB", "--hang-notice"], "--hang-notice", SECONDS),
    "run --engine kubernetes --pending-timeout": (
        ["run", "--dry-run", "--engine", "kubernetes", "JOB", "--pending-timeout"],
        "--pending-timeout",
        SECONDS,
    ),
    "submit --pending-timeout": (
        ["submit", "--wait", "JOB", "--pending-timeout"],
        "--pending-timeout",
        SECONDS,
    ),
    "submit --timeout": (["submit", "--wait", "JOB", "--timeout"], "--timeout", SECONDS),
    "wait --timeout": (["wait", "numbers", "--timeout"], "--timeout", SECONDS),
    "logs --attempt": (
        ["logs", "numbers", "--attempt"],
        "--attempt",
        "expected an attempt number (0 or more)",
    ),
}
# What int() and float() took or made a usage block of, and how the message shows it.
ODD = {
    "٣": f"'٣'{HINT}",  # Arabic-Indic three
    "３": f"'３'{HINT}",  # fullwidth three
    "²": f"'²'{HINT}",  # str.isdigit() says yes, int() no
    "1_0": "1_0",
    " 5": "' 5'",
    "5\n": "'5\\n'",
}
# Accepted as infinity or nan where no range was checked: a wait that never ends.
NOT_FINITE = {"nan": "nan", "inf": "inf", "-inf": "-inf", "1e999": "1e999"}
UNCHECKED = ("submit --timeout", "submit --pending-timeout", "run --engine kubernetes --pending-timeout")


@pytest.fixture
def setup(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> tuple[Path, FakeKubeAPI | None]:
    home = tmp_path / "home"
    monkeypatch.setenv("TORCHJOB_HOME", str(home))
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "none"))  # never the user's cluster
    api = None
    option = getattr(request.node, "callspec", None) and request.node.callspec.params.get("option", "")
    if option and ("submit" in option or "kubernetes" in option):  # a server only where one is asked
        api = request.getfixturevalue("api")
        monkeypatch.setenv("KUBECONFIG", request.getfixturevalue("kubeconfig"))
    monkeypatch.setenv("TORCHJOB_SLURM_JOB_ROOT", str(tmp_path / "slurm"))
    job = tmp_path / "job.yaml"
    job.write_text(JOB)
    return job, api


def refused(
    option: str,
    value: str,
    shown: str,
    setup: tuple[Path, FakeKubeAPI | None],
    run_main: Callable[..., Ran],
) -> None:
    job, api = setup
    before, flag, expected = OPTIONS[option]
    argv = [str(job) if a == "JOB" else a for a in before]
    code, out, err = run_main(*[*argv[:-1], f"{argv[-1]}={value}"])  # = : argparse takes -inf
    assert (code, out) == (2, ""), err
    assert err == f"<command line>: {flag}: {expected}, got {shown}\n"
    assert api is None or api.requests == []  # nothing submitted
    for root in (job.parent / "home", job.parent / "slurm"):  # nothing started
        assert not root.exists() or not any(root.rglob("status.json")), list(root.rglob("*"))


@pytest.mark.parametrize("value", list(ODD))
@pytest.mark.parametrize("option", list(OPTIONS))
def test_a_number_option_reads_ascii_digits_only(
    option: str, value: str, setup: tuple[Path, FakeKubeAPI | None], run_main: Callable[..., Ran]
) -> None:
    refused(option, value, ODD[value], setup, run_main)


@pytest.mark.parametrize("value", list(NOT_FINITE))
@pytest.mark.parametrize("option", UNCHECKED)
def test_a_seconds_option_refuses_nan_and_infinity(
    option: str, value: str, setup: tuple[Path, FakeKubeAPI | None], run_main: Callable[..., Ran]
) -> None:
    refused(option, value, NOT_FINITE[value], setup, run_main)


@pytest.mark.parametrize("value", ["-1", "-0.5"])
@pytest.mark.parametrize("option", ["submit --timeout"])
def test_submit_refuses_a_negative_timeout(
    option: str, value: str, setup: tuple[Path, FakeKubeAPI | None], run_main: Callable[..., Ran]
) -> None:
    refused(option, value, value, setup, run_main)


@pytest.mark.parametrize("value", ["٣", "３", "²"])
def test_quick_modes_worker_replicas_reads_ascii_digits_only(
    value: str, setup: tuple[Path, FakeKubeAPI | None], run_main: Callable[..., Ran]
) -> None:
    job, _ = setup
    script = job.parent / "train.py"
    script.write_text("print('ran')\n")
    argv = ["run", "--dry-run", "-j", "1x1", "--set", f"worker.replicas={value}", str(script)]
    code, out, err = run_main(*argv)
    assert (code, out) == (2, ""), err
    assert err == (
        f"<command line>: --set: worker.replicas={value}: expected a number of worker nodes "
        f"(0 or more), got {value!r}\n"
    )


@pytest.mark.parametrize("value", ["1_0", "0x2", "1:00"])
def test_set_takes_no_yaml_only_spelling_of_a_number(
    value: str, setup: tuple[Path, FakeKubeAPI | None], run_main: Callable[..., Ran]
) -> None:
    """YAML 1.1 reads these as 10, 2 and 60; on the command line they are not numbers."""
    job, _ = setup
    code, out, err = run_main("run", "--dry-run", str(job), "--set", f"main.replicas={value}")
    assert (code, out) == (2, ""), err
    assert err == (
        f"<command line>: spec.tasks[0].replicas: --set main.replicas={value}: expected an integer, "
        f"got string {value!r}\n"
    )


def test_set_reads_a_leading_zero_as_decimal(
    setup: tuple[Path, FakeKubeAPI | None], run_main: Callable[..., Ran]
) -> None:
    """``010`` is ten, as Go's strconv reads it; YAML 1.1 made it octal: 8 pods."""
    job, _ = setup
    code, out, err = run_main("run", "--dry-run", str(job), "--set", "main.replicas=010")
    assert code == 0, err
    assert out.startswith("local job numbers: 10 pod(s) on this machine\n"), out


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["run", "--dry-run", "JOB", "--timeout", "2.5"], "local job numbers: 1 pod(s)"),
        (["run", "--dry-run", "JOB", "--timeout", "1e3", "--max-restarts", "+2"], "local job numbers:"),
        (["run", "--dry-run", "JOB", "--hang-notice", ".5"], "local job numbers:"),
    ],
)
def test_plain_numbers_are_still_read(
    argv: list[str], expected: str, setup: tuple[Path, FakeKubeAPI | None], run_main: Callable[..., Ran]
) -> None:
    job, _ = setup
    code, out, err = run_main(*[str(job) if a == "JOB" else a for a in argv])
    assert code == 0, err
    assert out.startswith(expected), out
