"""Pre-warmed containers (issue 13): a program cannot tell a warm start from a cold one, except that
torch is imported already; an init container's failure never runs the program; nothing is left.

Each job runs the same programs twice, with pre-warming on and off (the local engine setting ``prewarm``), and
the containers' logs must be the same but for the one line that says whether torch was imported
before the program started (which also proves that the warm path was taken).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from support import container, job_dir, leftovers, log_text, make_job, run, sh, task
from torchjob.engines.local import check_job
from torchjob.spec.manifest import job_manifest
from torchjob.spec.model import Job

pytestmark = pytest.mark.timeout(120)

# The same body runs as a script, as `-m eqmod` and as `-c BODY`; each form ends its own way.
BODY = r"""
import os, signal, sys, warnings
print("globals", list(globals()))
print("argv", sys.argv, "name", __name__, "file", globals().get("__file__"))
print("spec", getattr(__spec__, "name", None), "loader", type(__loader__).__name__)
print("cwd", os.getcwd(), "path0", sys.path[0], "orig", sys.orig_argv[1:])
print("env", os.environ.get("FOO"), os.environ.get("HOSTNAME"), "child", os.getpid() != os.getppid())
print("flags", sys.flags.optimize, sys.flags.dont_write_bytecode, sys.flags.no_user_site)
print("signals", [signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGPIPE)])
print("stdin", sys.stdin.read(), "main", sys.modules["__main__"].__dict__ is globals())
print("torch imported", "torch" in sys.modules, flush=True)
ending = os.environ.get("ENDING") or {"b c": "sigterm", "x": "raise", "y": "interrupt"}[sys.argv[-1]]
if ending == "sigterm":
    def on_term(signum, frame):
        print("SIGTERM handled", flush=True)
        sys.exit(7)
    signal.signal(signal.SIGTERM, on_term)
    os.kill(os.getpid(), signal.SIGTERM)
    signal.pause()
elif ending == "raise":
    def fail():
        raise ValueError("from the program")
    fail()
elif ending == "interrupt":
    raise KeyboardInterrupt
