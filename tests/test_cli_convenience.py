"""Issue 11's conveniences through the real CLI: validate --local, overrides, quick mode, housekeeping."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from support import cli

pytestmark = pytest.mark.timeout(120)


BROKEN = """\
apiVersion: batch.volcano.sh/v1alpha1
kind: Job
metadata: {name: broken}
spec:
  tasks:
    - name: main
      replicas: 1
      template:
        spec:
          restartPolicy: Never
          containers:
            - name: nocmd
              image: busybox
              env:
                - name: TOKEN
                  valueFrom: {secretKeyRef: {name: s, key: k}}
            - name: nodir
              image: busybox
              command: [sh, -c, "true"]
              workingDir: /no/such/dir/anywhere
            - name: noscript
              image: busybox
              command: [python3, -u]
              args: [missing_train.py, --lr, "0.1"]
"""


def test_validate_local_and_run_report_every_local_problem_at_once(tmp_path: Path) -> None:
    (tmp_path / "job.yaml").write_text(BROKEN)
    plain = cli(tmp_path, "validate", "job.yaml")
    assert plain.returncode == 0, plain.stderr  # the job itself is valid
    for args in (("validate", "--local", "job.yaml"), ("run", "job.yaml")):
        proc = cli(tmp_path, *args)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        lines = proc.stderr.splitlines()
        where = "job.yaml:{}: spec.tasks[0].template.spec.containers[{}]"
        expected = [
            (where.format(12, 0) + ".command:", "has no command"),
            (where.format(16, 0) + ".env[0].valueFrom.secretKeyRef:", "Secrets are not available"),
            (where.format(20, 1) + ".workingDir:", "does not exist here"),
            (where.format(24, 2) + ".args[0]:", "'missing_train.py' does not exist"),
        ]
        for start, text in expected:
            assert any(line.startswith(start) and text in line for line in lines), (start, lines)
        assert not (tmp_path / "home" / "jobs").exists() or not list((tmp_path / "home" / "jobs").iterdir())


def test_a_script_that_exists_in_the_working_directory_passes(tmp_path: Path) -> None:
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "train.py").write_text("print('trained')\n")
    job = BROKEN.split("          containers:")[0] + (
        "          containers:\n"
        "            - name: main\n"
        "              image: x\n"
        f"              workingDir: {tmp_path / 'code'}\n"
        "              command: [python, -X, dev, train.py]\n"
    )
    (tmp_path / "job.yaml").write_text(job)
    proc = cli(tmp_path, "validate", "--local", "job.yaml")
    assert proc.returncode == 0, proc.stderr
    proc = cli(tmp_path, "run", "job.yaml")
    assert proc.returncode == 0, proc.stderr
    assert "trained" in proc.stdout


def test_validate_local_tells_a_script_of_the_image_by_its_absolute_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Kubeflow's own PyTorchJob examples run ``python3 /opt/<app>/mnist.py``, a file of their image:
    here every start failed with python's "can't open file" and OnFailure restarted it without
    end. The check tells it at once with the --workdir that maps the folder; a script that exists
    at its absolute path, or one on a volume the engine makes at start, is not told."""
    from torchjob.cli import main

    (tmp_path / "train.py").write_text("print('trained')\n")
    job = BROKEN.split("          containers:")[0] + (
        "          volumes: [{name: scratch, emptyDir: {}}]\n"
        "          containers:\n"
        "            - {name: image, image: x, command: [python3, /opt/no-such-app/mnist.py, --epochs=1]}\n"
        f"            - {{name: here, image: x, command: [python, {tmp_path / 'train.py'}]}}\n"
        "            - name: volume\n"
        "              image: x\n"
        "              command: [python, /scratch/made.py]\n"
        "              volumeMounts: [{name: scratch, mountPath: /scratch}]\n"
    )
    (tmp_path / "job.yaml").write_text(job)
    assert main(["validate", "--local", str(tmp_path / "job.yaml")]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert lines == [
        f"{tmp_path / 'job.yaml'}:13: spec.tasks[0].template.spec.containers[0].command[1]: python script "
        "'/opt/no-such-app/mnist.py' does not exist here (a file of the container's image?); "
        "--workdir /opt/no-such-app=DIR reads it from a local DIR instead"
    ], lines
    # The fix it names is checked as run would make it, with run's --set too.
    app = tmp_path / "app"
    app.mkdir()
    (app / "mnist.py").write_text("print('trained')\n")
    given = ["--workdir", f"/opt/no-such-app={app}", "--set", "main.replicas=3"]
    assert main(["validate", "--local", *given, str(tmp_path / "job.yaml")]) == 0
    out, err = capsys.readouterr()
    assert out == f"{tmp_path / 'job.yaml'}: job broken: valid; 3 pods (mainx3); plugins: none\n", err
    assert main(["validate", "--set", "main.replica=3", str(tmp_path / "job.yaml")]) == 2
    assert capsys.readouterr().err.startswith("<command line>: --set: 'replica': "), "one line, the option"


SMALL = """\
apiVersion: batch.volcano.sh/v1alpha1
kind: Job
metadata: {name: small}
spec:
  tasks:
    - name: main
      replicas: 1
      template:
        spec:
          restartPolicy: Never
          containers:
            - name: main
              image: busybox
              command: [sh, -c, 'echo "dir=$(pwd) token=$TOKEN args=$*"', sh]
              env:
                - name: TOKEN
                  valueFrom: {secretKeyRef: {name: creds, key: token}}
    - name: worker
      replicas: 1
      template:
        spec:
          restartPolicy: Never
          containers: [{name: w, image: busybox, command: [sh, -c, 'echo worker $VC_TASK_INDEX']}]
"""


def test_run_overrides_replicas_workdir_secret_env_and_program_args(tmp_path: Path) -> None:
    (tmp_path / "job.yaml").write_text(SMALL)
    (tmp_path / "wd").mkdir()
    proc = cli(
        tmp_path,
        "run",
        "job.yaml",
        "--set",
        "worker.replicas=3",
        "--workdir",
        "wd",
        "-e",
        "TOKEN=s3cret",
        "--",
        "--lr",
        "$(TOKEN)",
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"dir={tmp_path / 'wd'} token=s3cret args=--lr $(TOKEN)" in proc.stdout
    workers = [line for line in proc.stdout.splitlines() if line.startswith("worker-") and "| worker" in line]
    assert len(workers) == 3, proc.stdout


@pytest.mark.parametrize(
    ("option", "message"),
    [
        (
            "worker.replicas=many",
            "<command line>: spec.tasks[1].replicas: --set worker.replicas=many: expected",
        ),
        ("trainer.replicas=2", "<command line>: --set: the job has no task 'trainer' (tasks: main, worker)"),
        ("worker.image=x", "<command line>: --set: 'image': the task fields that can be set are"),
        ("replicas", "<command line>: --set: expected TASK.FIELD=VALUE or FIELD=VALUE"),
    ],
)
def test_a_bad_set_names_the_option_and_starts_nothing(tmp_path: Path, option: str, message: str) -> None:
    (tmp_path / "job.yaml").write_text(SMALL)
    proc = cli(tmp_path, "run", "job.yaml", "-e", "TOKEN=x", "--set", option)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.startswith(message), proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "home" / "jobs").exists()


TRAIN = """\
import os, sys
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
t = torch.tensor([float(dist.get_rank())])
dist.all_reduce(t)
# One write per line: two ranks of a pod share its stdout, and print() under PYTHONUNBUFFERED=1
# writes the text and its newline separately, so lines of two processes could interleave.
sys.stdout.write(f"rank {dist.get_rank()} of {dist.get_world_size()} local {os.environ['LOCAL_RANK']} "
                 f"sum {t.item():.0f} args {sys.argv[1:]}\\n")
dist.destroy_process_group()
"""


def test_quick_mode_runs_a_script_on_nodes_times_processes_with_gloo(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(TRAIN)
    proc = cli(tmp_path, "run", "-j", "2x2", "train.py", "--", "--lr", "0.1", timeout=110)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for rank in range(4):
        expected = f"rank {rank} of 4 local {rank % 2} sum 6 args ['--lr', '0.1']"
        assert any(line.endswith(expected) for line in proc.stdout.splitlines()), proc.stdout


def test_quick_mode_renders_and_refuses_bad_shapes_and_missing_scripts(tmp_path: Path) -> None:
    (tmp_path / "train_gpt.py").write_text("print(1)\n")
    proc = cli(tmp_path, "render", "-o", "json", "-j", "3x4", "train_gpt.py", "--", "--lr", "0.1")
    assert proc.returncode == 0, proc.stderr
    import json

    pods = [i for i in json.loads(proc.stdout)["items"] if i["kind"] == "Pod"]
    assert [p["metadata"]["name"] for p in pods] == [
        "train-gpt-master-0",
        "train-gpt-worker-0",
        "train-gpt-worker-1",
    ]
    main = pods[2]["spec"]["containers"][0]
    assert main["command"][:3] == ["python", "-m", "torch.distributed.run"]
    assert "--nnodes=3" in main["command"] and "--nproc-per-node=4" in main["command"]
    # what a cluster runs: the image's working directory, not this machine's
    assert main["args"] == ["train_gpt.py", "--lr", "0.1"] and "workingDir" not in main
    for args, message in (
        (("-j", "2x", "train_gpt.py"), "<command line>: -j: expected NODESxPROCS_PER_NODE"),
        (("-j", "0x2", "train_gpt.py"), "<command line>: -j: expected NODESxPROCS_PER_NODE"),
        (("-j", "２x２", "train_gpt.py"), "<command line>: -j: expected NODESxPROCS_PER_NODE"),  # ASCII only
        (("-j", "9" * 5000 + "x2", "train_gpt.py"), "<command line>: -j: expected NODESxPROCS_PER_NODE"),
        (("-j", "1x1", "nope.py"), "nope.py: no such script in"),
    ):
        for command in ("run", "render"):
            proc = cli(tmp_path, command, *args)
            assert proc.returncode == 2 and proc.stderr.startswith(message), (command, args, proc.stderr)


TASK_FILE = """\
from torchjob import task
from torchjob.sdk.config import PyTorch


@task(task_config=PyTorch(num_workers=1))
def train(lr: float, epochs: int = 1, tag: str = "x") -> str:
    import os
    print(f"rank {os.environ['RANK']} lr={lr} epochs={epochs} tag={tag}", flush=True)
    return "ok"

"""


def test_a_task_called_at_import_time_is_refused_and_starts_no_job(tmp_path: Path) -> None:
    (tmp_path / "t.py").write_text(TASK_FILE + "train(0.1)\n")
    for command in ("render", "validate", "run"):
        proc = cli(tmp_path, command, "t.py:train")
        assert proc.returncode == 2, (command, proc.stdout, proc.stderr)
        assert proc.stderr.startswith("t.py:11: the file calls task 'train' when it is imported"), proc.stderr
        assert 'if __name__ == "__main__":' in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "home" / "jobs").exists()


def test_run_passes_arguments_to_a_task_and_refuses_a_missing_one(tmp_path: Path) -> None:
    (tmp_path / "t.py").write_text(TASK_FILE + 'if __name__ == "__main__":\n    train(0.1)\n')
    proc = cli(tmp_path, "run", "t.py:train")
    assert proc.returncode == 2 and "t.py:train: --lr: missing (float)" in proc.stderr, proc.stderr
    assert not (tmp_path / "home" / "jobs").exists()
    proc = cli(tmp_path, "run", "t.py:train", "--", "--lr", "0.5", "--tag", "$(HOME)")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for rank in (0, 1):
        assert f"rank {rank} lr=0.5 epochs=1 tag=$(HOME)" in proc.stdout, proc.stdout
    rendered = cli(tmp_path, "render", "-o", "json", "t.py:train", "--", "--lr", "2")
    assert rendered.returncode == 0, rendered.stderr
    import json

    pod = next(i for i in json.loads(rendered.stdout)["items"] if i["kind"] == "Pod")
    command = pod["spec"]["containers"][0]["command"]
    assert command[command.index("--task-args") + 1] == '["--lr", "2"]', command


def test_validate_a_workflow(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parent.parent
    ref = f"{root}/examples/sdk/adaptive_training.py:adaptive_training"
    proc = cli(tmp_path, "validate", ref)
    assert proc.returncode == 0, proc.stderr
    assert "workflow adaptive_training: valid; parameters: --use-single-node (bool)" in proc.stdout


QUICK = SMALL.replace(
    """              env:
                - name: TOKEN
                  valueFrom: {secretKeyRef: {name: creds, key: token}}
""",
    "",
)


def _jobs(tmp_path: Path) -> list[str]:
    root = tmp_path / "home" / "jobs"
    return sorted(p.name for p in root.iterdir()) if root.exists() else []


def test_run_rm_removes_the_job_once_it_has_ended(tmp_path: Path) -> None:
    (tmp_path / "job.yaml").write_text(QUICK)
    proc = cli(tmp_path, "run", "--rm", "job.yaml")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Completed" in proc.stdout and _jobs(tmp_path) == []
    # No path to the logs it has just removed; it says they are gone instead.
    assert "logs:" not in proc.stdout and "its logs are removed (--rm)" in proc.stdout, proc.stdout
    failing = QUICK.replace("echo worker $VC_TASK_INDEX", "exit 3")
    (tmp_path / "fail.yaml").write_text(failing)
    # A failed job is kept for its logs, and the output says so (with -q and without).
    for quiet in (["-q"], []):
        before = set(_jobs(tmp_path))
        proc = cli(tmp_path, "run", *quiet, "--rm", "fail.yaml")
        assert proc.returncode == 1 and "Failed" in proc.stdout, proc.stdout + proc.stderr
        (job,) = set(_jobs(tmp_path)) - before
        assert f"kept {job} for its logs" in proc.stdout or "kept for its logs" in proc.stdout, proc.stdout
        assert f"torchjob delete {job}" in proc.stdout
    assert len(_jobs(tmp_path)) == 2
    proc = cli(tmp_path, "run", "-d", "--rm", "job.yaml")
    assert proc.returncode == 2 and "--rm" in proc.stderr and len(_jobs(tmp_path)) == 2


def test_prune_removes_finished_jobs_only_and_delete_all_removes_every_job(tmp_path: Path) -> None:
    (tmp_path / "job.yaml").write_text(QUICK)
    (tmp_path / "long.yaml").write_text(QUICK.replace("echo worker $VC_TASK_INDEX", "sleep 60"))
    done = [cli(tmp_path, "run", "-q", "job.yaml").stdout.split()[0] for _ in range(2)]
    running = cli(tmp_path, "run", "-d", "long.yaml")
    assert running.returncode == 0, running.stderr
    assert len(_jobs(tmp_path)) == 3
    kept = cli(tmp_path, "prune", "--older-than", "1h")
    assert kept.returncode == 0 and "no finished jobs to remove" in kept.stdout and len(_jobs(tmp_path)) == 3
    bad = cli(tmp_path, "prune", "--older-than", "soon")
    assert bad.returncode == 2 and "--older-than: expected a duration" in bad.stderr
    pruned = cli(tmp_path, "prune")
    assert pruned.returncode == 0, pruned.stderr
    assert sorted(pruned.stdout.split()[1::2]) == sorted(done)
    assert _jobs(tmp_path) == [running.stdout.strip()]
    assert cli(tmp_path, "delete").returncode == 2
    removed = cli(tmp_path, "delete", "--all")
    assert removed.returncode == 0 and removed.stdout.split() == ["deleted", running.stdout.strip()]
    assert _jobs(tmp_path) == []
    again = cli(tmp_path, "delete", "--all")  # nothing left: said, not silent
    assert again.returncode == 0 and again.stdout == "no local jobs to delete\n", again.stdout + again.stderr


@pytest.mark.parametrize("age", ["٠s", "０s", "1.٥h", "٣d"])
def test_prune_refuses_an_age_written_with_non_ascii_digits(tmp_path: Path, age: str) -> None:
    # Python's \\d and float() read '٠' (Arabic-Indic) and '０' (fullwidth) as 0: '٠s' was 0s and
    # removed every finished job. Numbers on the command line are ASCII (docs/validation.md).
    (tmp_path / "job.yaml").write_text(QUICK)
    done = cli(tmp_path, "run", "-q", "job.yaml").stdout.split()[0]
    bad = cli(tmp_path, "prune", "--older-than", age)
    assert bad.returncode == 2 and bad.stdout == "", bad.stdout
    assert bad.stderr.strip().splitlines() == [
        f"<command line>: --older-than: expected a duration such as 90s, 30m, 12h, 7d or 1h30m, got {age!r}"
    ]
    assert _jobs(tmp_path) == [done]


PROGRESS = """\
apiVersion: batch.volcano.sh/v1alpha1
kind: Job
metadata: {name: bar}
spec:
  tasks:
    - name: main
      replicas: 1
      template:
        spec:
          restartPolicy: Never
          containers:
            - name: main
              image: busybox
              command:
                - python
                - -c
                - |
                  import sys, time
                  for step in (1, 2, 3):
                      sys.stdout.write(f"\\rstep {step}/3 \\x1b[A")
                      sys.stdout.flush()
                      time.sleep(0.8)
                  sys.stdout.write("\\rstep done\\n")
"""


def test_progress_bars_redrawn_with_carriage_returns_show_live_on_a_terminal(tmp_path: Path) -> None:
    import pty

    (tmp_path / "job.yaml").write_text(PROGRESS)
    master, slave = pty.openpty()
    env = {**os.environ, "TORCHJOB_HOME": str(tmp_path / "home"), "TERM": "xterm"}
    env.pop("NO_COLOR", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "torchjob", "run", "job.yaml"],
        env=env,
        cwd=tmp_path,
        stdout=slave,
        stderr=slave,
        stdin=subprocess.DEVNULL,
    )
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # the terminal closed: the run is over
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    assert proc.wait(timeout=60) == 0
    text = b"".join(chunks).decode(errors="replace")
    # Each state while the line was unfinished, then the line as it ended, once, as a log line.
    for step in (1, 2, 3):
        assert f"| step {step}/3 " in text, text
    assert text.count("| step done") == 1, text
    assert "\x1b[A" not in text.replace("\x1b[A\x1b[J", ""), "a bar's cursor move reached the terminal"


def test_render_appends_program_arguments_and_validate_refuses_them(tmp_path: Path) -> None:
    import json

    (tmp_path / "job.yaml").write_text(SMALL)
    proc = cli(tmp_path, "render", "-o", "json", "job.yaml", "--", "--epochs", "3")
    assert proc.returncode == 0, proc.stderr
    pods = [i for i in json.loads(proc.stdout)["items"] if i["kind"] == "Pod"]
    assert [p["spec"]["containers"][0].get("args") for p in pods] == [["--epochs", "3"], ["--epochs", "3"]]
    proc = cli(tmp_path, "validate", "job.yaml", "--", "--epochs", "3")
    assert proc.returncode == 2 and "arguments after -- are the program's" in proc.stderr


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["python", "train.py", "--lr", "1"], (1, "train.py")),
        (["python3", "-u", "-X", "dev", "-W", "ignore", "src/x.py"], (6, "src/x.py")),
        (["python3.12", "--", "-odd.py"], (2, "-odd.py")),
        (["python", "-m", "torch.distributed.run", "train.py"], None),
        (["python", "-c", "print(1)"], None),
        (["python", "-"], None),
        (["python"], None),
        (["sh", "-c", "python train.py"], None),
    ],
)
def test_the_script_of_a_python_command(argv: list[str], expected: tuple[int, str] | None) -> None:
    from torchjob.engines.local.localcheck import script_of

    assert script_of(argv) == expected
