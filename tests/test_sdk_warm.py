"""Warm calls (issue 23): a process's later calls of a task fork their ranks from its warm pool.

Each test runs a real Python script calling real 2-rank gloo tasks on the local engine, so that the
pool (one per process) and its end are those of that script alone.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

pytest.importorskip("torch", reason="torch is not installed")
pytestmark = [pytest.mark.torch, pytest.mark.timeout(300)]

TASK_MODULE = textwrap.dedent(
    """
    import os, sys
    from torchjob import PyTorch, Worker, task

    VERSION = 1

    def body(x):
        import torch, torch.distributed as dist
        dist.init_process_group("gloo")
        t = torch.tensor([float(x)])
        dist.all_reduce(t)
        print(f"rank {dist.get_rank()} of call {x}", flush=True)
        leaked = globals().get("LEAK")
        globals()["LEAK"] = "set by an earlier call"
        return {"sum": t.item(), "leaked": leaked, "version": VERSION, "env": dict(os.environ),
                "pid": os.getpid(), "ids": [os.getsid(0), os.getpgid(0)]}

    allreduce = task(task_config=PyTorch(worker=Worker(replicas=1)))(body)
    cold = task(task_config=PyTorch(worker=Worker(replicas=1)), warm=False)(body)
    """
)

SCRIPT = textwrap.dedent(
    """
    import json, os, sys, time
    import warmtask
    from torchjob.engines.local import pool

    def forks():
        return (pool._home[0] / "preload.log").read_text().count("forked ") if pool._home else 0

    out = {}
    out["first"] = warmtask.allreduce(1)
    out["forks_after_first"] = forks()
    out["second"] = warmtask.allreduce(2)
    out["forks_after_second"] = forks()
    os.environ["SET_BY_THE_NOTEBOOK"] = "1"  # a new environment: a new server, warm again after
    warmtask.allreduce(0)
    out["forks_before_new_env"] = forks()
    warmtask.allreduce(0)
    out["forks_after_new_env"] = forks()
    del os.environ["SET_BY_THE_NOTEBOOK"]
    warmtask.allreduce(0)  # the first environment again: its server was kept as the spare
    out["forks_back"] = forks()
    out["servers_started"] = (pool._home[0] / "preload.log").read_text().count("imported ")
    out["keyword"] = warmtask.cold(3)
    out["forks_after_keyword"] = forks()
    os.environ["TORCHJOB_WARM"] = "0"
    out["env_off"] = warmtask.allreduce(4)
    out["forks_after_env_off"] = forks()
    del os.environ["TORCHJOB_WARM"]
    source = open("warmtask.py").read().replace("VERSION = 1", "VERSION = 2")
    with open("warmtask.py", "w") as f:
        f.write(source)
    later = time.time() + 5
    os.utime("warmtask.py", (later, later))  # a new mtime even within the clock's resolution
    out["edited"] = warmtask.allreduce(5)
    kept = [s for _, s in pool._pools.values()] + list(pool._spares.values())
    out["servers"] = [s.proc.pid for s in kept if s.proc is not None]
    print("RESULT " + json.dumps(out), flush=True)
    """
)

# Set per pod or per job, for programs to read: differ between any two calls, warm or cold.
PER_CALL = ("TORCHJOB_", "VC_", "VK_")
PER_CALL_NAMES = {"HOSTNAME", "MASTER_ADDR", "MASTER_PORT", "PATH", "PYTHON_EXEC", "TMPDIR"}


def _comparable(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if not k.startswith(PER_CALL) and k not in PER_CALL_NAMES}


def _script(tmp_path: Path, body: str) -> Path:
    (tmp_path / "warmtask.py").write_text(TASK_MODULE)
    script = tmp_path / "main.py"
    script.write_text(body)
    return script


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "TORCHJOB_WARM"}
    env["TORCHJOB_HOME"] = str(tmp_path / "home")
    return env


def _run(script: Path, env: dict[str, str], timeout: float = 280) -> subprocess.CompletedProcess[str]:
    """``python SCRIPT`` in its folder, which must end with exit code 0."""
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=script.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def _result(stdout: str, missing: str | None = None) -> Any:
    """The JSON a script printed on its ``RESULT`` line (``missing`` stands for an absent one)."""
    lines = (x for x in stdout.splitlines() if x.startswith("RESULT "))
    line = next(lines) if missing is None else next(lines, "RESULT " + missing)
    return json.loads(line[len("RESULT ") :])


def test_later_calls_fork_fresh_ranks_with_a_cold_calls_environment(tmp_path: Path) -> None:
    script = _script(tmp_path, SCRIPT)
    done = _run(script, _env(tmp_path))
    out = _result(done.stdout)
    assert [out[k]["sum"] for k in ("first", "second", "keyword", "env_off", "edited")] == [2, 4, 6, 8, 10]
    # Every call's rank output is echoed, a warm call's too (it ends before the logs are first read).
    for x in range(1, 6):
        assert (
            f"master-0 | rank 0 of call {x}" in done.stdout
            and f"worker-0 | rank 1 of call {x}" in done.stdout
        )
    assert out["forks_after_second"] == out["forks_after_first"] + 2  # both ranks of the 2nd call forked
    # A variable set between calls: the server is replaced, and the calls after are forked again.
    assert out["forks_after_new_env"] == out["forks_before_new_env"] + 2
    assert out["forks_back"] == out["forks_after_new_env"] + 2 and out["servers_started"] == 2
    assert out["forks_after_keyword"] == out["forks_back"]  # @task(warm=False): cold
    assert out["forks_after_env_off"] == out["forks_after_keyword"]  # TORCHJOB_WARM=0: cold
    # Fresh processes: what one call set in its module's globals is not there in the next one.
    assert out["first"]["leaked"] is None and out["second"]["leaked"] is None
    assert out["first"]["pid"] != out["second"]["pid"]
    # The environment of a forked rank is a cold rank's (bar what differs between any two calls).
    assert _comparable(out["second"]["env"]) == _comparable(out["env_off"]["env"])
    # An edit of the task's module takes effect in the next call (a new server imports it).
    assert out["edited"]["version"] == 2
    # The servers ended with the script (atexit).
    for pid in out["servers"]:
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


SPARES = textwrap.dedent(
    """
    import json, os, signal, time
    import psutil
    import warmtask
    from torchjob.engines.local import pool

    def spares():  # this process's live children in the server's session, bar the server
        found = []
        for child in psutil.Process().children():
            try:
                if child.pid != server and os.getsid(child.pid) == server and child.status() != "zombie":
                    found.append(child.pid)
            except (OSError, psutil.Error):
                pass
        return sorted(found)

    def wait_for(count):
        deadline = time.monotonic() + 60
        while len(spares()) != count and time.monotonic() < deadline:
            time.sleep(0.02)
        return spares()

    out = {"first": warmtask.allreduce(1)}
    server = next(iter(pool._pools.values()))[1].proc.pid
    out["spares"] = wait_for(2)  # forked after the first call, one per rank it forked
    out["cold"] = warmtask.cold(2)  # a cold job beside them: its orphan sweeps leave them alone
    out["spares_after_cold"] = spares()
    out["second"] = warmtask.allreduce(3)
    out["spares_after_second"] = wait_for(2)
    for pid in out["spares_after_second"]:
        os.kill(pid, signal.SIGKILL)  # killed while idle: the next call forks anew
    wait_for(0)
    out["third"] = warmtask.allreduce(4)
    zombies = [c.pid for c in psutil.Process().children() if c.status() == "zombie"]
    out["killed_left"] = sorted(set(zombies) & set(out["spares_after_second"]))
    out["spares_at_the_end"] = wait_for(2)
    print("RESULT " + json.dumps(out), flush=True)
    """
)


def test_the_ranks_of_a_call_are_the_spares_forked_after_the_one_before(tmp_path: Path) -> None:
    """After a warm call the server forks a spare per rank (idle children of the caller in its
    session); the next call's ranks are those spares, each in a session and group of its own with
    nothing of an earlier call; a cold job's sweeps leave the spares alone; spares killed while
    idle are reaped and the next call forks anew; the caller's end takes the spares with it."""
    script = _script(tmp_path, SPARES)
    done = _run(script, _env(tmp_path))
    out = _result(done.stdout)
    assert [out[k]["sum"] for k in ("first", "cold", "second", "third")] == [2, 4, 6, 8]
    assert len(out["spares"]) == 2 and out["spares_after_cold"] == out["spares"]
    second = out["second"]
    assert second["pid"] in out["spares"] and second["ids"] == [second["pid"], second["pid"]]
    assert second["leaked"] is None
    assert out["third"]["pid"] not in out["spares_after_second"] and out["killed_left"] == []
    for pid in out["spares_at_the_end"]:  # ended with the script (atexit)
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


