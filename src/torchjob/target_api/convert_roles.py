"""How each kind's job is said in the terms every target reads (target_api/convert.py): its master
and workers, the launch of its programs, and its restart and success rules."""

from __future__ import annotations

import re
from typing import Any

from torchjob.spec.model import ElasticPolicy
from torchjob.target_api import torchrun
from torchjob.target_api.convert import Conversion

WIRING = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")
DEFAULT_PORT = 23456
_JOBSET_NAMES = re.compile(r"JOB_COMPLETION_INDEX|jobset\.sigs\.k8s\.io/|batch\.kubernetes\.io/")


def convert(c: Conversion) -> None:
    from torchjob.plugins.kubeflow import KubeflowPlugin
    from torchjob.plugins.trainer import TrainerPlugin

    if "jobset" in c.plugins:
        _own_subdomain(c)
    if "kubeflow" in c.plugins:
        _pytorchjob(c, KubeflowPlugin(c.plugins["kubeflow"]).values)
    elif "trainer" in c.plugins:
        _trainjob(c, TrainerPlugin(c.plugins["trainer"]).values)
    elif "jobset" in c.plugins:
        _jobset(c)
    _lifecycle(c)


def _position(c: Conversion, name: str) -> int | None:
    return next((i for i, t in enumerate(c.tasks()) if t["name"] == name), None)


def _roles(c: Conversion, master: str, worker: str | None, port: int) -> None:
    flags = [f"--master={master}", f"--port={port}"]
    if worker is not None:
        flags.insert(1, f"--worker={worker}")
    c.spec.setdefault("plugins", {})["pytorch"] = flags


def _pytorchjob(c: Conversion, v: dict[str, Any]) -> None:
    master, worker, port = str(v["master"]), str(v["worker"]) or None, int(v["port"])
    if not master and worker is not None:  # an elastic or worker-only job: worker 0 leads
        position = _position(c, worker)
        if position is not None:
            c.split(position, "master", "worker")
        master, port = "master", int(v["rdzv-port"]) if v["elastic"] else port
        worker = "worker" if _position(c, "worker") is not None else None
    _roles(c, master, worker, port)
    nproc = str(v["nproc-per-node"]) or str(v["elastic-nproc-per-node"] or "1")
    elastic = None
    if v["elastic"]:
        low, high = int(v["min-replicas"]), int(v["max-replicas"])
        number = int(nproc) if nproc.isdigit() else 1
        restarts = int(v["max-restarts"] or 0)
        c.elastic = ElasticPolicy(low, high, number, str(v["rdzv-backend"]), max_restarts=restarts)
        c.spec["minAvailable"] = min(low, c.spec.get("minAvailable", low))
        elastic = {"nnodes": f"{low}:{high}", "rdzv-backend": str(v["rdzv-backend"])}
        if v["max-restarts"] is not None:
            elastic["max-restarts"] = str(v["max-restarts"])
    _launch(c, [master, worker], nproc, elastic)


def _trainjob(c: Conversion, v: dict[str, Any]) -> None:
    position = _position(c, str(v["node"]))
    if position is None:
        return
    c.split(position, "master", "worker")
    worker = "worker" if _position(c, "worker") is not None else None
    _roles(c, "master", worker, int(v["port"]))
    nproc = str(v["nproc-per-node"])
    _launch(c, ["master", worker], nproc, None)


def _launch(
    c: Conversion, roles: list[str | None], nproc: str, elastic: dict[str, str] | None, *, pet: bool = True
) -> None:
    """Each role's torchrun told its rendezvous as the target sets none of the kind's ``PET_*``
    (``pet``: the kind sets them; a JobSet's commands say their rendezvous themselves)."""
    nodes = sum(t["replicas"] for t in c.tasks() if t["name"] in roles)
    launches = False
    for task in c.tasks():
        if task["name"] not in roles:
            continue
        for k, container in enumerate(task["template"].get("spec", {}).get("containers") or []):
            for port in list(container.get("ports") or []):  # the operator's default: the plugin's --port
                if isinstance(port, dict) and port.get("name") == "pytorchjob-port":
                    container["ports"].remove(port)
            if not container.get("ports"):
                container.pop("ports", None)
            path = f"spec.tasks[{c.tasks().index(task)}].template.spec.containers[{k}]"
            found = _launch_container(c, container, path, nodes, nproc, elastic, pet)
            launches |= found is not None
            nproc = found or nproc
    if c.target == "trainjob" and launches:  # numProcPerNode matters to the torchrun it starts
        if not nproc.isdigit():
            c.note(
                "spec.plugins",
                f"{nproc!r} processes per node become 1: a TrainJob's numProcPerNode is a number",
            )
        if c.elastic is None:
            c.elastic = ElasticPolicy(nodes, nodes, int(nproc) if nproc.isdigit() else 1)


