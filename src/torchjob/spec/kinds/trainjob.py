"""``trainer.kubeflow.org/v1alpha1`` ``TrainJob``: read as Kubeflow Trainer (v2.2 and later) runs it.

Trainer makes a TrainJob into its runtime's JobSet (kubeflow/trainer ``pkg/runtime``): the
replicated job labelled ``trainer.kubeflow.org/trainjob-ancestor-step: trainer`` (``node`` in
``torch-distributed``) becomes one Job of ``numNodes`` pods (the TrainJob's, else the runtime's
``mlPolicy.numNodes``), whose ``node`` container takes the trainer's ``image``, ``command``,
``args``, ``env`` and ``resourcesPerNode`` (in place of the runtime's) and the port 29500;
``runtimePatches`` are merged into the JobSet in order (labels, annotations, pod fields,
containers by name). The torch policy gives the ``node`` container (and the runtime's
``envInjection`` targets) ``PET_NNODES``, ``PET_NPROC_PER_NODE`` (``numProcPerNode``; unset:
``auto`` on a GPU node, else the CPUs requested, else the CPU limit, at least 1),
``PET_NODE_RANK``, ``PET_MASTER_ADDR`` (``<job>-node-0-0.<job>``) and ``PET_MASTER_PORT``
(29500): the ``trainer`` plugin. That JobSet is then read as any JobSet (jobset.py): its pods,
restarts and success are JobSet's. ``activeDeadlineSeconds`` is the job's
deadline.
"""

from __future__ import annotations

import math

from torchjob.spec.kinds.common import (
    MAX_PROCS_PER_NODE,
    at,
    copy,
    integer,
    items,
    mapping,
    pod_names_fit,
    start,
    text,
    too_many_procs,
)
from torchjob.spec.kinds.jobset import translate_set
from torchjob.spec.kinds.runtimes import CLUSTER, Runtimes, trainer_pod_spec
from torchjob.spec.model import JobRunPolicy
from torchjob.spec.podschema import check_kind
from torchjob.spec.validate import MAX_PODS
from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any

    from torchjob.spec.kinds.runtimes import Runtime
    from torchjob.spec.kinds.translation import Translation
    from torchjob.spec.source import Document

ANCESTOR = "trainer.kubeflow.org/trainjob-ancestor-step"
NODE = "node"
PORT = 29500
GROUP = "trainer.kubeflow.org"
RESERVED_ENV = ("PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT")
INITIALIZERS = {"dataset": "dataset-initializer", "model": "model-initializer"}
# Lists a runtime patch merges by a key (strategic merge); any other list it replaces.
MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "volumes": "name",
    "env": "name",
    "imagePullSecrets": "name",
    "volumeMounts": "mountPath",
    "replicatedJobs": "name",
}


