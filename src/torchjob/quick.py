"""``torchjob run|render -j NxM SCRIPT -- ARGS``: a job for a script, with no YAML (TorchX's habit).

N nodes (pods) of M processes each: a ``master`` task of one pod and a ``worker`` task of N-1,
with the ``pytorch`` plugin giving every pod ``MASTER_ADDR``, ``MASTER_PORT`` and its node
``RANK``. Each pod runs PyTorch's own launcher, ``python -m torch.distributed.run`` (torchrun),
with a static rendezvous at the master pod: it starts M processes and gives each the usual
``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE`` (N*M) and ``MASTER_ADDR``/``MASTER_PORT``. The script
therefore runs as it would under ``torchrun`` on N machines. Containers run in the directory the
script is given relative to (``--workdir``, else the current directory).
"""

from __future__ import annotations

import os
import re
from typing import Any

from torchjob.errors import Problem, SpecError
from torchjob.jobs import LoadedJob, check_document
from torchjob.spec.source import Document

COMMAND_LINE = "<command line>"
DEFAULT_IMAGE = "pytorch/pytorch:latest"
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


def job_name(script: str) -> str:
    """A DNS-1123 job name from the script's file name (``train_gpt.py`` -> ``train-gpt``)."""
    stem = os.path.splitext(os.path.basename(script))[0].lower()
    name = re.sub(r"[^a-z0-9]+", "-", stem).strip("-")[:40].strip("-")
    return name if name and name[0].isalpha() else f"job-{name}".rstrip("-")


def _escape(arg: str) -> str:
    """Kubernetes expands ``$(VAR)`` in args; a user's argument is meant literally."""
    return arg.replace("$", "$$")


def quick_manifest(
    script: str, nodes: int, procs: int, program_args: list[str], workdir: str
) -> dict[str, Any]:
    launcher = [
        "python",
        "-m",
        "torch.distributed.run",
        f"--nnodes={nodes}",
        f"--nproc-per-node={procs}",
        "--node-rank=$(RANK)",
        "--master-addr=$(MASTER_ADDR)",
        "--master-port=$(MASTER_PORT)",
    ]

    def task(name: str, replicas: int) -> dict[str, Any]:
        container = {
            "name": "main",
            "image": DEFAULT_IMAGE,
            "workingDir": workdir,
            # What torchrun sets anyway, saying so in a banner on every pod when it is not set.
            "env": [{"name": "OMP_NUM_THREADS", "value": "1"}],
            "command": launcher,
            "args": [_escape(script), *map(_escape, program_args)],
        }
        return {
            "name": name,
            "replicas": replicas,
            "template": {"spec": {"restartPolicy": "Never", "containers": [container]}},
        }

    tasks = [task("master", 1)] + ([task("worker", nodes - 1)] if nodes > 1 else [])
    return {
        "apiVersion": "batch.volcano.sh/v1alpha1",
        "kind": "Job",
        "metadata": {"name": job_name(script)},
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


def quick_job(shape: str, script: str, program_args: list[str], workdir: str | None = None) -> LoadedJob:
    """The job ``-j SHAPE SCRIPT -- ARGS`` stands for, checked like a file; SpecError if it cannot be."""
    nodes, procs = parse_shape(shape)
    base = os.path.abspath(workdir if workdir is not None else os.curdir)
    if workdir is not None and not os.path.isdir(base):
        raise SpecError([Problem("--workdir", f"{workdir!r} is not a directory", COMMAND_LINE)])
    if not os.path.isfile(os.path.join(base, script)):
        raise SpecError([Problem("", f"no such script in {base}", script)])
    document = Document(data=quick_manifest(script, nodes, procs, program_args, base), file=script)
    job, problems = check_document(document)
    if job is None:
        raise SpecError(problems)
    return LoadedJob(job, document)
