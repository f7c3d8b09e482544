"""GPUs for local pods: each container that asks for ``nvidia.com/gpu: N`` gets N of its own.

What the NVIDIA device plugin does on a node, done with ``CUDA_VISIBLE_DEVICES``:

* the machine's GPUs are those ``CUDA_VISIBLE_DEVICES`` already allows (when torchjob itself runs
  under it), else those ``nvidia-smi -L`` lists, else those ``/proc/driver/nvidia/gpus/`` holds;
  a GPU is named by its UUID when known, so the order CUDA enumerates them in does not matter;
  ``CUDA_VISIBLE_DEVICES`` is read as CUDA reads it: the list ends at the first entry that names no
  device (``-1``, ``NoDevFiles``), and a device named twice is one device;
* a pod needs the GPUs of its containers together, or those of its largest init container if
  that is more (init containers run before the others and hand their GPUs on), as Kubernetes
  counts them; every pod of the job gets a distinct share, kept across restarts;
* once any container asks for GPUs, every container of the job gets ``CUDA_VISIBLE_DEVICES``: its
  share, or empty when it asked for none (a pod that asked for none sees no GPU, as on a node);
* asking for more GPUs than the machine has is an error before anything starts; a machine with no
  GPU at all runs the job without them, after a one-line note (code that picks ``cuda`` when it is
  available then runs on CPU).

A job that asks for no GPU is left alone: nothing is probed and ``CUDA_VISIBLE_DEVICES`` is not
touched. :func:`allocate` is pure; :func:`inventory` is the only part that looks at the machine.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from torchjob.errors import Issue
from torchjob.records import record, replace
from torchjob.spec.source import child
from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any

    from torchjob.spec.model import Job

RESOURCE = "nvidia.com/gpu"
PROC_GPUS = Path("/proc/driver/nvidia/gpus")
# Compiled (and cached by re) only on a machine whose GPUs are looked for.
_SMI_LINE = r"^GPU (\d+):.*?(?:\(UUID: (\S+)\))?\s*$"
_PROC_UUID = r"(?m)^GPU UUID:\s*(\S+)"
_VISIBLE_ENTRY = r"[0-9]+|(?:GPU|MIG)-[0-9A-Za-z/-]+"
# A healthy nvidia-smi -L answers in well under a second; one that hangs (a wedged driver) must not
# hold a job's start for long: it is asked once per process (the supervisor is forked from the CLI).
_SMI_TIMEOUT = 4.0
_smi_seen: dict[tuple[str, int, int], tuple[Inventory | None, str]] = {}
_uuids_seen: dict[tuple[str, str], tuple[str, ...]] = {}

Issues = list[Issue]


@record(frozen=True)
class Inventory:
    """The GPUs this machine offers, as ``CUDA_VISIBLE_DEVICES`` entries, and where that came from."""

    devices: tuple[str, ...]
    source: str
    by_index: bool = False  # entries are PCI-ordered indexes: CUDA must count in that order too
    problem: str = ""  # why a source that should have answered did not (a failing nvidia-smi)

    def where(self) -> str:
        return f"{self.source}; {self.problem}" if self.problem else self.source


@record(frozen=True)
class ContainerNeed:
    name: str
    gpus: int
    init: bool = False


def count(n: int) -> str:
    """``1 GPU``, ``2 GPUs``: a message never says "the 1 GPUs"."""
    return f"{n} GPU" if n == 1 else f"{n} GPUs"


class NotEnoughGPUs(Exception):
    def __init__(self, wanted: int, available: int) -> None:
        super().__init__(f"{count(wanted)} wanted, {available} available")
        self.wanted = wanted
        self.available = available


def requested(container: Mapping[str, Any]) -> int:
    """The whole number of GPUs a container's ``resources.limits`` ask for; ValueError if not one."""
    limits = (container.get("resources") or {}).get("limits") or {}
    value = limits.get(RESOURCE)
    if value is None:
        return 0
    text = str(value).strip()
    if isinstance(value, bool) or not text.isdigit():
        raise ValueError(f"expected a whole number of GPUs, got {value!r}")
    return int(text)