def _launch_container(
    c: Conversion,
    container: dict[str, Any],
    path: str,
    nodes: int,
    nproc: str,
    elastic: dict[str, str] | None,
    pet: bool,
) -> str | None:
    """Rewrite one container's torchrun for the target; its processes per node if it runs torchrun."""
    run = torchrun.find(container)
    if run is None:
        text = " ".join(str(x) for x in [*(container.get("command") or []), *(container.get("args") or [])])
        if "PET_" in text and c.target != "kubeflow":
            c.note(f"{path}.command", "the command reads PET_* variables, which this target does not set")
        if c.target == "trainjob" and "torchrun" in text:
            c.note(
                f"{path}.command",
                "a TrainJob runs the command under torchrun: a torchrun inside it would start twice",
            )
        return None
    given = run.value("nproc-per-node")
    if c.target == "trainjob":
        program, _, dropped = torchrun.under_runtime(run)
        if dropped:
            c.note(f"{path}.command", dropped)
        torchrun.put(container, program, len(program))
        return given or nproc
    if not pet:
        return given or nproc
    if c.target == "kubeflow":  # the operator sets PET_* itself, nprocPerNode "1" and the pods
        wanted = {"nproc-per-node": nproc} if nproc != "1" and elastic is None else {}
    elif elastic is not None:
        endpoint = "$(MASTER_ADDR):$(MASTER_PORT)"
        wanted = {"nnodes": elastic["nnodes"], "nproc-per-node": nproc, "rdzv-endpoint": endpoint}
        wanted.update({k: v for k, v in elastic.items() if k != "nnodes"})
    else:
        wanted = {
            "nnodes": str(nodes),
            "nproc-per-node": nproc,
            "node-rank": "$(RANK)",
            "master-addr": "$(MASTER_ADDR)",
            "master-port": "$(MASTER_PORT)",
        }
    if wanted:
        changed = torchrun.with_flags(run, wanted)
        torchrun.put(container, changed.tokens(), changed.in_command)
    return given or nproc


def _own_subdomain(c: Conversion) -> None:
    """The subdomain JobSet gives every pod is JobSet's: a target addresses the pods itself."""
    from torchjob.plugins.jobset import JobSetPlugin

    subdomain = str(JobSetPlugin(c.plugins["jobset"]).values["subdomain"]) or c.data["metadata"]["name"]
    for task in c.tasks():
        spec = task["template"].get("spec") or {}
        if spec.get("subdomain") == subdomain:
            spec.pop("subdomain")


def _jobset(c: Conversion) -> None:
    """A JobSet has no roles of its own: found where the pods' env points MASTER_ADDR at one of them."""
    tasks = c.tasks()
    found = _master_pod(c)
    for task in tasks:
        for k, container in enumerate(task["template"].get("spec", {}).get("containers") or []):
            text = str([container.get("command"), container.get("args"), container.get("env")])
            if _JOBSET_NAMES.search(text) and not (found and _only_wiring(container)):
                path = f"spec.tasks[{tasks.index(task)}].template.spec.containers[{k}]"
                c.note(
                    path, "reads JOB_COMPLETION_INDEX or a JobSet label, which this target's pods do not have"
                )
    if found is None:
        return
    position, port = found
    name = str(tasks[position]["name"])
    master: str = name
    worker: str | None = None
    if len(tasks) == 1 and tasks[0]["replicas"] > 1:
        c.split(0, "master", "worker")
        master, worker = "master", "worker"
    else:
        others = [str(t["name"]) for t in tasks if t["name"] != name]
        wired = [t for t in others if _names_master(c, t, name)]
        worker = others[0] if len(others) == 1 else wired[0] if len(wired) == 1 else None
        if worker is None and len(wired) == len(others):  # the Jobs of one replicated job?
            from torchjob.target_api.setworkers import merge

            worker = merge(c, name, others, _only_wiring)
        if worker is None and others:  # no one task of workers: the pytorch roles cannot say it
            return
    for task in c.tasks():
        if task["name"] in (master, worker):
            for container in task["template"].get("spec", {}).get("containers") or []:
                env = container.get("env") or []
                container["env"] = [e for e in env if not (isinstance(e, dict) and e.get("name") in WIRING)]
                if not container["env"]:
                    container.pop("env")
    _roles(c, master, worker, port)
    c.note("spec.plugins", f"{', '.join(WIRING)} written in the pods' env are set by this target instead")
    _launch(c, [master, worker], "1", None, pet=False)


