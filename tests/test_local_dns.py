"""Pod names resolve for a local job's processes: a private /etc/hosts per container process."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from support import container, job_dir, leftovers, log_dir, log_text, make_job, run, sh, status_of, task
from test_waitmaster import PROBING, make_shell
from torchjob import records
from torchjob.engines.local import podnames
from torchjob.plugins.waitmaster import INTERVAL_ENV, wait_for_master_script

pytestmark = pytest.mark.timeout(90)


def _mountinfo() -> str:
    return Path("/proc/self/mountinfo").read_text() if Path("/proc/self/mountinfo").exists() else ""


@pytest.fixture
def hosts_file() -> Iterator[Path]:
    """A job-like hosts file any user can read (the non-root test reads it as another user)."""
    folder = Path(tempfile.mkdtemp(prefix="torchjob-dns-"))
    folder.chmod(0o755)
    path = folder / "hosts"
    path.write_text(
        podnames.hosts_text(Path(podnames.ETC_HOSTS).read_text(), [("127.0.1.9", ["pod-a", "pod-a.sub"])])
    )
    path.chmod(stat.S_IRUSR | stat.S_IWUSR | stat.S_IRGRP | stat.S_IROTH)
    yield path
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def names_work(hosts_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(podnames.SWITCH, raising=False)
    why_not = podnames.probe(podnames.HostsMount.of(str(hosts_file)))
    if why_not is not None:
        pytest.skip(f"this machine cannot give a process its own /etc/hosts: {why_not}")


def test_hosts_text_keeps_the_machine_lines_first_and_lists_each_name_once() -> None:
    text = podnames.hosts_text(
        "127.0.0.1 localhost\n",
        [("127.0.1.1", ["a", "a.j", "a"]), ("127.0.1.2", ["a.j", "b", "b.j"]), ("127.0.1.3", ["b"])],
    )
    lines = text.splitlines()
    assert lines[0] == "127.0.0.1 localhost"
    assert lines[2:] == ["127.0.1.1 a a.j", "127.0.1.2 b b.j"]  # a later pod never takes a name


def test_the_switch_turns_names_off(hosts_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(podnames.SWITCH, "0")
    assert podnames.probe(podnames.HostsMount.of(str(hosts_file))) == f"{podnames.SWITCH}=0"


@pytest.mark.usefixtures("names_work")
def test_a_failing_probe_says_why(hosts_file: Path) -> None:
    broken = podnames.HostsMount(hosts_file.as_posix().encode(), b"not a map", b"nor this", alone=False)
    why_not = podnames.probe(broken)
    assert why_not is not None and "Invalid argument" in why_not, why_not
    missing = podnames.HostsMount.of(str(hosts_file.parent / "missing"))
    assert "cannot read the job's hosts file" in str(podnames.probe(missing))


@pytest.mark.usefixtures("names_work")
def test_a_process_sees_the_file_and_the_machine_does_not(hosts_file: Path) -> None:
    before = _mountinfo()
    mount = podnames.HostsMount.of(str(hosts_file))
    out = subprocess.run(
        ["sh", "-c", "cat /etc/hosts; id -u"],
        preexec_fn=mount.enter,
        capture_output=True,
        text=True,
        timeout=10,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[:-1] == hosts_file.read_text().splitlines()
    assert out.stdout.splitlines()[-1] == str(os.getuid())  # the same user inside
    assert "pod-a" not in Path(podnames.ETC_HOSTS).read_text()
    assert _mountinfo() == before  # nothing leaked into this namespace


@pytest.mark.usefixtures("names_work")
@pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() != 0, reason="needs root to become another user"
)
def test_a_user_who_is_not_root_gets_the_file_through_a_user_namespace(hosts_file: Path) -> None:
    mount = podnames.HostsMount(hosts_file.as_posix().encode(), b"4242 4242 1", b"4343 4343 1", alone=False)

    def become_nobody_then_enter() -> None:
        os.setgroups([])
        os.setgid(4343)  # ids unknown to the system; an unmapped id would show as 65534
        os.setuid(4242)
        mount.enter()

    out = subprocess.run(
        ["sh", "-c", "id -u; id -g; cat /etc/hosts"],
        preexec_fn=become_nobody_then_enter,
        capture_output=True,
        text=True,
        timeout=10,
        cwd="/",
    )
    if out.returncode != 0 and "unshare" in out.stderr:
        pytest.skip(f"unprivileged user namespaces are not available: {out.stderr.strip()}")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[:2] == ["4242", "4343"]  # uid and gid map to themselves
    assert "127.0.1.9 pod-a pod-a.sub" in lines


def _resolver_job(out: Path) -> list[dict[str, object]]:
    program = (
        "import json, os, socket, subprocess, sys\n"
        "getent = subprocess.run(['getent', 'hosts', 'dns-worker-1.dns'], capture_output=True, text=True)\n"
        "data = dict(\n"
        "    master_addr=os.environ['MASTER_ADDR'],\n"
        "    master_ip=socket.gethostbyname(os.environ['MASTER_ADDR']),\n"
        "    worker_1=getent.stdout.split(),\n"
        "    localhost=socket.gethostbyname('localhost'),\n"
        "    volcano=open(os.path.join(os.environ['TORCHJOB_VOLCANO_DIR'], 'worker.host')).read().split(),\n"
        ")\n"
        f"json.dump(data, open({str(out)!r}, 'w'))\n"
    )
    return [
        task("master", [container("m", ["python", "-c", program])]),
        task("worker", [container("w", sh("true"))], replicas=2),
    ]


@pytest.mark.usefixtures("names_work")
@pytest.mark.skipif(shutil.which("getent") is None, reason="getent is not installed")
def test_pod_names_resolve_to_the_pods_addresses_and_master_addr_is_the_cluster_name(tmp_path: Path) -> None:
    out = tmp_path / "names.json"
    job = make_job("dns", _resolver_job(out), plugins={"pytorch": ["--master=master", "--worker=worker"]})
    before = _mountinfo()
    result = run(job, tmp_path)
    assert result.ok, result.reason
    data = json.loads(out.read_text())
    assert data["master_addr"] == "dns-master-0.dns"  # byte-identical to a cluster's
    assert data["master_ip"] == "127.0.1.1"
    assert data["worker_1"][0] == "127.0.1.3" and "dns-worker-1.dns" in data["worker_1"]
    assert data["localhost"] == "127.0.0.1"  # the machine's own names still resolve
    assert data["volcano"] == ["dns-worker-0.dns", "dns-worker-1.dns"]
    status = status_of(result)
    assert status["nameResolution"] == "resolved"
    assert [p["address"] for p in status["pods"]] == ["127.0.1.1", "127.0.1.2", "127.0.1.3"]
    assert leftovers(result.id) == []
    assert _mountinfo() == before
    assert "dns-master-0" not in Path(podnames.ETC_HOSTS).read_text()


def test_with_names_off_the_job_gets_addresses(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(podnames.SWITCH, "0")
    out = tmp_path / "env.json"
    program = (
        "import json, os\n"
        "hosts = open('/etc/hosts').read()\n"
        "data = dict(addr=os.environ['MASTER_ADDR'], private='dns-master-0' in hosts)\n"
        f"json.dump(data, open({str(out)!r}, 'w'))\n"
    )
    job = make_job(
        "dns",
        [
            task("master", [container("m", ["python", "-c", program])]),
            task("worker", [container("w", sh("true"))]),
        ],
        plugins={"pytorch": ["--master=master", "--worker=worker"]},
    )
    result = run(job, tmp_path)
    assert result.ok, result.reason
    data = json.loads(out.read_text())
    assert data == {"addr": "127.0.1.1", "private": False}
    assert status_of(result)["nameResolution"] == f"addresses only ({podnames.SWITCH}=0)"
    assert "dns-master-0.dns" in (job_dir(result) / "hosts").read_text()  # still written, for reference


GLOO = """
import os, sys
import torch
import torch.distributed as dist

