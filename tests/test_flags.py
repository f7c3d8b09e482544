"""Plugin flags: every spelling Go's flag package accepts works, and every mistake is an error.

Volcano only logs flag errors and carries on with half-parsed values; torchjob refuses the job
instead, with a message naming the plugin and the flag.
"""

from __future__ import annotations

from typing import Any

import pytest

from torchjob.errors import SpecError
from torchjob.jobs import load_jobs_from_text
from torchjob.plugins.env import EnvPlugin
from torchjob.plugins.flags import parse_flags, parse_int
from torchjob.plugins.pytorch import PyTorchPlugin
from torchjob.plugins.svc import SvcPlugin


def pytorch(*args: str) -> tuple[dict[str, Any], list[str]]:
    return parse_flags("pytorch", PyTorchPlugin.flags, list(args))


def value(flag: str, *args: str) -> Any:
    values, errors = pytorch(*args)
    assert errors == []
    return values[flag]


def test_defaults_are_volcanos() -> None:
    values, errors = pytorch()
    assert errors == []
    assert values == {
        "master": "master",
        "worker": "worker",
        "port": 23456,
        "wait-master-enabled": False,
        "wait-master-timeout": 300,
        "wait-master-image": "busybox:1.36.1",
    }


@pytest.mark.parametrize(
    "args",
    [
        ["--port=1234"],
        ["-port=1234"],
        ["--port", "1234"],
        ["-port", "1234"],
        ["--port=0x4d2"],
        ["--port=+1234"],
    ],
)
def test_integer_spellings(args: list[str]) -> None:
    assert value("port", *args) == 1234


@pytest.mark.parametrize(
    ("text", "number"), [("1_000", 1000), ("0o17", 15), ("0b101", 5), ("0", 0), ("-7", -7)]
)
def test_go_integer_literals(text: str, number: int) -> None:
    assert parse_int(text) == (number, "")


@pytest.mark.parametrize("args", [["--wait-master-enabled"], ["-wait-master-enabled"]])
def test_bare_boolean_means_true(args: list[str]) -> None:
    assert value("wait-master-enabled", *args) is True


@pytest.mark.parametrize("text", ["1", "t", "T", "TRUE", "true", "True"])
def test_parsebool_true(text: str) -> None:
    assert value("wait-master-enabled", f"--wait-master-enabled={text}") is True


@pytest.mark.parametrize("text", ["0", "f", "F", "FALSE", "false", "False"])
def test_parsebool_false(text: str) -> None:
    assert value("wait-master-enabled", f"--wait-master-enabled={text}") is False


def test_string_flags_take_the_next_argument() -> None:
    values, errors = pytorch("--master", "chief", "-worker", "helper", "--wait-master-image", "busybox:1.36")
    assert errors == []
    assert (values["master"], values["worker"], values["wait-master-image"]) == (
        "chief",
        "helper",
        "busybox:1.36",
    )


def test_a_full_realistic_list() -> None:
    values, errors = pytorch(
        "--master=master", "--worker=worker", "--port=23456", "--wait-master-enabled=true",
        "--wait-master-timeout=600", "--wait-master-image=busybox:1.36.1",
    )  # fmt: skip
    assert errors == []
    assert values["wait-master-enabled"] is True and values["wait-master-timeout"] == 600