"""


def _equivalence_job(tmp_path: Path, name: str, same_env: bool = False, **metadata: object) -> Path:
    """``same_env``: the containers' environments are alike (each ending follows from its argv),
    as forking them all from one preloading server needs."""
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    (work / "prog.py").write_text(BODY)
    (work / "eqmod.py").write_text(BODY)
    python = ["python", "-u", "-B", "-s"]
    forms = {
        "script": ([*python, "prog.py", "a", "b c"], "sigterm"),
        "module": ([*python, "-m", "eqmod", "x"], "raise"),
        "code": ([*python, "-c", BODY, "y"], "interrupt"),
    }
    containers = [
        container(
            form,
            argv,
            workingDir=str(work),
            env=[
                {"name": "FOO", "value": "bar"},
                *([] if same_env else [{"name": "ENDING", "value": ending}]),
            ],
        )
        for form, (argv, ending) in forms.items()
    ]
    job = make_job(name, [task("main", containers, init=[container("init", sh("sleep 0.3"))])])
    manifest = job_manifest(job)
    manifest["metadata"].update(metadata)
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(manifest))
    return path


def _load(path: Path):  # type: ignore[no-untyped-def]
    from torchjob.jobs import load_jobs

    return load_jobs(str(path))[0].job


def test_a_program_cannot_tell_a_warm_start_from_a_cold_one(tmp_path: Path) -> None:
    job = _load(_equivalence_job(tmp_path, "same"))
    cold = run(job, tmp_path / "cold", timeout=90, prewarm=False)
    warm = run(job, tmp_path / "warm", timeout=90, prewarm=True)
    codes = {p.name: p.exit_code for p in cold.pods}
    assert codes == {p.name: p.exit_code for p in warm.pods}
    for form in ("script", "module", "code"):
        before, after = log_text(cold, "main-0", form), log_text(warm, "main-0", form)
        assert "torch imported False" in before, before
        assert "torch imported True" in after, after  # the warm path was taken
        assert before.replace("torch imported False", "") == after.replace("torch imported True", ""), form
    script, module, code = (log_text(warm, "main-0", f) for f in ("script", "module", "code"))
    assert "SIGTERM handled" in script
    assert "ValueError: from the program" in module and "warmstart" not in module
    assert 'File "<string>"' in code and "KeyboardInterrupt" in code
    status = json.loads((job_dir(warm) / "status.json").read_text())
    exits = {c["name"]: c["exitCode"] for c in status["pods"][0]["containers"]}
    assert exits == {"init": 0, "script": 7, "module": 1, "code": 130}
    assert leftovers(warm.id) == [] and leftovers(cold.id) == []


def test_an_init_container_failure_never_runs_the_program(tmp_path: Path) -> None:
    ran = tmp_path / "ran"
    # The init container waits until it sees its pod's warm process, then fails.
    seen = (
        "for i in $(seq 200); do for p in /proc/[0-9]*; do "
        'if tr "\\0" "\\n" < $p/cmdline 2>/dev/null | grep -q torchjob_prewarm && '
        'tr "\\0" "\\n" < $p/environ 2>/dev/null | grep -qx "TORCHJOB_POD_UID=$TORCHJOB_POD_UID"; '
        "then echo warm process seen; exit 3; fi; done; sleep 0.05; done; exit 4"
    )
    program = ["python", "-c", f"open({str(ran)!r}, 'w').write('ran')"]
    job = make_job(
        "initfails", [task("main", [container("app", program)], init=[container("init", sh(seen))])]
    )
    result = run(job, tmp_path, timeout=60, prewarm=True)
    assert result.phase == "Failed"
    assert result.pods[0].exit_code == 3
    assert "warm process seen" in log_text(result, "main-0", "init")
    assert not ran.exists()
    assert log_text(result, "main-0", "app") == ""
    assert leftovers(result.id) == []


def test_the_annotation_and_no_prewarm_turn_it_off(tmp_path: Path) -> None:
    path = _equivalence_job(tmp_path, "off", annotations={"torchjob.io/prewarm": "false"})
    result = run(_load(path), tmp_path / "a", timeout=90, prewarm=True)
    assert "torch imported False" in log_text(result, "main-0", "script")
    home = tmp_path / "home"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torchjob",
            "run",
            "-q",
            "--no-prewarm",
            str(_equivalence_job(tmp_path, "flag")),
        ],
        env={**os.environ, "TORCHJOB_HOME": str(home)},
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr  # the programs end with codes 7, 1, 130
    logs = list(home.glob("jobs/*/logs/*/attempt-0/script.log"))
    assert len(logs) == 1 and "torch imported False" in logs[0].read_text()


def test_a_warmed_module_list_and_a_bad_annotation(tmp_path: Path) -> None:
    path = _equivalence_job(tmp_path, "json", annotations={"torchjob.io/prewarm": "json,email.parser"})
    result = run(_load(path), tmp_path / "a", timeout=90, prewarm=True)
    text = log_text(result, "main-0", "script")
    assert "torch imported False" in text and "globals" in text
    bad = _load(_equivalence_job(tmp_path, "bad", annotations={"torchjob.io/prewarm": "torch;rm -rf"}))
    problems = check_job(bad)
    assert [p.path for p in problems] == ["metadata.annotations['torchjob.io/prewarm']"], problems


def test_a_noisy_import_falls_back_to_a_cold_start(tmp_path: Path) -> None:
    """A warmed module that prints (or warns) at import: the program is started cold instead, so
    the output appears where the program imports it, as without pre-warming."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "noisy.py").write_text("print('noisy imported', flush=True)\n")
    (work / "prog.py").write_text(
        "import sys\nprint('before', 'noisy' in sys.modules, flush=True)\nimport noisy\n"
    )
    job = make_job(
        "noisy",
        [
            task(
                "main",
                [container("app", ["python", "prog.py"], workingDir=str(work))],
                init=[container("init", sh("sleep 0.2"))],
            )
        ],
    )
    manifest = job_manifest(job)
    manifest["metadata"]["annotations"] = {"torchjob.io/prewarm": "noisy"}
    path = tmp_path / "noisy.json"
    path.write_text(json.dumps(manifest))
    result = run(_load(path), tmp_path, timeout=60, prewarm=True)
    assert result.phase == "Completed"
    assert log_text(result, "main-0", "app") == "before False\nnoisy imported\n"


@pytest.mark.parametrize(
    ("args", "warm"),
    [
        (["prog.py", "-i"], True),  # after the script, options are the program's
        (["-u", "-B", "-O", "-W", "ignore", "-Xdev", "prog.py"], True),
        (["-OO", "-m", "pkg.mod", "x"], True),
        (["-c", "print(1)"], True),
        (["-i", "prog.py"], False),
        (["-I", "prog.py"], False),
        (["-x", "prog.py"], False),
        (["-", "x"], False),
        (["--version"], False),
        (["-u"], False),  # an interactive interpreter
        (["-m"], False),
    ],
)
def test_which_commands_are_started_warm(args: list[str], warm: bool) -> None:
    from torchjob.engines.local import prewarm
    from torchjob.engines.local.containers import ContainerRun

    run = ContainerRun(name="c", image="x", init=False, argv=[sys.executable, *args], env={}, cwd=None)
    argv = prewarm.warm_argv(run, 5, ("torch",), "/tmp")
    assert (argv is not None) == warm
    if argv is not None:  # the options go first, unchanged; the program's argv last, unchanged
        i = argv.index("-c")
        options, program = argv[1:i], argv[i + 7 :]  # -c BOOT RUNNER fd timeout modules cwd
        assert options + program == args
        assert argv[i + 3 : i + 7] == ["5", f"{prewarm.MAX_WAIT + 60:g}", "torch", "/tmp"]
    other = ContainerRun(name="c", image="x", init=False, argv=["sh", "-c", "python x.py"], env={}, cwd=None)
    assert prewarm.warm_argv(other, 5, ("torch",), "/tmp") is None


