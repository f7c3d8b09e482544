"""A local job's network (issue 33): its own namespace, which no other local user reaches.

Another user who reads a job's rendezvous port (``/proc/net/tcp``) could connect to its c10d store
and write a pickle there that torch, and once torchjob's own progress watcher, unpickled. Each
local job now runs in a network namespace of its own. The tests that need a second user create one
(root only) and are skipped otherwise, as are those the machine cannot give a namespace.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pwd
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from support import (
    as_user,
    container,
    job_dir,
    leftovers,
    log_text,
    make_job,
    run,
    status_of,
    task,
    wait_until,
    write_job,
)
from torchjob.engines.local import netns, podnames
from torchjob.host.tcp import listening

pytestmark = pytest.mark.timeout(120)

SRC = Path(__file__).resolve().parents[1] / "src"
SYSTEM_PYTHON = "/usr/bin/python3"  # one another user may run (this venv's may live under /root)


@pytest.fixture
def namespaces_work(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(netns.SWITCH, raising=False)
    made = netns.create()
    if isinstance(made, str):
        pytest.skip(f"this machine gives a job no network namespace: {made}")
    made.close()


def _run_cli(job_file: str, home: Path, *args: str, **env: str) -> subprocess.Popen[str]:
    full = {k: v for k, v in os.environ.items() if k not in (netns.SWITCH, "TORCHJOB_RUNTIME_DIR")}
    full.update(TORCHJOB_HOME=str(home), **env)
    return subprocess.Popen(
        [sys.executable, "-m", "torchjob", "run", *args, job_file],
        env=full,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _status(home: Path) -> dict[str, Any]:
    (status,) = (home / "jobs").glob("*/status.json")
    data: dict[str, Any] = json.loads(status.read_text())
    return data


def _ended(proc: subprocess.Popen[str], timeout: float = 90) -> str:
    try:
        out, _ = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return out


GLOO = """
import os, sys, time
import torch, torch.distributed as dist
dist.init_process_group("gloo")  # rank 0 serves the c10d store at MASTER_PORT
rank = dist.get_rank()
if rank == 0:
    facts = [os.environ["MASTER_PORT"], os.environ["TORCHJOB_POD_IP"], os.readlink("/proc/self/ns/net")]
    with open(sys.argv[1] + ".part", "w") as f:
        f.write(" ".join(facts))
    os.rename(sys.argv[1] + ".part", sys.argv[1])
    deadline = time.monotonic() + 60
    while not os.path.exists(sys.argv[2]) and time.monotonic() < deadline:
        time.sleep(0.05)
value = torch.tensor([float(rank + 1)])
dist.all_reduce(value)
print("sum", value.item(), flush=True)
dist.destroy_process_group()
"""

ATTACKER = """
import json, socket, sys
port, found = int(sys.argv[1]), {}
for host in sys.argv[2:]:
    try:
        with socket.create_connection((host, port), timeout=3) as sock:
            sock.sendall(b"a pickle for the store")  # what the store would unpickle
            found[host] = "connected"
    except OSError as err:
        found[host] = type(err).__name__
