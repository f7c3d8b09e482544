"""Every malformed job in tests/bad_inputs/ is refused by the real CLI the way a user should see it.

Each input names what it expects in header lines ``# expect@LINE: PATH: FRAGMENT`` (``@LINE``
optional, ``-`` for "no field path"), or in a sidecar ``NAME.expect`` when the file itself must stay
comment-free (an empty file, JSON, bytes that are not UTF-8).

Every input goes through the CLI's ``main`` in this process (``run_main``); a few go through the
real program in a process of its own too (``test_the_program_refuses``), for what only a process
shows: its exit code, its streams' encoding, no traceback from the interpreter's teardown.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from support import Ran, torchjob

HERE = Path(__file__).parent
BAD = HERE / "bad_inputs"
INPUTS = sorted(p for p in BAD.iterdir() if p.suffix in (".yaml", ".json"))
_EXPECT = re.compile(r"^# expect(?:@(?P<line>\d+))?: (?P<path>.+?): (?P<fragment>.+)$")

pytestmark = pytest.mark.timeout(60)


@dataclass(frozen=True)
class Expect:
    line: int | None
    path: str | None
    fragment: str


def expectations(file: Path) -> list[Expect]:
    sidecar = file.with_name(file.name + ".expect")
    source = sidecar if sidecar.exists() else file
    found = []
    for text in source.read_bytes().decode("utf-8", "replace").splitlines():
        match = _EXPECT.match(text)
        if match:
            line = int(match["line"]) if match["line"] else None
            path = None if match["path"] == "-" else match["path"]
            found.append(Expect(line, path, match["fragment"]))
    return found


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return torchjob(*args, cwd=HERE)


def check_stderr(file: str, stderr: str, expected: list[Expect]) -> None:
    assert expected, f"{file} names no expectation"
    lines = stderr.splitlines()
    assert lines, "a refused input must say why on stderr"
    assert "Traceback" not in stderr
    form = re.compile(rf"^{re.escape(file)}(:\d+)?: \S.*$")
    for text in lines:
        assert form.match(text), f"not 'FILE:LINE: field.path: message': {text!r}"
    for want in expected:
        where = file + (f":{want.line}" if want.line is not None else "")
        prefix = where + ": " + (f"{want.path}: " if want.path else "")
        hits = [
            t
            for t in lines
            if want.fragment in t
            and (t.startswith(prefix) if want.line is not None else _has_path(t, file, want))
        ]
        assert hits, f"expected {prefix!r}...{want.fragment!r} in:\n{stderr}"


def _has_path(text: str, file: str, want: Expect) -> bool:
    """Without an expected line, the message may carry any line number (or none)."""
    rest = re.sub(rf"^{re.escape(file)}(:\d+)?: ", "", text)
    return rest.startswith(f"{want.path}: ") if want.path else True


def test_there_are_enough_bad_inputs() -> None:
    assert len(INPUTS) >= 45
    for file in INPUTS:
        assert expectations(file), f"{file.name} names no expectation"


@pytest.mark.parametrize("file", INPUTS, ids=[p.name for p in INPUTS])
def test_validate_refuses(file: Path, run_main: Callable[..., Ran]) -> None:
    name = f"bad_inputs/{file.name}"
    result = run_main("validate", name, cwd=HERE)
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stdout == "", "a refused file gets no summary line"
    check_stderr(name, result.stderr, expectations(file))


@pytest.mark.parametrize("file", INPUTS, ids=[p.name for p in INPUTS])
def test_render_refuses_and_writes_nothing(file: Path, run_main: Callable[..., Ran]) -> None:
    name = f"bad_inputs/{file.name}"
    result = run_main("render", name, cwd=HERE)
    assert result.returncode == 2
    assert result.stdout == "", "render must not leave half an output behind"
    check_stderr(name, result.stderr, expectations(file))


# The real program, a process per command: a YAML error, a field's, bytes that are not UTF-8, a
# refused run; what the in-process tests above check of every input, checked of these as printed.
END_TO_END = ["multi_doc_second_syntax.yaml", "replicas_string.yaml", "not_utf8.yaml", "nul_in_command.yaml"]


@pytest.mark.parametrize("name", END_TO_END)
def test_the_program_refuses(name: str, tmp_path: Path) -> None:
    jobs = tmp_path / "jobs"
    for command in (["validate"], ["render"], ["run", "--state-dir", str(jobs)]):
        result = run(*command, f"bad_inputs/{name}")
        assert result.returncode == 2, (command, result.stdout + result.stderr)
        assert result.stdout == "", command
        check_stderr(f"bad_inputs/{name}", result.stderr, expectations(BAD / name))
    assert not jobs.exists() or not any(jobs.iterdir()), "no job directory for a refused job"


# Inputs `validate` once accepted and `run` then crashed on (issue 8): values the local engine reads
# (env sources, resources, volumes, the grace period) and what a process cannot be given.
RUN_REFUSES = [
    "nul_in_command.yaml",
    "nul_in_env_value.yaml",
    "resources_cpu_infinite.yaml",
    "resources_not_mapping.yaml",
    "value_from_not_mapping.yaml",
    "field_ref_not_mapping.yaml",
    "env_from_not_list.yaml",
    "env_from_entry_not_mapping.yaml",
    "env_from_ref_not_mapping.yaml",
    "host_path_not_mapping.yaml",
    "grace_period_huge.yaml",
    "env_value_too_long.yaml",
    "int_over_4300_digits.yaml",
    "yaml_alias_text_bomb.yaml",
    "yaml_alias_text_bomb_documents.yaml",
]


@pytest.mark.parametrize("name", RUN_REFUSES)
def test_run_refuses_and_starts_nothing(name: str, tmp_path: Path, run_main: Callable[..., Ran]) -> None:
    jobs = tmp_path / "jobs"
    result = run_main("run", "--state-dir", str(jobs), f"bad_inputs/{name}", cwd=HERE)
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stdout == ""
    check_stderr(f"bad_inputs/{name}", result.stderr, expectations(BAD / name))
    assert not jobs.exists() or not any(jobs.iterdir()), "no job directory for a refused job"


def test_stdin_input_is_named_dash(run_main: Callable[..., Ran]) -> None:
    result = run_main("render", "-", stdin=(BAD / "replicas_string.yaml").read_text())
    assert result.returncode == 2
    assert result.stdout == ""
    assert re.match(
        r"^-:\d+: spec\.tasks\[1\]\.replicas: expected an integer, got string 'two'$", result.stderr
    )


def test_stdin_that_is_not_utf8() -> None:
    """Standard input is read as UTF-8 whatever the locale, and bytes that are not are refused."""
    for command in ("validate", "render"):
        result = subprocess.run(
            [sys.executable, "-m", "torchjob", command, "-"],
            input=b"apiVersion: \xff\xfe\n",
            capture_output=True,
            timeout=60,
            env={**os.environ, "LC_ALL": "C", "PYTHONIOENCODING": "", "PYTHONUTF8": "0"},
        )
        assert result.returncode == 2
        assert result.stdout == b""
        assert result.stderr == b"-: cannot read file: not UTF-8 text (invalid start byte at byte 12)\n"


def test_missing_file(run_main: Callable[..., Ran]) -> None:
    for command in ("validate", "render"):
        result = run_main(command, "bad_inputs/no-such-file.yaml", cwd=HERE)
        assert result.returncode == 2
        assert result.stdout == ""
        assert result.stderr == "bad_inputs/no-such-file.yaml: cannot read file: No such file or directory\n"


def test_directory_is_not_a_file(run_main: Callable[..., Ran]) -> None:
    result = run_main("validate", "bad_inputs", cwd=HERE)
    assert result.returncode == 2
    assert result.stderr.startswith("bad_inputs: cannot read file: ")
    assert "Traceback" not in result.stderr


def test_an_endless_file_under_a_memory_limit_is_one_line() -> None:
    """`validate /dev/zero` under `ulimit -v`: read no more than a job file can be, not until memory ends."""
    import resource

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (600 * 2**20, resource.getrlimit(resource.RLIMIT_AS)[1]))

    result = subprocess.run(
        [sys.executable, "-m", "torchjob", "validate", "/dev/zero"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=HERE,
        preexec_fn=limit,
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr == "/dev/zero: it is larger than 16 MiB; expected a job file\n"


def test_all_problems_are_reported_at_once(run_main: Callable[..., Ran]) -> None:
    result = run_main("validate", "bad_inputs/several_problems.yaml", cwd=HERE)
    assert result.returncode == 2
    lines = result.stderr.splitlines()
    # Five independent mistakes, each on its own line with its own line number.
    assert len(lines) == 5, result.stderr
    numbers = [int(line.split(":")[1]) for line in lines]
    assert numbers == sorted(set(numbers)), "one line each, in file order"


def test_one_mistake_gives_one_message(run_main: Callable[..., Ran]) -> None:
    """A broken field must not drag follow-on errors along (minAvailable, WORLD_SIZE, ...)."""
    for name in (
        "replicas_string.yaml",
        "replicas_negative.yaml",
        "missing_metadata_name.yaml",
        "task_name_uppercase.yaml",
        "task_min_available_gt_replicas.yaml",
    ):
        result = run_main("validate", f"bad_inputs/{name}", cwd=HERE)
        assert len(result.stderr.splitlines()) == 1, result.stderr


def test_validate_reports_every_file(run_main: Callable[..., Ran]) -> None:
    """Several files: problems of each are reported, and the exit code is still 2."""
    files = ["bad_inputs/replicas_string.yaml", "bad_inputs/flag_port_abc.yaml", "bad_inputs/empty.yaml"]
    result = run_main("validate", *files, cwd=HERE)
    assert result.returncode == 2
    for file in files:
        assert any(line.startswith(file + ":") for line in result.stderr.splitlines()), file


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("import sys\nsys.exit(0)\n", "importing the file called sys.exit(0); torchjob imports it"),
        ("raise SystemExit('bye')\n", "importing the file called sys.exit('bye')"),
        ("import sys\nsys.exit()\n", "importing the file called sys.exit();"),
        ("import os\nos._exit(0)\n", "importing the file called os._exit(0); torchjob imports it"),
        ("import os\ntry:\n    os._exit(3)\nexcept Exception:\n    pass\n", "called os._exit(3)"),
        ("class Stop(BaseException): pass\nraise Stop('x')\n", "importing the file raised Stop: x"),
        (
            "class E(Exception):\n    def __str__(self): raise RuntimeError\nraise E()\n",
            "importing the file raised E: <E that cannot be shown>",
        ),
    ],
    ids=["exit-0", "exit-text", "exit-none", "os-exit-0", "os-exit-caught", "base-exception", "unprintable"],
)
def test_importing_a_task_file_never_ends_torchjob_or_hides_other_files(
    tmp_path: Path, body: str, message: str
) -> None:
    """`validate bad.yaml x.py:t` with x.py exiting at import exited 0, silently (issue 8)."""
    (tmp_path / "x.py").write_text(body)
    (tmp_path / "bad.yaml").write_text((BAD / "replicas_string.yaml").read_text())
    result = subprocess.run(
        [sys.executable, "-m", "torchjob", "validate", "x.py:t", "bad.yaml"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 2, result.stderr
    assert lines[0].startswith("x.py: ") and message in lines[0], lines[0]
    assert lines[1].startswith("bad.yaml:") and "spec.tasks[1].replicas" in lines[1], lines[1]


def test_run_refuses_a_task_file_that_calls_os_exit_at_import(tmp_path: Path) -> None:
    """It ended torchjob at once: nothing printed, exit 0, nothing run."""
    (tmp_path / "x.py").write_text("import os\nos._exit(0)\n")
    result = subprocess.run(
        [sys.executable, "-m", "torchjob", "run", "--state-dir", str(tmp_path / "jobs"), "x.py:t"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.startswith("x.py: importing the file called os._exit(0)"), result.stderr
    assert not (tmp_path / "jobs").exists() or not any((tmp_path / "jobs").iterdir())


def test_a_process_the_task_file_forks_at_import_still_exits() -> None:
    """Only this process's os._exit is refused: a child the file forks meanwhile ends as it means to."""
    body = (
        "import os\npid = os.fork()\nif pid == 0:\n    os._exit(7)\n"
        "assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 7\n"
        "from torchjob import task\n@task\ndef t() -> int:\n    return 1\n"
    )
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "y.py").write_text(body)
        result = subprocess.run(
            [sys.executable, "-m", "torchjob", "validate", "y.py:t"],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=folder,
        )
    assert result.returncode == 0, result.stderr
    assert "valid" in result.stdout