def pod_gpus(needs: Sequence[ContainerNeed]) -> int:
    """GPUs a pod holds: its containers' together, or its largest init container's if more."""
    mains = sum(n.gpus for n in needs if not n.init)
    return max([mains, *(n.gpus for n in needs if n.init)])


def allocate(
    pods: Mapping[Any, Sequence[ContainerNeed]], devices: Sequence[str]
) -> dict[Any, dict[str, list[str]]]:
    """Give every pod its own devices and split them among its containers (init ones reuse them).

    Pods are served in the order given; raises :class:`NotEnoughGPUs` if they need more than
    ``devices`` holds. A container that asked for none gets an empty list.
    """
    wanted = sum(pod_gpus(needs) for needs in pods.values())
    if wanted > len(devices):
        raise NotEnoughGPUs(wanted, len(devices))
    shares: dict[Any, dict[str, list[str]]] = {}
    cursor = 0
    for key, needs in pods.items():
        share = list(devices[cursor : cursor + pod_gpus(needs)])
        cursor += len(share)
        given: dict[str, list[str]] = {}
        offset = 0
        for need in needs:
            if need.init:
                given[need.name] = share[: need.gpus]
            else:
                given[need.name] = share[offset : offset + need.gpus]
                offset += need.gpus
        shares[key] = given
    return shares


def container_env(devices: Sequence[str], inventory: Inventory) -> dict[str, str]:
    env = {"CUDA_VISIBLE_DEVICES": ",".join(devices)}
    if inventory.by_index:
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    return env


def inventory(environ: Mapping[str, str] | None = None, proc: Path = PROC_GPUS) -> Inventory:
    """This machine's GPUs (see the module's docstring for where they are looked for)."""
    environ = os.environ if environ is None else environ
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return parse_visible(visible)
    found, problem = _from_nvidia_smi(environ)
    if found is not None:
        return found
    return replace(_from_proc(proc), problem=problem) if problem else _from_proc(proc)


def identities(
    devices: Sequence[str], environ: Mapping[str, str] | None = None, proc: Path | None = None
) -> tuple[str, ...]:
    """One name per GPU, whatever each device was called: an index, or a UUID prefix as CUDA takes
    one, becomes the GPU's full UUID when the machine says which GPU that is (the UUIDs under
    ``/proc/driver/nvidia/gpus/``, else ``nvidia-smi -L``'s, both in PCI order: CUDA's order with
    ``CUDA_DEVICE_ORDER=PCI_BUS_ID``, and its default order too on a machine of identical GPUs);
    otherwise the name as given. So ``0`` in one job's environment and ``GPU-<uuid>`` in another's
    are one GPU to the queue."""
    if not devices or all(d.startswith("MIG-") for d in devices):  # a MIG UUID is always whole
        return tuple(devices)
    table = _uuids(environ, proc or PROC_GPUS)
    if not table:  # nothing to tell them by: each is its name
        return tuple(devices)
    out = []
    for device in devices:
        if device.isdigit():
            out.append(table[int(device)] if int(device) < len(table) else device)
            continue
        matches = [u for u in table if u.startswith(device)] if device.startswith("GPU-") else []
        out.append(matches[0] if len(matches) == 1 else device)
    return tuple(out)


def _uuids(environ: Mapping[str, str] | None, proc: Path) -> tuple[str, ...]:
    """The machine's GPUs' UUIDs in PCI order; () when they cannot be told. Looked up once per
    process and place (a job's checks, its plan and its supervisor all ask)."""
    environ = os.environ if environ is None else environ
    key = (environ.get("PATH", ""), str(proc))
    if key not in _uuids_seen:
        found = _from_proc(proc)
        if not found.devices or found.by_index:
            smi, _ = _from_nvidia_smi(environ)
            found = smi if smi is not None else found
        _uuids_seen[key] = () if found.by_index else found.devices
    return _uuids_seen[key]


