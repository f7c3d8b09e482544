"""A JobSet's workers made of several Jobs (a replicated job of ``replicas`` > 1 beside a one-pod
master), said as the one task of workers a PyTorchJob or TrainJob has (target_api/convert_roles.py).

Every Job of a replicated job has the same pod template; what tells its pods apart is what JobSet
and the Job controller give each one (its Job's index, its completion index) and the env written
from them. The workers are one task when that changes nothing a pod sees: no container reads a
pod's own indexes outside the rendezvous env the target sets anew (``MASTER_ADDR``, ``MASTER_PORT``,
``RANK``, ``WORLD_SIZE``), and what that env gave each pod is what the target gives it (``RANK``:
1 for the first worker pod, then in order; ``WORLD_SIZE``: every pod). Their restart rules are one
replicated job's, the same for every Job; a success policy met by any one of its Jobs is not a
task's rule and cannot be kept. What cannot be said so is refused, naming the replicated job.
"""

from __future__ import annotations

import re
from typing import Any

from torchjob.errors import Problem, SpecError
from torchjob.target_api.convert import Conversion

ROLE_TARGETS = ("kubeflow", "trainjob")  # the targets that need a master and one task of workers
_REF = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")
_FIELD = re.compile(r"metadata\.(?:labels|annotations)\['([^']+)'\]\Z")


def merge(c: Conversion, master: str, others: list[str], only_wiring: Any) -> str | None:
    """The task of workers the Jobs ``others`` of one replicated job become (its name), None where
    they are not the Jobs of one replicated job; SpecError where they cannot be one task exactly.
    ``only_wiring(container)``: whether its JobSet names are only in the rendezvous env."""
    names = {name.rpartition("-")[0] for name in others}
    if c.target not in ROLE_TARGETS or len(others) < 2 or len(names) != 1:
        return None
    (rname,) = names
    tasks = c.tasks()
    positions = [i for i, t in enumerate(tasks) if t["name"] in others]
    if positions != list(range(positions[0], positions[0] + len(others))):
        return None
    jobs = [tasks[i] for i in positions]
    reason = _why_not(c, master, jobs, positions, only_wiring)
    if reason:
        message = (
            f"replicated job {rname!r} of {len(jobs)} Jobs cannot be expressed by target {c.target!r} as "
            f"its workers: {reason}; use --target pods or volcano or jobset"
        )
        raise SpecError([Problem(f"spec.tasks[{positions[0]}]", message)])
    first = positions[0]
    merged = {**jobs[0], "name": rname, "replicas": sum(t["replicas"] for t in jobs)}
    tasks[first : first + len(jobs)] = [merged]
    gone = len(jobs) - 1
    c.index = {i: c.index[i if i <= first else i + gone] for i in range(len(tasks))}
    for other in tasks:
        depends = other.get("dependsOn")
        if isinstance(depends, dict) and any(n in others for n in depends.get("name", [])):
            kept = [n if n not in others else rname for n in depends["name"]]
            depends["name"] = list(dict.fromkeys(kept))
    return str(rname)


def _why_not(
    c: Conversion, master: str, jobs: list[dict[str, Any]], positions: list[int], only_wiring: Any
) -> str:
    """Why the Jobs cannot be one task of workers exactly ("" when they can)."""
    for job in jobs:
        for policy in job.get("policies") or []:
            if policy.get("event") == "TaskCompleted" and policy.get("action") == "CompleteJob":
                return "the set completes with any one of its Jobs (successPolicy), not with its workers"
    containers = jobs[0]["template"].get("spec", {}).get("containers") or []
    if not all(only_wiring(container) for container in containers):
        return (
            "their pods read their Job's index or completion index (JOB_COMPLETION_INDEX or a JobSet "
            "label), which the target's workers do not have"
        )
    size = sum(t["replicas"] for t in c.tasks() if t["name"] in (master, *[j["name"] for j in jobs]))
    rank = 1
    for position, job in zip(positions, jobs, strict=True):
        job_index = int(str(job["name"]).rpartition("-")[2] or 0)
        for pod in range(job["replicas"]):
            fields = _pod_fields(job_index, position, pod)
            for container in containers:
                env = _resolved(container.get("env") or [], fields)
                if "RANK" in env and env["RANK"] != str(rank):
                    return (
                        f"RANK is {env['RANK'] or 'unknown'} in pod {pod} of Job {job_index}, where the "
                        f"target gives it {rank} (the master is 0, the workers follow in order)"
                    )
                if "WORLD_SIZE" in env and env["WORLD_SIZE"] != str(size):
                    return f"WORLD_SIZE is {env['WORLD_SIZE'] or 'unknown'}, where the target gives {size}"
            rank += 1
    return ""


def _pod_fields(job_index: int, global_index: int, pod: int) -> dict[str, str]:
    """The labels and annotations JobSet and the Job controller give a pod that tell it apart."""
    return {
        "jobset.sigs.k8s.io/job-index": str(job_index),
        "jobset.sigs.k8s.io/job-global-index": str(global_index),
        "batch.kubernetes.io/job-completion-index": str(pod),
    }


def _resolved(env: list[Any], fields: dict[str, str]) -> dict[str, str]:
    """A container's env values as the kubelet makes them for one pod ("" where not known here)."""
    values: dict[str, str | None] = {
        "JOB_COMPLETION_INDEX": fields["batch.kubernetes.io/job-completion-index"]
    }
    for var in env:
        if not isinstance(var, dict):
            continue
        name, value = str(var.get("name")), None
        if "value" in var:
            text = str(var["value"])
            refs = [values.get(m) for m in _REF.findall(text)]
            if all(r is not None for r in refs):
                value = _REF.sub(lambda m: str(values.get(m.group(1), m.group(0))), text)
        else:
            path = str(((var.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath") or "")
            found = _FIELD.match(path)
            value = fields.get(found.group(1)) if found else None
        values[name] = value
    return {k: v or "" for k, v in values.items()}
