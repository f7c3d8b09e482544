"""What `torchjob run` prints: every line of fast output, and never a supervisor stuck on its reader.

The jobs here write a burst of numbered lines; the checks count them in what the CLI printed
(through a real pipe or into a file) against the container's log file on disk.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from support import container, make_job, task, wait_until
from torchjob.spec.manifest import job_manifest

pytestmark = pytest.mark.timeout(90)


def _job_file(tmp_path: Path, lines: int, then: str = "") -> str:
    program = tmp_path / "burst.py"
    program.write_text(
        "import sys, time\n"
        f"for i in range({lines}):\n"
        "    sys.stdout.write(f'line {i} ' + 'x' * 190 + '\\n')\n"
        "sys.stdout.flush()\n"
        f"{then}\n"
    )
    job = make_job("burst", [task("main", [container("app", ["python", str(program)])])])
    path = tmp_path / "job.json"
    path.write_text(json.dumps(job_manifest(job)))
    return str(path)


def _env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "TORCHJOB_HOME": str(tmp_path / "home")}


def _numbers(out: str) -> list[int]:
    return [int(m.group(1)) for m in re.finditer(r"^main-0 \| line (\d+) x+$", out, re.MULTILINE)]


def _job_dir(tmp_path: Path) -> Path:
    jobs = tmp_path / "home" / "jobs"
    assert wait_until(lambda: jobs.is_dir() and any(jobs.iterdir()), 15), "the job never started"
    return next(jobs.iterdir())


def _phase(job_dir: Path) -> str:
    try:
        return str(json.loads((job_dir / "status.json").read_text()).get("phase"))
    except (OSError, ValueError):
        return ""


def _finished(job_dir: Path) -> bool:
    """The supervisor wrote its last status (after the job's last lines, before the summary)."""
    try:
        return json.loads((job_dir / "status.json").read_text()).get("finishedAt") is not None
    except (OSError, ValueError):
        return False


def _logged(job_dir: Path) -> int:
    logs = list(job_dir.glob("logs/*/attempt-0/app.log"))
    return logs[0].read_bytes().count(b"\n") if logs else 0


@pytest.mark.parametrize("lines", [30_000, 200_000])
@pytest.mark.parametrize("into", ["pipe", "file"])
def test_a_burst_of_output_is_shown_whole_before_the_summary(tmp_path: Path, lines: int, into: str) -> None:
    # 30,000 lines (6 MB): 20,763 were shown of shorter ones; 200,000 (40 MB): a small part.
    command = [sys.executable, "-m", "torchjob", "run", _job_file(tmp_path, lines)]
    if into == "pipe":
        proc = subprocess.run(command, env=_env(tmp_path), capture_output=True, text=True, timeout=80)
        out = proc.stdout
    else:
        with open(tmp_path / "out.txt", "wb") as handle:
            proc = subprocess.run(
                command, env=_env(tmp_path), stdout=handle, stderr=subprocess.PIPE, timeout=80
            )
        out = (tmp_path / "out.txt").read_text()
    assert proc.returncode == 0, out[-2000:]
    assert _numbers(out) == list(range(lines))
    tail = out[out.index(f"| line {lines - 1} ") :]
    assert re.search(r"^Completed:", tail, re.MULTILINE), "the summary comes after the last line"
    assert "not shown" not in out


def _stalled_run(
    tmp_path: Path, *args: str, lines: int = 100_000, stderr: int = subprocess.DEVNULL
) -> tuple[subprocess.Popen[bytes], Path]:
    """`torchjob run` into a pipe nobody reads, once its program has written every line."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "torchjob", "run", *args, _job_file(tmp_path, lines, "time.sleep(300)")],
        env=_env(tmp_path),
        stdout=subprocess.PIPE,
        stderr=stderr,
    )
    job_dir = _job_dir(tmp_path)
    assert wait_until(lambda: _logged(job_dir) == lines, 30), "the program did not write its lines"
    return proc, job_dir


def _exit_within(proc: subprocess.Popen[bytes], seconds: float) -> int:
    try:
        return proc.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=5)
        pytest.fail(f"torchjob still ran {seconds}s later: its output blocked it")


def test_a_timeout_ends_the_job_while_nobody_reads_its_output(tmp_path: Path) -> None:
    started = time.monotonic()
    proc, job_dir = _stalled_run(tmp_path, "--timeout", "3")
    try:
        # 3 s, the pod's stop, then at most 2 s waiting for the reader twice (last lines, summary).
        assert _exit_within(proc, 20 - (time.monotonic() - started)) == 1
        assert _phase(job_dir) == "Terminated"
        assert "deadline" in json.loads((job_dir / "status.json").read_text())["reason"]
        assert _logged(job_dir) == 100_000  # the log file holds every line
    finally:
        proc.stdout.close()  # type: ignore[union-attr]


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 1)])
def test_signals_stop_the_job_while_nobody_reads_its_output(tmp_path: Path, sig: int, code: int) -> None:
    proc, job_dir = _stalled_run(tmp_path)
    try:
        time.sleep(0.5)  # the supervisor has filled the pipe and its own buffer by now
        proc.send_signal(sig)
        assert _exit_within(proc, 12) == code
        assert _phase(job_dir) == "Terminated"
    finally:
        proc.stdout.close()  # type: ignore[union-attr]


def test_ctrl_c_ends_promptly_with_stderr_in_the_stalled_pipe_too(tmp_path: Path) -> None:
    """`torchjob run ... 2>&1 | less`, not scrolled: the last words on stderr must not hold the exit."""
    proc, job_dir = _stalled_run(tmp_path, stderr=subprocess.STDOUT)
    try:
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        started = time.monotonic()
        assert _exit_within(proc, 12) == 130
        assert time.monotonic() - started < 5
        assert _phase(job_dir) == "Terminated"
    finally:
        proc.stdout.close()  # type: ignore[union-attr]


def test_lines_a_stalled_reader_never_took_are_counted_in_the_summary(tmp_path: Path) -> None:
    lines = 60_000  # 12 MB: far more than a pipe and the supervisor's buffer hold
    proc = subprocess.Popen(
        [sys.executable, "-m", "torchjob", "run", _job_file(tmp_path, lines)],
        env=_env(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    job_dir = _job_dir(tmp_path)
    # Read nothing until the supervisor has given up on the reader and written the final status.
    assert wait_until(lambda: _finished(job_dir), 40), "the job did not end"
    out, _ = proc.communicate(timeout=30)
    text = out.decode()
    found = re.search(
        r"^(\d+) lines of container output not shown above .* every line is in (\S+)$", text, re.M
    )
    assert found, text[-3000:]
    shown = _numbers(text)
    assert shown == list(range(len(shown)))  # in order, none lost in between
    assert len(shown) + int(found.group(1)) == lines
    assert found.group(2) == f"{job_dir}/logs"
    assert proc.returncode == 0


def test_a_terminal_nobody_reads_does_not_stop_the_timeout(tmp_path: Path) -> None:
    """Ctrl-S or a terminal that does not keep up: the same as a pipe, through the terminal device."""
    import pty

    master, terminal = pty.openpty()
    env = {**_env(tmp_path), "TERM": "xterm"}
    env.pop("NO_COLOR", None)
    started = time.monotonic()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "torchjob",
            "run",
            "--timeout",
            "3",
            _job_file(tmp_path, 100_000, "time.sleep(300)"),
        ],
        env=env,
        stdin=terminal,
        stdout=terminal,
        stderr=terminal,
        start_new_session=True,
    )
    os.close(terminal)
    try:
        assert _exit_within(proc, 20 - (time.monotonic() - started)) == 1
        assert _phase(_job_dir(tmp_path)) == "Terminated"
    finally:
        os.close(master)


def test_the_log_follower_counts_the_lines_it_skips_up_to_where_it_was_sealed(tmp_path: Path) -> None:
    from torchjob.files import LogFollower

    log = tmp_path / "app.log"
    log.write_bytes(b"one\ntwo\nthr")
    follower = LogFollower()
    follower.follow(log, "p")
    assert [text for _item, text in follower.read()] == ["one", "two"]
    with open(log, "ab") as handle:
        handle.write(b"ee\nfour\nfive")  # "three", "four" and the unterminated "five"
    follower.seal()
    with open(log, "ab") as handle:
        handle.write(b"\nwritten after the seal\n")
    assert follower.skip() == 3
    assert follower.files == {}