assert not os.environ["MASTER_ADDR"][0].isdigit(), os.environ["MASTER_ADDR"]
dist.init_process_group("gloo", timeout=__import__("datetime").timedelta(seconds=60))
rank = dist.get_rank()
value = torch.tensor([float(rank + 1)])
dist.all_reduce(value)
assert value.item() == 3.0, value
peer = torch.tensor([float(rank)])
if rank == 0:
    dist.send(torch.tensor([42.0]), 1)
else:
    dist.recv(peer, 0)
    assert peer.item() == 42.0, peer
print("gloo ok", rank, os.environ["MASTER_ADDR"], flush=True)
print("namespaces", os.readlink("/proc/self/ns/mnt"), os.readlink("/proc/self/ns/user"), flush=True)
print("hostname", __import__("socket").gethostname(), os.uname().nodename, flush=True)
print("ncclhost", os.environ.get("NCCL_HOSTID"), flush=True)
dist.barrier()
dist.destroy_process_group()
"""


def _run_gloo(tmp_path: Path, name: str, command: Callable[[str], list[str]]) -> tuple[Any, dict[str, str]]:
    """A master and a worker running ``command(GLOO's script)`` with the pytorch plugin; the
    report, and each pod's log."""
    script = tmp_path / "gloo.py"
    script.write_text(GLOO)
    job = make_job(
        name,
        [
            task("master", [container("m", command(str(script)))]),
            task("worker", [container("w", command(str(script)))]),
        ],
        plugins={"pytorch": ["--master=master", "--worker=worker"]},
    )
    result = run(job, tmp_path, timeout=80)
    logs = {
        p.name: (log_dir(result, p) / ("m.log" if "master" in p.name else "w.log")).read_text()
        for p in result.pods
    }
    return result, logs


@pytest.mark.torch
@pytest.mark.usefixtures("names_work")
@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
@pytest.mark.parametrize("user_namespace", [False, True], ids=["as-is", "user-namespace"])
def test_a_two_rank_gloo_job_connects_through_the_master_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, user_namespace: bool
) -> None:
    if user_namespace:  # the path a user who is not root takes, also when the tests run as root
        of = podnames.HostsMount.of
        monkeypatch.setattr(
            podnames.HostsMount, "of", lambda source, **kw: records.replace(of(source, **kw), alone=False)
        )
    elif os.geteuid() != 0:
        pytest.skip("without root every job takes the user-namespace path")
    result, logs = _run_gloo(tmp_path, "gloo", lambda script: ["python", script])
    assert result.ok, (result.reason, logs)
    assert "gloo ok 0 gloo-master-0.gloo" in logs["gloo-master-0"]
    assert "gloo ok 1 gloo-master-0.gloo" in logs["gloo-worker-0"]
    # torch's store looks up each peer it accepts, an IPv4-mapped address on its dual-stack socket:
    # in the job's own network only the job's hosts file can answer (netns.hosts_entries)
    unnamed = [x for p, text in logs.items() for x in text.splitlines() if "cannot be retrieved" in x]
    assert unnamed == [], (status_of(result)["network"], unnamed)
    line = next(x for x in logs["gloo-master-0"].splitlines() if x.startswith("namespaces "))
    mnt, user = line.split()[1:]
    assert mnt != os.readlink("/proc/self/ns/mnt")  # the container had a mount namespace of its own
    assert (user != os.readlink("/proc/self/ns/user")) == (user_namespace or os.geteuid() != 0)
    # each its pod's host name, as in a pod (a UTS namespace of its own); the machine's unchanged
    assert "hostname gloo-master-0 gloo-master-0" in logs["gloo-master-0"]
    assert "hostname gloo-worker-0 gloo-worker-0" in logs["gloo-worker-0"]
    assert socket.gethostname() not in ("gloo-master-0", "gloo-worker-0")
    # NCCL would take each for a host of its own (the host name and boot id): both get the
    # machine's identity as NCCL finds it outside a pod, so ranks stay neighbours (podnames.py)
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().split()[0]
    assert all(f"ncclhost {socket.gethostname()}{boot}\n" in text for text in logs.values()), logs
    assert leftovers(result.id) == []


