"""``torchjob run|render -j NxM SCRIPT -- ARGS``: a job for a script, with no YAML (TorchX's habit).

N nodes (pods) of M processes each: a ``master`` task of one pod and a ``worker`` task of N-1,
with the ``pytorch`` plugin giving every pod ``MASTER_ADDR``, ``MASTER_PORT`` and its node
``RANK``. Each pod runs PyTorch's own launcher, ``python -m torch.distributed.run`` (torchrun),
with a static rendezvous at the master pod: it starts M processes and gives each the usual
``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE`` (N*M) and ``MASTER_ADDR``/``MASTER_PORT``. The script
therefore runs as it would under ``torchrun`` on N machines. Locally, containers run in the
directory the script is given relative to (``--workdir``, else the current directory); for a
cluster the job has no working directory (the image's own, which holds the script) and its image is
``--image``: ``run``/``submit`` on a cluster refuse a script without it (the default image holds
neither the script nor its files); ``render`` uses the default with a warning.

``torchjob run train.py`` without ``-j`` is ``-j 1x1``: a FILE that :func:`is_script` is a script.
"""

from __future__ import annotations

import os
import re

from torchjob.errors import Problem, SpecError
from torchjob.jobs import LoadedJob, check_document
from torchjob.spec.model import ORIGIN
from torchjob.spec.source import Document
from torchjob.spec.units import parse_int
from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any

COMMAND_LINE = "<command line>"
DEFAULT_IMAGE = "pytorch/pytorch:latest"
DEFAULT_SHAPE = "1x1"  # a script given without -j: one pod, one process, as `python train.py`
JOB_SUFFIXES = (".yaml", ".yml", ".json")
LAUNCHER = ("python", "-m", "torch.distributed.run")
_READ_LIMIT = 1 << 20  # bytes of a FILE without a known suffix read to tell a script from a job
# ASCII digits (\d would take '２x２' as 2x2), few enough for int() (it refuses 4,300 and more)
_SHAPE = re.compile(r"([0-9]{1,9})x([0-9]{1,9})")
MAX_NODES = 1000
MAX_PROCS = 1024


def parse_shape(shape: str) -> tuple[int, int]:
    """``NxM`` as (nodes, processes per node); SpecError for anything else."""
    match = _SHAPE.fullmatch(shape.strip())
    nodes, procs = (int(match[1]), int(match[2])) if match else (0, 0)
    if not (1 <= nodes <= MAX_NODES and 1 <= procs <= MAX_PROCS):
        message = (
            f"expected NODESxPROCS_PER_NODE such as 2x4 (1-{MAX_NODES} nodes, 1-{MAX_PROCS} "
            f"processes), got {shape!r}"
        )
        raise SpecError([Problem("-j", message, COMMAND_LINE)])
    return nodes, procs


def is_script(path: str) -> bool:
    """Whether FILE is a Python script rather than a job file: a name ending in ``.py``, else a file
    that holds no YAML/JSON mapping or list (a job) and compiles as Python (``train`` with no suffix)."""
    if path == "-" or path.lower().endswith(JOB_SUFFIXES):
        return False
    if path.endswith(".py"):
        return True
    try:
        with open(path, "rb") as handle:
            data = handle.read(_READ_LIMIT)
    except OSError:
        return False
    if data.startswith(b"#!") and b"python" in data.split(b"\n", 1)[0]:
        return True
    if "." in os.path.basename(path).lstrip("."):  # notes.txt, data.csv: text that may compile, no script
        return False
    import yaml  # only for a FILE whose name does not say what it is

    try:
        if any(isinstance(doc, (dict, list)) for doc in yaml.safe_load_all(data)):
            return False
    except yaml.YAMLError:
        pass
    try:
        compile(data, path, "exec", dont_inherit=True)
    except (SyntaxError, ValueError):
        return False
    return True


def nodes_from_sets(sets: list[str]) -> tuple[int | None, list[str]]:
    """``--set worker.replicas=K`` in quick mode: K+1 nodes (torchrun must be told its node count,
    not only the job), and the other ``--set`` assignments; (None, sets) without one."""
    nodes, rest = None, []
    for assignment in sets:
        target, _, value = assignment.partition("=")
        if target.strip() == "worker.replicas":
            workers = _whole(value.strip())  # str.isdigit() took '٣' for 3 and '²' (int() refuses it)
            if workers is None or workers < 0:
                message = (
                    f"{assignment}: expected a number of worker nodes (0 or more), got {value.strip()!r}"
                )
                raise SpecError([Problem("--set", message, COMMAND_LINE)])
            nodes = workers + 1
        else:
            rest.append(assignment)
    return nodes, rest


def unwrap_launcher(command: list[str], args: list[str]) -> tuple[list[str], int] | None:
    """The command without quick mode's torchrun (``python SCRIPT ARGS``) and its processes per
    node, for a target whose runtime starts torchrun itself (trainjob); None for other commands."""
    if tuple(command[: len(LAUNCHER)]) != LAUNCHER or not args:
        return None
    flags = dict(f[2:].split("=", 1) for f in command[len(LAUNCHER) :] if f.startswith("--") and "=" in f)
    expected = {"nnodes", "nproc-per-node", "node-rank", "master-addr", "master-port"}
    procs = _whole(flags.get("nproc-per-node", ""))
    if set(flags) != expected or len(flags) != len(command) - len(LAUNCHER) or procs is None or procs < 0:
        return None
    return ["python", *args], procs


def _whole(text: str) -> int | None:
    """A whole number in ASCII digits (spec/units.py), as torchrun's own parser reads it; else None."""
    try:
        return parse_int(text)
    except ValueError:
        return None


