"""The cluster's own MaxStepCount: read from the running Slurm (``scontrol show config``), each pod
container a job step, a job needing more refused at its field with the site's number and where it
came from; Slurm's default, said assumed, where the cluster cannot be asked.

The parser is checked on the output of Debian's Slurm 22.05 captured from the tests' private
cluster (tests/captured/); the end-to-end tests run one private cluster whose slurm.conf sets a
small MaxStepCount, shared by the module.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from slurm_cluster import SlurmCluster
from support import private_slurm
from test_slurm_engine import cli_env, job_dirs, status_json, torchjob
from torchjob.engines.slurm import clients
from torchjob.engines.slurm.limits import DEFAULT, MAX_STEP_COUNT, StepLimit, read_step_limit, step_limit_from
from torchjob.engines.slurm.plan import PlanError, job_steps, plan_job
from torchjob.engines.slurm.settings import SlurmSettings
from torchjob.jobs import load_jobs_from_text

pytestmark = pytest.mark.timeout(180)

CAPTURED = Path(__file__).resolve().parent / "captured" / "scontrol_show_config_22.05.txt"
SITE_STEPS = 4  # the module's cluster's MaxStepCount


def _job(text: str) -> object:
    (loaded,) = load_jobs_from_text(text, "job.yaml")
    return loaded.job


def _workers(replicas: int, init: bool = False, plugins: str = "") -> str:
    inits = "initContainers: [{name: fetch, image: x, command: ['true']}], " if init else ""
    return (
        "apiVersion: batch.volcano.sh/v1alpha1\nkind: Job\nmetadata: {name: steps}\nspec:\n"
        f"{plugins}"
        f"  tasks: [{{name: worker, replicas: {replicas}, template: {{spec: {{restartPolicy: Never, "
        f"{inits}containers: [{{name: main, image: x, command: ['true']}}]}}}}}}]\n"
    )


# -- the parser, on real output ----------------------------------------------------------------


def test_the_parser_reads_scontrol_show_config_as_slurm_22_05_prints_it() -> None:
    text = CAPTURED.read_text()
    config = clients.parse_config(text)
    assert config["MaxStepCount"] == "5" and config["MaxTasksPerNode"] == "512"
    assert config["MaxArraySize"] == "1001" and config["MaxJobCount"] == "10000"
    assert config["SchedulerParameters"] == "bf_interval=1"  # a value keeps its own "="
    assert config["AuthInfo"].startswith("socket=/") and config["AuthInfo"].endswith("/munge.sock")
    assert config["SuspendRate"] == "60 nodes/min" and config["TaskPluginParam"] == "(null type)"
    assert all(key and not any(c.isspace() for c in key) for key in config), sorted(config)[:5]
    assert not any(key.startswith(("Configuration", "Slurmctld(")) for key in config)  # heading, the ping
    assert len(config) == text.count(" = ")  # every pair, nothing else
    assert step_limit_from(config) == StepLimit(5, read=True)
    assert step_limit_from(config).source == "this cluster's MaxStepCount (scontrol show config)"


def test_a_section_a_repeated_key_and_odd_lines_do_not_confuse_it() -> None:
    text = (
        "Configuration data as of 2026-11-29T16:25:05\n"
        "MaxStepCount            = 70000\n"
        "\n"
        "Cgroup Support Configuration:\n"
        "AllowedRAMSpace         = 100.0%\n"
        "MaxStepCount            = 3\n"  # a plugin's section repeating a name: the first is slurmctld's
        "MPI Plugins Configuration:\n"
        "PMIxCliTmpDirBase       = (null)\n"
        "Slurmctld(primary) at vm is UP\n"
    )
    config = clients.parse_config(text)
    assert config == {"MaxStepCount": "70000", "AllowedRAMSpace": "100.0%", "PMIxCliTmpDirBase": "(null)"}
    assert step_limit_from(config).count == 70_000


@pytest.mark.parametrize("value", ["", "abc", "0", "-5", "٣", "1e5", "40000 steps"])
def test_a_value_that_is_no_count_keeps_the_default_said_assumed(value: str) -> None:
    limit = step_limit_from({"MaxStepCount": value})
    assert (limit.count, limit.read) == (MAX_STEP_COUNT, False)
    assert (
        limit.source
        == f"Slurm's default MaxStepCount, assumed: scontrol show config gives MaxStepCount = {value!r}"
    )


def test_a_configuration_without_the_key_keeps_the_default_said_assumed() -> None:
    config = clients.parse_config(CAPTURED.read_text().replace("MaxStepCount", "Other"))
    limit = step_limit_from(config)
    assert (limit.count, limit.read) == (MAX_STEP_COUNT, False)
    assert limit.source == "Slurm's default MaxStepCount, assumed: scontrol show config has no MaxStepCount"


def test_without_scontrol_or_a_configuration_the_default_is_assumed_and_the_dry_run_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no Slurm client at all
    limit = read_step_limit(os.environ)
    assert (limit.count, limit.read, limit.why) == (MAX_STEP_COUNT, False, "scontrol is not on PATH")
    done = torchjob(
        {**os.environ, "TORCHJOB_SLURM_JOB_ROOT": str(tmp_path / "root")},
        "run", "examples/pytorch-job.yaml", "--engine", "slurm", "--dry-run", timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert (
        "# job steps: 5 in the first attempt (one per container, init containers too; each restart one "
        "more); at most 40000 per job: Slurm's default MaxStepCount, assumed: scontrol is not on PATH\n"
    ) in done.stdout
    if clients.installed("scontrol"):  # a configuration no client can read: not asked, said why
        monkeypatch.undo()
        monkeypatch.setenv("SLURM_CONF", str(tmp_path / "nothing.conf"))
        limit = read_step_limit(os.environ)
        assert not limit.read and limit.why.startswith(
            f"SLURM_CONF={tmp_path / 'nothing.conf'} names no file"
        )


def _fake_scontrol(folder: Path, ping: str, show: str) -> dict[str, str]:
    """An environment whose scontrol runs ``ping`` for ``scontrol ping`` and ``show`` for
    ``scontrol show config`` (shell), and no SLURM_CONF."""
    folder.mkdir()
    script = folder / "scontrol"
    script.write_text(f'#!/bin/sh\ncase "$1" in\nping) {ping} ;;\nshow) {show} ;;\nesac\n')
    script.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "SLURM_CONF"}
    env["PATH"] = f"{folder}:{env['PATH']}"
    return env


def test_the_configuration_is_asked_beside_the_ping_not_after_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ping answers UP only once show config has been asked (else DOWN after 5 s)."""
    monkeypatch.setattr(clients, "_down_at", [])
    asked = tmp_path / "asked"
    env = _fake_scontrol(
        tmp_path / "bin",
        f"i=0; while [ ! -e {asked} ] && [ $i -lt 100 ]; do sleep 0.05; i=$((i+1)); done; "
        f"if [ -e {asked} ]; then echo 'Slurmctld(primary) at h is UP'; "
        "else echo 'Slurmctld(primary) at h is DOWN'; fi",
        f"touch {asked}; echo 'MaxStepCount            = 7'",
    )
    monkeypatch.setenv("PATH", env["PATH"])  # (a client is looked up on PATH)
    limit = read_step_limit(env)
    assert (limit.count, limit.read) == (7, True), limit.why