@pytest.mark.usefixtures("names_work")
def test_a_pod_with_a_host_name_of_its_own_keeps_the_machines_nccl_identity_unless_it_sets_one(
    tmp_path: Path,
) -> None:
    show = ["sh", "-c", 'echo "ncclhost $NCCL_HOSTID $(uname -n)"']
    theirs = container("c", show, env=[{"name": "NCCL_HOSTID", "value": "mine"}])
    result = run(make_job("nccl", [task("a", [container("c", show)]), task("b", [theirs])]), tmp_path)
    assert result.ok, result.reason
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().split()[0]
    assert log_text(result, "a-0", "c") == f"ncclhost {socket.gethostname()}{boot} nccl-a-0\n"
    assert log_text(result, "b-0", "c") == "ncclhost mine nccl-b-0\n"


C10D = "torchrun --nnodes=2 --nproc-per-node=1 --rdzv-backend=c10d --rdzv-id=c --rdzv-endpoint={} {}"


@pytest.mark.torch
@pytest.mark.usefixtures("names_work")
@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
def test_torchruns_c10d_rendezvous_is_hosted_by_the_pod_the_endpoint_names(tmp_path: Path) -> None:
    """torchrun's c10d backend hosts its store in the agent whose host name is the endpoint's
    (the master's, $MASTER_ADDR): with the machine's host name in every pod no agent did, and the
    job hung until the rendezvous timed out."""
    result, logs = _run_gloo(
        tmp_path, "rdzv", lambda script: ["sh", "-c", C10D.format("$MASTER_ADDR:$MASTER_PORT", script)]
    )
    assert result.ok, (result.reason, logs)
    assert sorted(
        line.split()[2] for text in logs.values() for line in text.splitlines() if line.startswith("gloo ok")
    ) == ["0", "1"]
    assert leftovers(result.id) == []


