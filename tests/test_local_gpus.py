"""GPUs for local pods: inventory, allocation and CUDA_VISIBLE_DEVICES, with fake inventories.

No GPU exists where these tests run: the inventory is given as data, or a fake ``nvidia-smi`` on
PATH stands in for the real one when a whole job runs.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from support import container, log_text, make_job, run, sh, task
from torchjob.engines.local import check_job
from torchjob.engines.local.gpus import (
    ContainerNeed,
    Inventory,
    NotEnoughGPUs,
    allocate,
    check,
    inventory,
    job_env,
    parse_nvidia_smi,
    parse_visible,
    pod_gpus,
    requested,
)
from torchjob.errors import Issue, SpecError

pytestmark = pytest.mark.timeout(60)

SMI = """\
GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-aaaa)
GPU 1: NVIDIA A100-SXM4-40GB (UUID: GPU-bbbb)
GPU 2: NVIDIA A100-SXM4-40GB (UUID: GPU-cccc)
GPU 3: NVIDIA A100-SXM4-40GB (UUID: GPU-dddd)
"""
FOUR = Inventory(("GPU-aaaa", "GPU-bbbb", "GPU-cccc", "GPU-dddd"), "nvidia-smi -L")
NONE = Inventory((), "/proc/driver/nvidia/gpus")


def gpu(n: Any) -> dict[str, Any]:
    return {"limits": {"nvidia.com/gpu": n}}


def test_requested_reads_whole_numbers_from_limits() -> None:
    assert requested({"name": "a"}) == 0
    assert requested({"resources": {"requests": {"nvidia.com/gpu": 2}}}) == 0  # limits decide
    assert requested({"resources": gpu(2)}) == 2
    assert requested({"resources": gpu("3")}) == 3
    for bad in (0.5, "1.5", "-1", True, "one"):
        with pytest.raises(ValueError, match="whole number"):
            requested({"resources": gpu(bad)})


def test_a_pod_holds_its_containers_gpus_or_its_largest_init_containers() -> None:
    assert pod_gpus([ContainerNeed("a", 1), ContainerNeed("b", 2)]) == 3
    assert pod_gpus([ContainerNeed("i", 4, init=True), ContainerNeed("a", 1)]) == 4
    assert pod_gpus([ContainerNeed("i", 1, init=True), ContainerNeed("a", 2)]) == 2
    assert pod_gpus([]) == 0


def test_allocate_gives_each_pod_and_container_its_own_devices() -> None:
    pods = {
        "master-0": [ContainerNeed("main", 2)],
        "worker-0": [ContainerNeed("setup", 1, init=True), ContainerNeed("main", 1)],
        "worker-1": [ContainerNeed("wait", 0, init=True), ContainerNeed("main", 1), ContainerNeed("log", 0)],
    }
    shares = allocate(pods, FOUR.devices)
    assert shares == {
        "master-0": {"main": ["GPU-aaaa", "GPU-bbbb"]},
        "worker-0": {"setup": ["GPU-cccc"], "main": ["GPU-cccc"]},  # init hands its GPU on
        "worker-1": {"wait": [], "main": ["GPU-dddd"], "log": []},
    }
    mains = [d for pod in shares.values() for d in pod["main"]]
    assert len(mains) == len(set(mains)) == 4


def test_allocate_refuses_more_than_exist() -> None:
    with pytest.raises(NotEnoughGPUs) as caught:
        allocate({"a": [ContainerNeed("m", 3)], "b": [ContainerNeed("m", 2)]}, FOUR.devices)
    assert (caught.value.wanted, caught.value.available) == (5, 4)


def test_parse_nvidia_smi_uses_uuids_else_pci_ordered_indexes() -> None:
    assert parse_nvidia_smi(SMI) == FOUR
    old = parse_nvidia_smi("GPU 0: Tesla K80\nGPU 1: Tesla K80\n")
    assert (old.devices, old.by_index) == (("0", "1"), True)
    assert parse_nvidia_smi("").devices == ()


def test_inventory_prefers_cuda_visible_devices_then_nvidia_smi_then_proc(tmp_path: Path) -> None:
    assert inventory({"CUDA_VISIBLE_DEVICES": "2, 3"}).devices == ("2", "3")
    assert inventory({"CUDA_VISIBLE_DEVICES": ""}).devices == ()  # the caller hid every GPU
    bin_dir = tmp_path / "bin"
    fake_smi(bin_dir, SMI)
    assert inventory({"PATH": str(bin_dir)}) == FOUR
    proc = tmp_path / "gpus"
    for bus, uuid in (("0000:3b:00.0", "GPU-bbbb"), ("0000:1a:00.0", "GPU-aaaa")):
        (proc / bus).mkdir(parents=True)
        (proc / bus / "information").write_text(f"Model: \t\t NVIDIA A100\nGPU UUID: \t {uuid}\n")
    empty_path = {"PATH": str(tmp_path / "nothing")}
    assert inventory(empty_path, proc) == Inventory(("GPU-aaaa", "GPU-bbbb"), str(proc))
    (proc / "0000:1a:00.0" / "information").write_text("Model: NVIDIA A100\nGPU UUID: ??\n")
    assert inventory(empty_path, proc) == Inventory(("0", "1"), str(proc), by_index=True)
    assert inventory(empty_path, tmp_path / "no-driver").devices == ()


def fake_smi(bin_dir: Path, output: str, script: str = "") -> None:
    bin_dir.mkdir(parents=True, exist_ok=True)
    smi = bin_dir / "nvidia-smi"
    body = script or f"cat <<'EOF'\n{output}EOF\n"
    smi.write_text(f'#!/bin/sh\n[ "$1" = -L ] || exit 9\n{body}')
    smi.chmod(0o755)


def test_cuda_visible_devices_is_read_as_cuda_reads_it() -> None:
    assert parse_visible("0,0").devices == ("0",)  # one GPU named twice is one GPU
    assert parse_visible("GPU-aaaa,1,GPU-aaaa").devices == ("GPU-aaaa", "1")
    for none in ("-1", "NoDevFiles", "-1,0"):  # CUDA stops at the first entry that is no device
        found = parse_visible(none)
        assert found.devices == ()
        assert found.source == f"CUDA_VISIBLE_DEVICES={none}"
    assert parse_visible("1,-1,2").devices == ("1",)
    assert parse_visible("２").devices == ()  # fullwidth digits are no index to CUDA
    assert inventory({"CUDA_VISIBLE_DEVICES": "3,3"}).devices == ("3",)


def test_a_gpu_named_twice_is_not_given_to_two_pods() -> None:
    job = gpu_job("twice", 1, 1, 1)
    [(path, message)] = [(i.path, i.message) for i in check(job, inventory({"CUDA_VISIBLE_DEVICES": "0,0"}))]
    assert path == "spec.tasks"
    assert "ask for 2 GPUs" in message and "this machine has 1 " in message


def test_a_failing_nvidia_smi_says_why(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    fake_smi(
        bin_dir, "", script="echo 'Failed to initialize NVML: Driver/library version mismatch' >&2\nexit 9\n"
    )
    found = inventory({"PATH": str(bin_dir)}, tmp_path / "no-driver")
    assert found.devices == ()
    assert (
        found.problem
        == "nvidia-smi -L failed (exit 9): Failed to initialize NVML: Driver/library version mismatch"
    )
    pods = {("a", 0): {"containers": [{"name": "m", "resources": gpu(1)}]}}
    _, note = job_env(pods, found)
    assert "no GPU on this machine" in note
    assert "Driver/library version mismatch" in note


def test_a_hanging_nvidia_smi_is_given_up_on_quickly(tmp_path: Path) -> None:
    import time

    bin_dir = tmp_path / "bin"
    asked = tmp_path / "asked"
    # its child holds the pipe too
    fake_smi(bin_dir, "", script=f"echo asked >> {asked}\nsleep 60 &\nsleep 60\n")
    started = time.monotonic()
    found = inventory({"PATH": str(bin_dir)}, tmp_path / "no-driver")
    took = time.monotonic() - started
    assert found.devices == ()
    assert "did not answer" in found.problem
    assert took < 8, took  # given up on, not waited 60 s for
    # asked once per process: a second look is the first one's answer, nvidia-smi is not run again
    assert inventory({"PATH": str(bin_dir)}, tmp_path / "no-driver") == found
    assert asked.read_text() == "asked\n"


def test_nvidia_smi_output_that_is_not_utf8_is_read(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    fake_smi(bin_dir, "", script="printf 'GPU 0: Caf\\351 GPU (UUID: GPU-aaaa)\\n'\n")
    assert inventory({"PATH": str(bin_dir)}).devices == ("GPU-aaaa",)


def gpu_job(name: str, master: int, workers: int, per_worker: int, script: str = "true") -> Any:
    return make_job(
        name,
        [
            task("master", [container("main", sh(script), resources=gpu(master))]),
            task("worker", [container("main", sh(script), resources=gpu(per_worker))], replicas=workers),
        ],
    )


def test_check_counts_every_replica_and_refuses_more_than_the_machine_has() -> None:
    assert check(gpu_job("fits", 2, 2, 1), FOUR) == []
    [(path, message)] = [(i.path, i.message) for i in check(gpu_job("toomany", 2, 2, 2), FOUR)]
    assert path == "spec.tasks"
    assert message.startswith("the pods ask for 6 GPUs (nvidia.com/gpu limits) in all; this machine has 4")


def test_check_on_a_machine_without_gpus_is_no_error() -> None:
    assert check(gpu_job("cpu", 1, 1, 1), NONE) == []


def test_check_reports_a_quantity_that_is_not_whole_with_its_path() -> None:
    job = gpu_job("half", 1, 1, 1)
    job.spec.tasks[1].template.spec["containers"][0]["resources"] = gpu("0.5")
    assert check(job, FOUR) == [
        Issue(
            'spec.tasks[1].template.spec.containers[0].resources.limits["nvidia.com/gpu"]',
            "expected a whole number of GPUs, got '0.5'",
        )
    ]


def test_messages_count_one_gpu_as_one() -> None:
    """Not "the 1 GPUs" (issue 33)."""
    assert str(NotEnoughGPUs(1, 0)) == "1 GPU wanted, 0 available"
    assert str(NotEnoughGPUs(3, 1)) == "3 GPUs wanted, 1 available"
    one = {("a", 0): {"containers": [{"name": "m", "resources": gpu(1)}]}}
    two = {**one, ("a", 1): {"containers": [{"name": "m", "resources": gpu(1)}]}}
    assert job_env(one, NONE)[1].startswith(
        "no GPU on this machine (/proc/driver/nvidia/gpus): the 1 GPU the"
    )
    assert job_env(two, NONE)[1].startswith(
        "no GPU on this machine (/proc/driver/nvidia/gpus): the 2 GPUs the"
    )
    assert (
        job_env(two, Inventory(("GPU-aaaa",), "nvidia-smi -L"))[1]
        == "only 1 GPU left for 2: the pods get none"
    )
    job = make_job("one", [task("main", [container("main", sh("true"), resources=gpu(1))], replicas=2)])
    (issue,) = check(job, Inventory(("GPU-aaaa",), "nvidia-smi -L"))
    assert issue.message.startswith(
        "the pods ask for 2 GPUs (nvidia.com/gpu limits) in all; this machine has 1 "
    )


def test_absent_warns_at_the_first_request_only_where_no_gpu_is_found() -> None:
    from torchjob.engines.local.gpus import absent

    job = gpu_job("two", 1, 1, 1)
    (issue,) = absent(job, NONE)
    assert issue.severity == "warning"
    assert issue.path == 'spec.tasks[0].template.spec.containers[0].resources.limits["nvidia.com/gpu"]'
    assert issue.message.startswith("no GPU on this machine (/proc/driver/nvidia/gpus): the 2 GPUs the")
    assert absent(job, FOUR) == []
    cpu = make_job("cpu", [task("main", [container("main", sh("true"))])])
    assert absent(cpu, NONE) == []


def test_a_job_without_gpus_never_looks_for_them(monkeypatch: pytest.MonkeyPatch) -> None:
    import torchjob.engines.local.gpus as gpus

    def boom(*_args: Any, **_kwargs: Any) -> Inventory:
        raise AssertionError("the inventory was probed")

    monkeypatch.setattr(gpus, "inventory", boom)
    job = make_job("cpu", [task("main", [container("main", sh("true"))])])
    assert check(job) == []
    assert job_env({("main", 0): job.spec.tasks[0].template.spec}) == ({}, "")


def test_job_env_sets_each_containers_share_and_order_for_indexes() -> None:
    pods = {("a", 0): {"containers": [{"name": "m", "resources": gpu(1)}, {"name": "side"}]}}
    env, note = job_env(pods, FOUR)
    assert note == ""
    assert env == {
        ("a", 0): {"m": {"CUDA_VISIBLE_DEVICES": "GPU-aaaa"}, "side": {"CUDA_VISIBLE_DEVICES": ""}}
    }
    env, _ = job_env(pods, Inventory(("0", "1"), "nvidia-smi -L", by_index=True))
    assert env[("a", 0)]["m"] == {"CUDA_VISIBLE_DEVICES": "0", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    env, note = job_env(pods, NONE)
    assert env == {}
    assert note.startswith("no GPU on this machine (/proc/driver/nvidia/gpus): the 1 GPU the pods ask for")


# --- whole jobs, with a fake nvidia-smi on PATH


@pytest.fixture
def four_gpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_smi(tmp_path / "fake-bin", SMI)
    monkeypatch.setenv("PATH", f"{tmp_path / 'fake-bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


@pytest.mark.usefixtures("four_gpus")
def test_each_pod_of_a_running_job_sees_its_own_gpus(tmp_path: Path) -> None:
    job = gpu_job("gpus", 2, 2, 1, script='echo "cvd=$CUDA_VISIBLE_DEVICES"')
    result = run(job, tmp_path)
    assert result.ok, result.reason
    seen = {
        pod: log_text(result, pod, "main").split("cvd=")[1].split()[0]
        for pod in ("master-0", "worker-0", "worker-1")
    }
    assert seen == {"master-0": "GPU-aaaa,GPU-bbbb", "worker-0": "GPU-cccc", "worker-1": "GPU-dddd"}


@pytest.mark.usefixtures("four_gpus")
def test_a_job_asking_for_more_gpus_than_exist_starts_nothing(tmp_path: Path) -> None:
    job = gpu_job("greedy", 2, 3, 1, script=f"touch {tmp_path / 'started'}")
    assert check_job(job) == [
        Issue(
            "spec.tasks",
            "the pods ask for 5 GPUs (nvidia.com/gpu limits) in all; this machine has 4 "
            "(nvidia-smi -L): lower the limits or the replicas",
        )
    ]
    with pytest.raises(SpecError):
        run(job, tmp_path)
    assert not (tmp_path / "started").exists()
    assert not (tmp_path / "jobs").exists() or not any((tmp_path / "jobs").iterdir())


def test_without_gpus_the_job_runs_after_a_one_line_note(tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text(
        "apiVersion: batch.volcano.sh/v1alpha1\nkind: Job\nmetadata: {name: cpuonly}\nspec:\n  tasks:\n"
        "    - name: main\n      replicas: 2\n      template:\n        spec:\n"
        "          restartPolicy: Never\n          containers:\n"
        "            - name: main\n              image: x\n"
        "              command: [sh, -c, 'echo \"cvd=[$CUDA_VISIBLE_DEVICES]\"']\n"
        "              resources: {limits: {nvidia.com/gpu: 1}}\n"
    )
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # as on a machine without GPUs
    result = subprocess.run(
        [sys.executable, "-m", "torchjob", "run", "--state-dir", str(tmp_path / "jobs"), str(job)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    output = result.stdout + result.stderr
    notes = [line for line in output.splitlines() if "no GPU on this machine" in line]
    assert len(notes) == 1, output
    assert "the 2 GPUs the pods ask for are ignored" in notes[0]
    assert output.count("cvd=[]") == 2
    checked = subprocess.run(  # validate --local says it beforehand, at the field
        [sys.executable, "-m", "torchjob", "validate", "--local", str(job)],
        capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    assert checked.returncode == 0, checked.stderr
    field = 'spec.tasks[0].template.spec.containers[0].resources.limits["nvidia.com/gpu"]'
    assert checked.stderr.splitlines() == [
        f"{job}:15: {field}: warning: {notes[0].removeprefix('torchjob: ')}"
    ]
