"""Ctrl-C and SIGTERM of an attached `torchjob run --engine slurm`, each landing at an exact point
(a stopped process, a client held on a fifo): one handler from sbatch to the last word
(follow.Interrupts), the stop's clients out of the terminal's reach, the stop bounded."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import threading
import time
import uuid
from pathlib import Path

import pytest

from slurm_cluster import SlurmCluster
from test_slurm_engine import cancelled, cli_env, following, ignoring_sigterm, status_json, torchjob, wait_for
from test_slurm_steps import no_process_left
from torchjob.engine_api.base import EngineError, ThisProcess
from torchjob.engines.slurm import cancel, clients, follow

MORE = "wait, it is not left running"  # what a signal after the first one is told


# ---------------------------------------------------------------------- the handler, in-process


def test_a_signal_while_holding_is_noted_and_raised_once_following_begins() -> None:
    told: list[str] = []
    before = (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT))
    with follow.Interrupts() as interrupts:
        signal.raise_signal(signal.SIGTERM)  # while sbatch runs: noted, not raised
        assert interrupts.signum == signal.SIGTERM
        with pytest.raises(KeyboardInterrupt):
            interrupts.follow(lambda: told.append("more"))
        signal.raise_signal(signal.SIGINT)  # the stop it began is not cut short: said, once
        signal.raise_signal(signal.SIGINT)
    assert told == ["more"]
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before  # as they were


def test_following_the_first_signal_raises_and_every_later_one_is_held() -> None:
    told: list[str] = []
    with follow.Interrupts() as interrupts:
        interrupts.follow(lambda: told.append("more"))
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGTERM)
        # Landing anywhere from here on (the first one's unwinding, the cancel): held, said once.
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGINT):
            signal.raise_signal(signum)
    assert (interrupts.signum, told) == (signal.SIGTERM, ["more"])


def test_a_stream_refusing_the_note_does_not_cut_the_stop_short() -> None:
    def busy() -> None:
        raise RuntimeError("reentrant call inside <_io.BufferedWriter name='<stderr>'>")

    with follow.Interrupts() as interrupts:
        interrupts.follow(busy)
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
        signal.raise_signal(signal.SIGINT)  # not raised out of the handler


def test_in_the_program_a_stopped_run_holds_every_later_signal_to_the_end(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The torchjob program ends with its command: once a signal stopped the run, one more (a CI
    runner's SIGTERM while the last lines are said) is held, unsaid, not Python's default."""
    monkeypatch.setattr(ThisProcess, "ends_with_command", True)
    told: list[str] = []
    with follow.Interrupts() as interrupts:
        interrupts.follow(lambda: told.append("more"))
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
    assert signal.getsignal(signal.SIGTERM) == signal.getsignal(signal.SIGINT) == interrupts._handle
    for signum in (signal.SIGTERM, signal.SIGINT):  # neither ends this process nor raises
        signal.raise_signal(signum)
    assert (interrupts.signum, told) == (signal.SIGINT, [])  # the stop was said already


def test_in_the_program_a_run_no_signal_stopped_gives_the_handlers_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(ThisProcess, "ends_with_command", True)
    before = (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT))
    with follow.Interrupts() as interrupts:
        interrupts.follow()
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before


class _SignalledWhileFinalized:
    def __del__(self) -> None:
        signal.raise_signal(signal.SIGINT)  # its KeyboardInterrupt cannot leave a finalizer


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_signal_whose_raise_was_lost_in_a_finalizer_ends_the_follow_at_its_next_poll() -> None:
    with follow.Interrupts() as interrupts:
        interrupts.follow()
        _SignalledWhileFinalized()  # printed as ignored by Python, and gone
        assert interrupts.signum == signal.SIGINT
        with pytest.raises(KeyboardInterrupt):
            interrupts.check()


# ---------------------------------------------------------------------- end to end, real Slurm


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]


def _finish(process: subprocess.Popen[str], timeout: float = 90) -> str:
    try:
        _, err = process.communicate(timeout=timeout)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGCONT)
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    return err


def test_ctrl_c_and_sigterm_landing_together_are_one_stop(slurm: SlurmCluster, tmp_path: Path) -> None:
    """Both pending when torchjob runs again: the first raises wherever it lands, the second is
    handled while that unwinds, before any stop could set a handler of its own."""
    marker = uuid.uuid4().hex
    process = following(cli_env(slurm, tmp_path / "root"), ignoring_sigterm(tmp_path, marker))
    try:
        os.kill(process.pid, signal.SIGSTOP)
        wait_for(lambda: _state(process.pid) == "T", 10, "torchjob stopped")
        os.killpg(process.pid, signal.SIGINT)
        os.killpg(process.pid, signal.SIGTERM)
    finally:
        os.kill(process.pid, signal.SIGCONT)
    err = _finish(process)
    assert process.returncode == 130, err
    assert MORE in err, err
    assert "Ctrl-C: cancelled Slurm job" in err, err
    assert slurm.jobs() == []
    assert no_process_left(marker) == []