def test_a_ping_that_finds_slurmctld_down_ends_the_configuration_s_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(clients, "_down_at", [])
    pid = tmp_path / "show.pid"
    env = _fake_scontrol(
        tmp_path / "bin",
        "echo 'Slurmctld(primary) at h is DOWN'",
        f"echo $$ > {pid}.tmp; mv {pid}.tmp {pid}; exec sleep 120",
    )
    monkeypatch.setenv("PATH", env["PATH"])
    limit = read_step_limit(env)
    assert (limit.count, limit.read) == (MAX_STEP_COUNT, False)
    assert limit.why == "slurmctld does not answer (Slurmctld(primary) at h is DOWN)"
    if pid.exists():  # it had started: it was ended, not left waiting for slurmctld
        assert not Path(f"/proc/{pid.read_text().strip()}").exists()


# -- counting a job's steps --------------------------------------------------------------------


def test_every_container_of_every_pod_is_a_step_a_plugins_init_container_too() -> None:
    assert job_steps(_job(_workers(3))) == 3
    assert job_steps(_job(_workers(3, init=True))) == 6
    example = _job((Path(__file__).resolve().parent.parent / "examples" / "pytorch-job.yaml").read_text())
    assert job_steps(example) == 5  # the master, and each of 2 workers with the plugin's wait-for-master
    job = _job(_workers(3, init=True))
    with pytest.raises(PlanError) as caught:
        plan_job(job, SlurmSettings(), "/j", ["ctl"], step_limit=StepLimit(5, read=True))
    assert caught.value.path == "spec.tasks"
    assert caught.value.message == (
        "the job's 3 pods start 6 job steps (a step per container, init containers too); expected at "
        "most 5, this cluster's MaxStepCount (scontrol show config)"
    )
    assert plan_job(job, SlurmSettings(), "/j", ["ctl"], step_limit=StepLimit(6, read=True)).steps == 6


