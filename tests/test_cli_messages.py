"""Issue 19's messages that point at the fix, through the real CLI: each mistake is refused (or told)
in one line that says what to do instead."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from support import cli, container, make_job, sh, task, write_job

pytestmark = pytest.mark.timeout(120)


def _jobs(tmp_path: Path) -> list[str]:
    root = tmp_path / "home" / "jobs"
    return sorted(p.name for p in root.iterdir()) if root.exists() else []


def test_a_misspelt_preload_module_is_refused_before_the_job_starts(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "mylib.py").write_text("VALUE = 1\n")  # beside the program: the server finds it there
    (work / "main.py").write_text("import mylib\nprint('value', mylib.VALUE)\n")
    job = make_job("pre", [task("main", [container("app", ["python", "main.py"], workingDir=str(work))])])
    file = write_job(tmp_path, job)
    for modules, hint in (("troch", "'torch'"), ("json,torch.distribted", "'torch.distributed'")):
        proc = cli(tmp_path, "run", "--preload", modules, file)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        lines = proc.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("<command line>: --preload: no module named"), lines
        assert f"for {sys.executable}; did you mean {hint}?" in lines[0], lines
        assert proc.stdout == "" and _jobs(tmp_path) == []  # nothing started, nothing written
    proc = cli(tmp_path, "run", "-q", "--preload", "json,mylib,os.path", file)
    assert proc.returncode == 0, proc.stdout + proc.stderr


ENV_JOB = """\
apiVersion: batch.volcano.sh/v1alpha1
kind: Job
metadata: {name: envjob}
spec:
  plugins:
    pytorch: ["--master=master", "--worker=worker"]
  tasks:
    - name: master
      replicas: 1
      template:
        spec:
          restartPolicy: Never
          containers:
            - name: master
              image: busybox:1.36
              command: ["sh", "-c", "echo port $MASTER_PORT"]
              env:
                - {name: MASTER_PORT, value: "29500"}
                - {name: OTHER, value: "1"}
    - name: worker
      replicas: 1
      template:
        spec:
          restartPolicy: Never
          containers:
            - name: worker
              image: busybox:1.36
              command: ["sh", "-c", "true"]
              env:
                - {name: MASTER_ADDR, value: localhost}
                - {name: RANK, value: "1"}
    - name: extra
      replicas: 1
      template:
        spec:
          restartPolicy: Never
          containers:
            - name: extra
              image: busybox:1.36
              command: ["sh", "-c", "true"]
              env:
                - {name: RANK, value: "7"}
"""


def test_env_the_pytorch_plugin_overrides_is_warned_of_by_validate_render_and_run(tmp_path: Path) -> None:
    (tmp_path / "job.yaml").write_text(ENV_JOB)
    expected = [
        "job.yaml:18: spec.tasks[0].template.spec.containers[0].env[0]: warning: the pytorch plugin sets "
        "MASTER_PORT to its --port (23456) after this entry, which is ignored; remove it, or set the port "
        "with --port=N in spec.plugins.pytorch",
        "job.yaml:30: spec.tasks[1].template.spec.containers[0].env[0]: warning: the pytorch plugin sets "
        "MASTER_ADDR to the master pod's address after this entry, which is ignored; remove it",
        "job.yaml:31: spec.tasks[1].template.spec.containers[0].env[1]: warning: the pytorch plugin sets "
        "RANK to each pod's rank (master 0, workers 1 to N) after this entry, which is ignored; remove it",
    ]  # the extra task's RANK is its own: the plugin gives a task that is neither master nor worker none
    for command in (["validate"], ["render"], ["run", "-q"]):
        proc = cli(tmp_path, *command, "job.yaml")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert proc.stderr.splitlines() == expected, proc.stderr
    log = next((tmp_path / "home" / "jobs").glob("envjob-*/logs/envjob-master-0/attempt-0/master.log"))
    assert (
        log.read_text() != "port 29500\n"
    )  # what the warning says: the plugin's value wins (maybe remapped)


WORKSPACE_JOB = """\
apiVersion: batch.volcano.sh/v1alpha1
kind: Job
metadata: {name: ws}
spec:
  tasks:
    - name: main
      replicas: 1
      template:
        spec:
          restartPolicy: Never
          initContainers:
            - name: prep
              image: busybox:1.36
              workingDir: /workspace/data
              command: ["sh", "-c", "pwd"]
          containers:
            - name: main
              image: busybox:1.36
              workingDir: /workspace
              command: ["python", "/workspace/train.py"]
              args: ["--out", "/workspace/out", "/workspacex"]