def _fifo_reader_waiting(fifo: Path) -> int | None:
    """The fifo's write end, once a reader waits to open it (else None): that reader goes on
    to wait in its read until this end writes or closes."""
    try:
        return os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:  # ENXIO: no reader yet
        return None


def test_signals_after_the_stop_while_torchjob_ends_keep_exit_code_130(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    """After the Ctrl-C's stop, `run` notes where the job was started (last-started.json): that
    file is a fifo here, so torchjob waits in its read, after the stop, for the test. A SIGTERM
    then (a CI runner's) and another Ctrl-C are held to the end: exit 130, nothing more said."""
    home = tmp_path / "home"
    home.mkdir()
    fifo = home / "last-started.json"
    os.mkfifo(fifo, 0o600)
    marker = uuid.uuid4().hex
    env = cli_env(slurm, tmp_path / "root", TORCHJOB_HOME=str(home))
    process = following(env, ignoring_sigterm(tmp_path, marker))
    writer = None
    try:
        os.killpg(process.pid, signal.SIGINT)
        deadline = time.monotonic() + 90
        while writer is None and process.poll() is None and time.monotonic() < deadline:
            writer = _fifo_reader_waiting(fifo)
            time.sleep(0.05)
        assert writer is not None, "torchjob never read last-started.json after its stop"
        for signum in (signal.SIGTERM, signal.SIGINT):
            if process.poll() is not None:
                break  # ended by the one before
            os.kill(process.pid, signum)
            # Delivered (not pending) before the next: a default SIGTERM has ended it by then.
            wait_for(lambda: process.poll() is not None or _nothing_pending(process.pid), 10, "delivered")
        with contextlib.suppress(BrokenPipeError):  # no reader: the signal ended torchjob
            os.write(writer, b"{}\n")
    finally:
        if writer is not None:
            os.close(writer)
    err = _finish(process)
    assert process.returncode == 130, err
    assert err.count("Ctrl-C: cancelled Slurm job") == 1, err
    assert "interrupted" not in err and MORE not in err and "Traceback" not in err, err
    assert [p.name for p in home.iterdir()] == ["last-started.json"]  # written whole, no .tmp left
    assert slurm.jobs() == []
    assert no_process_left(marker) == []


def _nothing_pending(pid: int) -> bool:
    """No signal waits to be delivered to the process (or it is gone)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return True
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    return all(int(fields.get(key, "0").strip() or "0", 16) == 0 for key in ("SigPnd", "ShdPnd"))


# A `scontrol` before the real one on PATH: a ping of the torchjob process named in HOLD/hold
# waits for a line on the fifo HOLD/go, each such ping said in HOLD/held first.
HOLDING_SCONTROL = """#!/bin/sh
if [ "$1" = ping ] && [ -f "$HOLD/hold" ]; then
    read -r holder < "$HOLD/hold"
    if [ "$PPID" = "$holder" ]; then
        echo "$$" >> "$HOLD/held"
        read -r word < "$HOLD/go"
    fi
fi
exec {real} "$@"
"""


def test_a_second_ctrl_c_does_not_end_the_stops_ping(slurm: SlurmCluster, tmp_path: Path) -> None:
    """A Ctrl-C at the terminal signals its whole process group: a Slurm client there dies of it.
    The stop's `scontrol ping`, held on a fifo, gets a second Ctrl-C: it must live (and answer UP),
    else torchjob takes Slurm for down and leaves the job running."""
    real = shutil.which("scontrol", path=slurm.env.get("PATH"))
    assert real is not None
    hold = tmp_path / "hold"
    hold.mkdir()
    wrapper = hold / "bin" / "scontrol"
    wrapper.parent.mkdir()
    wrapper.write_text(HOLDING_SCONTROL.format(real=real))
    wrapper.chmod(0o700)
    os.mkfifo(hold / "go", 0o600)
    env = cli_env(slurm, tmp_path / "root", HOLD=str(hold))
    env["PATH"] = f"{wrapper.parent}{os.pathsep}{env.get('PATH', os.defpath)}"
    marker = uuid.uuid4().hex
    process = following(env, ignoring_sigterm(tmp_path, marker))
    go = None
    try:

        def held(count: int) -> bool:
            return (hold / "held").exists() and len((hold / "held").read_text().split()) >= count

        (hold / "hold").write_text(f"{process.pid}\n")
        wait_for(lambda: held(1), 30, "a ping of the following held")
        os.killpg(process.pid, signal.SIGINT)  # the first Ctrl-C: cut short, that ping goes
        wait_for(lambda: held(2), 30, "the stop's ping held")
        (hold / "hold").unlink()
        os.killpg(process.pid, signal.SIGINT)  # the second, while the stop asks whether Slurm answers
        go = os.open(hold / "go", os.O_RDWR)  # never blocks; the line waits for the ping's read
        os.write(go, b"go\n")
        err = _finish(process)
    finally:
        if go is not None:
            os.close(go)
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    assert process.returncode == 130, err
    assert "Slurm does not answer" not in err, err
    assert MORE in err and "Ctrl-C: cancelled Slurm job" in err, err
    assert slurm.jobs() == []
    assert no_process_left(marker) == []


def _running_job(slurm: SlurmCluster, tmp_path: Path, marker: str) -> tuple[dict[str, str], str, str]:
    """A detached job whose program is deaf to SIGTERM, running: (its env, its id, Slurm's id)."""
    env = cli_env(slurm, tmp_path / "root")
    done = torchjob(env, "run", str(ignoring_sigterm(tmp_path, marker)), "--engine", "slurm", "-d")
    assert done.returncode == 0, done.stderr
    job_id = done.stdout.strip()
    wait_for(lambda: status_json(env, job_id)["phase"] == "Running", 60, "the job running")
    (slurm_id,) = slurm.jobs()
    return env, job_id, slurm_id


def _deleted(slurm: SlurmCluster, env: dict[str, str], job_id: str, marker: str) -> None:
    deleted = torchjob(env, "delete", job_id, "--engine", "slurm")
    assert deleted.returncode == 0, deleted.stderr
    assert slurm.jobs() == []
    assert no_process_left(marker) == []


@pytest.fixture
def in_process_clients(slurm: SlurmCluster, monkeypatch: pytest.MonkeyPatch) -> int:
    """The clients of this process talk to the cluster; slurmctld's pid (continued afterwards)."""
    monkeypatch.setenv("SLURM_CONF", slurm.env["SLURM_CONF"])
    monkeypatch.setattr(clients, "_down_at", [])  # this process's memory of an outage, its own
    return int((slurm.dir / "ctld.pid").read_text())


def test_the_cancel_is_bounded_while_slurmctld_does_not_answer(
    slurm: SlurmCluster, tmp_path: Path, in_process_clients: int
) -> None:
    """Each client call of a cancel gets what is left of its time, not a call's own 30 s: a
    slurmctld that takes no calls (stopped) holds a Ctrl-C's stop no longer than asked."""
    marker = uuid.uuid4().hex
    env, job_id, slurm_id = _running_job(slurm, tmp_path, marker)
    os.kill(in_process_clients, signal.SIGSTOP)
    try:
        began = time.monotonic()
        with pytest.raises(EngineError) as raised:
            cancel.cancel(slurm_id, timeout=3)
        took = time.monotonic() - began
    finally:
        os.kill(in_process_clients, signal.SIGCONT)
    assert took < 3 + 2, (took, str(raised.value))  # a call's own timeout is 30 s
    _deleted(slurm, env, job_id, marker)


def test_the_wait_after_scancel_is_bounded_when_slurmctld_stops_answering(
    slurm: SlurmCluster, tmp_path: Path, in_process_clients: int
) -> None:
    """slurmctld stops answering once the job is cancelled: the wait for its steps polls a
    slurmctld it pings first, each call within what is left, and ends on time saying so."""
    marker = uuid.uuid4().hex
    env, job_id, slurm_id = _running_job(slurm, tmp_path, marker)
    failed: list[BaseException] = []

    def stop() -> None:
        try:
            cancel.cancel(slurm_id, timeout=6)
        except BaseException as err:  # handed to the test's thread
            failed.append(err)

    began = time.monotonic()
    stopping = threading.Thread(target=stop, daemon=True)
    stopping.start()
    try:
        wait_for(lambda: cancelled(slurm), 30, "the job cancelled")
        os.kill(in_process_clients, signal.SIGSTOP)
        stopping.join(timeout=60)
        took = time.monotonic() - began
    finally:
        os.kill(in_process_clients, signal.SIGCONT)
    assert not stopping.is_alive()
    assert len(failed) == 1 and isinstance(failed[0], EngineError), failed
    assert "may still have steps 6 s after scancel (" in str(failed[0]), failed[0]  # Slurm's silence
    assert took < 6 + 2, took  # a call's own timeout is 30 s
    wait_for(lambda: slurm.jobs() == [], 30, "the job gone once slurmctld answers")
    _deleted(slurm, env, job_id, marker)
