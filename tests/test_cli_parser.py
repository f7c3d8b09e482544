"""The command line built for one command parses, helps and refuses exactly as the whole one does."""

from __future__ import annotations

import argparse
import contextlib
import io
from collections.abc import Sequence

import pytest

from torchjob.cli.app import _command_of, build_parser, dispatch

COMMANDS = sorted(
    next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices
)


def outcome(parser: argparse.ArgumentParser, argv: Sequence[str]) -> tuple[object, str, str]:
    """What parsing ``argv`` gives: the arguments (or the exit code), and what was printed."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            result: object = vars(parser.parse_args(argv))
        except SystemExit as exit:
            result = ("exit", exit.code)
    return result, out.getvalue(), err.getvalue()


def same_as_whole(argv: list[str]) -> None:
    command = _command_of(argv)
    assert command is not None
    assert outcome(build_parser(command), argv) == outcome(build_parser(), argv)


def test_every_command_is_known() -> None:
    assert {"run", "status", "logs", "delete", "validate", "render", "submit"} <= set(COMMANDS)


@pytest.mark.parametrize("command", COMMANDS)
def test_help_and_a_bad_option_read_the_same(command: str) -> None:
    same_as_whole([command, "--help"])
    same_as_whole([command, "--no-such-option"])
    same_as_whole(["-v", command, "a", "b", "c", "d"])


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "job.yaml"],
        ["run", "job.yaml", "-d", "--timeout", "5", "-e", "A=1", "-e", "B=2", "-q", "-v"],
        ["-v", "run", "job.yaml", "--max-restarts", "x"],
        ["run", "job.yaml", "unexpected"],
        ["run"],
        ["status", "-o", "json", "job"],
        ["logs", "job", "worker-0", "-f"],
        ["delete", "a", "b"],
        ["validate", "a.yaml", "b.yaml"],
        ["render", "a.yaml", "--target", "pods"],
        ["render", "a.yaml", "--target", "nowhere"],
    ],
)
def test_a_command_parses_the_same(argv: list[str]) -> None:
    same_as_whole(argv)


def test_only_the_command_being_run_gets_its_arguments() -> None:
    """The narrowing is real: the other commands' arguments are not built at all."""
    narrowed = build_parser("run")
    subcommands = next(a for a in narrowed._actions if isinstance(a, argparse._SubParsersAction))
    assert list(subcommands.choices) == ["run"]
    assert len(COMMANDS) > 1


@pytest.mark.parametrize(
    ("argv", "command"),
    [
        (["run", "x"], "run"),
        (["-v", "run"], "run"),
        (["--verbose", "status"], "status"),
        (["--help", "run"], None),  # the list of commands is printed: the whole parser
        (["-h"], None),
        (["--version"], None),
        (["-v"], None),
        ([], None),
    ],
)
def test_the_command_is_read_only_when_nothing_else_comes_first(argv: list[str], command: str | None) -> None:
    assert _command_of(argv) == command


def test_an_unknown_command_is_refused_by_the_whole_parser() -> None:
    result, _, err = outcome(build_parser("no-such-command"), ["no-such-command"])
    assert result == ("exit", 2)
    assert "invalid choice: 'no-such-command'" in err and "'run'" in err


@pytest.mark.parametrize("command", ["run", "render", "status", "logs", "delete"])
def test_an_unknown_option_is_refused_with_the_commands_usage(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """``torchjob run --bogus job.yaml``: the usage shown is run's (where its options are), not
    the top level's, which argparse shows for a subcommand's unknown option."""
    with pytest.raises(SystemExit) as exit:
        dispatch([command, "--no-such-option", "job.yaml"])
    assert exit.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith(f"usage: torchjob {command} "), err
    assert err.endswith(f"torchjob {command}: error: unrecognized arguments: --no-such-option\n"), err