def _names_master(c: Conversion, task: str, master: str) -> bool:
    """Whether the pods of ``task`` point MASTER_ADDR at the master's pod (they join its rendezvous)."""
    host = f"{c.data['metadata']['name']}-{master}-0"
    for found in c.tasks():
        if found["name"] == task:
            for container in found["template"].get("spec", {}).get("containers") or []:
                for e in container.get("env") or []:
                    if isinstance(e, dict) and e.get("name") == "MASTER_ADDR":
                        return str(e.get("value") or "").split(".")[0] == host
    return False


def _only_wiring(container: dict[str, Any]) -> bool:
    """The JobSet names the container reads are those of the env that wires the rendezvous."""
    env = [e for e in container.get("env") or [] if isinstance(e, dict) and e.get("name") not in WIRING]
    text = str([container.get("command"), container.get("args"), env])
    return _JOBSET_NAMES.search(text) is None


def _master_pod(c: Conversion) -> tuple[int, int] | None:
    """(the task of the pod MASTER_ADDR names, the port) when it is a task's first pod."""
    job = c.data["metadata"]["name"]
    tasks = c.tasks()
    for task in tasks:
        for container in task["template"].get("spec", {}).get("containers") or []:
            env = {str(e.get("name")): e for e in container.get("env") or [] if isinstance(e, dict)}
            value = str((env.get("MASTER_ADDR") or {}).get("value") or "")
            host = value.split(".")[0]
            for position, candidate in enumerate(tasks):
                one = candidate["replicas"] == 1 or (len(tasks) == 1 and candidate["replicas"] > 1)
                if host == f"{job}-{candidate['name']}-0" and one:  # a Job of no pods has no master
                    return position, _port(env, container)
    return None


def _port(env: dict[str, Any], container: dict[str, Any]) -> int:
    value = str((env.get("MASTER_PORT") or {}).get("value") or "")
    if value.isdigit() and 0 < int(value) < 65536:
        return int(value)
    ports = [p.get("containerPort") for p in container.get("ports") or [] if isinstance(p, dict)]
    return next((p for p in ports if isinstance(p, int)), DEFAULT_PORT)


def _lifecycle(c: Conversion) -> None:
    """The kind's per-task rules as the job-level rules every target reads. Where some tasks' failed
    pods end the job and others' restart it, the job restarts and the ending tasks keep their own
    ``PodFailed -> TerminateJob`` (Volcano reads it; the targets without task policies say they
    drop it)."""
    fails = restarts = codes = False
    ending: list[dict[str, Any]] = []  # the tasks whose failed pod ends the job
    for position, task in enumerate(c.tasks()):
        kept = []
        for policy in task.get("policies") or []:
            event, action = policy.get("event"), policy.get("action")
            if policy.get("exitCode") is not None:
                codes = True
            elif event == "TaskCompleted" and action == "CompleteJob":
                kept.append(policy)
                continue
            elif action == "TerminateJob":
                fails = True
                if event == "PodFailed":
                    ending.append(task)
            elif action == "RestartJob":
                restarts = True
            if event == "TaskFailed" and task.get("maxRetry"):
                limit = task["maxRetry"]
                c.note(
                    f"spec.tasks[{position}].maxRetry",
                    f"a Job fails after {limit} container restart(s) of its pods (backoffLimit); not "
                    "here: OnFailure pods restart in place without limit",
                )
        if kept:
            task["policies"] = kept
        else:
            task.pop("policies", None)
        task.pop("maxRetry", None)
    if codes:
        c.note(
            "spec.tasks",
            "restartPolicy ExitCode (a pod killed by a signal is made again) becomes: a failed pod "
            "fails the job",
        )
    if restarts:
        c.spec["policies"] = [{"event": "PodFailed", "action": "RestartJob"}]
        for task in ending:
            task["policies"] = [{"event": "PodFailed", "action": "TerminateJob"}, *task.get("policies", [])]
    elif fails:
        c.spec["policies"] = [{"event": "PodFailed", "action": "TerminateJob"}]
        c.spec["maxRetry"] = 1
    if c.spec.get("maxRetry", 0) > 2**31 - 2:  # an ExitCode job's: its retries are gone with them
        c.spec["maxRetry"] = 1