FIRST_CALL = textwrap.dedent(
    """
    import json, time
    import warmtask
    from torchjob.engines.local import pool, runner

    runner.FORK_RETRY = 120.0  # the retry a container waiting for the server's import would wait for
    started = time.monotonic()
    first = warmtask.allreduce(1)
    took = time.monotonic() - started
    forks = (pool._home[0] / "preload.log").read_text().count("forked ")
    print("RESULT " + json.dumps({"sum": first["sum"], "took": took, "forks": forks}), flush=True)
    """
)


def test_the_first_calls_ranks_start_the_moment_the_server_has_imported(tmp_path: Path) -> None:
    """The first call's ranks wait for the pool's server to import torch; the supervisor wakes for
    its answer instead of trying them again on a timer (which here is 120 s)."""
    script = _script(tmp_path, FIRST_CALL)
    done = _run(script, _env(tmp_path))
    out = _result(done.stdout)
    assert out["sum"] == 2 and out["forks"] == 2  # both ranks forked from the server
    assert out["took"] < 60, out  # torch's import, even on a loaded machine; not the 120 s retry


KILLED = textwrap.dedent(
    """
    import os, sys, time
    import warmtask
    from torchjob.engines.local import pool
    warmtask.allreduce(1)
    servers = [s.proc.pid for _, s in pool._pools.values() if s.proc is not None]
    print("SERVERS " + " ".join(map(str, servers)), flush=True)
    time.sleep(300)
    """
)


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def test_a_killed_caller_leaves_no_server(tmp_path: Path) -> None:
    script = _script(tmp_path, KILLED)
    proc = subprocess.Popen(
        [sys.executable, str(script)], cwd=tmp_path, env=_env(tmp_path), stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        line = ""
        for line in proc.stdout:  # the ranks' output comes first
            if line.startswith("SERVERS"):
                break
        servers = [int(p) for p in line.split()[1:]]
        assert line.startswith("SERVERS") and servers, line
        assert all(psutil.pid_exists(p) for p in servers)

        def spares() -> list[int]:  # the caller's children in a server's session (forked.py)
            children = psutil.Process(proc.pid).children()
            return [c.pid for c in children if c.pid not in servers and os.getsid(c.pid) in servers]

        deadline = time.monotonic() + 30
        while len(spares()) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        servers += spares()
        assert len(servers) == 3  # the server and a spare per rank of the call
        proc.send_signal(signal.SIGKILL)  # as a notebook kernel killed: no atexit
        proc.wait(10)
        deadline = time.monotonic() + 10
        while any(_alive(p) for p in servers) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(_alive(p) for p in servers)
    finally:
        proc.kill()
        proc.wait(10)


FORKED = textwrap.dedent(
    """
    import os, sys
    import warmtask
    from torchjob.engines.local import pool
    warmtask.allreduce(1)
    server = next(iter(pool._pools.values()))[1]
    pid = os.fork()
    if pid == 0:  # a child of the caller (multiprocessing's fork) calls the task: its own pool
        value = warmtask.allreduce(2)["sum"]
        os._exit(0 if value == 4 else 3)
    _, status = os.waitpid(pid, 0)
    print("CHILD", os.waitstatus_to_exitcode(status), flush=True)
    print("STATE", server.state, server.proc is not None and server.proc.poll() is None, flush=True)
    print("AGAIN", warmtask.allreduce(3)["sum"], flush=True)
    """
)


def test_a_forked_caller_does_not_use_or_end_its_parents_server(tmp_path: Path) -> None:
    script = _script(tmp_path, FORKED)
    done = _run(script, _env(tmp_path))
    assert "CHILD 0" in done.stdout, done.stdout + done.stderr[-2000:]
    assert "STATE ready True" in done.stdout, done.stdout  # the parent's server is untouched
    assert "AGAIN 6.0" in done.stdout, done.stdout


def test_an_elastic_call_leaves_the_callers_environment_as_it_was(monkeypatch: pytest.MonkeyPatch) -> None:
    """The launcher's OMP_NUM_THREADS=1 is for its workers: it stayed in the caller's os.environ,
    so every later call (and the warm pool's environment) differed from the first."""
    from torchjob import Elastic, task

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    two = task(task_config=Elastic(nproc_per_node=2))(_omp)
    assert two() == "1"  # the workers had it
    assert "OMP_NUM_THREADS" not in os.environ


def _omp() -> str | None:
    return os.environ.get("OMP_NUM_THREADS")


ELASTIC = textwrap.dedent(
    """
    import json, os
    import multiprocessing.forkserver as forkserver
    from torchjob import Elastic, task

    @task(task_config=Elastic(nproc_per_node=2))
    def parent(x):
        leaked = globals().get("LEAK")
        globals()["LEAK"] = 1
        return os.getppid(), leaked, os.environ.get("OMP_NUM_THREADS")

    out = {"first": parent(1), "second": parent(2)}
    out["server"] = forkserver._forkserver._forkserver_pid
    os.environ["TORCHJOB_WARM"] = "0"
    out["cold"] = parent(3)
    out["caller"] = os.getpid()
    print("RESULT " + json.dumps(out), flush=True)
    """
)


def test_single_node_elastic_workers_are_forked_from_a_server(tmp_path: Path) -> None:
    script = tmp_path / "elastic_main.py"
    script.write_text(ELASTIC)
    done = _run(script, _env(tmp_path))
    out = _result(done.stdout)
    assert out["server"] is not None and out["second"][0] == out["server"]  # forked from the server
    assert out["first"][1] is None and out["second"][1] is None  # fresh workers every call
    assert out["second"][2] == out["cold"][2] == "1"
    assert out["cold"][0] != out["server"]  # TORCHJOB_WARM=0: spawned as before


HELD_OPEN = textwrap.dedent(
    """
    import json, os, signal, time
    import multiprocessing.forkserver as forkserver
    from torchjob import Elastic, task

    @task(task_config=Elastic(nproc_per_node=2))
    def parent(x):
        return os.getppid()

    first = parent(1)
    old = forkserver._forkserver._forkserver_pid
    holder = os.fork()  # any fork of the caller holds the server's "alive" pipe open
    if holder == 0:
        time.sleep(120)
        os._exit(0)
    os.environ["CHANGED_BY_THE_USER"] = "1"  # the server no longer fits: it is replaced
    started = time.monotonic()
    second = parent(2)
    took = time.monotonic() - started
    os.kill(holder, signal.SIGKILL)
    os.waitpid(holder, 0)
    try:
        os.kill(old, 0)
        old_alive = True
    except ProcessLookupError:
        old_alive = False
    new = forkserver._forkserver._forkserver_pid
    print("RESULT " + json.dumps({"old": old, "new": new, "second": second, "took": took,
                                  "old_alive": old_alive}), flush=True)
    """
)


def test_a_server_that_does_not_stop_when_asked_is_killed_not_waited_for(tmp_path: Path) -> None:
    # A fork of the caller kept the old server's pipe open, so it never saw the caller let go:
    # replacing it waited for it forever (a 300 s hang in CI). It is now killed after a grace.
    script = tmp_path / "held_open.py"
    script.write_text(HELD_OPEN)
    done = _run(script, _env(tmp_path), timeout=200)
    out = _result(done.stdout)
    assert out["new"] not in (None, out["old"]) and out["second"] == out["new"]  # a new server served
    assert not out["old_alive"]
    assert out["took"] < 60, out


MULTI_NODE = textwrap.dedent(
    """
    import json, os, sys
    from torchjob import Elastic, task

    @task(task_config=Elastic(nnodes=2, nproc_per_node=2))
    def ranks(x):
        import torch, torch.distributed as dist
        dist.init_process_group("gloo")
        t = torch.tensor([float(x)])
        dist.all_reduce(t)
        with open("/proc/self/cmdline", "rb") as f:
            spawned = b"multiprocessing.spawn" in f.read()  # spawn's child runs a new interpreter
        leaked = globals().get("LEAK")
        globals()["LEAK"] = 1
        envs = [None] * dist.get_world_size()
        mine = {k: v for k, v in os.environ.items() if k not in ("RANK", "LOCAL_RANK", "GROUP_RANK",
                "ROLE_RANK", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_ERROR_FILE")}
        dist.all_gather_object(envs, (spawned, leaked, mine))
        return t.item(), envs

    out = {"first": ranks(1), "second": ranks(2)}
    os.environ["TORCHJOB_WARM"] = "0"
    out["cold"] = ranks(3)
    print("RESULT " + json.dumps(out), flush=True)
    """
)


def test_multi_node_elastic_ranks_are_forked_from_each_agents_server(tmp_path: Path) -> None:
    script = tmp_path / "multi_main.py"
    script.write_text(MULTI_NODE)
    temp = tmp_path / "tmp"
    temp.mkdir()
    done = _run(script, dict(_env(tmp_path), TMPDIR=str(temp)))
    out = _result(done.stdout)
    assert out["first"][0] == 4.0 and out["second"][0] == 8.0 and out["cold"][0] == 12.0
    assert "after torch was imported" not in done.stdout + done.stderr  # no preload warning
    second, cold = out["second"][1], out["cold"][1]
    assert len(second) == 4
    assert [spawned for spawned, _, _ in second] == [False] * 4  # forked: no new interpreter
    assert [spawned for spawned, _, _ in cold] == [True] * 4  # TORCHJOB_WARM=0: spawned as before
    assert [leaked for _, leaked, _ in second] == [None] * 4  # fresh ranks every call
    for (_, _, warm_env), (_, _, cold_env) in zip(second, cold, strict=True):
        assert _comparable(warm_env) == _comparable(cold_env)
    assert [p.name for p in temp.iterdir() if p.name.startswith(("pymp-", "ranks-"))] == []  # no socket left


KILLED_MULTI_NODE = textwrap.dedent(
    """
    import os, sys, time
    from torchjob import Elastic, task

    @task(task_config=Elastic(nnodes=2, nproc_per_node=2))
    def hang(call):
        if call == 2:
            with open(f"rank-{os.environ['RANK']}", "w") as f:
                f.write(f"{os.getpid()} {os.getppid()}")
            time.sleep(300)
        return call

    hang(1)
    hang(2)
    """
)


def test_a_killed_caller_leaves_no_warm_rank_or_rank_server(tmp_path: Path) -> None:
    script = tmp_path / "killed_main.py"
    script.write_text(KILLED_MULTI_NODE)
    proc = subprocess.Popen(
        [sys.executable, str(script)], cwd=tmp_path, env=_env(tmp_path), stdout=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 200
        files = [tmp_path / f"rank-{r}" for r in range(4)]
        while not all(f.exists() and f.read_text() for f in files) and time.monotonic() < deadline:
            assert proc.poll() is None
            time.sleep(0.1)
        pids = {int(p) for f in files for p in f.read_text().split()}  # ranks and their parents
        assert len(pids) == 6  # 4 ranks, forked by 2 servers (one per node's agent)
        assert all(psutil.pid_exists(p) for p in pids)
        proc.send_signal(signal.SIGKILL)  # as a notebook kernel killed: no atexit
        proc.wait(10)
        deadline = time.monotonic() + 20
        while any(psutil.pid_exists(p) for p in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(psutil.pid_exists(p) for p in pids)
    finally:
        proc.kill()
        proc.wait(10)


THREAD_TASK = textwrap.dedent(
    """
    import os, time
    from torchjob import PyTorch, Worker, task

    def body(x, hold=""):
        import torch, torch.distributed as dist
        dist.init_process_group("gloo")  # MASTER_ADDR is the master pod's name: /etc/hosts
        t = torch.tensor([float(x)])
        dist.all_reduce(t)
        if hold:  # tell the caller this call runs, then wait (bounded) until it says go on
            open(hold + ".running", "w").close()
            deadline = time.monotonic() + 60
            while not os.path.exists(hold + ".go") and time.monotonic() < deadline:
                time.sleep(0.02)
        dist.destroy_process_group()
        return t.item()

    allreduce = task(task_config=PyTorch(worker=Worker(replicas=1)))(body)
    """
)

THREADS = textwrap.dedent(
    """
    import json, os, threading, time
    import threadtask
    from torchjob.engines.local import pool

    results = {}

    def call(x, hold=""):
        try:
            results[x] = threadtask.allreduce(x, hold)
        except BaseException as err:
            results[x] = repr(err)[:2000]

    def wait_for(path):
        deadline = time.monotonic() + 120
        while not os.path.exists(path) and time.monotonic() < deadline:
            time.sleep(0.02)

    call(1)  # the pool's server is ready
    # Two calls started at once from two threads.
    both = [threading.Thread(target=call, args=(x,)) for x in (10, 100)]
    for thread in both:
        thread.start()
    for thread in both:
        thread.join(120)
    # A call that ends while another thread's call, forked from the pool after it started, still
    # runs: its end must leave the other's ranks (children of this process too) alone.
    def start(x, hold):
        thread = threading.Thread(target=call, args=(x, os.path.abspath(hold)))
        thread.start()
        wait_for(hold + ".running")
        return thread

    def forks():
        return (pool._home[0] / "preload.log").read_text().count("forked ")

    warm = start(1000, "a")  # holds the pool
    cold = start(10000, "b")  # the pool is busy: cold
    open("a.go", "w").close()
    warm.join(120)
    before = forks()
    later = start(100000, "c")  # forked from the pool after the cold call started
    open("b.go", "w").close()
    cold.join(120)
    open("c.go", "w").close()
    later.join(120)
    # Counted once the call is over: the server writes a fork's line after the forked rank runs,
    # so a busy machine may see the rank's file first. No other call used the pool meanwhile.
    results["forked"] = forks() - before
    print("RESULT " + json.dumps(results), flush=True)
    """
)


def test_calls_from_two_threads_at_once(tmp_path: Path) -> None:
    """The pool serves one call at a time (its /etc/hosts view and request pipe are single);
    a call made meanwhile from another thread starts cold, and neither job takes the other's
    processes for its own."""
    (tmp_path / "threadtask.py").write_text(THREAD_TASK)
    script = tmp_path / "main.py"
    script.write_text(THREADS)
    done = _run(script, _env(tmp_path))
    results = _result(done.stdout, missing="{}")
    expected = {"1": 2.0, "10": 20.0, "100": 200.0, "1000": 2000.0, "10000": 20000.0, "100000": 200000.0}
    assert results == {**expected, "forked": 2}, done.stdout[-3000:]


NET_TASK = textwrap.dedent(
    """
    import os, socket, time
    from torchjob import PyTorch, Worker, task

    def body(x, fail=False):
        import torch, torch.distributed as dist
        if fail and os.environ["RANK"] == "1":  # once the master's store listens: this rank fails
            deadline = time.monotonic() + 60
            master = (os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]))
            while time.monotonic() < deadline:
                try:
                    socket.create_connection(master).close()
                    break
                except OSError:
                    time.sleep(0.05)
            raise ValueError("rank 1 fails")
        dist.init_process_group("gloo")
        t = torch.tensor([float(x)])
        dist.all_reduce(t)
        dist.destroy_process_group()
        return t.item(), os.readlink("/proc/self/ns/net")

    allreduce = task(task_config=PyTorch(worker=Worker(replicas=1)))(body)
    """
)

SERVER_ENDS = textwrap.dedent(
    """
    import contextlib, json, os, signal, threading, time
    import nettask
    from torchjob.engines.local import pool

    def forks():
        return (pool._home[0] / "preload.log").read_text().count("forked ") if pool._home else 0

    def server():
        return next(iter(pool._pools.values()))[1]

    out = {}
    first = threading.Thread(target=lambda: out.__setitem__("first", nettask.allreduce(1)))
    first.start()  # the first call from a thread that then ends (a thread pool's worker, say)
    first.join(240)
    out["forks_first"] = forks()
    time.sleep(0.5)
    killed = server().proc
    out["alive_after_the_thread"] = killed.poll() is None
    out["second"] = nettask.allreduce(2)
    out["forks_second"] = forks()
    with contextlib.suppress(ProcessLookupError):  # (gone already if the thread's end took it)
        os.kill(killed.pid, signal.SIGKILL)  # as the machine's OOM killer would
    deadline = time.monotonic() + 10
    while killed.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    out["third"] = nettask.allreduce(3)
    out["forks_third"] = forks()
    out["a_new_server"] = server().proc is not killed
    try:
        nettask.allreduce(4, True)
    except Exception as err:
        out["failed"] = f"{type(err).__name__}: {err}"
    out["machine"] = os.readlink("/proc/self/ns/net")
    print("RESULT " + json.dumps(out), flush=True)
    """
)


def test_the_pool_outlives_the_first_calls_thread_replaces_a_killed_server_and_blames_no_rank(
    tmp_path: Path,
) -> None:
    """Issue 33: the server died with the thread that made the first call (PR_SET_PDEATHSIG), and
    once it had died every later call started cold; a failed warm call named its own master, a
    process forked from the server, as "another process" that took its port."""
    (tmp_path / "nettask.py").write_text(NET_TASK)
    script = tmp_path / "main.py"
    script.write_text(SERVER_ENDS)
    env = _env(tmp_path)
    done = _run(script, env)
    out = _result(done.stdout)
    assert out["first"][0] == 2 and out["second"][0] == 4 and out["third"][0] == 6, out
    assert out["forks_first"] == 2 and out["alive_after_the_thread"], out
    assert out["forks_second"] == 4, out  # warm: forked from the same server
    assert out["a_new_server"] and out["forks_third"] == 6, out  # warm again, from a new server
    assert out["failed"].startswith("RemoteError") and "rank 1 fails" in out["failed"], out
    # Every call's ranks in one network, the pool's own: not this machine's.
    assert out["first"][1] == out["second"][1] == out["third"][1] != out["machine"], out
    (failed,) = [
        json.loads(p.read_text())
        for p in (tmp_path / "home" / "calls").glob("*/status.json")
        if json.loads(p.read_text())["phase"] != "Completed"
    ]
    messages = [e["message"] for e in failed["events"]] + [failed["reason"]]
    assert not [m for m in messages if "taken by another process" in m], messages


LEAK_TASK = textwrap.dedent(
    """
    import os, time
    from torchjob import PyTorch, Worker, task

    def body(data, hold=""):
        if hold and os.environ["RANK"] == "0":
            with open(hold + ".part", "w") as f:
                f.write(str(os.getpid()))
            os.rename(hold + ".part", hold)
            time.sleep(300)
        return len(data)

    call = task(task_config=PyTorch(worker=Worker(replicas=1)))(body)
    """
)

LEAK_MAIN = textwrap.dedent(
    """
    import os, sys
    import leaktask
    if len(sys.argv) > 1:  # a call that hangs, with 5 MB of pickled arguments
        leaktask.call(b"x")
        leaktask.call(os.urandom(5_000_000), sys.argv[1])
    print("RESULT", leaktask.call(b"abc"), flush=True)
    """
)


def _ours(temp: Path) -> set[str]:
    return {p.name for p in temp.iterdir() if p.name.startswith(("torchjob-sdk-", "torchjob-pool-"))}


def test_a_killed_callers_arguments_and_pool_directory_go_with_the_next_call(tmp_path: Path) -> None:
    """Issue 33: a SIGKILLed caller left its pickled arguments and its pool's directory in the
    temporary directory for ever. The next call removes them: only those whose process is gone
    (another live caller's stay), and only directories torchjob made (a look-alike stays)."""
    (tmp_path / "leaktask.py").write_text(LEAK_TASK)
    (tmp_path / "main.py").write_text(LEAK_MAIN)
    temp = tmp_path / "tmp"
    temp.mkdir()
    (temp / "torchjob-sdk-not-made-by-torchjob").mkdir()
    env = dict(_env(tmp_path), TMPDIR=str(temp))
    callers: list[subprocess.Popen[str]] = []

    def hang(name: str) -> set[str]:
        before = _ours(temp)
        proc = subprocess.Popen(
            [sys.executable, "main.py", str(tmp_path / name)],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        callers.append(proc)
        deadline = time.monotonic() + 200
        while not (tmp_path / name).exists() and time.monotonic() < deadline:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            time.sleep(0.1)
        assert (tmp_path / name).exists(), "the call never ran"
        return _ours(temp) - before

    try:
        killed = hang("killed")
        live = hang("live")
        assert len(killed) == 2 and len(live) == 2, (killed, live)  # a call's directory, a pool's
        (work,) = [temp / n for n in killed if n.startswith("torchjob-sdk-")]
        assert (work / "payload.pkl").stat().st_size > 5_000_000
        callers[0].send_signal(signal.SIGKILL)  # as a notebook's kernel killed: nothing cleaned up
        callers[0].wait(10)
        assert killed <= _ours(temp)
        done = _run(tmp_path / "main.py", env)
        assert "RESULT 3" in done.stdout
        left = _ours(temp)
        assert not killed & left, left  # the killed caller's: gone
        assert live <= left, left  # a live caller's: kept
        assert "torchjob-sdk-not-made-by-torchjob" in left  # not torchjob's: kept
    finally:
        for proc in callers:
            proc.kill()
            proc.wait(10)