"""


def test_workdir_maps_a_jobs_own_working_directory_and_the_error_says_how(tmp_path: Path) -> None:
    (tmp_path / "job.yaml").write_text(WORKSPACE_JOB)
    project = tmp_path / "project"
    (project / "data").mkdir(parents=True)
    (project / "train.py").write_text("import os, sys\nprint('cwd', os.getcwd(), sys.argv[1:])\n")
    # A plain --workdir is for containers without a working directory: the error says what works.
    refused = cli(tmp_path, "run", "--workdir", "project", "job.yaml")
    assert refused.returncode == 2 and _jobs(tmp_path) == [], refused.stdout + refused.stderr
    assert (
        "job.yaml:19: spec.tasks[0].template.spec.containers[0].workingDir: container 'main': working "
        "directory '/workspace' does not exist here; --workdir /workspace=DIR runs it in a local DIR instead"
    ) in refused.stderr.splitlines(), refused.stderr
    ran = cli(tmp_path, "run", "--workdir", "/workspace=project", "job.yaml")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert f"main-0/prep | {project / 'data'}" in ran.stdout, ran.stdout  # below it: the same place
    # The script's path is mapped too; an argument that only begins with the same letters is not.
    assert f" | cwd {project} ['--out', '{project / 'out'}', '/workspacex']" in ran.stdout
    missing = cli(tmp_path, "run", "--workdir", "/workspace=nowhere", "job.yaml")
    assert (
        missing.returncode == 2
        and missing.stderr == "<command line>: --workdir: 'nowhere' is not a directory\n"
    )


def test_an_sdk_config_typo_names_the_file_line_and_the_field_meant(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(
        "from torchjob import PyTorch, Worker, task\n\n\n"
        "@task(task_config=PyTorch(worker=Worker(replica=3)))\n"
        "def train() -> None:\n"
        "    pass\n"
    )
    for command in ("validate", "run", "render"):
        proc = cli(tmp_path, command, "train.py:train")
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert (
            proc.stderr
            == "train.py:4: invalid task: Worker: unknown field 'replica'; did you mean 'replicas'?\n"
        )


def _kubeconfig(tmp_path: Path, server: str, insecure: bool = False) -> Path:
    skip = ", insecure-skip-tls-verify: true" if insecure else ""
    path = tmp_path / "kubeconfig.yaml"
    path.write_text(
        "apiVersion: v1\nkind: Config\n"
        f'clusters: [{{name: c, cluster: {{server: "{server}"{skip}}}}}]\n'
        "users: [{name: u, user: {token: abc}}]\n"
        "contexts: [{name: x, context: {cluster: c, user: u}}]\n"
        "current-context: x\n"
    )
    return path


class _WebServer:
    """A web server that is not a Kubernetes API (nginx's welcome page, a proxy's login): real HTTP,
    in a thread; over TLS with a self-signed certificate when ``cert`` is given."""

    def __init__(self, cert: tuple[Path, Path] | None = None) -> None:
        import http.server
        import threading

        page = b"<!DOCTYPE html>\n<html>\n<body>\n<h1>Not found</h1>\n</body>\n</html>\n"

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(404)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(page)))
                self.end_headers()
                self.wfile.write(page)

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        scheme = "http"
        if cert is not None:
            import ssl

            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(str(cert[0]), str(cert[1]))
            self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
            scheme = "https"
        self.url = f"{scheme}://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)


def test_kubeconfig_and_api_server_mistakes_are_one_line_each(tmp_path: Path) -> None:
    pytest.importorskip("kubernetes")
    proc = cli(tmp_path, "status", "--engine", "kubernetes", "--kubeconfig", "missing.yaml")
    # The file was given: "pass --kubeconfig" would be no help.
    assert (proc.returncode, proc.stderr) == (2, "torchjob: no kubeconfig: missing.yaml does not exist\n")
    html = "an HTML page, not a Kubernetes API answer: is the kubeconfig's server right?"
    web = _WebServer()
    try:
        config = _kubeconfig(tmp_path, web.url)
        proc = cli(tmp_path, "status", "--engine", "kubernetes", "--kubeconfig", str(config))
    finally:
        web.close()
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr == f"torchjob: cannot list /api/v1/namespaces/default/pods: not found ({html})\n"


def test_an_unverified_certificate_is_told_once_in_one_line_not_by_urllib3(tmp_path: Path) -> None:
    pytest.importorskip("kubernetes")
    import shutil

    if shutil.which("openssl") is None:
        pytest.skip("needs openssl to make a self-signed certificate")
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    make = [
        "openssl",
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "1",
        "-subj",
        "/CN=localhost",
    ]
    subprocess.run(
        [*make, "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True, timeout=60
    )
    web = _WebServer((cert, key))
    try:
        config = _kubeconfig(tmp_path, web.url, insecure=True)
        proc = cli(tmp_path, "status", "--engine", "kubernetes", "--kubeconfig", str(config))
    finally:
        web.close()
    lines = proc.stderr.splitlines()
    assert proc.returncode == 2 and len(lines) == 2, proc.stderr
    assert (
        lines[0]
        == f"torchjob: warning: the certificate of {web.url} is not verified (insecure-skip-tls-verify)"
    )
    assert "InsecureRequestWarning" not in proc.stderr and "an HTML page" in lines[1]


SECRET_JOB = """\
apiVersion: batch.volcano.sh/v1alpha1
kind: Job
metadata: {name: secret}
spec:
  minAvailable: 3
  tasks:
    - name: master
      replicas: 1
      template:
        spec:
          restartPolicy: Never
          containers:
            - name: master
              image: busybox:1.36
              command: ["sh", "-c", "echo token=$TOKEN"]
              env:
                - name: TOKEN
                  valueFrom: {secretKeyRef: {name: creds, key: token}}
    - name: worker
      replicas: 2
      template:
        spec:
          restartPolicy: Never
          containers:
            - {name: worker, image: "busybox:1.36", command: ["true"]}