# --- local state that cannot be used: one line naming it, exit 2, never a traceback

TINY_JOB = """\
apiVersion: batch.volcano.sh/v1alpha1
kind: Job
metadata: {name: tiny}
spec:
  tasks:
    - name: main
      replicas: 1
      template:
        spec:
          restartPolicy: Never
          containers: [{name: main, image: x, command: [sh, -c, "echo hi"]}]
"""


def _as_an_ordinary_user() -> None:
    """Run as root without the capabilities that read and write past file modes (root ignores them)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    for capability in (1, 2):  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH: out of the bounding set
        libc.prctl(24, capability, 0, 0, 0)  # PR_CAPBSET_DROP; harmless when not root


def local(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return torchjob(*args, home=home, cwd=HERE, preexec_fn=_as_an_ordinary_user)


def test_an_unreadable_job_directory_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "tiny.yaml").write_text(TINY_JOB)
    home = tmp_path / "home"
    started = local(home, "run", "-q", str(tmp_path / "tiny.yaml"))
    assert started.returncode == 0, started.stderr
    [job_dir] = (home / "jobs").iterdir()
    job_dir.chmod(0)
    probe = subprocess.run(["ls", str(job_dir)], preexec_fn=_as_an_ordinary_user, capture_output=True)
    if probe.returncode == 0:  # root that cannot give up reading past modes (no CAP_SETPCAP)
        job_dir.chmod(0o700)
        pytest.skip("file modes do not stop this user")
    try:
        for command in (
            ["status"],
            ["status", job_dir.name],
            ["logs", job_dir.name],
            ["delete", job_dir.name],
        ):
            result = local(home, *command)
            assert result.returncode == 2, (command, result.stderr)
            assert "Traceback" not in result.stderr
            [line] = result.stderr.splitlines()
            assert line.startswith(f"torchjob: cannot read {job_dir}/status.json: Permission denied"), line
        assert job_dir.exists()  # nothing was deleted
    finally:
        job_dir.chmod(0o700)


def test_torchjob_home_that_is_a_file_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "tiny.yaml").write_text(TINY_JOB)
    home = tmp_path / "file"
    home.write_text("not a directory")
    for command in (["status"], ["run", str(tmp_path / "tiny.yaml")]):
        result = local(home, *command)
        assert result.returncode == 2, result.stderr
        assert result.stderr == f"torchjob: TORCHJOB_HOME={home}: {home} is not a directory\n"
    assert home.read_text() == "not a directory"


def test_a_torchjob_home_where_no_directory_can_be_made_is_one_line(tmp_path: Path) -> None:
    """/proc passes the root's checks for root, yet nothing can be made in it: one line, exit 2."""
    if not os.path.isdir("/proc/self"):
        pytest.skip("no /proc here")
    (tmp_path / "tiny.yaml").write_text(TINY_JOB)
    result = subprocess.run(  # not as local() does: root's access() must say /proc is writable
        [sys.executable, "-m", "torchjob", "run", str(tmp_path / "tiny.yaml")],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "TORCHJOB_HOME": "/proc/torchjob-nowhere"},
    )
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    [line] = result.stderr.splitlines()
    assert line.startswith("torchjob: ") and "/proc/torchjob-nowhere" in line, line


