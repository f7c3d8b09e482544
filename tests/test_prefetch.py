"""`torchjob run FILE` reads its job file in a forked child while it imports the engine
(spec/prefetch.py): the documents, and the problems, must be exactly what reading it here gives."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from torchjob.errors import SpecError
from torchjob.spec import prefetch
from torchjob.spec.source import load_documents

GOOD = """\
apiVersion: batch.volcano.sh/v1alpha1
kind: Job
metadata: {name: a}
spec:
  tasks:
    - name: w
      replicas: 1
      replicas: 2
      template: {spec: {containers: [{name: c, image: i, command: ["true"]}]}}
---
---
apiVersion: v1
kind: List
items:
  - {apiVersion: batch.volcano.sh/v1alpha1, kind: Job, metadata: {name: b}, spec: {when: 2024-01-01}}
"""

# Runs in a fresh interpreter (one thread, as the program): start, then take, print what came back.
TAKE = """
import json
from torchjob.errors import SpecError
path = sys.argv[1]
prefetch.start(["run", "--job", "a", path])
child = prefetch._pending[0].pid if prefetch._pending else None
try:
    docs = prefetch.take(path)
    out = None if docs is None else [
        [d.data, d.lines, d.index, d.total, d.prefix, [(p.path, p.message, p.line) for p in d.problems]]
        for d in docs
    ]
except SpecError as err:
    out = {"problems": [p.format() for p in err.problems]}
try:
    os.waitpid(child, os.WNOHANG)
    reaped = False
except ChildProcessError:
    reaped = True
print(json.dumps({"child": child, "reaped": reaped, "out": out}))
"""


def _take_in_a_program(path: Path) -> dict[str, object]:
    ran = _program(TAKE, path)
    assert ran.returncode == 0, ran.stderr
    found: dict[str, object] = json.loads(ran.stdout)
    return found


# What every program below begins with: the suite's own load would make the command skip the child.
PRELUDE = (
    "import os, sys, time, threading; from torchjob.spec import prefetch; prefetch.idle_core = lambda: True\n"
)


def _program(code: str, path: Path) -> subprocess.CompletedProcess[str]:
    """``code`` after PRELUDE in a fresh interpreter (one thread, as the program); ``path`` its argument."""
    argv = [sys.executable, "-c", PRELUDE + code, str(path)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


def _here(path: Path) -> object:
    try:
        docs = load_documents(str(path))
    except SpecError as err:
        return {"problems": [p.format() for p in err.problems]}
    return [
        [d.data, d.lines, d.index, d.total, d.prefix, [(p.path, p.message, p.line) for p in d.problems]]
        for d in docs
    ]


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["run", "job.yaml"], "job.yaml"),
        (["-v", "run", "--job", "x", "j.YML"], "j.YML"),
        (["run", "-e", "A=b", "a.json", "--", "x.yaml"], "a.json"),
        (["run", "--", "x.yaml"], None),
        (["run", "train.py"], None),
        (["run", "-"], None),
        (["validate", "job.yaml"], None),
        (["status"], None),
    ],
)
def test_the_job_file_is_guessed_from_the_command_line(argv: list[str], expected: str | None) -> None:
    assert prefetch.job_file(argv) == expected


def test_documents_read_by_the_child_are_the_ones_read_here(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(GOOD)
    taken = _take_in_a_program(path)
    assert taken["out"] is not None, "the child's documents were not used"
    assert taken["out"] == json.loads(json.dumps(_here(path)))
    assert taken["reaped"] is True


@pytest.mark.parametrize(
    "text",
    ["a: [\n", "a: 1\na: 2\nb: {c: 1, c: 2}\n", "x: \x07\n", "- !!python/object:os.system x\n", "a: 1e400\n"],
)
def test_problems_found_by_the_child_are_the_ones_found_here_too(tmp_path: Path, text: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    taken = _take_in_a_program(path)
    assert taken["out"] == json.loads(json.dumps(_here(path)))


def test_a_file_changed_after_the_child_read_it_is_read_again(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text("a: 1\n")
    ran = _program(
        "p = sys.argv[1]; prefetch.start(['run', p]);"
        "time.sleep(0.01); open(p, 'w').write('b: 22\\n'); print(prefetch.take(p) is None)",
        path,
    )
    assert ran.stdout.strip() == "True", ran.stderr


def test_a_guess_the_command_does_not_load_is_dropped(tmp_path: Path) -> None:
    path = tmp_path / "other.yaml"
    path.write_text("a: 1\n")
    ran = _program(
        "prefetch.start(['run', sys.argv[1]]);"
        "pid = prefetch._pending[0].pid; prefetch.keep_only('job.yaml');\n"
        "try:\n    os.waitpid(pid, os.WNOHANG); print('left')\n"
        "except ChildProcessError:\n    print('reaped')\n"
        "print(prefetch._pending)",
        path,
    )
    assert ran.stdout.split() == ["reaped", "[]"], ran.stderr


def test_no_child_is_forked_beside_other_threads(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text("a: 1\n")
    ran = _program(
        "e = threading.Event();"
        "t = threading.Thread(target=e.wait, daemon=True); t.start(); prefetch.start(['run', sys.argv[1]]);"
        "print(len(prefetch._pending)); e.set()",
        path,
    )
    assert ran.stdout.strip() == "0", ran.stderr


@pytest.mark.parametrize("cores, running, idle", [(2, 1, True), (4, 3, True), (2, 2, False), (1, 1, False)])
def test_the_child_is_forked_only_with_a_core_free(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, cores: int, running: int, idle: bool
) -> None:
    loadavg = tmp_path / "loadavg"
    loadavg.write_text(f"3.10 2.00 1.00 {running}/345 6789\n")  # the load average is not what counts
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)))
    assert prefetch.idle_core(str(loadavg)) is idle


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_the_child_dies_with_the_command(tmp_path: Path) -> None:
    path = tmp_path / "big.yaml"  # seconds of parsing: the command is killed long before
    path.write_text("items:\n" + "".join(f"  - {{name: n{i}, v: {i}}}\n" for i in range(80_000)))
    code = (
        PRELUDE
        + "prefetch.start(['run', sys.argv[1]]); print(prefetch._pending[0].pid, flush=True); time.sleep(60)"
    )
    command = subprocess.Popen([sys.executable, "-c", code, str(path)], stdout=subprocess.PIPE, text=True)
    try:
        assert command.stdout is not None
        child = int(command.stdout.readline())
        time.sleep(0.3)  # it has started parsing
        assert not _gone(child)
    finally:
        command.kill()
        command.wait(timeout=10)
    deadline = time.monotonic() + 10
    while not _gone(child) and time.monotonic() < deadline:
        time.sleep(0.02)
    if not _gone(child):
        os.kill(child, signal.SIGKILL)
        pytest.fail("the child outlived the command that started it")


TRACED_MAIN = """
import atexit, sys
from torchjob.errors import SpecError
from torchjob.spec import prefetch
import torchjob.cli as cli
prefetch.idle_core = lambda: True
taken, real = [], prefetch.take
def take(file):
    try:
        found = real(file)
    except SpecError:
        taken.append("problems")
        raise
    taken.append("none" if found is None else "documents")
    return found