def test_a_site_above_or_below_slurms_default_is_held_to_its_own_number() -> None:
    """50,000 pods where the site allows 100,000 are planned; 30,000 where it allows 20,000 are not
    (Slurm's default, 40,000, would have said the opposite of both)."""
    big = _job(_workers(50_000))
    with pytest.raises(PlanError):
        plan_job(big, SlurmSettings(), "/j", ["ctl"], step_limit=DEFAULT)
    assert (
        len(plan_job(big, SlurmSettings(), "/j", ["ctl"], step_limit=StepLimit(100_000, read=True)).pods)
        == 50_000
    )
    small = _job(_workers(30_000))
    assert plan_job(small, SlurmSettings(), "/j", ["ctl"]).steps == 30_000
    with pytest.raises(PlanError) as caught:
        plan_job(small, SlurmSettings(), "/j", ["ctl"], step_limit=StepLimit(20_000, read=True))
    assert (
        "the job has 30000 pods, each a job step; expected at most 20000, this cluster's"
        in caught.value.message
    )


def test_the_batch_host_plans_under_the_limit_the_login_node_read() -> None:
    from torchjob.engines.slurm.batch import step_limit_of

    given = {"stepLimit": {"count": 100_000, "read": True, "why": ""}}
    assert step_limit_of(given) == StepLimit(100_000, read=True)
    assert step_limit_of({}) == DEFAULT  # a job directory of an older torchjob
    assert step_limit_of({"stepLimit": {"count": "many"}}) == DEFAULT


# -- against a real Slurm whose slurm.conf sets MaxStepCount -----------------------------------


@pytest.fixture(scope="module")
def limited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    yield from private_slurm(tmp_path_factory, extra=[f"MaxStepCount={SITE_STEPS}"])


@pytest.mark.slow
def test_the_running_clusters_value_is_read_once_and_a_job_above_it_is_refused_at_its_field(
    limited: SlurmCluster, tmp_path: Path
) -> None:
    live = clients.parse_config(limited.run("scontrol", "show", "config").stdout)
    assert live["MaxStepCount"] == str(SITE_STEPS)
    env = cli_env(limited, tmp_path / "root")
    path = tmp_path / "job.yaml"
    path.write_text(_workers(SITE_STEPS + 1))
    said = (
        f"{path}:5: spec.tasks: the job has {SITE_STEPS + 1} pods, each a job step; expected at most "
        f"{SITE_STEPS}, this cluster's MaxStepCount (scontrol show config)\n"
    )
    for verb in (["run"], ["run", "--dry-run"], ["submit"]):
        done = torchjob(env, *verb, str(path), "--engine", "slurm")
        assert (done.returncode, done.stderr, done.stdout) == (2, said, ""), (verb, done.stdout, done.stderr)
    assert limited.jobs() == [] and job_dirs(tmp_path / "root") == []  # nothing submitted, nothing written


@pytest.mark.slow
def test_a_job_of_as_many_steps_as_the_cluster_allows_runs(limited: SlurmCluster, tmp_path: Path) -> None:
    """Two pods of an init container and a container: four steps, the cluster's MaxStepCount."""
    env = cli_env(limited, tmp_path / "root")
    path = tmp_path / "job.yaml"
    path.write_text(_workers(2, init=True))
    dry = torchjob(env, "run", "--dry-run", str(path), "--engine", "slurm")
    assert (
        f"# job steps: {SITE_STEPS} in the first attempt (one per container, init containers too; "
        f"each restart one more); at most {SITE_STEPS} per job: this cluster's MaxStepCount "
        "(scontrol show config)\n"
    ) in dry.stdout, dry.stdout
    done = torchjob(env, "run", str(path), "--engine", "slurm", "-v")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stderr.count("slurm: scontrol show config") == 1, done.stderr  # once for the command
    assert limited.jobs() == []


# -- restarts that reach the limit while the job runs ------------------------------------------


def _restarting(how: str) -> str:
    """One pod whose container fails every time (exit 3): restarted in place (``OnFailure``) or as
    a new attempt of the whole job (``RestartJob``, maxRetry 20); every run a new job step."""
    policy = "Never" if how == "RestartJob" else "OnFailure"
    job = "  maxRetry: 20\n  policies: [{event: PodFailed, action: RestartJob}]\n"
    job = job if how == "RestartJob" else ""
    return (
        "apiVersion: batch.volcano.sh/v1alpha1\nkind: Job\nmetadata: {name: again}\nspec:\n"
        f"{job}"
        f"  tasks: [{{name: worker, replicas: 1, template: {{spec: {{restartPolicy: {policy}, "
        "containers: [{name: main, image: x, command: ['sh', '-c', 'echo ran; exit 3']}]}}}]\n"
    )