def test_a_task_reference_with_a_bad_name_does_not_import_the_file(
    tmp_path: Path, home: Path, run_main: Callable[..., Ran]
) -> None:
    """``FILE.py:`` or ``FILE.py:1x`` is no reference: the file (here a plain script that would
    print) is not imported to look for a workflow, and the message says what was expected."""
    script = tmp_path / "script.py"
    script.write_text("print('the script ran')\n")
    for command in ("run", "render", "validate"):
        for ref in (f"{script}:", f"{script}:1x"):
            result = run_main(command, ref)
            assert result.returncode == 2, (command, ref, result.stderr)
            assert "the script ran" not in result.stdout + result.stderr, (command, ref)
            assert result.stderr == (
                f"{ref}: expected FILE.py:NAME, NAME a task or workflow of the file (a Python name), "
                f"got {ref.rpartition(':')[2]!r}\n"
            )


def test_another_users_torchjob_home_is_refused(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to give a directory to another user")
    (tmp_path / "tiny.yaml").write_text(TINY_JOB)
    home = tmp_path / "theirs"
    (home / "jobs").mkdir(parents=True)
    os.chown(home / "jobs", 4242, 4242)
    for command in (["status"], ["run", str(tmp_path / "tiny.yaml")]):
        result = local(home, *command)
        assert result.returncode == 2, result.stderr
        assert result.stderr == (
            f"torchjob: TORCHJOB_HOME={home}: {home / 'jobs'} belongs to uid 4242, not to you (uid 0): "
            "torchjob keeps job state only in a directory of your own\n"
        )
    assert list((home / "jobs").iterdir()) == []
    (home / "jobs").rmdir()  # no job directory yet: it would be made in their directory
    os.chown(home, 4242, 4242)
    result = local(home, "run", str(tmp_path / "tiny.yaml"))
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith(f"torchjob: TORCHJOB_HOME={home}: {home} belongs to uid 4242"), (
        result.stderr
    )
    assert list(home.iterdir()) == []


# --- the command line's own mistakes are blamed on it; validate --local warns as run does


def test_an_env_option_with_a_bad_name_is_refused(
    tmp_path: Path, home: Path, run_main: Callable[..., Ran]
) -> None:
    (tmp_path / "tiny.yaml").write_text(TINY_JOB)
    result = run_main("run", "--env", "MY VAR=1", str(tmp_path / "tiny.yaml"))
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr == "<command line>: --env: 'MY VAR' is not a valid environment variable name\n"
    assert not (home / "jobs").exists() or not any((home / "jobs").iterdir())


def test_a_set_that_conflicts_with_the_file_names_the_set(
    tmp_path: Path, home: Path, run_main: Callable[..., Ran]
) -> None:
    """The file was valid; the --set made its task's minAvailable too large: say which option did."""
    (tmp_path / "tiny.yaml").write_text(
        TINY_JOB.replace("      replicas: 1\n", "      replicas: 2\n      minAvailable: 2\n")
    )
    result = run_main("run", "--set", "main.replicas=1", str(tmp_path / "tiny.yaml"))
    assert result.returncode == 2, result.stdout + result.stderr
    [line] = result.stderr.splitlines()
    # a minAvailable that a --set ...replicas broke names that --set and the one that mends it
    assert line.endswith(
        "spec.tasks[0].minAvailable: expected at most replicas (1), got 2; "
        "with --set main.replicas=1, add --set main.minAvailable=1 (or lower)"
    ), line
    # any other field the --set broke says which option it follows
    (tmp_path / "success.yaml").write_text(
        TINY_JOB.replace("      replicas: 1\n", "      replicas: 2\n").replace(
            "spec:\n", "spec:\n  minSuccess: 2\n", 1
        )
    )
    result = run_main("run", "--set", "main.replicas=1", str(tmp_path / "success.yaml"))
    assert result.returncode == 2, result.stdout + result.stderr
    [line] = result.stderr.splitlines()
    assert line.startswith(f"{tmp_path / 'success.yaml'}:") and line.endswith(
        "(after --set main.replicas=1)"
    ), line


def test_validate_local_prints_the_warnings_run_prints(tmp_path: Path) -> None:
    job = TINY_JOB.replace(
        '"echo hi"]}]', '"echo hi"], securityContext: {capabilities: {add: [NET_ADMIN]}}}]'
    )
    (tmp_path / "sec.yaml").write_text(job)
    validated = local(tmp_path / "home", "validate", "--local", str(tmp_path / "sec.yaml"))
    assert validated.returncode == 0, validated.stderr
    path = "spec.tasks[0].template.spec.containers[0].securityContext.capabilities"
    assert f"sec.yaml:11: {path}: warning: has no effect on local processes" in validated.stderr
    ran = local(tmp_path / "home", "run", str(tmp_path / "sec.yaml"))
    assert f"torchjob: warning: {path}: has no effect on local processes" in ran.stdout + ran.stderr