prefetch.take = take
atexit.register(lambda: print("TAKEN", *taken, file=sys.stderr, flush=True))
sys.exit(cli.main())
"""


@pytest.mark.parametrize(
    "spec, code, taken",
    [
        ("[", 2, "problems"),
        ("{tasks: 3}", 2, "documents"),
        (
            "{tasks: [{name: w, replicas: 1, template: {spec: {containers: [{name: c, image: i, "
            "command: ['true']}]}}}]}",
            0,
            "documents",
        ),
    ],
)
def test_torchjob_run_takes_what_the_child_read(tmp_path: Path, spec: str, code: int, taken: str) -> None:
    """End to end: the program itself (one thread at its start) forks the reader and uses it."""
    path = tmp_path / "job.yaml"
    path.write_text(
        f"apiVersion: batch.volcano.sh/v1alpha1\nkind: Job\nmetadata: {{name: x}}\nspec: {spec}\n"
    )
    env = {**os.environ, "TORCHJOB_HOME": str(tmp_path / "home")}
    argv = [sys.executable, "-c", TRACED_MAIN, "run", "--dry-run", str(path)]
    ran = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)
    assert ran.returncode == code, ran.stderr
    assert f"TAKEN {taken}" in ran.stderr


def test_only_an_engine_with_start_modules_is_imported_ahead() -> None:
    """The local engine's start modules are imported while the child reads; a cluster engine's
    client is not imported before the job file is known to be good."""
    code = (
        "import sys; from torchjob.engine_api.registry import engine_info, import_for_start;"
        "import_for_start('kubernetes'); import_for_start('slurm');"
        "k = any(engine_info(e).factory.split(':')[0] in sys.modules for e in ('kubernetes', 'slurm'));"
        "import_for_start('local'); print(k, 'torchjob.engines.local.supervisor' in sys.modules)"
    )
    ran = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert ran.stdout.split() == ["False", "True"], ran.stderr
