"""The ``torchjob`` commands, in kubectl's habits: the parser and the dispatch to each command.

Thin on purpose: each command module parses its arguments and calls the layers below. Heavy
modules (torch, kubernetes) are imported only inside the commands that need them.
Exit codes: 0 success, 1 the job failed, 2 bad input, 130 interrupted.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from collections.abc import Callable, Sequence

from torchjob import __version__
from torchjob.cli import cluster_commands, local_commands, spec_commands
from torchjob.engine_api.base import EngineError, Interrupted, JobNotFound
from torchjob.errors import EXIT_BAD_INPUT, EXIT_INTERRUPTED, EXIT_OK, Problem, SpecError
from torchjob.spec import prefetch
from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any


def _terminal_columns() -> int:
    """shutil.get_terminal_size's width: $COLUMNS, else the terminal's, else 80."""
    with contextlib.suppress(ValueError):
        if int(os.environ.get("COLUMNS", "0")) > 0:
            return int(os.environ["COLUMNS"])
    stdout = sys.__stdout__
    try:
        return (os.get_terminal_size(stdout.fileno()).columns if stdout else 0) or 80
    except (AttributeError, ValueError, OSError):
        return 80


class _Formatter(argparse.HelpFormatter):
    # argparse sizes every formatter (one per argument added) with shutil, whose import with its
    # compression modules costs every torchjob command about 2 ms. argparse also makes a formatter
    # for every argument added (to check its metavar): the width is read once per build_parser().
    columns = 80

    def __init__(self, prog: str) -> None:
        super().__init__(prog, width=self.columns - 2)


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _Formatter)
        super().__init__(*args, **kwargs)


class _Skipped:
    """Takes a command's arguments and keeps none: the stand-in for a command that is not run."""

    def __getattr__(self, name: str) -> Callable[..., _Skipped]:
        return lambda *args, **kwargs: self


class _OnlyCommand:
    """The subcommands, narrowed to the one being run: argparse spends about 8 us on each argument
    added, and the commands ``torchjob run`` does not run have some 70 of them."""

    def __init__(self, commands: Any, command: str) -> None:
        self.commands = commands
        self.command = command
        self.found = False

    def add_parser(self, name: str, **kwargs: Any) -> Any:
        if name != self.command and self.command not in kwargs.get("aliases", ()):
            return _Skipped()
        self.found = True
        return self.commands.add_parser(name, **kwargs)


def _command_of(argv: Sequence[str]) -> str | None:
    """The command ``argv`` runs when nothing but -v comes before it (so no --help shows the list of
    commands, which a narrowed parser lacks); else None."""
    for arg in argv:
        if arg not in ("-v", "--verbose"):
            return None if arg.startswith("-") else arg
    return None


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole command line; with ``command``, only that command's arguments (if it is one)."""
    _Formatter.columns = _terminal_columns()
    parser = _Parser(  # its subcommands' parsers are _Parser too
        prog="torchjob",
        description="Run Volcano-style PyTorch jobs on this machine, or render them for a cluster.",
    )
    parser.add_argument("--version", action="version", version=f"torchjob {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log torchjob's decisions (debug level)")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.required = True
    registry = commands if command is None else _OnlyCommand(commands, command)
    spec_commands.register(registry)
    local_commands.register(registry)
    cluster_commands.register(registry)
    if isinstance(registry, _OnlyCommand) and not registry.found:  # not a command: argparse says so
        return build_parser()
    for sub in commands.choices.values():  # also after the command: torchjob run job.yaml -v
        # SUPPRESS: an -v given before the command is kept when it is not repeated after it
        sub.add_argument(
            "-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS
        )
    return parser