def read(tr: Translation, runtimes: Runtimes | None = None) -> None:
    tr.schema(check_kind(tr.source.data, "TrainJob"))
    spec, source = start(tr)
    runtime = _runtime(tr, source, runtimes or Runtimes())
    if runtime is None:
        tr.complete = False
        return
    trainer = mapping(source.get("trainer"))
    _trainer_checks(tr, trainer)
    jobset = copy(mapping(at(runtime.data, "spec", "template", "spec")))
    rjobs = items(jobset.get("replicatedJobs"))
    node = next(
        (
            r
            for r, rjob in enumerate(rjobs)
            if at(rjob, "template", "metadata", "labels", ANCESTOR) == "trainer"
        ),
        None,
    )
    if node is None:
        message = (
            f"{runtime.where} has no replicated job labelled {ANCESTOR}: trainer, for the trainer's nodes"
        )
        tr.add("spec.runtimeRef.name", message)
        tr.complete = False
        return
    policy = mapping(at(runtime.data, "spec", "mlPolicy"))
    nodes = integer(trainer.get("numNodes"), integer(policy.get("numNodes"), 1))
    if nodes is not None and nodes < 1:  # the TrainJob's own count is told above
        if integer(trainer.get("numNodes")) is None:  # the runtime's: a TrainJob of no pods
            tr.add(
                "spec.runtimeRef",
                f"{runtime.where} gives mlPolicy.numNodes {nodes} and spec.trainer.numNodes is not "
                "given; expected at least 1 node",
            )
        tr.complete = False
        return
    if nodes is not None and nodes > MAX_PODS:  # before the pods are made
        field = "spec.trainer.numNodes" if integer(trainer.get("numNodes")) is not None else "spec.runtimeRef"
        why = "the most pods one Kubernetes cluster is built for"
        tr.add(field, f"expected at most {MAX_PODS} nodes, {why}, got {nodes}")
        tr.complete = False
        return
    rjob = rjobs[node]
    rjob["replicas"] = 1
    pod_spec = trainer_pod_spec(tr, runtime, rjob, node, nodes)
    if pod_spec is None:
        tr.complete = False
        return
    containers = items(pod_spec.get("containers"))
    container = next((c for c in containers if isinstance(c, dict) and c.get("name") == NODE), None)
    if container is None:
        tr.add("spec.runtimeRef.name", f"{runtime.where} has no container named node in its trainer's job")
        tr.complete = False
        return
    nproc = _nproc(trainer, container)
    _apply_trainer(container, trainer)
    _initializers(tr, jobset, mapping(source.get("initializer")))
    _patches(tr, jobset, items(source.get("runtimePatches")))
    rname = text(rjob.get("name"))
    base = "spec.template.spec"

    def place(path: str) -> tuple[Document, str]:
        return runtime.document, f"{base}.{path}" if path else base

    names = translate_set(tr, spec, jobset, place)
    pod_names_fit(tr, spec, "TrainJob")
    _route_trainer(tr, spec, f"{rname}-0", container)
    tr.route("spec.tasks", "spec.runtimeRef", whole=True)  # a task of its own: the runtime's
    inject = _injection(tr, policy, names, runtime)
    flags = [f"--node={rname}-0", f"--container={NODE}", f"--nproc-per-node={nproc}"]
    if inject:
        flags.append(f"--inject={','.join(inject)}")
    spec["plugins"] = {"trainer": flags, **spec.get("plugins", {})}
    tr.run_policy = JobRunPolicy(active_deadline_seconds=integer(source.get("activeDeadlineSeconds")))
    tr.route(
        "run_policy.active_deadline_seconds", "spec.activeDeadlineSeconds", whole=True
    )  # a target's word
    for key, words in (
        ("suspend", "Trainer makes no pod of a suspended TrainJob until it is resumed; here it runs"),
        (
            "managedBy",
            "another controller than Trainer's runs this TrainJob on a cluster; here torchjob does",
        ),
    ):
        value = source.get(key)
        if value not in (None, False, "trainer.kubeflow.org/trainjob-controller"):
            tr.warn(f"spec.{key}", words)
    if at(runtime.data, "spec", "podGroupPolicy") is not None:
        tr.warn(
            "spec.runtimeRef",
            f"{runtime.where} gang-schedules the pods (podGroupPolicy); here they start as the local "
            "queue admits them",
        )


def _runtime(tr: Translation, source: dict[str, Any], runtimes: Runtimes) -> Runtime | None:
    ref = mapping(source.get("runtimeRef"))
    name = text(ref.get("name"))
    kind = text(ref.get("kind"), CLUSTER)
    group = text(ref.get("apiGroup"), GROUP)
    if tr.broken("spec.runtimeRef") or not name:
        return None
    if group != GROUP:
        tr.add("spec.runtimeRef.apiGroup", f"expected {GROUP!r}, got {group!r}")
        return None
    namespace = text(at(tr.source.data, "metadata", "namespace"), "default")
    runtime = runtimes.find(kind, name, namespace)
    if runtime is None:
        known = ", ".join(runtimes.known(kind)) or "none"
        where = "in this file, in --runtime FILE" + (
            f" (in namespace {namespace!r})" if kind != CLUSTER else ""
        )
        message = f"no {kind} named {name!r} {where}, or installed by Trainer (known: {known})"
        tr.add("spec.runtimeRef.name", message)
        return None
    torch = at(runtime.data, "spec", "mlPolicy", "torch")
    others = [
        p for p in ("mpi", "jax", "xgboost", "flux") if at(runtime.data, "spec", "mlPolicy", p) is not None
    ]
    if torch is None and others:
        tr.add(
            "spec.runtimeRef.name",
            f"{runtime.where} runs {others[0]}; torchjob reads TrainJobs of torch runtimes",
        )
        return None
    return runtime


