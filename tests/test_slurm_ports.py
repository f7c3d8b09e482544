"""The master's port on Slurm when another job on the node holds the declared one (masterport.py):
the claim in-process, then real gloo jobs on a private Slurm whose declared port this test holds."""

from __future__ import annotations

import json
import random
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import yaml

from slurm_cluster import SlurmCluster, free_port
from test_slurm_engine import REPO, cli_env, status_json
from test_slurm_steps import no_process_left
from torchjob.engines.slurm.masterport import MasterPorts, claim, on_this_node
from torchjob.engines.slurm.plan import (
    Placement,
    SlurmAddressing,
    configmaps_of,
    place,
    plan_job,
    pod_launches,
    rendezvous_ports,
)
from torchjob.engines.slurm.settings import SlurmSettings
from torchjob.expand import expand
from torchjob.host import tcp
from torchjob.host.tcp import listening
from torchjob.jobs import load_jobs

# -- in-process: the claim -----------------------------------------------------------------------


def listener(port: int) -> socket.socket:
    """A server on ``port`` as a master's TCPStore makes one (SO_REUSEADDR, then bind, listen)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("", port))
    sock.listen()
    return sock


def test_a_claim_keeps_other_claims_out_and_lets_the_masters_listener_in() -> None:
    port = free_port()
    held = claim(port)
    assert held is not None
    try:
        assert claim(port) is None  # another job's controller sees the port taken
        assert listening({port}) == []  # bound, not listening
        master = listener(port)  # the master's own listener binds the claimed port all the same
        try:
            assert [sock.port for sock in listening({port})] == [port]
        finally:
            master.close()
    finally:
        held.close()
    again = claim(port)
    assert again is not None
    again.close()


def closed_connection_on(port: int) -> None:
    """A real connection to ``port`` whose server side closes first, as a run's master does at its
    end: that side waits in TIME_WAIT on the port (60 s on Linux), nothing else holds it."""
    server = listener(port)
    client = socket.create_connection(("127.0.0.1", port), timeout=10)
    accepted, _ = server.accept()
    accepted.close()
    server.close()
    client.close()
    deadline = time.monotonic() + 30
    while tcp.states(port) != {tcp.TIME_WAIT}:  # the client's FIN lands it there (at once when quiet)
        assert time.monotonic() < deadline, tcp.states(port)
        time.sleep(0.05)


def bound_without_reuse(port: int) -> bool:
    """Whether a bind without SO_REUSEADDR (the claim's first try) gets ``port``."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("", port))
        except OSError:
            return False
        return True


def test_a_port_its_last_run_left_in_time_wait_is_claimed_and_still_held_against_other_claims() -> None:
    port = free_port()
    closed_connection_on(port)
    assert not bound_without_reuse(port)  # what moved the port before
    held = claim(port)
    assert held is not None
    try:
        assert claim(port) is None  # a second live claim, here ...
        asked = json.dumps({"declared": [port], "avoid": []})
        done = subprocess.run(  # ... and in another process, as another job's controller
            [sys.executable, "-m", "torchjob.engines.slurm.masterport", asked],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        assert json.loads(done.stdout)[str(port)] != port
        master = listener(port)  # the master's own listener binds the claimed port all the same
        try:
            assert [sock.port for sock in listening({port})] == [port]
            held.close()
            assert claim(port) is None  # a listener holds it, TIME_WAIT or not
        finally:
            master.close()
    finally:
        held.close()


def test_back_to_back_runs_keep_the_declared_port() -> None:
    said: list[str] = []
    declared = free_port()
    closed_connection_on(declared)
    ports = MasterPorts([declared], avoid=(), local=True, say=said.append)
    assert ports.for_version(0) == {declared: declared}
    assert said == []
    assert claim(declared) is None
    ports.release()


def test_a_live_connection_on_the_port_moves_it_as_a_listener_does() -> None:
    port = free_port()
    server = listener(port)
    client = socket.create_connection(("127.0.0.1", port), timeout=10)
    accepted, _ = server.accept()
    server.close()  # the last run's master is gone; one of its connections is not
    try:
        assert tcp.TIME_WAIT not in tcp.states(port) and tcp.states(port)
        assert claim(port) is None
    finally:
        accepted.close()
        client.close()


def test_the_declared_port_when_free_another_when_held_and_claimed_anew_per_attempt() -> None:
    said: list[str] = []
    declared = free_port()
    ports = MasterPorts([declared], avoid={declared + 1}, local=True, say=said.append, rng=random.Random(7))
    assert ports.for_version(0) == {declared: declared}  # a job alone on its node: as before
    assert said == []
    assert claim(declared) is None  # held for the master until it listens
    master = listener(declared)
    ports.watch(now=1e9)
    assert ports.held == {}  # the master listens: the claim is let go
    ports.for_version(1)  # a restart of the job while the port is in use (the old master's, here)
    moved = ports.chosen[declared]
    assert moved != declared and moved != declared + 1
    assert said == [f"port {declared} is in use on the master's node: the master gets {moved} instead"]
    assert claim(moved) is None
    master.close()
    ports.release()
    assert ports.for_version(2) == {declared: declared}  # free again: the declared one again
    ports.release()


def test_a_master_on_another_node_gets_the_ports_a_step_there_chose_else_the_declared_ones() -> None:
    said: list[str] = []
    blocker = listener(free_port())
    declared = blocker.getsockname()[1]
    try:
        # the step's program, as srun runs it on the master's node
        asked = json.dumps({"declared": [declared], "avoid": [declared + 1]})
        done = subprocess.run(
            [sys.executable, "-m", "torchjob.engines.slurm.masterport", asked],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        answer = {int(k): v for k, v in json.loads(done.stdout).items()}
        assert set(answer) == {declared} and answer[declared] not in (declared, declared + 1)
        ports = MasterPorts([declared], avoid=(), local=False, say=said.append, remote=lambda d, a: answer)
        assert ports.for_version(0) == answer and ports.held == {}  # nothing is held from here
        assert said == [
            f"port {declared} is in use on the master's node: the master gets {answer[declared]} instead"
        ]
        said.clear()
        unprobed = MasterPorts([declared], avoid=(), local=False, say=said.append, remote=lambda d, a: None)
        assert unprobed.for_version(0) == {declared: declared}
        assert len(said) == 1 and "could not be probed" in said[0]
    finally:
        blocker.close()


def test_a_free_declared_port_is_claimed_without_socket_py_random_or_the_tcp_tables() -> None:
    """What the controller imports before its first pod: the claim of a free port needs none of them."""
    program = (
        "import sys; from torchjob.engines.slurm.masterport import MasterPorts\n"
        f"ports = MasterPorts([{free_port()}], avoid=(), local=True, say=print)\n"
        "ports.for_version(0); ports.release()\n"
        "print(sorted({'socket', 'random', 'torchjob.host.tcp'} & set(sys.modules)))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "[]", done.stdout + done.stderr


def test_the_masters_node_is_this_machine_by_slurmd_s_name_else_by_the_host_name() -> None:
    here = socket.gethostname().split(".")[0]
    assert on_this_node("n1", {"SLURMD_NODENAME": "n1"})
    assert not on_this_node(here, {"SLURMD_NODENAME": "n1"})  # a batch host knows its node
    assert on_this_node(here, {})  # an salloc shell on the node named as this machine
    assert not on_this_node(f"{here}x", {})


def test_every_port_of_the_master_follows_the_moved_one_and_the_other_pods_keep_their_slots() -> None:
    placements = {
        ("master", 0): Placement(0, "n1", 0, 0),
        ("worker", 0): Placement(0, "n1", 1, 10),
    }
    addressing = SlurmAddressing(placements, ("master", 0), {23456: 40001})
    assert addressing.port_of(("master", 0), 23456) == 40001
    assert addressing.port_of(("master", 0), 23460) == 23460  # a containerPort: its own slot's
    assert addressing.port_of(("worker", 0), 23456) == 23466
    assert addressing.master_ports([23456, 23460]) == {23456: 40001, 23460: 23460}


# -- a real Slurm: gloo jobs whose declared port is held -------------------------------------------

ALL_REDUCE = """
import datetime, json, os
import torch
import torch.distributed as dist
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
value = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(value)
print("RESULT " + json.dumps({"rank": dist.get_rank(), "sum": value.item(), "port": os.environ["MASTER_PORT"],
                              "own": os.environ["TORCHJOB_PORT_" + os.environ["DECLARED"]]}), flush=True)
dist.destroy_process_group()
"""


def gloo_job(path: Path, name: str, port: int, marker: str) -> Path:
    container = {
        "name": "main",
        "image": "busybox",
        "command": ["python", "-c", ALL_REDUCE, marker],
        "env": [{"name": "DECLARED", "value": str(port)}],
    }
    template = {"spec": {"restartPolicy": "Never", "containers": [container]}}
    doc = {
        "apiVersion": "batch.volcano.sh/v1alpha1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "plugins": {"pytorch": ["--master=master", "--worker=worker", f"--port={port}"]},
            "policies": [{"event": "PodFailed", "action": "TerminateJob"}],
            "tasks": [
                {"name": "master", "replicas": 1, "template": template},
                {"name": "worker", "replicas": 1, "template": template},
            ],
        },
    }
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.mark.slow
@pytest.mark.torch
@pytest.mark.timeout(240)
def test_two_gloo_jobs_at_once_whose_declared_port_another_listener_holds(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    pytest.importorskip("torch")
    env = cli_env(slurm, tmp_path / "root")
    marker = uuid.uuid4().hex
    blocker = listener(free_port())  # another job's master on this node, which every node is here
    declared = blocker.getsockname()[1]
    try:
        runs = [
            subprocess.Popen(
                [sys.executable, "-m", "torchjob", "run", "--engine", "slurm", str(job)],
                env=env,
                cwd=REPO,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for name in ("first", "second")
            for job in [gloo_job(tmp_path / f"{name}.yaml", name, declared, marker)]
        ]
        outputs = [run.communicate(timeout=180) for run in runs]
    finally:
        blocker.close()
    masters = set()
    for run, (out, err), name in zip(runs, outputs, ("first", "second"), strict=True):
        assert run.returncode == 0, out + err
        results = [json.loads(line.split("RESULT ", 1)[1]) for line in out.splitlines() if "RESULT " in line]
        assert sorted(r["rank"] for r in results) == [0, 1] and {r["sum"] for r in results} == {3.0}, out
        (port,) = {int(r["port"]) for r in results}  # every pod agrees
        assert port != declared
        own = {r["rank"]: int(r["own"]) for r in results}
        assert own[0] == port  # the master's TORCHJOB_PORT_<declared> is the port it got
        assert f"port {declared} is in use on the master's node: the master gets {port} instead" in out + err
        status = status_json(env, name)
        assert status["ports"] == [{"declared": declared, "host": port}]
        masters.add(port)
    assert len(masters) == 2  # two jobs at once, two masters' ports
    assert no_process_left(marker) == []


@pytest.mark.parametrize(
    "file",
    [
        "pytorch-job.yaml",
        "kinds/pytorchjob.yaml",
        "kinds/pytorchjob-elastic.yaml",
        "kinds/trainjob.yaml",
        "kinds/jobset.yaml",
    ],
)
def test_every_plugins_port_in_every_pods_env_is_the_moved_one(file: str, tmp_path: Path) -> None:
    """MASTER_PORT, PET_MASTER_PORT, a rendezvous endpoint, the master's TORCHJOB_PORT_<declared>:
    once the master's node had the declared port taken, no pod is handed the declared number."""
    job = load_jobs(str(REPO / "examples" / file))[0].job
    assert job is not None
    plan = plan_job(job, SlurmSettings(), str(tmp_path), ["true"])
    layout = {c.index: [(f"node{c.index}", c.ntasks)] for c in plan.components}
    placements = place(plan, layout)
    declared = rendezvous_ports(job)
    assert declared, file
    moved = {port: 40001 + i for i, port in enumerate(declared)}
    addressing = SlurmAddressing(placements, plan.master, moved)
    state = expand(job, addressing)
    handed = []
    for pod in state.pods:
        for launch in pod_launches(plan, pod, addressing, configmaps_of(state)):
            own = {f"TORCHJOB_PORT_{p}" for p in plan.ports} | {"TORCHJOB_PORT_OFFSET"}
            values = [v for k, v in launch.env.items() if k not in own] + launch.argv
            for port in declared:
                assert not [v for v in values if str(port) in v], (launch.pod, launch.env, launch.argv)
            handed += [v for v in values if any(str(p) in v for p in moved.values())]
            if (launch.task, launch.index) == plan.master:
                assert {launch.env[f"TORCHJOB_PORT_{p}"] for p in declared} == {
                    str(p) for p in moved.values()
                }
    assert handed, "no pod was handed the master's port"


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_inside_an_salloc_on_the_masters_node_the_port_is_claimed_without_a_step(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    """salloc's shell runs here, on the node named as this machine: the controller claims the
    master's port itself (no step probes it, 0.07 s and a step of the allocation): the job's two
    pods are the only steps made before the one that counts them."""
    env = cli_env(slurm, tmp_path / "root")
    env.pop("TORCHJOB_SLURM_PARTITION")
    blocker = listener(free_port())  # the declared port is taken on this node
    declared = blocker.getsockname()[1]
    container = {"name": "main", "image": "busybox", "command": ["sh", "-c", 'echo "PORT=$MASTER_PORT"']}
    template = {"spec": {"restartPolicy": "Never", "containers": [container]}}
    doc = {
        "apiVersion": "batch.volcano.sh/v1alpha1",
        "kind": "Job",
        "metadata": {"name": "here"},
        "spec": {
            "plugins": {"pytorch": ["--master=master", "--worker=worker", f"--port={declared}"]},
            "tasks": [
                {"name": "master", "replicas": 1, "template": template},
                {"name": "worker", "replicas": 1, "template": template},
            ],
        },
    }
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(doc))
    run = f"{sys.executable} -m torchjob run {job} --engine slurm"
    try:
        done = subprocess.run(
            ["salloc", "-n", "2", "--", "sh", "-c", f"{run} && srun -n1 printenv SLURM_STEP_ID"],
            env=env,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
    finally:
        blocker.close()
    assert done.returncode == 0, done.stdout + done.stderr
    ports = {line.split("PORT=", 1)[1] for line in done.stdout.splitlines() if "PORT=" in line}
    (port,) = ports  # both pods were given the one port the controller claimed
    assert int(port) != declared
    assert f"port {declared} is in use on the master's node: the master gets {port} instead" in (
        done.stdout + done.stderr
    )
    assert done.stdout.splitlines()[-1] == "2", done.stdout  # steps 0 and 1 were the pods
