"""The preloading fork server (issue 13, ``--preload torch``): a program forked from the server
cannot tell it from a cold start except that torch is imported already; the server holds one
thread when it forks; restarts fork again; an init container's failure never runs the program;
containers it cannot serve start cold. (No orphans: tests/test_local_orphans.py runs in this mode.)
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from support import container, job_dir, leftovers, log_dir, log_text, make_job, run, sh, task, wait_until
from test_local_prewarm import _equivalence_job, _load
from torchjob.engines.local import process
from torchjob.engines.local.containers import ContainerRun
from torchjob.engines.local.preload import FORK_LATER, Forked, Preloader
from torchjob.spec.manifest import job_manifest

pytestmark = pytest.mark.timeout(120)

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "pytorch-job.yaml"
TORCH = ("torch",)


def test_a_program_cannot_tell_a_preloaded_start_from_a_cold_one(tmp_path: Path) -> None:
    job = _load(_equivalence_job(tmp_path, "same", same_env=True))
    cold = run(job, tmp_path / "cold", timeout=90, prewarm=False)
    forked = run(job, tmp_path / "forked", timeout=90, preload=TORCH)
    assert {p.name: p.exit_code for p in cold.pods} == {p.name: p.exit_code for p in forked.pods}
    for form in ("script", "module", "code"):
        before, after = log_text(cold, "main-0", form), log_text(forked, "main-0", form)
        assert "torch imported False" in before, before
        assert "torch imported True" in after, after  # forked: pre-warming is off with --preload
        assert before.replace("torch imported False", "") == after.replace("torch imported True", ""), form
    script, module, code = (log_text(forked, "main-0", f) for f in ("script", "module", "code"))
    assert "SIGTERM handled" in script
    assert "ValueError: from the program" in module and "forkserver" not in module
    assert "warmstart" not in module
    assert 'File "<string>"' in code and "KeyboardInterrupt" in code
    status = json.loads((job_dir(forked) / "status.json").read_text())
    exits = {c["name"]: c["exitCode"] for c in status["pods"][0]["containers"]}
    assert exits == {"init": 0, "script": 7, "module": 1, "code": 130}
    assert leftovers(forked.id) == [] and leftovers(cold.id) == []


def _preloader(tmp_path: Path, modules: tuple[str, ...], work: Path) -> tuple[Preloader, ContainerRun]:
    process.set_child_subreaper(True)  # as the supervisor is: the forked process is reparented here
    env = {**os.environ, process.MARKER: f"preload-test-{os.getpid()}", "PYTHONUNBUFFERED": "1"}
    run_ = ContainerRun("app", "x", False, [sys.executable, "-u", "prog.py", "x"], env, str(work))
    preloader = Preloader(modules, tmp_path)
    return preloader, run_


def _fork(preloader: Preloader, run_: ContainerRun, log: Path) -> Forked | None:
    """Ask as the supervisor does, on its turns, until the server has imported (or is given up)."""
    deadline = time.monotonic() + 90
    while (answer := preloader.fork(run_, log)) == FORK_LATER:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert not isinstance(answer, str)
    return answer


def test_the_server_has_one_thread_and_no_cuda_when_it_forks(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "prog.py").write_text(
        "import os, sys, threading\n"
        "tasks = len(os.listdir('/proc/self/task'))\n"
        "print(sorted(os.listdir('/proc/self/fd'), key=int)[:-1])\n"  # the last: listdir's own
        "print(sys.argv, 'torch' in sys.modules, threading.active_count(), tasks)\n"
        "import torch\n"
        "print(torch.cuda.is_initialized(), torch.distributed.is_initialized())\n"
        "x = torch.ones(300, 300); x @ x; print(torch.get_num_threads() >= 1)\n"
        "raise SystemExit(5)\n"
    )
    preloader, run_ = _preloader(tmp_path, TORCH, work)
    try:
        assert preloader.accepts(run_)
        child = _fork(preloader, run_, tmp_path / "app.log")
        assert child is not None, preloader.why_off
        assert preloader.proc is not None
        # A session of its own, as a container's: under autogroup scheduling it gets a CPU share
        # of its own rather than one shared with what else runs in the caller's session.
        assert os.getsid(preloader.proc.pid) == preloader.proc.pid != os.getsid(0)
        server_threads = os.listdir(f"/proc/{preloader.proc.pid}/task")
        assert len(server_threads) == 1  # no intra-op pool, no OpenBLAS pool, nothing left running
        assert child.wait(60) == 5
        lines = (tmp_path / "app.log").read_text().splitlines()
        assert lines == ["['0', '1', '2']", "['prog.py', 'x'] True 1 1", "False False", "True"]
        again = preloader.fork(run_, tmp_path / "again.log")  # a restart forks again
        assert again is not None and again.wait(60) == 5 and again.pid != child.pid
    finally:
        preloader.close()
        process.set_child_subreaper(False)


def test_a_module_that_starts_a_thread_makes_every_container_start_cold(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "threader.py").write_text(
        "import threading, time\nthreading.Thread(target=time.sleep, args=(60,)).start()\n"
    )
    (work / "prog.py").write_text("import sys\nprint('threader' in sys.modules)\n")
    preloader, run_ = _preloader(tmp_path, ("threader",), work)
    try:
        assert preloader.accepts(run_)
        assert _fork(preloader, run_, tmp_path / "app.log") is None
        assert preloader.state == "off" and "thread" in preloader.why_off
    finally:
        preloader.close()
        process.set_child_subreaper(False)


def test_restarts_fork_again_and_an_init_failure_never_runs_the_program(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    flag = tmp_path / "failed-once"
    program = [
        "python",
        "-c",
        f"import os, sys; open({str(runs)!r}, 'a').write(str('torch' in sys.modules) + '\\n')\n"
        f"if not os.path.exists({str(flag)!r}): open({str(flag)!r}, 'w'); sys.exit(3)",
    ]
    ran = tmp_path / "ran"
    never = ["python", "-c", f"open({str(ran)!r}, 'w').write('ran')"]
    job = make_job(
        "again",
        [
            task("main", [container("app", program)], restart="OnFailure"),
            task("blocked", [container("app", never)], init=[container("init", sh("exit 4"))]),
        ],
    )
    result = run(job, tmp_path, timeout=60, preload=TORCH)
    pods = {p.name.split("-", 1)[1]: p for p in result.pods}
    assert pods["main-0"].restarts == 1 and pods["main-0"].exit_code == 0
    assert runs.read_text() == "True\nTrue\n"  # both runs forked from the server
    assert pods["blocked-0"].exit_code == 4 and not ran.exists()
    blocked = next(p for p in result.pods if p.name.endswith("blocked-0"))
    assert not (log_dir(result, blocked) / "app.log").exists() or log_text(result, "blocked-0", "app") == ""
    assert leftovers(result.id) == []


def test_env_that_torch_reads_at_import(tmp_path: Path) -> None:
    """A container whose spec sets such a variable differently from the server's starts cold; a
    program that sets one itself is warned, in one line."""
    setter = "import os, sys\nos.environ['OMP_NUM_THREADS'] = '1'\nos.environ['MKL_NUM_THREADS'] = '1'\n"
    setter += "print('torch' in sys.modules, os.environ['OMP_NUM_THREADS'])\n"
    probe = "import sys\nprint('torch' in sys.modules)\n"
    job = make_job(
        "envs",
        [
            task("a", [container("app", ["python", "-c", setter])]),
            task(
                "b",
                [container("app", ["python", "-c", probe], env=[{"name": "OMP_NUM_THREADS", "value": "1"}])],
            ),
        ],
    )
    result = run(job, tmp_path, timeout=60, preload=TORCH)
    first, second = log_text(result, "a-0", "app"), log_text(result, "b-0", "app")
    warning = "torchjob: warning: the program sets OMP_NUM_THREADS after torch was imported"
    assert first.startswith(warning) and first.count("torchjob: warning") == 1, first
    assert first.endswith("True 1\n")
    assert second == "False\n"  # started cold: the server imported torch without it


def test_a_bad_preload_flag_is_a_usage_error(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torchjob",
            "run",
            "--preload",
            "torch;rm",
            str(REPO / "examples" / "pytorch-job.yaml"),
        ],
        env={**os.environ, "TORCHJOB_HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "--preload" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "jobs").exists() or not any((tmp_path / "jobs").iterdir())


def test_the_example_job_runs_preloaded(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torchjob",
            "run",
            "--preload",
            "torch",
            str(REPO / "examples" / "pytorch-job.yaml"),
        ],
        env={**os.environ, "TORCHJOB_HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=110,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Completed" in proc.stdout
    job_dir = next((tmp_path / "jobs").iterdir())
    record = (job_dir / "preload.log").read_text()
    assert record.count("forked") == 3, record  # the master and 2 workers, those after their init containers
    for log in job_dir.glob("logs/*/attempt-0/*.log"):
        if log.name in ("master.log", "worker.log"):
            assert "sendrecv:" in log.read_text()
    job_id = job_dir.name
    assert leftovers(job_id) == []


def test_ctrl_c_while_the_server_imports_stops_the_job_at_once(tmp_path: Path) -> None:
    """The supervisor waits for the server's import when it forks the first container; a signal
    ends that wait (an import that hangs would otherwise hold the job for minutes)."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "slow.py").write_text("import time\ntime.sleep(60)\n")
    (work / "prog.py").write_text("print('ran')\n")
    job = make_job("slow", [task("main", [container("app", ["python", "prog.py"], workingDir=str(work))])])
    path = tmp_path / "slow.json"
    path.write_text(json.dumps(job_manifest(job)))
    home = tmp_path / "home"
    proc = subprocess.Popen(
        [sys.executable, "-m", "torchjob", "run", "-q", "--preload", "slow", str(path)],
        env={**os.environ, "TORCHJOB_HOME": str(home)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    jobs = home / "jobs"
    assert wait_until(lambda: any(jobs.glob("*/preload.log")), 30)
    job_id = next(jobs.iterdir()).name
    assert wait_until(lambda: len(leftovers(job_id)) >= 1, 10)  # the server, importing
    time.sleep(0.5)
    started = time.monotonic()
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=20) == 130
    assert time.monotonic() - started < 10  # not the import's 60 s
    assert leftovers(job_id) == []


@pytest.mark.parametrize(
    ("argv", "env", "same"),
    [
        (["-u", "-c", "print(1)"], {}, True),  # -c imports from the working directory, as the script's
        (["-u", "-m", "pkg.mod"], {}, True),
        (["-u", "other.py"], {"RANK": "3", "MASTER_ADDR": "x"}, True),  # per-pod variables are the program's
        (["-u", "prog.py"], {"TORCHJOB_POD_NAME": "p-1", "HOSTNAME": "p-1", "VC_TASK_INDEX": "1"}, True),
        (["-u", "prog.py"], {"TORCHDYNAMO_VERBOSE": "1"}, False),  # any other variable may be read at import
        (["-u", "prog.py"], {"MY_SETTING": "x"}, False),
        (["prog.py"], {}, False),  # other interpreter options: other sys.flags
        (["-u", "prog.py"], {"OMP_NUM_THREADS": "2"}, False),  # read by torch's OpenMP at import
        (["-u", "prog.py"], {"PYTHONHASHSEED": "0"}, False),  # read by the interpreter at start
        (["-u", "prog.py"], {"LC_ALL": "C"}, False),
        (["-u", "sub/prog.py"], {}, False),  # another script directory: another sys.path[0]
        (["-i", "prog.py"], {}, None),  # never forked: pre-warming's rules
    ],
)
def test_which_containers_share_the_server(
    tmp_path: Path, argv: list[str], env: dict[str, str], same: bool | None
) -> None:
    from torchjob.engines.local.preload import _key

    base = {"PATH": "/bin", "OMP_NUM_THREADS": "1"}
    first = ContainerRun("a", "x", False, [sys.executable, "-u", "prog.py"], base, str(tmp_path))
    other = ContainerRun("b", "x", False, [sys.executable, *argv], {**base, **env}, str(tmp_path))
    key = _key(other)
    if same is None:
        assert key is None
    else:
        assert (key == _key(first)) == same


@pytest.mark.torch
def test_an_sdk_task_returns_the_same_value_cold_and_preloaded(tmp_path: Path) -> None:
    """`torchjob run FILE.py:TASK`: the ranks of an SDK task forked from the server give what cold
    ranks give (the elastic example: 2 processes in one pod, a real gloo all-reduce)."""
    results: dict[str, list[str]] = {}
    ref = f"{REPO / 'examples' / 'sdk' / 'allreduce.py'}:allreduce"
    for mode, flags in (("cold", ["--no-prewarm"]), ("preload", ["--preload", "torch"])):
        home = tmp_path / mode
        proc = subprocess.run(
            [sys.executable, "-m", "torchjob", "run", *flags, ref, "--", "--scale", "2"],
            env={**os.environ, "TORCHJOB_HOME": str(home)},
            capture_output=True, text=True, timeout=200, cwd=REPO,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stdout + proc.stderr
        results[mode] = [line.split("| ", 1)[1] for line in proc.stdout.splitlines() if "returned" in line]
        job_dir = next((home / "jobs").iterdir())
        forked = (job_dir / "preload.log").read_text().count("forked") if mode == "preload" else 0
        assert forked == (1 if mode == "preload" else 0), mode
        assert leftovers(job_dir.name) == []
    assert (
        results["cold"] == results["preload"] == ["torchjob: rank 0 returned {'world_size': 2.0, 'sum': 6.0}"]
    )


def test_the_server_imports_with_no_pods_variables_and_forks_only_an_equal_environment(
    tmp_path: Path,
) -> None:
    """A preloaded module sees no pod's name; a pod whose environment differs in any variable (here
    TORCHDYNAMO_VERBOSE, which no list of prefixes named) starts cold, so that what its imports
    read is its own."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "seen.py").write_text(
        "import ctypes, os  # as torch does: the server needs ctypes\n"
        "POD = os.environ.get('TORCHJOB_POD_NAME')\nDYN = os.environ.get('TORCHDYNAMO_VERBOSE')\n"
    )
    (work / "prog.py").write_text(
        "import os, seen\n"
        "print('import', seen.POD, seen.DYN)\n"
        "print('run', os.environ['TORCHJOB_POD_NAME'], os.environ.get('TORCHDYNAMO_VERBOSE'))\n"
    )
    app = container("app", ["python", "prog.py"], workingDir=str(work))
    dynamo = container(
        "app",
        ["python", "prog.py"],
        workingDir=str(work),
        env=[{"name": "TORCHDYNAMO_VERBOSE", "value": "1"}],
    )
    job = make_job("podenv", [task("a", [app], replicas=2), task("b", [dynamo])])
    result = run(job, tmp_path, timeout=60, preload=("seen",))
    assert result.ok, result.reason
    for pod in ("a-0", "a-1", "b-0"):
        lines = dict(line.split(" ", 1) for line in log_text(result, pod, "app").splitlines())
        run_pod, run_dyn = lines["run"].split()
        import_pod, import_dyn = lines["import"].split()
        assert import_dyn == run_dyn, (pod, lines)  # what the import read is the pod's own
        assert import_pod in ("None", run_pod), (pod, lines)  # never another pod's name
    record = (job_dir(result) / "preload.log").read_text()
    assert record.count("forked") == 2, record  # a-0 and a-1; b-0 cold
    assert log_text(result, "a-1", "app").startswith("import None None\n")
    assert leftovers(result.id) == []


def _slow_preload_job(tmp_path: Path) -> Path:
    work = tmp_path / "work"
    work.mkdir()
    (work / "slow.py").write_text("import time\ntime.sleep(60)\n")
    (work / "prog.py").write_text("print('ran')\n")
    job = make_job("slow", [task("main", [container("app", ["python", "prog.py"], workingDir=str(work))])])
    path = tmp_path / "slow.json"
    path.write_text(json.dumps(job_manifest(job)))
    return path


def test_the_deadline_holds_while_the_server_imports(tmp_path: Path) -> None:
    """The supervisor never waits for the server's import: --timeout, policies and status go on."""
    home = tmp_path / "home"
    started = time.monotonic()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torchjob",
            "run",
            "--timeout",
            "3",
            "--preload",
            "slow",
            str(_slow_preload_job(tmp_path)),
        ],
        env={**os.environ, "TORCHJOB_HOME": str(home)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    took = time.monotonic() - started
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "deadline of 3s passed" in proc.stdout + proc.stderr
    assert took < 20, took  # not the import's 60 s
    job_id = next((home / "jobs").iterdir()).name
    assert leftovers(job_id) == []


def test_a_preload_that_cannot_be_used_is_said_once_on_the_console(tmp_path: Path) -> None:
    # A module that exists (a misspelt one is refused before start) but fails as it is imported.
    (tmp_path / "no_such_module_here.py").write_text("raise RuntimeError('cannot be imported')\n")
    app = container("app", ["python", "-c", "print('ran')"], workingDir=str(tmp_path))
    job = make_job("nopre", [task("main", [app], replicas=2)])
    path = tmp_path / "nopre.json"
    path.write_text(json.dumps(job_manifest(job)))
    proc = subprocess.run(
        [sys.executable, "-m", "torchjob", "run", "--preload", "no_such_module_here", str(path)],
        env={**os.environ, "TORCHJOB_HOME": str(tmp_path / "home")},
        capture_output=True,
        text=True,
        timeout=60,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    said = [line for line in output.splitlines() if "--preload no_such_module_here" in line]
    assert len(said) == 1, output
    assert (
        "the fork server cannot be used (the import failed or printed something); containers start cold"
        in said[0]
    )
    assert output.count("ran") == 2


def test_a_preload_no_container_can_use_is_said_once(tmp_path: Path) -> None:
    job = make_job("shonly", [task("main", [container("app", sh("echo ran"))], replicas=2)])
    path = tmp_path / "shonly.json"
    path.write_text(json.dumps(job_manifest(job)))
    proc = subprocess.run(
        [sys.executable, "-m", "torchjob", "run", "--preload", "json", str(path)],
        env={**os.environ, "TORCHJOB_HOME": str(tmp_path / "home")},
        capture_output=True,
        text=True,
        timeout=60,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    said = [line for line in output.splitlines() if "--preload json" in line]
    assert len(said) == 1, output
    assert "no container runs torchjob's python in a form the fork server can serve" in said[0]


# Runs forkserver.py's _fork as the server would, on a request for a container that exits at once
# with 42; argv: forkserver.py, "one" (clone with CLONE_PARENT) or "two" (the two forks).
_FORK_PROBE = r"""
import ctypes, os, sys
server = {"__name__": "probe", "__builtins__": __builtins__}
exec(compile(open(sys.argv[1]).read(), sys.argv[1], "exec"), server)
if sys.argv[2] == "two":
    server["_clone"].append(None)  # as where clone cannot be used
requests_r, requests_w = os.pipe()
replies_r, replies_w = os.pipe()
log = sys.argv[3]
request = [os.getcwd().encode(), log.encode(), b"1", b"prog.py", b"ONLY=this"]
if server["_fork"](b"\0".join(request), requests_r, replies_w) is not None:  # in the container's process
    os._exit(42 if os.environ == {"ONLY": "this"} else 43)
print(os.read(replies_r, 100).decode().strip(), flush=True)
"""


@pytest.mark.parametrize("forks", ["one", "two"])
def test_a_forked_container_is_the_engines_child(tmp_path: Path, forks: str) -> None:
    """The server's fork: the container's process is a child of the server's parent (here, this
    process) whether made by one clone or by two forks, and this process waits for it."""
    from torchjob.engines.local import forkserver

    process.set_child_subreaper(forks == "two")  # only the two forks need it, as the supervisor is
    try:
        proc = subprocess.run(
            [sys.executable, "-c", _FORK_PROBE, forkserver.__file__, forks, str(tmp_path / "c.log")],
            capture_output=True, text=True, timeout=60, cwd=tmp_path,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        forked, reply = proc.stdout.splitlines()  # the server's record (preload.log), its reply
        word, pid = reply.split()
        assert word == "pid" and forked.startswith(f"forked {int(pid):08d}")
        done, status = os.waitpid(int(pid), 0)  # only a child of this process can be waited for
        assert done == int(pid) and os.waitstatus_to_exitcode(status) == 42
    finally:
        process.set_child_subreaper(False)


def _spares_of(server: int) -> list[int]:
    """This process's live children in the fork server's session, bar the server: its spares."""
    import psutil

    found = []
    for child in psutil.Process().children():
        try:
            ours = child.pid != server and os.getsid(child.pid) == server
            if ours and child.status() != psutil.STATUS_ZOMBIE:
                found.append(child.pid)
        except (OSError, psutil.Error):
            continue
    return found


def test_a_kept_servers_spares_take_the_next_containers_and_are_no_jobs_orphans(tmp_path: Path) -> None:
    """The warm pool's server forks a spare per container once those it forked have ended: an idle
    child of this process in the server's session, which the orphan scans leave alone and which is handed the
    next container (then in a session of its own); a spare killed while idle is skipped and
    reaped, and the server's end takes its spares with it."""
    from torchjob.engines.local import proctree

    work = tmp_path / "work"
    work.mkdir()
    (work / "prog.py").write_text(
        "import ctypes, os, time\nreaper = ctypes.c_int()\n"
        "ctypes.CDLL(None).prctl(37, ctypes.byref(reaper), 0, 0, 0)  # PR_GET_CHILD_SUBREAPER\n"
        "print('ids', os.getpid(), os.getsid(0), os.getpgid(0), reaper.value, flush=True)\n"
        "deadline = time.monotonic() + 30\n"
        "while os.path.exists('hold') and time.monotonic() < deadline:\n    time.sleep(0.01)\n"
    )
    preloader, run_ = _preloader(tmp_path, ("ctypes",), work)
    preloader.pooled = True  # kept for the next jobs: it forks spares
    try:
        assert preloader.accepts(run_)
        first = _fork(preloader, run_, tmp_path / "1.log")
        assert first is not None and first.wait(30) == 0
        assert preloader.proc is not None
        server = preloader.proc.pid
        assert wait_until(lambda: len(_spares_of(server)) == 1, 30)
        (spare,) = _spares_of(server)
        tree = proctree.children_map()
        assert spare not in proctree.adopted(tree, set(), "another-job")  # a server's, not an orphan
        proctree.HELPERS.discard(server)
        try:
            assert spare in proctree.adopted(tree, set(), "another-job")  # what the rule keeps out
        finally:
            proctree.HELPERS.add(server)
        second = _fork(preloader, run_, tmp_path / "2.log")
        assert second is not None and second.pid == spare and preloader.spares.pids == []
        assert second.wait(30) == 0
        # Its own session and group, and it adopts its orphans, as a cold start's process.
        assert f"ids {spare} {spare} {spare} 1" in (tmp_path / "2.log").read_text()
        assert wait_until(lambda: len(_spares_of(server)) == 1, 30)  # its end: the next spare
        (killed,) = _spares_of(server)
        assert killed != spare
        os.kill(killed, signal.SIGKILL)
        assert wait_until(lambda: _spares_of(server) == [], 10)
        third = _fork(preloader, run_, tmp_path / "3.log")  # a new fork: the dead spare is skipped
        assert third is not None and third.pid != killed and third.wait(30) == 0
        with pytest.raises(ChildProcessError):
            os.waitpid(killed, os.WNOHANG)  # reaped when the server told of it
        assert wait_until(lambda: len(_spares_of(server)) == 1, 30)
        (last,) = _spares_of(server)
        # Two containers at once; spares are asked for once both have ended, not while one runs.
        (work / "hold").touch()
        one, two = _fork(preloader, run_, tmp_path / "4.log"), _fork(preloader, run_, tmp_path / "5.log")
        assert one is not None and two is not None and one.pid == last
        os.kill(one.pid, signal.SIGKILL)
        assert one.wait(30) == -signal.SIGKILL
        assert preloader.spares.asked == 0 and preloader.spares.pids == []
        (work / "hold").unlink()
        assert two.wait(30) == 0
        assert preloader.spares.asked + len(preloader.spares.pids) == 2
        assert wait_until(lambda: len(_spares_of(server)) == 2, 30)
        lasts = _spares_of(server)
        # A container that a spare cannot set up (its log cannot be opened) starts cold, as one
        # freshly forked would; the spare, ended, is reaped, and the server serves on.
        assert _fork(preloader, run_, tmp_path / "missing" / "6.log") is None
        failed = [pid for pid in lasts if pid not in _spares_of(server)]
        assert len(failed) == 1 and preloader.state == "ready"
        with pytest.raises(ChildProcessError):
            os.waitpid(failed[0], os.WNOHANG)
    finally:
        preloader.close()
        process.set_child_subreaper(False)
    for pid in lasts:
        with pytest.raises(ChildProcessError):  # ended with the server, and reaped
            os.waitpid(pid, os.WNOHANG)