LOOKUPS = r"""
import json, socket, subprocess, sys

def answer(call):
    try:
        return call()
    except OSError as err:
        return f"{type(err).__name__} {err.args[0]}"

def getaddrinfo(name, family, flags):
    found = socket.getaddrinfo(name, None, family, socket.SOCK_STREAM, 0, flags)
    return [[int(f), a[0]] for f, _, _, _, a in found]

names, addresses = json.loads(sys.argv[1])
forward = {}
for name in names:
    row = forward[name] = {}
    for db in ("hosts", "ahosts", "ahostsv6"):
        done = subprocess.run(["getent", db, name], capture_output=True, text=True, timeout=10)
        row[db] = [done.returncode, done.stdout]
    row["gethostbyname"] = answer(lambda: socket.gethostbyname(name))
    row["gethostbyname_ex"] = answer(lambda: socket.gethostbyname_ex(name))
    mapped = socket.AI_V4MAPPED | socket.AI_ALL
    for family, flags in ((0, 0), (socket.AF_INET6, 0), (socket.AF_INET6, mapped)):
        row[f"getaddrinfo {family} {flags}"] = answer(lambda: getaddrinfo(name, family, flags))
reverse = {a: answer(lambda: socket.getnameinfo((a, 80), 0)[0]) for a in addresses}
json.dump({"forward": forward, "reverse": reverse}, sys.stdout)
"""