@pytest.mark.slow
@pytest.mark.parametrize("how", ["OnFailure", "RestartJob"])
def test_a_job_whose_restarts_reach_the_limit_fails_naming_it_instead_of_retrying(
    limited: SlurmCluster, tmp_path: Path, how: str
) -> None:
    """Each run of the failing container is a step: the fifth is refused by slurmctld (MaxStepCount
    4). Retrying cannot succeed; the job fails at once with the limit as its reason (without that,
    the refusals were retried until the deadline or maxRetry, for other reasons)."""
    env = cli_env(limited, tmp_path / "root")
    path = tmp_path / "job.yaml"
    path.write_text(_restarting(how))
    done = torchjob(env, "run", str(path), "--engine", "slurm", "--timeout", "100")
    assert done.returncode == 1, done.stdout + done.stderr
    (job_dir,) = job_dirs(tmp_path / "root")
    status = status_json(env, job_dir.name)
    assert status["phase"] == "Failed", status
    reason = str(status["reason"])
    assert reason.startswith("Slurm refused job step again-worker-0.main."), reason
    assert (
        "(Step limit reached for this job): the job created as many steps as the cluster lets one "
        f"job create ({SITE_STEPS}, this cluster's MaxStepCount (scontrol show config)); each "
        "container run and each restart is a new step, so nothing more can run"
    ) in reason
    logs = torchjob(env, "logs", job_dir.name, "--all-attempts", "--engine", "slurm").stdout
    assert logs.count("| ran") == SITE_STEPS, logs  # every step the cluster allowed ran the program
    assert "Step limit reached for this job" in logs, logs  # srun's words, where the user looks
    assert limited.jobs() == []


def test_the_reason_names_the_limit_read_or_says_why_it_was_not() -> None:
    from torchjob.engines.slurm.limits import reached

    tail = "; each container run and each restart is a new step, so nothing more can run"
    head = "Slurm refused job step j-w-0.main.3 (Step limit reached for this job): the job created as many "
    head += "steps as the cluster lets one job create"
    assert reached(StepLimit(9, read=True), "j-w-0.main.3") == (
        f"{head} (9, this cluster's MaxStepCount (scontrol show config)){tail}"
    )
    assert reached(StepLimit(MAX_STEP_COUNT, read=False, why="scontrol is not on PATH"), "j-w-0.main.3") == (
        f"{head} (its MaxStepCount, which torchjob could not read: scontrol is not on PATH){tail}"
    )
    assert reached(DEFAULT, "j-w-0.main.3") == f"{head} (its MaxStepCount){tail}"