def test_a_restarted_init_container_keeps_the_warm_process_and_the_program_runs_once(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    flag = tmp_path / "failed-once"
    init = sh(f"[ -e {flag} ] && exit 0; touch {flag}; exit 1")  # fails once, then succeeds
    program = [
        "python",
        "-c",
        f"import sys; open({str(runs)!r}, 'a').write(str('torch' in sys.modules) + '\\n')",
    ]
    job = make_job(
        "again",
        [task("main", [container("app", program)], restart="OnFailure", init=[container("init", init)])],
    )
    result = run(job, tmp_path, timeout=60, prewarm=True)
    assert result.ok, result.reason
    assert result.pods[0].restarts == 1  # the init container's
    assert runs.read_text() == "True\n"
    assert leftovers(result.id) == []


def test_by_default_no_more_pods_wait_warm_than_there_are_cpus() -> None:
    """More warm interpreters than CPUs slow the master's own start (8 ranks on 2 cores: 1.22x the
    floor warm, 1.03x cold): by default such a job starts cold; the annotation still forces it."""
    from torchjob.engines.local.prewarm import DEFAULT_MODULES, modules_of

    cpus = os.cpu_count() or 1
    init = [container("init", sh("true"))]

    def job(waiting: int, annotations: dict[str, str] | None = None) -> Job:
        made = make_job("warm", [task("main", [container("main", ["python", "-c", "pass"])], init=init,
                                      replicas=waiting)])  # fmt: skip
        if annotations:
            made.metadata.annotations.update(annotations)
        return made

    assert modules_of(job(cpus)) == DEFAULT_MODULES
    assert modules_of(job(cpus + 1)) == ()
    assert modules_of(job(cpus + 1, {"torchjob.io/prewarm": "true"})) == DEFAULT_MODULES
    assert modules_of(job(1, {"torchjob.io/prewarm": "false"})) == ()


def test_a_program_started_through_the_runner_finds_the_modules_of_a_cold_start(tmp_path: Path) -> None:
    """Every python main container starts through the runner: it may add no import a cold start
    does not make (typing, re, enum: milliseconds at each rank's start), but ``__future__``."""
    from torchjob.pyrunner.pyrun import BOOT, NO_WAIT, RUNNER

    program = tmp_path / "mods.py"
    program.write_text("import sys\nprint(' '.join(sorted(sys.modules)))\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONSTARTUP"}

    def modules(argv: list[str]) -> set[str]:
        out = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30, check=True)
        return set(out.stdout.split())

    cold = modules([sys.executable, str(program)])
    runner = modules([sys.executable, "-c", BOOT, RUNNER, NO_WAIT, "0", "", str(tmp_path), str(program)])
    assert runner - cold <= {"__future__"}, sorted(runner - cold)
    assert "sys" in cold and cold - runner == set()


@pytest.mark.parametrize("mode", ["-", "guard"])
def test_a_runner_that_cannot_be_loaded_starts_the_program_cold_not_a_silent_success(
    tmp_path: Path, mode: str
) -> None:
    """A program run at once (or a torchrun rank's guard) whose runner file cannot be read (an
    install removed under a running job, a runAsUser that may not read it) runs cold, with its own
    output and exit code: ending with 0 unrun would be a success that never ran."""
    from torchjob.pyrunner.pyrun import BOOT

    program = tmp_path / "prog.py"
    program.write_text("import sys\nprint('ran', sys.argv[1:], sys.flags.isolated)\nsys.exit(3)\n")
    missing = str(tmp_path / "gone" / "warmstart.py")
    own = ["-I", "-S"] if mode == "guard" else ["-u"]  # the guard's own options are not the program's
    argv = [sys.executable, *own, "-c", BOOT, missing, mode, "0", "", ".", str(program), "a b"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30, cwd=tmp_path)
    assert (done.returncode, done.stdout, done.stderr) == (3, "ran ['a b'] 0\n", "")
