"""Trying the Slurm engine on one machine, as docs/slurm.md tells a person to: tools/slurm_cluster.py
starts a private Slurm, its env.sh points the clients at it, torchjob runs a job there, and the
same tool stops it. And the configuration mistakes a person makes first, said in one line at once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from slurm_cluster import alive, why_not
from support import read_until, wait_until
from test_slurm_engine import REPO, job_file, task

pytestmark = [pytest.mark.timeout(180)]
TOOL = REPO / "tools" / "slurm_cluster.py"


def shell(script: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["sh", "-c", script], env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout, check=False
    )


@pytest.mark.slow
def test_the_documented_private_slurm_runs_a_job_and_stops(tmp_path: Path) -> None:
    reason = why_not()
    if reason is not None:
        pytest.skip(reason)
    where = tmp_path / "try"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "TORCHJOB_"))}
    env["TORCHJOB_SLURM_JOB_ROOT"] = str(tmp_path / "root")
    started = subprocess.run(
        [sys.executable, str(TOOL), "start", str(where)], env=env, capture_output=True, text=True, timeout=120
    )
    try:
        assert started.returncode == 0, started.stdout + started.stderr
        assert f". {where / 'env.sh'}" in started.stdout
        path = job_file(tmp_path, [task("w", "print('hello from slurm')")])
        torchjob = f"{sys.executable} -m torchjob run {path} --engine slurm"
        done = shell(f". {where / 'env.sh'} && sinfo -h -o %t && {torchjob}", env)
        assert done.returncode == 0, done.stdout + done.stderr
        assert done.stdout.splitlines()[0] == "idle" and "w-0 | hello from slurm" in done.stdout, done.stdout
        again = subprocess.run(
            [sys.executable, str(TOOL), "start", str(where)], env=env, capture_output=True, text=True
        )
        assert again.returncode == 2 and "is not empty" in again.stderr
    finally:
        pids = [int(p.read_text().split()[0]) for p in where.glob("*.pid") if p.read_text().strip()]
        stopped = subprocess.run(
            [sys.executable, str(TOOL), "stop", str(where)], env=env, capture_output=True, text=True
        )
    assert stopped.returncode == 0, stopped.stderr
    assert pids and not any(alive(pid) for pid in pids)


# A process that starts a tied cluster, says its daemons' pids, and waits to be killed.
TIED_STARTER = """
import json, sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from slurm_cluster import SlurmCluster
cluster = SlurmCluster(Path(sys.argv[2]), tied=True).start()
print(json.dumps(cluster.pids), flush=True)
time.sleep(600)
"""


@pytest.mark.slow
def test_a_tied_clusters_daemons_die_with_the_process_that_started_it(tmp_path: Path) -> None:
    """As when an xdist worker crashes with a fixture's cluster up: SIGKILL, no finally runs."""
    reason = why_not()
    if reason is not None:
        pytest.skip(reason)
    where = tmp_path / "tied"
    starter = subprocess.Popen(
        [sys.executable, "-c", TIED_STARTER, str(TOOL.parent), str(where)],
        stdout=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        cwd=REPO,
    )
    pids: dict[str, int] = {}
    try:
        assert starter.stdout is not None
        said = read_until(starter.stdout, "\n", timeout=120)
        pids = json.loads(said)
        assert sorted(name.split("-")[0] for name in pids) == ["munged", "slurmctld", "slurmd"], said
        assert all(alive(pid) for pid in pids.values())
        starter.send_signal(signal.SIGKILL)
        starter.wait(30)
        assert wait_until(lambda: not any(alive(pid) for pid in pids.values()), timeout=60), {
            name: pid for name, pid in pids.items() if alive(pid)
        }
    finally:
        starter.kill()
        starter.wait(30)
        if any(alive(pid) for pid in pids.values()) or not pids:
            subprocess.run([sys.executable, str(TOOL), "stop", str(where)], capture_output=True, timeout=120)


@pytest.mark.parametrize(
    ("conf", "said"),
    [
        ("", "SLURM_CONF is set but empty: unset it, or set it to the cluster's slurm.conf"),
        (
            "/nonexistent/slurm.conf",
            "SLURM_CONF=/nonexistent/slurm.conf names no file: set it to the cluster's slurm.conf",
        ),
    ],
)
def test_a_slurm_conf_no_client_can_read_is_one_line_at_once(conf: str, said: str, tmp_path: Path) -> None:
    if why_not(root=False) is not None:
        pytest.skip(str(why_not(root=False)))
    env = {**os.environ, "SLURM_CONF": conf, "TORCHJOB_SLURM_JOB_ROOT": str(tmp_path / "root")}
    path = job_file(tmp_path, [task("w", "print('never')")])
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "torchjob", "run", str(path), "--engine", "slurm"],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert (done.returncode, done.stderr) == (2, f"torchjob: {said}\n")
    assert time.monotonic() - started < 10  # Slurm's clients would retry reading it for a minute
    assert not (tmp_path / "root").exists()