def test_a_step_the_limit_refused_is_not_started_again_after_an_outage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Just after an outage a refused step is started again (slurmctld may still hold a finished
    step's resources); one refused for the limit would be refused every time: it ends."""
    import time

    from torchjob.engines.slurm.steps import Step

    monkeypatch.setattr(clients, "_down_at", [])
    clients.note_down()  # slurmctld was away a moment ago
    said = {
        "limit": "srun: error: Unable to create step for job 7: Step limit reached for this job\n",
        "busy": "srun: error: Unable to create step for job 7: Memory required by task is not available\n",
    }
    retried = {}
    for what, line in said.items():
        log = tmp_path / f"{what}.log"
        (tmp_path / f"{what}.log.srun").write_text(line)
        step = Step("7", what, ["true"], {}, log)
        step.messages_at = (tmp_path / f"{what}.log.srun", 0)
        retried[what] = step._not_created(time.monotonic())
    assert retried == {"limit": False, "busy": True}


# -- inside an allocation that made steps already ----------------------------------------------


def test_inside_an_allocation_only_a_job_large_next_to_the_limit_counts_the_steps_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The count is a step of its own (about 0.2 s before the first pod, at every start in a salloc):
    taken for a job of a tenth of the limit or more; a smaller one runs uncounted, and the dry run
    says which it is."""
    from torchjob.engines.slurm.allocation import check_steps as check_allocation
    from torchjob.engines.slurm.allocation import counted
    from torchjob.engines.slurm.dryrun import step_line

    job = _job(_workers(2))

    def planned(limit: int) -> Any:
        return plan_job(
            job, SlurmSettings(), "/j", ["ctl"], in_allocation=True, step_limit=StepLimit(limit, read=True)
        )

    small, near = planned(MAX_STEP_COUNT), planned(20)
    assert (counted(small), counted(near)) == (False, True)
    assert "not counted before the start" in step_line(small)
    assert "counted when the job starts (one step more)" in step_line(near)
    # An srun that notes each call and says step 0: counted, the check asks it; uncounted, never.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    srun = bin_dir / "srun"
    srun.write_text(f'#!/bin/sh\necho "$*" >> {calls}\necho 0\n')
    srun.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")  # (a client is looked up on PATH)
    environ = {"SLURM_JOB_ID": "1", "PATH": os.environ["PATH"]}
    check_allocation(small, environ)
    assert not calls.exists()
    check_allocation(near, environ)
    assert "printenv SLURM_STEP_ID" in calls.read_text()


def test_inside_an_allocation_the_step_choosing_the_masters_port_elsewhere_counts_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An srun that says step 0 (one step made, the count's own): a job of 2 steps fits a limit
    of 3 when its master's node is this machine, and not when the controller has to choose the
    master's port with a step on that node (masterport.py), a third step of the job."""
    import socket

    from torchjob.engine_api.base import EngineError
    from torchjob.engines.slurm.allocation import check_steps as check_allocation
    from torchjob.engines.slurm.allocation import port_probe

    pod = "{spec: {restartPolicy: Never, containers: [{name: main, image: x, command: ['true']}]}}"
    job = _job(
        "apiVersion: batch.volcano.sh/v1alpha1\nkind: Job\nmetadata: {name: steps}\nspec:\n"
        "  plugins: {pytorch: ['--master=master', '--worker=worker', '--port=23456']}\n"
        f"  tasks: [{{name: master, replicas: 1, template: {pod}}},\n"
        f"          {{name: worker, replicas: 1, template: {pod}}}]\n"
    )
    plan = plan_job(
        job, SlurmSettings(), "/j", ["ctl"], in_allocation=True, step_limit=StepLimit(3, read=True)
    )
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text("#!/bin/sh\necho 0\n")
    (bin_dir / "srun").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    here = socket.gethostname().split(".")[0]
    environ = {"SLURM_JOB_ID": "1", "PATH": os.environ["PATH"], "SLURM_TASKS_PER_NODE": "2"}
    on_this = {**environ, "SLURM_JOB_NODELIST": here}
    elsewhere = {**environ, "SLURM_JOB_NODELIST": f"{here}x"}
    assert (port_probe(plan, on_this), port_probe(plan, elsewhere)) == (0, 1)
    check_allocation(plan, on_this)
    with pytest.raises(
        EngineError, match="the job starts 2 and one to choose its master's port: more than 3"
    ):
        check_allocation(plan, elsewhere)


@pytest.mark.slow
def test_inside_an_allocation_the_steps_it_made_count_against_the_limit(
    limited: SlurmCluster, tmp_path: Path
) -> None:
    """Three steps made in the salloc before torchjob, one more to count them: a job of 2 steps
    would be the fifth and sixth (MaxStepCount 4), refused before anything starts (without the
    count it started, and failed at its second step). After two steps, a job of 1 fits."""
    import subprocess
    import sys

    env = cli_env(limited, tmp_path / "root")
    env.pop("TORCHJOB_SLURM_PARTITION")
    done = {}
    for pods, before in ((2, 3), (1, 2)):
        path = tmp_path / f"job{pods}.yaml"
        path.write_text(_workers(pods))
        cli = [sys.executable, "-m", "torchjob", "run", str(path), "--engine", "slurm"]
        dry = [" ".join([*cli, "--dry-run"])] if pods == 1 else []  # it makes no step: the job fits
        inside = " && ".join([*["srun -n1 true"] * before, *dry, f"exec {' '.join(cli)}"])
        done[pods] = subprocess.run(
            ["salloc", "-n", "2", "--", "sh", "-c", inside],
            env=env,
            cwd=Path(__file__).resolve().parent.parent,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    refused, fits = done[2], done[1]
    said = [line for line in refused.stderr.splitlines() if line.startswith("torchjob:")]
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert len(said) == 1 and said[0].endswith(
        "has created 4 job steps (the last one to count them) and the job starts 2: more than "
        f"{SITE_STEPS}, this cluster's MaxStepCount (scontrol show config); run it in a new "
        "allocation (--new-allocation, or another salloc)"
    ), refused.stderr
    assert fits.returncode == 0, fits.stdout + fits.stderr
    assert (
        "\n# the steps the allocation made count too: counted when the job starts (one step more)\n"
    ) in fits.stdout
    # salloc returns as it relinquishes: its allocation may still be COMPLETING for a moment.
    deadline = time.monotonic() + 30
    while limited.jobs() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert limited.jobs() == []