print(json.dumps(found))
"""


@pytest.mark.torch
@pytest.mark.usefixtures("namespaces_work")
@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
def test_another_user_reaches_nothing_of_a_job_in_its_own_network(
    other_user: pwd.struct_passwd, shared_tmp: Path, tmp_path: Path
) -> None:
    """While the master's c10d store listens, another user cannot connect to it at any address
    (so cannot plant anything in it), nor can this user from outside the job; the job's two pods
    still meet and all-reduce over gloo."""
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        pytest.skip(f"{SYSTEM_PYTHON} is needed to connect as the other user")
    (tmp_path / "gloo.py").write_text(GLOO)
    (shared_tmp / "attacker.py").write_text(ATTACKER)
    (shared_tmp / "attacker.py").chmod(0o644)
    ready, go = tmp_path / "ready", tmp_path / "go"
    command = ["python", str(tmp_path / "gloo.py"), str(ready), str(go)]
    job = make_job(
        "private",
        [task("master", [container("m", command)]), task("worker", [container("w", command)])],
        plugins={"pytorch": ["--master=master", "--worker=worker"]},
    )
    home = tmp_path / "home"
    proc = _run_cli(write_job(tmp_path, job), home, "--timeout", "90")
    try:
        assert wait_until(ready.exists, 60), _ended(proc, 5)
        port_text, pod_ip, job_net = ready.read_text().split()
        port = int(port_text)
        attempt = as_user(
            other_user, f"{SYSTEM_PYTHON} {shared_tmp / 'attacker.py'} {port} 127.0.0.1 {pod_ip}"
        )
        assert attempt.returncode == 0, attempt.stderr
        assert json.loads(attempt.stdout) == {
            "127.0.0.1": "ConnectionRefusedError",
            pod_ip: "ConnectionRefusedError",
        }
        for host in ("127.0.0.1", pod_ip):  # nor this user, from outside the job
            with pytest.raises(ConnectionRefusedError), socket.create_connection((host, port), timeout=3):
                pass
        assert listening([port]) == []  # nothing of the job listens on this machine's network
        assert job_net != os.readlink("/proc/self/ns/net")
        assert _status(home)["network"].startswith("its own"), _status(home)
    finally:
        go.touch()
    out = _ended(proc)
    assert proc.returncode == 0, out
    assert out.count("| sum 3.0") == 2, out  # both pods, over gloo in their own network


SERVER = """
import os, socket, sys
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(("0.0.0.0", int(os.environ["TORCHJOB_PORT_6006"])))
server.listen(8)
open(sys.argv[1], "w").write(os.environ["TORCHJOB_PORT_6006"] + " " + os.environ["TORCHJOB_POD_IP"])
server.settimeout(60)
while not os.path.exists(sys.argv[2]):
    try:
        client, _ = server.accept()
    except OSError:
        break
    client.sendall(b"hello from the pod")
    client.close()