def test_svc_flags() -> None:
    values, errors = parse_flags(
        "svc", SvcPlugin.flags, ["--publish-not-ready-addresses", "--inject-hosts-env=F"]
    )
    assert errors == []
    assert values["publish-not-ready-addresses"] is True
    assert values["inject-hosts-env"] is False
    assert values["disable-network-policy"] is False


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--port=abc"], "flag --port: expected an integer, got 'abc'"),
        (["--port=70000"], "flag --port: expected a port from 1 to 65535, got 70000"),
        (["--port=0"], "flag --port: expected a port from 1 to 65535, got 0"),
        (["--port=-1"], "flag --port: expected a port from 1 to 65535, got -1"),
        (["--port="], "flag --port: expected an integer, got ''"),
        (["--port= 80"], "flag --port: expected an integer, got ' 80'"),
        (["--port=80\n"], "flag --port: expected an integer, got '80\\n'"),
        (["--port=010"], "flag --port: '010' has a leading zero"),
        (["--port=99999999999999999999"], "'99999999999999999999' is out of range for a 64-bit integer"),
        (["--port=٣"], "flag --port: expected an integer"),  # a non-ASCII digit Python's int() would take
        (["--port"], "flag --port needs a value"),
        (["--wait-master-timeout=-5"], "expected an integer from 0 to 2147483647, got -5"),
        (["--wait-master-timeout=2147483648"], "flag --wait-master-timeout: expected an integer from 0"),
        (["--wait-master-timeout=5m"], "flag --wait-master-timeout: expected an integer, got '5m'"),
        (["--masterport=1"], "unknown flag --masterport; known flags are --master, --worker, --port"),
        (["--workers=worker"], "unknown flag --workers; did you mean --worker?"),
        (["-h"], "unknown flag --h"),
        (["--help"], "unknown flag --help"),
        (["--wait-master-enabled", "true"], "'true'; to set a boolean flag write --wait-master-enabled=true"),
        (["--wait-master-enabled=yes"], "flag --wait-master-enabled: expected true or false, got 'yes'"),
        (["--wait-master-enabled="], "flag --wait-master-enabled: expected true or false, got ''"),
        (["master"], "unexpected argument 'master'"),
        (["--"], "unexpected argument '--'"),
        (["-"], "unexpected argument '-'"),
        (["---port=1"], "bad flag syntax '---port=1'"),
        (["-=1"], "bad flag syntax '-=1'"),
        (["--port=1", "--port=2"], "flag --port is given more than once"),
        (["--wait-master-image=busybox;id"], "'busybox;id' is not a valid image reference"),
        (["--wait-master-image=$(id)"], "flag --wait-master-image: '$(id)' is not a valid image reference"),
        (["--wait-master-image=busy box"], "--wait-master-image: 'busy box' is not a valid image"),
        (["--wait-master-image="], "flag --wait-master-image: '' is not a valid image reference"),
        (["--master=Master"], "flag --master: 'Master' is not a DNS-1123 label"),
        (["--worker=w;reboot"], "flag --worker: 'w;reboot' is not a DNS-1123 label"),
        (["--master", "--worker=x"], "flag --master: '--worker=x' is not a DNS-1123 label"),
    ],
)  # fmt: skip
def test_strictness(args: list[str], message: str) -> None:
    _, errors = pytorch(*args)
    assert len(errors) == 1, errors
    assert errors[0].startswith("plugin pytorch: ")
    assert message in errors[0]
    assert "\n" not in errors[0]


def test_a_bad_value_keeps_the_default() -> None:
    """Unlike Go's flag package, a refused value never half-applies (Go stores 0 for 'abc')."""
    values, errors = pytorch("--port=abc", "--wait-master-timeout=-5")
    assert len(errors) == 2
    assert values["port"] == 23456 and values["wait-master-timeout"] == 300


def test_every_mistake_is_reported_not_only_the_first() -> None:
    """Go stops at the first error; torchjob goes on, so one run shows all of them."""
    _, errors = pytorch("--port=abc", "--foo", "--wait-master-enabled", "true", "--wait-master-timeout=-1")
    assert len(errors) == 4
    assert [e.split(":")[1].split()[0] for e in errors] == ["flag", "unknown", "unexpected", "flag"]


def test_env_takes_no_flags() -> None:
    _, errors = parse_flags("env", EnvPlugin.flags, ["--index=1"])
    assert errors == ["plugin env: unknown flag --index; this plugin takes no flags"]


def test_svc_bad_boolean() -> None:
    _, errors = parse_flags("svc", SvcPlugin.flags, ["--disable-network-policy=maybe"])
    assert errors == ["plugin svc: flag --disable-network-policy: expected true or false, got 'maybe'"]


JOB = """apiVersion: batch.volcano.sh/v1alpha1
kind: Job
metadata:
  name: flags
spec:
  plugins:
    pytorch: {flags}
  tasks:
    - name: master
      replicas: 1
      template:
        spec:
          containers: [{{name: main, image: "busybox:1.36.1"}}]
    - name: worker
      replicas: 2
      template:
        spec:
          containers: [{{name: main, image: "busybox:1.36.1"}}]
"""


def test_flag_errors_carry_the_plugin_path_and_line() -> None:
    with pytest.raises(SpecError) as caught:
        load_jobs_from_text(JOB.format(flags='["--port=abc", "--wait-master-enabled", "true"]'), "job.yaml")
    lines = [p.format() for p in caught.value.problems]
    assert lines == [
        "job.yaml:7: spec.plugins.pytorch: plugin pytorch: flag --port: expected an integer, got 'abc'",
        "job.yaml:7: spec.plugins.pytorch: plugin pytorch: unexpected argument 'true'; "
        "to set a boolean flag write --wait-master-enabled=true",
    ]


def test_parsed_flags_reach_the_pods() -> None:
    from torchjob.expand import expand

    text = JOB.format(flags='["-port", "0x1F90", "--wait-master-enabled=T", "--wait-master-timeout", "7"]')
    [loaded] = load_jobs_from_text(text)
    pods = expand(loaded.job).pods
    env = {e["name"]: e.get("value") for e in pods[0].manifest["spec"]["containers"][0]["env"]}
    assert env["MASTER_PORT"] == "8080"
    worker_init = pods[1].manifest["spec"]["initContainers"]
    assert [c["name"] for c in worker_init] == ["wait-for-master"]
    assert "timeout=7" in worker_init[0]["command"][-1]
