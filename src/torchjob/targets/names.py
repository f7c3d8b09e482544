"""Names each target's controller makes from the job's name, and the 63-character limit they share.

Spec validation already checks Volcano's own names (``<job>-<task>-<i>``). The other controllers
make longer ones, and a name the API server refuses means a job that never starts (a Service that
is never created leaves ``MASTER_ADDR`` unresolvable), so ``render`` refuses such a job up front,
naming the longest job name that would fit.
"""

from __future__ import annotations

from torchjob.errors import Problem, SpecError
from torchjob.spec.model import Job
from torchjob.spec.names import DNS1123_LABEL_MAX, is_dns1035_label

# JobSet's webhook checks a pod name with a 5-character random suffix (jobset PR #409).
POD_SUFFIX = "-abcde"


def generated(job: Job, target: str) -> list[tuple[str, str, str]]:
    """(field path, what, name): the longest name of each kind ``target``'s controller derives."""
    if target == "kubeflow":
        from torchjob.plugins.pytorch import PyTorchPlugin

        if "pytorch" not in job.spec.plugins:
            return []  # refused elsewhere
        plugin = PyTorchPlugin(job.spec.plugins["pytorch"])
        worker = job.task(plugin.worker)
        workers = job.elastic.max_nodes if job.elastic is not None else (worker.replicas if worker else 0)
        # The operator names each pod and its Service <job>-<replica type>-<index> (GenGeneralName).
        what = "pod and Service"
        out = [] if job.elastic is not None else [("metadata.name", what, f"{job.name}-master-0")]
        if workers:
            out.append(("metadata.name", what, f"{job.name}-worker-{workers - 1}"))
        return out
    if target == "jobset":
        # One replicated job per task, of `replicas` one-pod Jobs: Job <job>-<task>-<i>, pod <Job>-0-xxxxx.
        return [
            (f"spec.tasks[{i}].name", "pod", f"{job.name}-{t.name}-{max(t.replicas - 1, 0)}-0{POD_SUFFIX}")
            for i, t in enumerate(job.spec.tasks)
        ]
    if target == "trainjob":
        # The runtime's one replicated job "node" holds one Job of numNodes pods.
        nodes = sum(t.replicas for t in job.spec.tasks)
        return [("metadata.name", "pod", f"{job.name}-node-0-{max(nodes - 1, 0)}{POD_SUFFIX}")]
    return []  # pods and volcano: <job>-<task>-<i>, checked by spec validation


def check(job: Job, target: str) -> None:
    """Refuse a job whose generated names ``target``'s controller could not create."""
    problems: list[Problem] = []
    if target in ("kubeflow", "jobset", "trainjob") and not is_dns1035_label(job.name):
        # The PyTorchJob webhook, the JobSet's headless Service and the TrainJob's name rule.
        problems.append(
            Problem(
                "metadata.name",
                f"--target {target} needs a job name that starts with a letter (it names a "
                f"Service), got {job.name!r}",
            )
        )
    longest = max(generated(job, target), key=lambda item: len(item[2]), default=None)
    if longest is not None and len(longest[2]) > DNS1123_LABEL_MAX:
        path, what, name = longest
        fits = DNS1123_LABEL_MAX - (len(name) - len(job.name))
        hint = f"the longest job name that fits is {fits} characters" if fits > 0 else "shorten the task name"
        problems.append(
            Problem(
                "metadata.name" if fits > 0 else path,
                f"--target {target}: the controller would name a {what} {name!r} ({len(name)} "
                f"characters, more than {DNS1123_LABEL_MAX}); {hint}",
            )
        )
    if problems:
        raise SpecError(problems)