def job_name(script: str) -> str:
    """A DNS-1123 job name from the script's file name (``train_gpt.py`` -> ``train-gpt``)."""
    stem = os.path.splitext(os.path.basename(script))[0].lower()
    name = re.sub(r"[^a-z0-9]+", "-", stem).strip("-")[:40].strip("-")
    return name if name and name[0].isalpha() else f"job-{name}".rstrip("-")


def _escape(arg: str) -> str:
    """Kubernetes expands ``$(VAR)`` in args; a user's argument is meant literally."""
    return arg.replace("$", "$$")


def quick_manifest(
    script: str,
    nodes: int,
    procs: int,
    program_args: list[str],
    workdir: str | None,
    image: str = DEFAULT_IMAGE,
    own_threads: bool = False,
) -> dict[str, Any]:
    """``own_threads``: the pods inherit an ``OMP_NUM_THREADS`` of the user's (a local run)."""
    launcher = [
        *LAUNCHER,
        f"--nnodes={nodes}",
        f"--nproc-per-node={procs}",
        "--node-rank=$(RANK)",
        "--master-addr=$(MASTER_ADDR)",
        "--master-port=$(MASTER_PORT)",
    ]

    # torchrun sets OMP_NUM_THREADS=1 itself, with a banner on every pod, when it starts more
    # than one process and the variable is unset; one process keeps torch's default (every core),
    # and a value of the user's own (inherited by local pods) is left to win, as under torchrun.
    one_thread = procs > 1 and not own_threads

    def task(name: str, replicas: int) -> dict[str, Any]:
        container: dict[str, Any] = {"name": "main", "image": image}
        if workdir is not None:
            container["workingDir"] = workdir
        if one_thread:
            container["env"] = [{"name": "OMP_NUM_THREADS", "value": "1"}]
        container.update(command=launcher, args=[_escape(script), *map(_escape, program_args)])
        return {
            "name": name,
            "replicas": replicas,
            "template": {"spec": {"restartPolicy": "Never", "containers": [container]}},
        }

    tasks = [task("master", 1)] + ([task("worker", nodes - 1)] if nodes > 1 else [])
    return {
        "apiVersion": "batch.volcano.sh/v1alpha1",
        "kind": "Job",
        # The job speaks of its failures in the user's terms (controller: plain words).
        "metadata": {"name": job_name(script), "annotations": {ORIGIN: "script"}},
        "spec": {
            "minAvailable": nodes,
            "maxRetry": 1,  # the first failure fails the job (0 would be defaulted to 3)
            # One pod failing fails the job, as one node failing fails torchrun (and the others'
            # torchrun would wait for it at the rendezvous): a restart with no retries left.
            "policies": [{"event": "PodFailed", "action": "RestartJob"}],
            "plugins": {"pytorch": ["--master=master", "--worker=worker"]},
            "tasks": tasks,
        },
    }


def quick_job(
    shape: str | None,
    script: str,
    program_args: list[str],
    workdir: str | None = None,
    *,
    local: bool = True,
    image: str | None = None,
    nodes: int | None = None,
) -> LoadedJob:
    """The job ``-j SHAPE SCRIPT ARGS`` stands for, checked like a file; SpecError if it cannot be.

    ``local``: for this machine (the containers run in ``workdir`` or here); else for a cluster
    (``workdir`` as given, else none: the image's). ``nodes`` replaces the shape's node count
    (:func:`nodes_from_sets`).
    """
    given, procs = parse_shape(shape or DEFAULT_SHAPE)
    nodes = given if nodes is None else nodes
    if not 1 <= nodes <= MAX_NODES:
        message = f"expected 0-{MAX_NODES - 1} workers (quick mode has a master and NODES-1 workers)"
        raise SpecError([Problem("worker.replicas", message, COMMAND_LINE)])
    base = os.path.abspath(workdir if workdir is not None and local else os.curdir)
    if local and workdir is not None and not os.path.isdir(base):
        raise SpecError([Problem("--workdir", f"{workdir!r} is not a directory", COMMAND_LINE)])
    path = os.path.join(base, script)
    if not os.path.isfile(path):
        raise SpecError([Problem("", f"no such script in {base}", script)])
    if not is_script(path):
        message = "-j runs a Python script as torchrun does; this is a job file: run it without -j"
        raise SpecError([Problem("", message, script)])
    if image is not None and not image.strip():
        raise SpecError([Problem("--image", "expected an image reference, got ''", COMMAND_LINE)])
    where = base if local else workdir
    own_threads = local and "OMP_NUM_THREADS" in os.environ
    manifest = quick_manifest(script, nodes, procs, program_args, where, image or DEFAULT_IMAGE, own_threads)
    document = Document(data=manifest, file=script)
    job, problems = check_document(document)
    if job is None:
        raise SpecError(problems)
    return LoadedJob(job, document)


def require_image(image: str | None) -> None:
    """A script sent to a cluster needs an image that holds it: refused without ``--image``."""
    if image is None:
        message = (
            f"a script sent to a cluster needs an image that holds it and torch; the default, "
            f"{DEFAULT_IMAGE}, holds neither your script nor its files: give --image REGISTRY/NAME:TAG"
        )
        raise SpecError([Problem("--image", message, COMMAND_LINE)])


def default_image_warning(script: str, image: str | None) -> str | None:
    """A job for a cluster left on the default image, which does not hold the script: say so."""
    if image is not None:
        return None
    return (
        f"{script}: warning: the job uses the default image {DEFAULT_IMAGE}, which holds neither "
        "your script nor its files; on a cluster give an image that does: --image REGISTRY/NAME:TAG"
    )