"""


def test_the_secret_and_min_available_errors_say_which_option_fixes_them(tmp_path: Path) -> None:
    (tmp_path / "job.yaml").write_text(SECRET_JOB)
    proc = cli(tmp_path, "run", "job.yaml")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr == (
        "job.yaml:18: spec.tasks[0].template.spec.containers[0].env[0].valueFrom.secretKeyRef: Secrets are "
        "not available to local jobs; run -e TOKEN=VALUE stands in for it (or mark it optional)\n"
    )
    proc = cli(tmp_path, "run", "-e", "TOKEN=x", "--set", "worker.replicas=1", "job.yaml")
    assert proc.returncode == 2 and _jobs(tmp_path) == [], proc.stdout + proc.stderr
    assert proc.stderr == (
        "job.yaml:5: spec.minAvailable: expected at most the total replicas of all tasks (2), got 3; "
        "with --set worker.replicas=1, add --set minAvailable=2 (or lower)\n"
    )
    proc = cli(
        tmp_path,
        "run",
        "-q",
        "-e",
        "TOKEN=x",
        "--set",
        "worker.replicas=1",
        "--set",
        "minAvailable=2",
        "job.yaml",
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_docs_install_commands_work_from_a_checkout() -> None:
    """Every ``pip install`` in the README and docs installs this checkout (torchjob is not on an
    index), with extras that pyproject.toml defines."""
    import re

    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    root = Path(__file__).resolve().parent.parent
    extras = tomllib.loads((root / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    commands = []
    for doc in [root / "README.md", *sorted((root / "docs").glob("*.md"))]:
        commands += re.findall(r"pip install [^`\n#]*", doc.read_text())
    assert commands
    for command in commands:
        assert "torchjob[" not in command, command
        for wanted in re.findall(r"-e '\.\[([\w,]+)\]'", command):
            assert set(wanted.split(",")) <= set(extras), command


def test_a_python_container_without_torch_gets_one_line_naming_the_interpreter(tmp_path: Path) -> None:
    # -S: this interpreter without its site-packages, so `import torch` fails as it does where
    # torch was never installed; two pods crash-loop, the line is printed once.
    command = ["python", "-S", "-c", "import torch"]
    job = make_job("notorch", [task("main", [container("train", command)], replicas=2, restart="OnFailure")])
    proc = cli(tmp_path, "run", "--timeout", "3", write_job(tmp_path, job))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    line = (
        f"container train: {sys.executable} (the interpreter torchjob runs a container's python with) cannot "
        f"import torch; install it there ({sys.executable} -m pip install torch), or run torchjob from the "
        "environment that has torch"
    )
    assert proc.stdout.count(line) == 1, proc.stdout
    job_id = proc.stdout.split("torchjob: job ", 1)[1].split(" ", 1)[0]
    assert line in cli(tmp_path, "status", job_id).stdout  # an event: there for a detached job too
    # Another module missing, or another interpreter: no such line.
    for other in (
        ["python", "-c", "import nosuchmodule"],
        ["sh", "-c", "echo \"ModuleNotFoundError: No module named 'torch'\"; exit 1"],
    ):
        job = make_job("other", [task("main", [container("train", other)])])
        proc = cli(tmp_path, "run", write_job(tmp_path, job, "other.json"))
        assert proc.returncode == 1 and "cannot import torch" not in proc.stdout, proc.stdout


def test_a_silent_job_gets_one_notice_and_status_shows_each_pods_last_output(tmp_path: Path) -> None:
    quiet = make_job("quiet", [task("main", [container("app", sh("echo start; sleep 30"))], replicas=2)])
    file = write_job(tmp_path, quiet)
    proc = cli(tmp_path, "run", "--hang-notice", "1", "--timeout", "4", file)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    notices = [line for line in proc.stdout.splitlines() if "no pod has written any output for" in line]
    assert len(notices) == 1, proc.stdout  # once for one silence, not once a second
    assert "--hang-notice SECONDS sets when this is said" in notices[0]
    # 0 turns it off; the default (300 s) is not reached by a short job
    for option in (["--hang-notice", "0"], []):
        proc = cli(tmp_path, "run", *option, "--timeout", "2.5", file)
        assert "no pod has written" not in proc.stdout, proc.stdout
    for bad in (
        ["--hang-notice", "-1"],
        ["--hang-notice", "nan"],
        ["--hang-notice", "5", "--engine", "kubernetes"],
    ):
        proc = cli(tmp_path, "run", *bad, file)
        assert proc.returncode == 2 and proc.stderr.startswith("<command line>: --hang-notice: "), proc.stderr

    talking = make_job(
        "talking",
        [
            task("talk", [container("app", sh("while true; do echo tick; sleep 0.2; done"))]),
            task("mute", [container("app", sh("echo once; sleep 30"))]),
        ],
    )
    job_id = cli(tmp_path, "run", "-d", write_job(tmp_path, talking, "talking.json")).stdout.strip()
    ages: dict[str, float] = {}
    try:
        deadline = time.monotonic() + 30  # a busy machine may start the pods late: ask until mute is silent
        while time.monotonic() < deadline and ages.get("mute-0", 0.0) <= 2.0:
            time.sleep(0.5)
            out = cli(tmp_path, "status", job_id).stdout
            rows = {line.split()[0]: line for line in out.splitlines() if line.startswith("  ")}
            assert "LAST OUTPUT" in rows["POD"], out
            ages = {
                pod: float(rows[pod].split()[-2].rstrip("s"))
                for pod in ("talk-0", "mute-0")
                if rows[pod].split()[-1] == "ago"
            }
    finally:
        cli(tmp_path, "delete", job_id)
    assert ages["talk-0"] < 1.5 < 2.0 < ages["mute-0"], out  # the silent pod stands out