def parse_visible(value: str) -> Inventory:
    """``CUDA_VISIBLE_DEVICES`` as CUDA reads it: up to the first entry that is no device, once each."""
    entries: list[str] = []
    for entry in (e.strip() for e in value.split(",")):
        if not re.fullmatch(_VISIBLE_ENTRY, entry):
            break  # CUDA ignores this entry and every one after it: "-1" and "NoDevFiles" hide all
        if entry not in entries:
            entries.append(entry)
    return Inventory(
        tuple(entries), f"CUDA_VISIBLE_DEVICES={value}" if value and not entries else "CUDA_VISIBLE_DEVICES"
    )


def _from_nvidia_smi(environ: Mapping[str, str]) -> tuple[Inventory | None, str]:
    """What ``nvidia-smi -L`` lists, or None and why it said nothing useful ('' when it is absent)."""
    import shutil

    smi = shutil.which("nvidia-smi", path=environ.get("PATH"))
    if smi is None:
        return None, ""
    try:
        info = os.stat(smi)
    except OSError as err:
        return None, f"nvidia-smi: {err.strerror}"
    key = (smi, info.st_ino, info.st_mtime_ns)
    if key not in _smi_seen:
        _smi_seen[key] = _ask_nvidia_smi(smi)
    return _smi_seen[key]