@pytest.mark.usefixtures("names_work")
@pytest.mark.skipif(shutil.which("getent") is None, reason="getent is not installed")
def test_in_its_own_network_a_pods_mapped_address_has_a_reverse_name_and_no_forward_lookup_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torch's store looks up each peer, an IPv4-mapped address on its dual-stack socket; no name
    server answers in the job's network. The job's hosts file names those addresses for reverse
    lookups alone: every forward lookup of every name a pod may use answers as without them."""
    from torchjob.engines.local import netns
    from torchjob.engines.local.jobhosts import JobHosts
    from torchjob.engines.local.state import JobDir

    monkeypatch.delenv(netns.SWITCH, raising=False)
    network = netns.create()
    if isinstance(network, str):
        pytest.skip(f"this machine gives a job no network namespace: {network}")
    job = make_job(
        "dns",
        [
            task("master", [container("m", sh("true"))]),
            task("worker", [container("w", sh("true"))], replicas=2),
        ],
        plugins={"pytorch": ["--master=master", "--worker=worker"], "svc": []},
    )
    folder = tmp_path / "job"
    folder.mkdir(mode=0o700)
    JobHosts(job, JobDir(folder)).write(private=True)
    full = folder / "hosts"
    without = tmp_path / "without-mapped"
    lines = full.read_text().splitlines(keepends=True)
    without.write_text("".join(x for x in lines if not x.startswith("::ffff:")))
    assert without.read_text() != full.read_text()
    pods = ["dns-master-0", "dns-worker-0", "dns-worker-1"]
    addresses = ["127.0.0.1", "127.0.1.1", "127.0.1.2", "127.0.1.3"]
    names = [
        *(f"{pod}{tail}" for pod in pods for tail in ("", ".dns", ".dns.default", ".dns.default.svc")),
        *(f"{pod}.dns.default.svc.cluster.local{dot}" for pod in pods for dot in ("", ".")),
        *("dns", "dns.default.svc.cluster.local", "localhost", socket.gethostname()),
        *addresses,
        *(f"{a}." for a in addresses),
    ]  # (`getent hosts ::ffff:A` is a reverse lookup, asked below)

    def look(hosts: Path) -> dict[str, Any]:
        mount = podnames.HostsMount.of(str(hosts))

        def enter() -> None:  # as every container of the job: its network, then its /etc/hosts
            network.enter()
            mount.enter()

        done = subprocess.run(
            [sys.executable, "-c", LOOKUPS, json.dumps([names, [f"::ffff:{a}" for a in addresses]])],
            preexec_fn=enter,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        found: dict[str, Any] = json.loads(done.stdout)
        return found

    try:
        with_mapped, plain = look(full), look(without)
    finally:
        network.close()
    for name in names:
        assert with_mapped["forward"][name] == plain["forward"][name], name
    worker = with_mapped["forward"]["dns-worker-1.dns"]["hosts"]  # the lookups answered at all
    assert (worker[0], worker[1].split()) == (0, ["127.0.1.3", "dns-worker-1", "dns-worker-1.dns"])
    assert with_mapped["forward"]["localhost"]["hosts"][1].split() == ["127.0.0.1", "localhost"]
    named = with_mapped["reverse"]
    assert all(not str(name).startswith("gaierror") for name in named.values()), named


@pytest.fixture
def pod_a_listening() -> Iterator[int]:
    """A port open on pod-a's address (127.0.1.9), as a master would open it."""
    server = socket.socket()
    try:
        server.bind(("127.0.1.9", 0))
    except OSError as err:
        server.close()
        pytest.skip(f"cannot listen on 127.0.1.9 here: {err}")
    server.listen(16)
    yield int(server.getsockname()[1])
    server.close()


@pytest.mark.usefixtures("names_work")
@pytest.mark.parametrize("kind", PROBING)
def test_wait_for_master_reaches_the_master_by_name(
    kind: str, tmp_path: Path, hosts_file: Path, pod_a_listening: int
) -> None:
    shell = make_shell(kind, tmp_path)
    script = wait_for_master_script("pod-a.sub", pod_a_listening, 10)

    def wait(before_exec: Callable[[], None] | None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [shell.sh, "-c", script],
            env={"PATH": str(shell.path), INTERVAL_ENV: "0.05"},
            preexec_fn=before_exec,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=30,
        )

    done = wait(podnames.HostsMount.of(str(hosts_file)).enter)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "is ready" in done.stdout + done.stderr
    if kind == PROBING[0]:  # the name really came from the job's file: without it there is none
        script = wait_for_master_script("pod-a.sub", pod_a_listening, 0)
        assert wait(None).returncode != 0


def test_the_warm_pools_hosts_file_is_rewritten_only_when_a_job_changes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each pod of a job asks for the pool's /etc/hosts again while the ranks forked for the
    earlier pods resolve names through it: the same entries leave the file untouched (rewriting it
    emptied it for a moment, and gloo's lookup of the host's own name went to DNS: EAI_AGAIN)."""
    from types import SimpleNamespace

    from torchjob.engines.local import pool

    folder = tmp_path / "pool"
    folder.mkdir(mode=0o700)
    monkeypatch.setattr(pool, "_home", [folder])
    server: Any = SimpleNamespace(state="none", before_exec=None)
    first = "127.0.0.1 localhost\n10.0.0.1 job-master-0\n10.0.0.2 job-worker-0\n"
    assert pool.hosts_view(server, first)[0]
    hosts = folder / "hosts"
    before = os.stat(hosts)
    time.sleep(0.01)  # a write now would show in the modification time
    for _ in range(3):  # the job's other pods
        assert pool.hosts_view(server, first)[0]
    after = os.stat(hosts)
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)
    second = "127.0.0.1 localhost\n10.0.0.9 other-master-0\n"  # the next job's, shorter
    assert pool.hosts_view(server, second)[0]
    assert hosts.read_text() == second and os.stat(hosts).st_ino == before.st_ino