def _trainer_checks(tr: Translation, trainer: dict[str, Any]) -> None:
    for i, var in enumerate(items(trainer.get("env"))):
        if isinstance(var, dict) and var.get("name") in RESERVED_ENV:
            tr.add(
                f"spec.trainer.env[{i}].name",
                f"{var['name']} is set by the TrainJob's torch runtime; it cannot be given",
            )
    nproc = integer(trainer.get("numProcPerNode"))
    if nproc is not None and nproc < 1:
        tr.add("spec.trainer.numProcPerNode", f"expected at least 1, got {nproc}")
    elif nproc is not None and nproc > MAX_PROCS_PER_NODE:
        tr.add("spec.trainer.numProcPerNode", too_many_procs(nproc))
    nodes = integer(trainer.get("numNodes"))
    if nodes is not None and nodes < 1 and not tr.broken("spec.trainer.numNodes"):
        tr.add("spec.trainer.numNodes", f"expected at least 1 node, got {nodes}")


def _nproc(trainer: dict[str, Any], container: dict[str, Any]) -> str:
    """``PET_NPROC_PER_NODE`` as Trainer's torch plugin sets it: numProcPerNode, else ``auto`` on a
    GPU node, else the CPUs the node requests (its limit when it requests none), at least 1."""
    given = integer(trainer.get("numProcPerNode"))
    if given is not None:
        return str(given)
    # The TrainJob's resourcesPerNode replaces the runtime's (_apply_trainer): read one of them.
    wanted = trainer.get("resourcesPerNode")
    resources = mapping(wanted) if wanted is not None else mapping(container.get("resources"))
    requests, limits = mapping(resources.get("requests")), mapping(resources.get("limits"))
    from torchjob.spec.units import parse_quantity

    def count(table: dict[str, Any], kind: str) -> int:
        """The first resource named like ``kind`` in ``table``, rounded up as Kubernetes' Value()."""
        for key, value in table.items():
            if (key == "cpu") if kind == "cpu" else (kind in str(key).lower()):
                try:
                    return math.ceil(parse_quantity(value))
                except ValueError:
                    return 0  # refused by the pod's own check
        return 0

    if count(requests, "gpu") or count(limits, "gpu"):
        return "auto"
    return str(max(1, count(requests, "cpu") or count(limits, "cpu")))


def _apply_trainer(container: dict[str, Any], trainer: dict[str, Any]) -> None:
    """The trainer's image, command, args, env and resources on the ``node`` container."""
    for key in ("image", "command", "args"):
        if trainer.get(key) is not None:
            container[key] = copy(trainer[key])
    env: list[Any] = items(container.get("env"))
    for var in items(trainer.get("env")):
        if isinstance(var, dict):
            kept = [e for e in env if not (isinstance(e, dict) and e.get("name") == var.get("name"))]
            env = [*kept, copy(var)]
    if env:
        container["env"] = env
    if trainer.get("resourcesPerNode") is not None:  # Trainer replaces the runtime's, not merges
        container["resources"] = copy(mapping(trainer["resourcesPerNode"]))
    ports = container.setdefault("ports", [])
    if isinstance(ports, list) and not any(
        isinstance(p, dict) and p.get("containerPort") == PORT for p in ports
    ):
        ports.append({"containerPort": PORT})


def _initializers(tr: Translation, jobset: dict[str, Any], initializer: dict[str, Any]) -> None:
    """``spec.initializer``: the runtime's initializer jobs get STORAGE_URI and the env."""
    rjobs = {text(r.get("name")): r for r in items(jobset.get("replicatedJobs")) if isinstance(r, dict)}
    for key, rname in INITIALIZERS.items():
        given = initializer.get(key)
        if not isinstance(given, dict):
            continue
        rjob = rjobs.get(rname)
        if rjob is None:
            tr.add(f"spec.initializer.{key}", f"the runtime has no {rname} job to run it")
            continue
        for container in items(at(rjob, "template", "spec", "template", "spec", "containers")):
            if isinstance(container, dict) and container.get("name") == rname:
                env = [{"name": "STORAGE_URI", "value": text(given.get("storageUri"))}]
                env += [copy(v) for v in items(given.get("env")) if isinstance(v, dict)]
                _merge_list(container.setdefault("env", []), env, "name")
                secret = text(at(given, "secretRef", "name"))
                if secret:
                    container.setdefault("envFrom", []).append({"secretRef": {"name": secret}})


