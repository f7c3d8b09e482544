"""The supervisor wakes the wait-for-master probe when the job's network gets a new listener
(``engines/local/nudge.py``), so the probe can poll slowly and a worker still starts once the
master listens, not a poll interval later."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest

from support import container, make_job, run, sh, task
from torchjob.engines.local import creation
from torchjob.host import sockdiag

pytestmark = pytest.mark.timeout(120)

# The master listens a second after it starts and stays until the worker has written its mark.
MASTER = r"""
import os, socket, sys, time
marks = sys.argv[1]
time.sleep(1.0)
server = socket.socket(socket.AF_INET6 if socket.has_ipv6 else socket.AF_INET)
server.bind(("", int(os.environ["MASTER_PORT"])))
server.listen(8)
with open(os.path.join(marks, "listen"), "w") as out:
    out.write(str(time.time()))
deadline = time.time() + 60
while not os.path.exists(os.path.join(marks, "worker")) and time.time() < deadline:
    time.sleep(0.01)
"""


@pytest.mark.parametrize("network", ["own", "machine"])
def test_a_waiting_worker_starts_once_the_master_listens_not_a_poll_later(tmp_path, monkeypatch, network):
    # Without a nudge the probe would nap 30 s between looks, in the job's own network and on the
    # machine's alike (the supervisor asks either through sock_diag), whichever interval it got.
    monkeypatch.setattr(creation, "NUDGED_INTERVAL", "30")
    monkeypatch.setattr(creation, "WAIT_INTERVAL", "30")
    if network == "machine":
        monkeypatch.setenv("TORCHJOB_NETWORK", "host")
    marks = tmp_path / "marks"
    marks.mkdir()
    job = make_job(
        "nudged",
        [
            task("master", [container("main", ["python", "-c", MASTER, str(marks)])]),
            task(
                "worker",
                [container("main", sh(f'echo "$(date +%s.%N) [$TORCHJOB_JOB_UIDS]" > "{marks}/worker"'))],
            ),
        ],
        plugins={"pytorch": ["--master=master", "--worker=worker", "--wait-master-enabled=true"]},
    )
    report = run(job, tmp_path, timeout=60)
    assert report.phase == "Completed", report
    started, uids = (marks / "worker").read_text().split()
    waited = float(started) - float((marks / "listen").read_text())
    assert 0 <= waited < 10, f"the worker started {waited:.2f} s after the master listened"
    # On the machine's network another user may listen on the master's port first: the probe reads
    # the listener's uid (TORCHJOB_JOB_UIDS). In the job's own network every socket is the job's,
    # and that read (7 ms of the kernel's time a poll) is skipped: the variable is empty.
    own = network == "own" and namespaces_work()
    assert uids == ("[]" if own else f"[{os.geteuid()}]")


def namespaces_work() -> bool:
    """Whether a job gets a network namespace of its own here (else it runs on the machine's)."""
    from torchjob.engines.local import netns

    made = netns.create()
    if isinstance(made, str):
        return False
    made.close()
    return True


def test_sock_diag_lists_the_listening_sockets_with_their_port_uid_and_inode():
    with (
        sockdiag.open_socket() as diag,
        socket.socket() as server,
        socket.socket(socket.AF_INET6) as server6,
        socket.socket() as idle,
    ):
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        server6.bind(("::1", 0))
        server6.listen(1)
        idle.bind(("127.0.0.1", 0))  # bound, not listening
        found = {sock.inode: sock for sock in sockdiag.listeners(diag)}
        for sock in (server, server6):
            listener = found[socket_inode(sock)]
            assert (listener.port, listener.uid) == (sock.getsockname()[1], os.getuid())
        assert socket_inode(idle) not in found


def socket_inode(sock: socket.socket) -> int:
    return os.fstat(sock.fileno()).st_ino


def test_the_loops_wait_looks_every_so_often_and_still_ends_at_an_exit():
    from torchjob.engines.local.waiter import ExitWaiter, Look

    looks: list[float] = []

    def look() -> Look | None:
        looks.append(time.monotonic())
        return Look(0.01)

    waiter = ExitWaiter(look)
    try:
        began = time.monotonic()
        waiter.wait(0.2)
        assert time.monotonic() - began >= 0.19
        assert len(looks) >= 5  # every 10 ms, give or take a loaded machine
        child = subprocess.Popen(["sleep", "0.05"])
        waiter.add(child.pid)
        began = time.monotonic()
        waiter.wait(30)  # the exit ends it, not the 30 s
        assert time.monotonic() - began < 10
        child.wait(5)
    finally:
        waiter.close()


def test_a_descriptor_the_look_names_makes_the_wait_look_again_at_once():
    from torchjob.engines.local.waiter import ExitWaiter, Look

    read_end, write_end = os.pipe()
    looks: list[float] = []

    def look() -> Look | None:
        looks.append(time.monotonic())
        if len(looks) == 1:
            os.write(write_end, b"w")  # as a warm process says it is warm, during the wait
            return Look(30.0, (read_end,))  # without it, the next look would come in 30 s
        return None

    waiter = ExitWaiter(look)
    try:
        began = time.monotonic()
        waiter.wait(0.5)
        assert len(looks) == 2 and looks[1] - looks[0] < 0.4, looks
        assert time.monotonic() - began >= 0.49  # it was not a wake: the wait went on to its end
    finally:
        waiter.close()
        os.close(read_end)
        os.close(write_end)


def test_a_warm_process_says_when_its_imports_are_done_and_runs_its_program_only_on_go(tmp_path):
    from torchjob.pyrunner import pycommand
    from torchjob.pyrunner.pyrun import WARM

    out = tmp_path / "ran"
    script = tmp_path / "program.py"
    script.write_text("import sys\nopen(sys.argv[1], 'w').write('ran')\n")
    ours, theirs = socket.socketpair()
    argv = pycommand.runner_argv(
        [sys.executable, str(script), str(out)],
        dict(os.environ),
        theirs.fileno(),
        "60",
        ["json"],
        str(tmp_path),
    )
    assert argv is not None
    proc = subprocess.Popen(argv, pass_fds=(theirs.fileno(),))
    theirs.close()
    try:
        ours.settimeout(30)
        assert ours.recv(16) == WARM
        time.sleep(0.2)
        assert not out.exists()  # warm, and waiting for the word
        ours.sendall(b"go")
        assert proc.wait(30) == 0
        assert out.read_text() == "ran"
    finally:
        ours.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)


def test_a_jobs_network_tells_its_own_listeners_and_no_others():
    from torchjob.engines.local import netns

    network = netns.create()
    if isinstance(network, str):
        pytest.skip(f"no network namespace here: {network}")
    read_end, write_end = os.pipe()
    child = 0
    try:
        with socket.socket() as outside:
            outside.bind(("127.0.0.1", 0))
            outside.listen(1)
            child = os.fork()
            if child == 0:  # pragma: no cover - the child: listens inside the job's network
                try:
                    network.enter()
                    inside = socket.socket()
                    inside.bind(("127.0.0.1", 0))
                    inside.listen(1)
                    os.write(write_end, f"{inside.getsockname()[1]}\n".encode())
                    time.sleep(30)
                finally:
                    os._exit(0)
            os.close(write_end)
            port = int(os.read(read_end, 100))
            assert network.diag is not None
            found = sockdiag.listeners(network.diag)
            assert [sock.port for sock in found] == [port]  # not the one outside
    finally:
        if child:
            os.kill(child, 9)
            os.waitpid(child, 0)
        os.close(read_end)
        network.close()