def dispatch(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` (the program's arguments when None), run the command, give its exit code."""
    return _main(argv)


def _split_program_args(
    argv: Sequence[str], parser: argparse.ArgumentParser | None = None
) -> tuple[list[str], list[str]]:
    """``run|render ... -- ARGS``: what follows ``--`` is the program's (a workflow's or a task's
    arguments, or what every main container gets appended to its ``args``). For a script (quick
    mode) everything after it is the script's, as for ``torchrun train.py --steps 20``.

    Split off before argparse, which cannot take ``--`` after options that follow a positional.
    """
    argv = list(argv)
    at = _script_at(argv, parser) if parser is not None else None
    if at is not None:
        rest = argv[at + 1 :]
        return argv[: at + 1], rest[1:] if rest[:1] == ["--"] else rest
    task = _task_ref_at(argv, parser) if parser is not None else None
    if task is not None:
        return _task_args(argv, *task)
    if "--" not in argv:
        return argv, []
    at = argv.index("--")
    return argv[:at], argv[at + 1 :]


def _task_args(argv: list[str], at: int, options: dict[str, argparse.Action]) -> tuple[list[str], list[str]]:
    """After ``FILE.py:NAME``, as ``pyflyte run`` takes a task's inputs: an option torchjob does
    not have (``--epochs 10``, ``--flag``) and what follows it, up to torchjob's next option, are
    the task's or workflow's; so is everything after ``--``."""
    own, program, taking = argv[: at + 1], [], False
    i = at + 1
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            program += argv[i + 1 :]
            break
        name = arg.split("=", 1)[0] if arg.startswith("--") else arg[:2]
        action = options.get(name) if arg.startswith("-") and arg != "-" else None
        if action is not None:  # torchjob's own option, with its value
            taking = False
            own.append(arg)
            attached = "=" in arg if arg.startswith("--") else len(arg) > 2
            if action.nargs != 0 and not attached and i + 1 < len(argv):
                i += 1
                own.append(argv[i])
        elif arg.startswith("--") or taking:
            taking = True
            program.append(arg)
        else:
            own.append(arg)  # a stray positional: argparse says so
        i += 1
    return own, program


def _task_ref_at(
    argv: list[str], parser: argparse.ArgumentParser
) -> tuple[int, dict[str, argparse.Action]] | None:
    """FILE's index when it is ``FILE.py:NAME`` (not with ``-j``), and the command's options."""
    found = _file_at(argv, parser)
    if found is None:
        return None
    at, quick, options = found
    from torchjob.cli.sources import is_task_ref

    return (at, options) if quick is None and is_task_ref(argv[at]) else None


def _script_at(argv: list[str], parser: argparse.ArgumentParser) -> int | None:
    """The index of FILE in ``run|render|submit [OPTIONS] FILE ...`` when it is a script; else None."""
    found = _file_at(argv, parser)
    if found is None:
        return None
    from torchjob.cli.sources import is_script_ref

    at, quick, _ = found
    return at if is_script_ref(argv[at], quick) else None


def _file_at(
    argv: list[str], parser: argparse.ArgumentParser
) -> tuple[int, str | None, dict[str, argparse.Action]] | None:
    """FILE's index in ``run|render|submit [OPTIONS] FILE ...``, the ``-j`` given before it, and
    the command's options; None when there is none.

    torchjob's options before it are skipped with their values (``-j 2x2``, ``--set=x``, ``-j2x2``).
    """
    command = _command_of(argv)
    sub = getattr(parser, "_subparsers", None)
    if command not in SCRIPT_COMMANDS or sub is None:
        return None
    options = sub._group_actions[0].choices[command]._option_string_actions
    i, quick = argv.index(command) + 1, None
    while i < len(argv) and argv[i] != "--":
        arg = argv[i]
        if not arg.startswith("-") or arg == "-":
            return i, quick, options
        name = arg.split("=", 1)[0] if arg.startswith("--") else arg[:2]
        if name not in options and arg.startswith("--"):  # argparse takes unique prefixes too
            found = [o for o in options if o.startswith(name)]
            name = found[0] if len(found) == 1 else name
        action = options.get(name)
        attached = "=" in arg if arg.startswith("--") else len(arg) > 2
        takes = action is not None and action.nargs != 0 and not attached
        if action is not None and action.dest == "quick":
            quick = (argv[i + 1] if takes and i + 1 < len(argv) else arg[2:]).lstrip("=")
        i += 2 if takes else 1
    return None


SCRIPT_COMMANDS = ("run", "render", "submit")  # a script's arguments follow it


# The beginnings of torchrun's flags and of launchers (cli/habits.py): other command lines skip it.
_HABIT_HINTS = ("--nproc", "--nnodes", "--node", "--master", "--rdzv", "--standalone", "python", "torchrun")


def _torchrun_habit(argv: list[str], command: str | None, parser: argparse.ArgumentParser) -> str:
    """One line naming torchjob's way for torchrun's flags or a launcher before the script
    (cli/habits.py); "" for any other command line."""
    sub = getattr(parser, "_subparsers", None)
    if command not in SCRIPT_COMMANDS or sub is None:
        return ""
    after = argv[argv.index(command) + 1 :]
    if not any(a.startswith(_HABIT_HINTS) or a.rpartition("/")[2].startswith(_HABIT_HINTS) for a in after):
        return ""
    from torchjob.cli import habits

    options = sub._group_actions[0].choices[command]._option_string_actions
    takes_value = {name for name, action in options.items() if action.nargs != 0}
    found = habits.torchrun_habit(command, after, options, takes_value)
    if found is None:
        return ""
    return Problem(found[0], found[1], "<command line>").format()


def _found_elsewhere(args: argparse.Namespace, err: EngineError) -> str:
    """For a job not found: where a job of that name or id was last started from here, if not
    where the command looked (engine_api/lastrun.py); else ""."""
    engine, command = getattr(args, "engine", None), getattr(args, "engine_command", None)
    if not isinstance(err, JobNotFound) or not engine or not command:
        return ""
    from torchjob.cli.settings import given_settings, locating_flags
    from torchjob.engine_api.lastrun import hint

    return hint(command, err.ref, engine, locating_flags(engine, given_settings(args, command, engine)))


LAST_WORDS_WAIT = 0.5  # seconds a stalled stderr reader gets for torchjob's last lines


def _last_words(lines: list[str]) -> None:
    """Lines on stderr as torchjob ends: a reader that takes nothing (``2>&1 | less`` not scrolled,
    a full pipe) gets them for a second, then they are dropped; the exit code is not held up."""
    import select

    data = "".join(f"{line}\n" for line in lines).encode(errors="replace")
    try:
        sys.stderr.flush()
        fd = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # not a file of this process (a notebook's)
        print("\n".join(lines), file=sys.stderr)
        return
    deadline = time.monotonic() + LAST_WORDS_WAIT
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    while data:
        left = deadline - time.monotonic()
        if left <= 0 or not poller.poll(int(left * 1000) + 1):
            return
        try:  # writable: PIPE_BUF bytes at least go at once, without blocking
            data = data[os.write(fd, data[: select.PIPE_BUF]) :]
        except InterruptedError:
            continue
        except OSError:  # the reader went away
            return


def _main(argv: Sequence[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    from torchjob.cli.settings import find_engines

    find_engines(argv)  # engines of other distributions, only when this command line may need one
    command = _command_of(argv)
    parser = build_parser(command)
    habit = _torchrun_habit(argv, command, parser)
    if habit:
        _last_words([habit])
        return EXIT_BAD_INPUT
    argv, program_args = _split_program_args(argv, parser)
    args, unknown = parser.parse_known_args(argv)
    prefetch.keep_only(getattr(args, "file", None))  # a guess that was not the command's FILE: dropped
    if unknown:  # with the command's usage (argparse gives the top level's): its options are there
        commands = getattr(parser, "_subparsers", None)
        choices = commands._group_actions[0].choices if commands is not None else {}
        choices.get(getattr(args, "command", None), parser).error(
            f"unrecognized arguments: {' '.join(unknown)}"
        )
    if program_args and args.command not in SCRIPT_COMMANDS:
        parser.error("arguments after -- are the program's: torchjob run|render FILE -- ARGS")
    args.program_args = program_args
    if args.verbose or os.environ.get("TORCHJOB_LOG"):
        from torchjob.logs import configure

        configure("debug" if args.verbose else None)
    try:
        code: int = args.func(args)
        return code
    except SpecError as err:
        _last_words([problem.format() for problem in err.problems])
        return EXIT_BAD_INPUT
    except EngineError as err:
        _last_words([f"torchjob: {err}{_found_elsewhere(args, err)}"])
        return err.exit_code
    except KeyboardInterrupt as err:
        if not isinstance(err, Interrupted):  # else the engine's line has said it
            _last_words(["torchjob: interrupted"])
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `torchjob render ... | head` is not an error
        return EXIT_OK