def _patches(tr: Translation, jobset: dict[str, Any], patches: list[Any]) -> None:
    """``runtimePatches``, in order: replicated jobs by name, their pod fields merged."""
    rjobs = {text(r.get("name")): r for r in items(jobset.get("replicatedJobs")) if isinstance(r, dict)}
    for k, patch in enumerate(patches):
        base = f"spec.runtimePatches[{k}].trainingRuntimeSpec.template.spec.replicatedJobs"
        for r, change in enumerate(
            items(at(patch, "trainingRuntimeSpec", "template", "spec", "replicatedJobs"))
        ):
            change = mapping(change)
            name = text(change.get("name"))
            if name not in rjobs:
                tr.add(
                    f"{base}[{r}].name",
                    f"the runtime has no replicated job named {name!r} (it has {', '.join(rjobs)})",
                )
                continue
            target = rjobs[name].setdefault("template", {})
            pod_patch = mapping(at(change, "template", "spec", "template"))
            for c, container in enumerate(items(at(pod_patch, "spec", "containers"))):
                path = f"{base}[{r}].template.spec.template.spec.containers[{c}]"
                known = [
                    x.get("name")
                    for x in items(at(target, "spec", "template", "spec", "containers"))
                    if isinstance(x, dict)
                ]
                cname = mapping(container).get("name")
                if cname not in known:
                    tr.add(f"{path}.name", f"the runtime's {name} job has no container named {cname!r}")
                elif mapping(container).get("env") is not None and cname in (NODE, *INITIALIZERS.values()):
                    tr.add(
                        f"{path}.env",
                        f"a runtime patch cannot set the env of container {cname!r}; use spec.trainer.env",
                    )
            _merge(target, {k2: v for k2, v in mapping(change.get("template")).items()})


def _merge(base: dict[str, Any], patch: dict[str, Any]) -> None:
    """A strategic merge of plain data: maps merged, lists of named things by their key."""
    for key, value in patch.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            _merge(base[key], value)
        elif isinstance(value, list) and isinstance(base.get(key), list) and key in MERGE_KEYS:
            _merge_list(base[key], value, MERGE_KEYS[key])
        else:
            base[key] = copy(value)


def _merge_list(base: list[Any], patch: list[Any], key: str) -> None:
    for item in patch:
        same = next(
            (
                b
                for b in base
                if isinstance(b, dict) and isinstance(item, dict) and b.get(key) == item.get(key)
            ),
            None,
        )
        if same is not None and isinstance(item, dict):
            _merge(same, item)
        else:
            base.append(copy(item))


def _route_trainer(tr: Translation, spec: dict[str, Any], task_name: str, container: dict[str, Any]) -> None:
    """The node container's fields that came from the TrainJob's trainer are told there."""
    index = next((i for i, t in enumerate(spec.get("tasks", [])) if t["name"] == task_name), None)
    if index is None:
        return
    containers = items(at(spec["tasks"][index], "template", "spec", "containers"))
    c = next((i for i, x in enumerate(containers) if isinstance(x, dict) and x.get("name") == NODE), 0)
    path = f"spec.tasks[{index}].template.spec.containers[{c}]"
    trainer = mapping(at(tr.source.data, "spec", "trainer"))
    for key, source in (
        ("image", "image"),
        ("command", "command"),
        ("args", "args"),
        ("resources", "resourcesPerNode"),
    ):
        if key in trainer or source in trainer:
            tr.route(f"{path}.{key}", f"spec.trainer.{source}")
    env = items(container.get("env"))
    # The trainer's variables, by name; one without a name that is text is found by its value.
    given = items(trainer.get("env"))
    names = {var["name"]: i for i, var in enumerate(given) if isinstance(mapping(var).get("name"), str)}
    for i, var in enumerate(env):
        name = mapping(var).get("name")
        j = (
            names.get(name)
            if isinstance(name, str)
            else next((j for j, g in enumerate(given) if g == var), None)
        )
        if j is not None:
            tr.route(f"{path}.env[{i}]", f"spec.trainer.env[{j}]")


def _injection(tr: Translation, policy: dict[str, Any], tasks: list[str], runtime: Runtime) -> list[str]:
    """The runtime's ``envInjection`` targets as TASK/CONTAINER pairs (a task is ``<job>-<index>``)."""
    pairs = []
    for target in items(at(policy, "torch", "envInjection", "targets")):
        job = text(mapping(target).get("jobName"))
        for container in items(mapping(target).get("containerNames")):
            pairs += [f"{t}/{container}" for t in tasks if t.rpartition("-")[0] == job]
    return pairs