"""


def _answer(host: str, port: int) -> bytes:
    with socket.create_connection((host, port), timeout=5) as sock:
        sock.settimeout(5)
        data = b""
        while chunk := sock.recv(100):
            data += chunk
        return data


@pytest.mark.usefixtures("namespaces_work")
def test_a_declared_port_is_forwarded_to_the_user_alone(
    other_user: pwd.struct_passwd, shared_tmp: Path, tmp_path: Path
) -> None:
    """A containerPort (TensorBoard's, say) is reached from this machine at 127.0.0.1 and at the
    pod's address, by this user; another user's connection is closed unanswered, and logged."""
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        pytest.skip(f"{SYSTEM_PYTHON} is needed to connect as the other user")
    (tmp_path / "server.py").write_text(SERVER)
    (shared_tmp / "client.py").write_text(
        "import socket, sys\n"
        "with socket.create_connection(('127.0.0.1', int(sys.argv[1])), timeout=5) as s:\n"
        "    s.settimeout(5)\n"
        "    print(repr(s.recv(100)))\n"
    )
    (shared_tmp / "client.py").chmod(0o644)
    ready, stop = tmp_path / "ready", tmp_path / "stop"
    serve = container("web", ["python", str(tmp_path / "server.py"), str(ready), str(stop)])
    serve["ports"] = [{"containerPort": 6006}]
    home = tmp_path / "home"
    proc = _run_cli(write_job(tmp_path, make_job("web", [task("main", [serve])])), home, "--timeout", "60")
    try:
        assert wait_until(ready.exists, 30), _ended(proc, 5)
        time.sleep(0.2)  # the file is written right after listen(): give the pod a moment
        port_text, pod_ip = ready.read_text().split()
        port = int(port_text)
        assert _answer("127.0.0.1", port) == b"hello from the pod"
        assert _answer(pod_ip, port) == b"hello from the pod"
        theirs = as_user(other_user, f"{SYSTEM_PYTHON} {shared_tmp / 'client.py'} {port}")
        assert theirs.stdout.strip() in ("b''", ""), theirs.stdout + theirs.stderr  # closed, nothing said
        log = next((home / "jobs").glob("*/forward.log"))
        assert wait_until(lambda: f"from uid {other_user.pw_uid}" in log.read_text(), 5), log.read_text()
        status = _status(home)
        assert f"127.0.0.1:{port}" in status["network"] and f"{pod_ip}:{port}" in status["network"], status
    finally:
        stop.touch()
        os.kill(proc.pid, signal.SIGTERM)
    _ended(proc)
    job_id = _status(home)["id"]
    assert leftovers(job_id) == []  # the forwarder ended with the job
    with pytest.raises(ConnectionRefusedError), socket.create_connection(("127.0.0.1", port), timeout=3):
        pass


UNPRIVILEGED = """
import json, os, socket, subprocess, sys
from torchjob.engines.local import netns

made = netns.create()
if isinstance(made, str):
    print(json.dumps({"refused": made}))
    sys.exit(0)
serve = "import os,socket;s=socket.socket();s.bind(('127.0.1.1',0));s.listen();" \\
    "print(s.getsockname()[1],os.getuid(),flush=True);c,_=s.accept();c.sendall(b'inside')"
server = subprocess.Popen(
    [sys.executable, "-c", serve], stdout=subprocess.PIPE, text=True, preexec_fn=made.enter
)
port, uid = server.stdout.readline().split()
talk = f"import socket;print(socket.create_connection(('127.0.1.1',{port})).recv(100).decode())"
inside = subprocess.run([sys.executable, "-c", talk], capture_output=True, text=True, preexec_fn=made.enter)
try:
    socket.create_connection(("127.0.1.1", int(port)), timeout=3)
    outside = "connected"
except OSError as err:
    outside = type(err).__name__
found = {"port": int(port), "uid": int(uid), "inside": inside.stdout.strip(), "outside": outside}
print(json.dumps(found), flush=True)
sys.stdin.read()  # holds the namespace (its server) until the test has tried too
server.kill()
"""


def test_a_user_who_is_not_root_gets_a_network_of_its_own(
    other_user: pwd.struct_passwd, shared_tmp: Path
) -> None:
    """The way a user who is not root takes: a user namespace of the user's own uid, then the
    network namespace; a process in it keeps its uid, reaches the others in it, and nothing
    outside reaches it, root included."""
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        pytest.skip(f"{SYSTEM_PYTHON} is needed to run as the other user")
    (shared_tmp / "unprivileged.py").write_text(UNPRIVILEGED)
    (shared_tmp / "unprivileged.py").chmod(0o644)
    proc = subprocess.Popen(
        [SYSTEM_PYTHON, str(shared_tmp / "unprivileged.py")],
        user=other_user.pw_uid,
        group=other_user.pw_gid,
        extra_groups=[],
        env={"PYTHONPATH": str(SRC), "PATH": os.environ["PATH"]},
        cwd="/",
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdin is not None
        found = json.loads(proc.stdout.readline() or "{}")
        if "refused" in found:
            pytest.skip(f"no network namespace for a user who is not root here: {found['refused']}")
        why = (found, proc.stderr.read() if proc.poll() is not None and proc.stderr else "")
        assert found.get("uid") == other_user.pw_uid, why  # its own uid, mapped to itself
        assert found.get("inside") == "inside", why  # a process in the namespace reaches another
        assert found.get("outside") == "ConnectionRefusedError", why  # the user's own, outside: no
        with (
            pytest.raises(ConnectionRefusedError),
            socket.create_connection(("127.0.1.1", found["port"]), timeout=3),
        ):
            pass
        proc.stdin.close()
        assert proc.wait(20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_job_without_a_namespace_says_what_it_exposes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the system refuses a namespace the job runs on this machine's network, after one note
    saying that other local users can connect to its ports; the status tells why."""
    monkeypatch.delenv(netns.SWITCH, raising=False)
    monkeypatch.setattr(netns, "start", lambda: netns.Pending("unshare: Operation not permitted"))
    outside = os.readlink("/proc/self/ns/net")
    job = make_job("open", [task("main", [container("c", ["readlink", "/proc/self/ns/net"])])])
    result = run(job, tmp_path)
    assert result.ok, result.reason
    assert log_text(result, "main-0", "c").strip() == outside
    status = status_of(result)
    assert status["network"] == "this machine's (no network namespace: unshare: Operation not permitted)"
    assert any("other local users can connect to its ports" in e["message"] for e in status["events"]), status


@pytest.mark.usefixtures("namespaces_work")
@pytest.mark.parametrize("how", ["hostNetwork", "switch"])
def test_a_job_may_ask_for_the_machines_network(
    how: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    outside = os.readlink("/proc/self/ns/net")
    main = task("main", [container("c", ["readlink", "/proc/self/ns/net"])])
    if how == "hostNetwork":
        main["template"]["spec"]["hostNetwork"] = True
    else:
        monkeypatch.setenv(netns.SWITCH, "host")
    result = run(
        make_job("host", [main, task("own", [container("c", ["readlink", "/proc/self/ns/net"])])]), tmp_path
    )
    assert result.ok, result.reason
    assert log_text(result, "main-0", "c").strip() == log_text(result, "own-0", "c").strip() == outside
    why = "task main sets hostNetwork: true" if how == "hostNetwork" else "TORCHJOB_NETWORK=host"
    assert status_of(result)["network"] == f"this machine's ({why})"


@pytest.mark.usefixtures("namespaces_work")
def test_a_container_that_cannot_reach_the_network_is_told_how_to_run_on_the_machines(tmp_path: Path) -> None:
    reach = "import socket; socket.create_connection(('torchjob-test.invalid', 80), timeout=5)"
    job = make_job("offline", [task("main", [container("c", ["python", "-c", reach])])])
    result = run(job, tmp_path)
    assert not result.ok
    events = [e["message"] for e in status_of(result)["events"]]
    assert any("could not reach the network" in e and "TORCHJOB_NETWORK=host" in e for e in events), events


@pytest.mark.usefixtures("namespaces_work")
def test_making_a_network_holds_no_lock_of_another_thread(tmp_path: Path) -> None:
    """The child that makes a namespace waits for this process to open it. It once kept a copy of
    every descriptor, so the port registry's lock another thread (an SDK call) had just released
    stayed held by it: both jobs waited, and one failed with the registry's 10 s error."""
    import fcntl

    held = os.open(tmp_path / "lock", os.O_CREAT | os.O_RDWR, 0o600)
    fcntl.flock(held, fcntl.LOCK_EX)  # another thread's, while this one starts making a network
    pending = netns.start()
    try:
        os.close(held)  # that thread is done with it
        again = os.open(tmp_path / "lock", os.O_RDWR)

        def free() -> bool:
            try:
                fcntl.flock(again, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            return True

        assert wait_until(free, 3), "the namespace's child still holds the lock"
        os.close(again)
    finally:
        made = pending.result()
        if not isinstance(made, str):
            made.close()


@pytest.mark.usefixtures("namespaces_work")
def test_a_namespace_that_cannot_be_entered_leaves_the_job_on_the_machines_network(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Made but refused to the job's processes (a seccomp filter on setns, say): the probe that
    enters it first finds out, the job runs on this machine's network after the note, and its
    pod names still resolve."""

    def refused(self: netns.Network) -> None:
        raise OSError(1, "setns (the job's network namespace): Operation not permitted")

    monkeypatch.setattr(netns.Network, "enter", refused)
    outside = os.readlink("/proc/self/ns/net")
    job = make_job("refused", [task("main", [container("c", ["readlink", "/proc/self/ns/net"])])])
    result = run(job, tmp_path)
    assert result.ok, result.reason
    assert log_text(result, "main-0", "c").strip() == outside
    status = status_of(result)
    assert status["network"].startswith("this machine's (no network namespace: [Errno 1] setns"), status
    names = podnames.probe(podnames.HostsMount.of(str(job_dir(result) / "hosts")))  # as without one
    assert status["nameResolution"] == ("resolved" if names is None else f"addresses only ({names})"), status