def _ask_nvidia_smi(smi: str) -> tuple[Inventory | None, str]:
    import signal
    import subprocess

    try:
        # Its own session, so that a hanging one is killed with anything it started that holds the pipes.
        child = subprocess.Popen(
            [smi, "-L"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
    except OSError as err:
        return None, f"nvidia-smi -L could not start: {err.strerror}"
    try:
        out, err_out = child.communicate(timeout=_SMI_TIMEOUT)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(OSError):
            os.killpg(child.pid, signal.SIGKILL)
        try:
            child.communicate(timeout=1.0)
        except subprocess.TimeoutExpired:  # something outside its group holds the pipes: leave them
            child.kill()
            child.wait()
        return None, f"nvidia-smi -L did not answer in {_SMI_TIMEOUT:g} s"
    text = out.decode("utf-8", errors="replace")  # a driver's message in another encoding is no crash
    if child.returncode != 0:
        said = (err_out.decode("utf-8", errors="replace") + text).strip().splitlines()
        why = said[0].strip()[:200] if said else "no message"
        return None, f"nvidia-smi -L failed (exit {child.returncode}): {why}"
    return parse_nvidia_smi(text), ""


def parse_nvidia_smi(text: str) -> Inventory:
    """``nvidia-smi -L`` lines (``GPU 0: NVIDIA A100 (UUID: GPU-...)``) -> UUIDs (indexes if none)."""
    found = [m for m in (re.match(_SMI_LINE, line.strip()) for line in text.splitlines()) if m]
    if all(m.group(2) for m in found):
        return Inventory(tuple(m.group(2) for m in found), "nvidia-smi -L")
    return Inventory(tuple(m.group(1) for m in found), "nvidia-smi -L", by_index=True)


def _from_proc(proc: Path) -> Inventory:
    try:
        buses = sorted(p for p in proc.iterdir() if p.is_dir())  # PCI bus ids: nvidia-smi's order
    except OSError:
        return Inventory((), str(proc))
    uuids = []
    for bus in buses:
        try:
            match = re.search(_PROC_UUID, (bus / "information").read_text(errors="replace"))
        except OSError:
            match = None
        uuids.append(match.group(1) if match and match.group(1).startswith("GPU-") else "")
    if all(uuids):
        return Inventory(tuple(uuids), str(proc))
    return Inventory(tuple(str(i) for i in range(len(buses))), str(proc), by_index=True)


def needs_of(spec: Mapping[str, Any]) -> list[ContainerNeed]:
    """What each container of a pod spec asks for (bad quantities count as 0: :func:`check` says)."""
    out = []
    for kind in ("initContainers", "containers"):
        for container in spec.get(kind) or []:
            try:
                gpus = requested(container)
            except ValueError:
                gpus = 0
            out.append(ContainerNeed(str(container.get("name", "")), gpus, init=kind == "initContainers"))
    return out


Found = Inventory | Callable[[], Inventory | None] | None


def _found(found: Found) -> Inventory:
    """The inventory given, or the one a callable gives (declared GPUs), else the machine's."""
    given = found() if callable(found) else found
    return given if given is not None else inventory()


def _requests(job: Job) -> tuple[Issues, int, str]:
    """A job's GPU requests, read once: the quantities that are not whole numbers (at their
    fields), the GPUs its pods ask for in all, and the field of the first request. Per task, not
    per pod: replicas share their template."""
    issues: Issues = []
    wanted, first = 0, ""
    for t, task in enumerate(job.spec.tasks):
        spec = task.template.spec
        for kind in ("initContainers", "containers"):
            for i, container in enumerate(spec.get(kind) or []):
                try:
                    asked = requested(container)
                except ValueError as err:
                    asked = None
                    issues.append(Issue(_limits(t, kind, i), str(err)))
                if asked and not first:
                    first = _limits(t, kind, i)
        wanted += pod_gpus(needs_of(spec)) * task.replicas
    return issues, wanted, first


def _limits(task: int, kind: str, index: int) -> str:
    return child(f"spec.tasks[{task}].template.spec.{kind}[{index}].resources.limits", RESOURCE)


def check(job: Job, found: Found = None) -> Issues:
    """Problems of a job's GPU requests: quantities that are not whole numbers, more GPUs than exist.

    ``found`` is the inventory (or a function asked for it, which may say None), or None to look
    at the machine; asked only when something asks for GPUs.
    """
    issues, wanted, _ = _requests(job)
    if issues or wanted == 0:
        return issues
    machine = _found(found)
    if machine.devices and wanted > len(machine.devices):
        return [
            Issue(
                "spec.tasks",
                f"the pods ask for {count(wanted)} ({RESOURCE} limits) in all; this machine has "
                f"{len(machine.devices)} ({machine.source}): lower the limits or the replicas",
            )
        ]
    return []


def absent(job: Job, found: Found = None) -> Issues:
    """The note a run of ``job`` gives when its pods ask for GPUs and this machine has none, as a
    warning at the first such request (``validate --local``); none when the requests are not
    whole numbers (:func:`check` tells those)."""
    issues, wanted, first = _requests(job)
    if issues or wanted == 0:
        return []
    machine = _found(found)
    if machine.devices:
        return []
    return [Issue(first, _no_gpu(machine, wanted), "warning")]


def _no_gpu(machine: Inventory, wanted: int) -> str:
    return (
        f"no GPU on this machine ({machine.where()}): the {count(wanted)} the pods ask for are ignored "
        "and they run without CUDA"
    )


PodEnv = dict[str, dict[str, str]]  # container name -> the variables its GPU share sets


def job_env(pods: Mapping[Any, Mapping[str, Any]], found: Found = None) -> tuple[dict[Any, PodEnv], str]:
    """Per pod key, per container, the GPU variables; and a note for the user ('' when none is due).

    ``pods`` maps a pod key to its pod spec, in the order pods should be served.
    """
    needs = {key: needs_of(spec) for key, spec in pods.items()}
    wanted = sum(pod_gpus(n) for n in needs.values())
    if wanted == 0:
        return {}, ""
    machine = _found(found)
    if not machine.devices:
        return {}, _no_gpu(machine, wanted)
    try:
        shares = allocate(needs, machine.devices)
    except NotEnoughGPUs as err:  # the GPUs went away since the job was checked: hide them all
        shares = {key: {n.name: [] for n in pod} for key, pod in needs.items()}
        return _env(shares, machine), f"only {count(err.available)} left for {err.wanted}: the pods get none"
    return _env(shares, machine), ""


def _env(shares: Mapping[Any, Mapping[str, list[str]]], found: Inventory) -> dict[Any, PodEnv]:
    return {
        key: {name: container_env(devices, found) for name, devices in given.items()}
        for key, given in shares.items()
    }
