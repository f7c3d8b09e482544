"""``kubeflow.org/v1`` ``PyTorchJob``: the training operator v1's job, read as the operator runs it.

What the operator does (kubeflow/trainer ``release-1.9``, ``pkg/controller.v1/pytorch`` and
``common``) and what the Volcano Job torchjob runs does for it:

- a pod per replica, ``<job>-master-0`` and ``<job>-worker-<i>``: tasks ``master`` and
  ``worker``; each pod's ``restartPolicy`` is its replica's (``OnFailure`` when unset;
  ``ExitCode`` is a pod ``Never`` that is made again when its exit code is 128 or more);
- the env of every container (``kubeflow`` plugin): ``PYTHONUNBUFFERED``, ``MASTER_ADDR``/
  ``MASTER_PORT`` (and their ``PET_`` twins), ``WORLD_SIZE``, ``RANK``, ``PET_NODE_RANK``,
  ``PET_NPROC_PER_NODE``, ``PET_NNODES``, or the elastic ``PET_RDZV_*`` set;
- success: once the master succeeded (``TaskCompleted -> CompleteJob`` on ``master``); without a
  master once every worker did, or with an elastic policy once any one did (``minSuccess: 1``);
- failure: a failed pod of a ``Never`` replica fails the job; ``runPolicy.backoffLimit`` fails it
  once the containers of the running pods restarted that often (per replica type here);
  ``runPolicy.activeDeadlineSeconds`` is the job's deadline.
"""

from __future__ import annotations

from torchjob.spec.kinds.common import (
    INT32_MAX,
    MAX_PROCS_PER_NODE,
    add_task,
    at,
    copy,
    fail_on,
    integer,
    items,
    mapping,
    pod_names_fit,
    pod_restart_policy,
    retry_exit_codes,
    start,
    text,
    too_many_procs,
)
from torchjob.spec.model import JobRunPolicy
from torchjob.spec.podschema import check_kind
from torchjob.spec.source import child
from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any

    from torchjob.spec.kinds.translation import Translation

CONTAINER = "pytorch"
PORT_NAME = "pytorchjob-port"
DEFAULT_PORT = 23456
REPLICA_TYPES = ("Master", "Worker")
RESTART_POLICIES = ("Always", "OnFailure", "Never", "ExitCode")
CLEAN_POD_POLICIES = ("None", "Running", "All")
RDZV_BACKENDS = ("c10d", "etcd", "etcd-v2")
TORCHRUN_NPROC = ("auto", "cpu", "gpu")  # --nproc-per-node's words for a count torchrun finds


def read(tr: Translation, runtimes: Any = None) -> None:
    tr.schema(check_kind(tr.source.data, "PyTorchJob"))
    spec, source = start(tr)
    replicas = _replica_specs(tr, source)
    master, worker = replicas.get("Master"), replicas.get("Worker")
    elastic = mapping(source.get("elasticPolicy")) if "elasticPolicy" in source else None
    ports = {kind: _port(tr, kind, r) for kind, r in replicas.items()}
    counting = [k for k, r in replicas.items() if _policy(r[1]) in ("OnFailure", "Always", "ExitCode")]
    limit = integer(at(source, "runPolicy", "backoffLimit"))
    for kind, (path, replica) in replicas.items():
        count = integer(replica.get("replicas"), 1) or 0
        policy = _policy(replica)
        template = copy(mapping(replica.get("template")))
        pod_spec = template.setdefault("spec", {}) if isinstance(template.get("spec", {}), dict) else {}
        if pod_restart_policy(template) not in (None, _pod_policy(policy)):
            tr.warn(
                f"{path}.template.spec.restartPolicy",
                f"the operator gives the pods the replica's restartPolicy ({policy}); this one is ignored",
            )
        pod_spec["restartPolicy"] = _pod_policy(policy)
        task = add_task(tr, spec, kind.lower(), count, template, path)
        index = len(spec["tasks"]) - 1
        tr.route(f"spec.tasks[{index}].template.spec.restartPolicy", f"{path}.restartPolicy", whole=True)
        tr.route(f"spec.tasks[{index}].policies", f"{path}.restartPolicy", whole=True)
        tr.route(f"spec.tasks[{index}].maxRetry", "spec.runPolicy.backoffLimit", whole=True)
        policies: list[dict[str, Any]] = []
        if policy == "ExitCode":
            policies += retry_exit_codes()
        if policy in ("Never", "ExitCode"):
            policies.append(fail_on("PodFailed"))
        if limit is not None and kind in counting:
            task["maxRetry"] = max(limit, 1)  # the operator's limit 0 fails at the first restart
            policies.append(fail_on("TaskFailed"))
        if kind == "Master":
            policies.append({"event": "TaskCompleted", "action": "CompleteJob"})
        if policies:
            task["policies"] = policies
    if limit is not None and len(counting) > 1:
        tr.warn(
            "spec.runPolicy.backoffLimit",
            f"the operator fails the job when container restarts summed over all its pods reach "
            f"{limit}; here each replica type ({', '.join(counting)}) counts its own",
        )
    pod_names_fit(tr, spec, "PyTorchJob")
    total = sum(t["replicas"] for t in spec.get("tasks", []))
    spec["minAvailable"] = min(total, INT32_MAX)  # past it: the replicas' own count is told
    # a target's refusal of the elastic range of nodes is told at the elastic policy
    tr.route("spec.minAvailable", "spec.elasticPolicy" if elastic else "spec.pytorchReplicaSpecs", whole=True)
    tr.route("spec.tasks", "spec.pytorchReplicaSpecs", whole=True)  # the pods in all
    # A retried ExitCode pod is a RestartPod, which Volcano counts against maxRetry: no limit here.
    spec["maxRetry"] = INT32_MAX if any(_policy(r) == "ExitCode" for _, r in replicas.values()) else 1
    tr.route("spec.maxRetry", "spec.pytorchReplicaSpecs", whole=True)  # from the replicas' restartPolicy
    if master is None and elastic is not None:
        spec["minSuccess"] = 1  # an elastic job without a master succeeds with its first worker
    _run_policy(tr, spec, mapping(source.get("runPolicy")))
    spec["plugins"] = {"kubeflow": _flags(tr, source, master, worker, elastic, ports)}
    tr.route("spec.plugins", "spec", whole=True)
    if not replicas and not tr.broken("spec.pytorchReplicaSpecs"):
        tr.add("spec.pytorchReplicaSpecs", "expected a Master or a Worker replica spec")


def _replica_specs(tr: Translation, source: dict[str, Any]) -> dict[str, tuple[str, dict[str, Any]]]:
    """The replica specs by type (the operator takes ``master``/``WORKER`` too), with their paths."""
    found: dict[str, tuple[str, dict[str, Any]]] = {}
    given: dict[str, Any] = {}  # the key each type was given as
    for key, replica in mapping(source.get("pytorchReplicaSpecs")).items():
        path = child("spec.pytorchReplicaSpecs", str(key))  # a key of any text stays one line
        kind = next((k for k in REPLICA_TYPES if k.lower() == str(key).lower()), None)
        if kind is None:
            tr.add(path, f"unknown replica type {key!r}; a PyTorchJob has Master and Worker")
            continue
        if kind in given:
            tr.add(path, f"replica type {kind} is given twice (also as {given[kind]!r})")
            continue
        given[kind] = key
        if not isinstance(replica, dict):
            continue  # the schema said so
        found[kind] = (path, replica)
        policy = replica.get("restartPolicy")
        if isinstance(policy, str) and policy not in RESTART_POLICIES:
            tr.add(f"{path}.restartPolicy", _choice(policy, RESTART_POLICIES))
        count = integer(replica.get("replicas"))
        if kind == "Master" and count is not None and count != 1:
            tr.add(f"{path}.replicas", f"a PyTorchJob's Master has exactly 1 replica, got {count}")
        elif count is not None and count < 1:
            tr.add(f"{path}.replicas", f"expected at least 1 replica, got {count}")
        containers = items(at(replica, "template", "spec", "containers"))
        if containers and not any(isinstance(c, dict) and c.get("name") == CONTAINER for c in containers):
            tr.add(
                f"{path}.template.spec.containers",
                "the operator needs a container named 'pytorch' (it sets its port and reads its exit code)",
            )
    return dict(sorted(found.items(), key=lambda item: REPLICA_TYPES.index(item[0])))


def _policy(replica: dict[str, Any]) -> str:
    policy = replica.get("restartPolicy")
    return policy if policy in RESTART_POLICIES else "OnFailure"


def _pod_policy(policy: str) -> str:
    return "Never" if policy == "ExitCode" else policy


def _port(tr: Translation, kind: str, replica: tuple[str, dict[str, Any]]) -> int:
    """The ``pytorch`` container's ``pytorchjob-port``, which the operator adds when missing."""
    _, data = replica
    containers = items(at(data, "template", "spec", "containers"))
    for container in containers:
        if isinstance(container, dict) and container.get("name") == CONTAINER:
            for port in items(container.get("ports")):
                if isinstance(port, dict) and port.get("name") == PORT_NAME:
                    number = integer(port.get("containerPort"))  # out of range: told by the pod's checks
                    return number if number is not None and 0 < number < 65536 else DEFAULT_PORT
            return DEFAULT_PORT
    return DEFAULT_PORT


def _add_default_ports(spec: dict[str, Any]) -> None:
    """SetDefaults_PyTorchJob: the ``pytorch`` container gets ``pytorchjob-port`` 23456."""
    for task in spec.get("tasks", []):
        for container in items(at(task, "template", "spec", "containers")):
            if isinstance(container, dict) and container.get("name") == CONTAINER:
                ports = container.get("ports")
                if ports is None:
                    ports = container["ports"] = []
                if isinstance(ports, list) and not any(
                    isinstance(p, dict) and p.get("name") == PORT_NAME for p in ports
                ):
                    ports.append({"name": PORT_NAME, "containerPort": DEFAULT_PORT})


def _run_policy(tr: Translation, spec: dict[str, Any], run: dict[str, Any]) -> None:
    clean = run.get("cleanPodPolicy")
    if isinstance(clean, str) and clean not in CLEAN_POD_POLICIES:
        tr.add("spec.runPolicy.cleanPodPolicy", _choice(clean, CLEAN_POD_POLICIES))
    ttl = integer(run.get("ttlSecondsAfterFinished"))
    if ttl is not None:
        spec["ttlSecondsAfterFinished"] = ttl
        tr.route("spec.ttlSecondsAfterFinished", "spec.runPolicy.ttlSecondsAfterFinished")
    deadline = integer(run.get("activeDeadlineSeconds"))
    _bounds(tr, run)
    # What a target says of the run policy (run_policy.*) is said of these fields.
    tr.route("run_policy.active_deadline_seconds", "spec.runPolicy.activeDeadlineSeconds", whole=True)
    tr.route("run_policy.clean_pod_policy", "spec.runPolicy.cleanPodPolicy", whole=True)
    tr.run_policy = JobRunPolicy(
        clean_pod_policy=clean if isinstance(clean, str) else None,
        ttl_seconds_after_finished=ttl,
        active_deadline_seconds=deadline,
        backoff_limit=integer(run.get("backoffLimit")),
    )
    scheduling = mapping(run.get("schedulingPolicy"))
    if text(scheduling.get("queue")):
        spec["queue"] = scheduling["queue"]
        tr.route("spec.queue", "spec.runPolicy.schedulingPolicy.queue")
    if text(scheduling.get("priorityClass")):
        spec["priorityClassName"] = scheduling["priorityClass"]
        tr.route("spec.priorityClassName", "spec.runPolicy.schedulingPolicy.priorityClass")
    if run.get("suspend") is True:
        tr.warn(
            "spec.runPolicy.suspend",
            "the operator creates no pod of a suspended job until it is resumed; here it runs",
        )
    _add_default_ports(spec)


def _bounds(tr: Translation, run: dict[str, Any]) -> None:
    """What the operator makes of a run policy's numbers below their bounds: neither its CRD nor
    its webhook refuses them, but the job fails at once (core.PastBackoffLimit: 0 restarts already
    reach a negative limit; PastActiveDeadline: a deadline of 0 or less has passed as it starts)."""
    for key, least, why in (
        ("backoffLimit", 0, "a negative limit fails the job before the operator makes a pod"),
        ("activeDeadlineSeconds", 1, "the operator fails the job as soon as it starts"),
    ):
        value, path = integer(run.get(key)), f"spec.runPolicy.{key}"
        if value is not None and value < least and not tr.broken(path):
            tr.add(path, f"expected an integer >= {least}, got {value} ({why})")


def _flags(
    tr: Translation,
    source: dict[str, Any],
    master: tuple[str, dict[str, Any]] | None,
    worker: tuple[str, dict[str, Any]] | None,
    elastic: dict[str, Any] | None,
    ports: dict[str, int],
) -> list[str]:
    """The ``kubeflow`` plugin's flags: what the operator's env for each pod is made of."""
    flags = [f"--master={'master' if master else ''}", f"--worker={'worker' if worker else ''}"]
    flags.append(f"--port={ports.get('Master', ports.get('Worker', DEFAULT_PORT))}")
    nproc = source.get("nprocPerNode")
    elastic_nproc = integer(at(elastic, "nProcPerNode")) if elastic is not None else None
    if isinstance(nproc, str) and elastic_nproc is not None:
        tr.add(
            "spec.nprocPerNode",
            "give spec.nprocPerNode or the deprecated spec.elasticPolicy.nProcPerNode, not both",
        )
    count = int(nproc) if isinstance(nproc, str) and nproc.isascii() and nproc.isdigit() else None
    if count is not None and count > MAX_PROCS_PER_NODE:
        tr.add("spec.nprocPerNode", too_many_procs(count))
    elif isinstance(nproc, str) and not (count or 0) >= 1 and nproc not in TORCHRUN_NPROC:
        # what torchrun's --nproc-per-node takes: its agent refuses anything else when it starts
        tr.add(
            "spec.nprocPerNode",
            f"expected a number of processes (1 or more), auto, cpu or gpu, got {nproc!r}",
        )
    if elastic_nproc is not None and elastic_nproc > MAX_PROCS_PER_NODE:
        tr.add("spec.elasticPolicy.nProcPerNode", too_many_procs(elastic_nproc))
    if not isinstance(nproc, str) and elastic_nproc is None:
        nproc = "auto"  # SetDefaults_PyTorchJob
    if isinstance(nproc, str):
        flags.append(f"--nproc-per-node={nproc}")
    if elastic is None:
        return flags
    if worker is None:
        tr.add("spec.elasticPolicy", "an elastic PyTorchJob needs a Worker replica spec")
    workers = integer(worker[1].get("replicas"), 1) if worker else 1
    low, high = _least(tr, elastic, "minReplicas", 1), _least(tr, elastic, "maxReplicas", 1)
    low, high = (low if low is not None else high), (high if high is not None else low)
    low = workers if low is None else low
    high = workers if high is None else high
    if low is not None and high is not None and low > high:
        tr.add("spec.elasticPolicy.minReplicas", f"expected at most maxReplicas ({high}), got {low}")
    backend = elastic.get("rdzvBackend")
    if isinstance(backend, str) and backend not in RDZV_BACKENDS:
        tr.add("spec.elasticPolicy.rdzvBackend", _choice(backend, RDZV_BACKENDS))
    elif isinstance(backend, str) and backend != "c10d" and not text(elastic.get("rdzvHost")):
        tr.warn(
            "spec.elasticPolicy.rdzvBackend",
            f"the {backend} rendezvous needs an etcd server; give its address as rdzvHost",
        )
    flags += ["--elastic", f"--min-replicas={low}", f"--max-replicas={high}"]
    flags.append(f"--rdzv-backend={backend if isinstance(backend, str) else 'c10d'}")
    rdzv_port = integer(elastic.get("rdzvPort"))
    if rdzv_port is not None and not 0 < rdzv_port < 65536:
        tr.add("spec.elasticPolicy.rdzvPort", f"expected a port from 1 to 65535, got {rdzv_port}")
        rdzv_port = None
    flags.append(f"--rdzv-port={rdzv_port if rdzv_port is not None else ports.get('Worker', DEFAULT_PORT)}")
    for key, flag in (("rdzvHost", "rdzv-host"), ("rdzvId", "rdzv-id")):
        if text(elastic.get(key)):
            flags.append(f"--{flag}={elastic[key]}")
    conf = [
        f"{text(c.get('key'))}={text(c.get('value'))}"
        for c in items(elastic.get("rdzvConf"))
        if isinstance(c, dict)
    ]
    if conf:
        flags.append(f"--rdzv-conf={','.join(conf)}")
    if elastic.get("standalone") is True:
        flags.append("--standalone")
    restarts = _least(tr, elastic, "maxRestarts", 0)
    if restarts is not None:
        flags.append(f"--max-restarts={restarts}")
    if elastic_nproc is not None:
        tr.warn("spec.elasticPolicy.nProcPerNode", "deprecated by the operator; use spec.nprocPerNode")
        flags.append(f"--elastic-nproc-per-node={elastic_nproc}")
    if elastic.get("metrics"):
        tr.warn(
            "spec.elasticPolicy.metrics",
            "the operator scales the workers with a HorizontalPodAutoscaler on these metrics; "
            "here their number stays as given",
        )
    return flags


def _least(tr: Translation, elastic: dict[str, Any], key: str, least: int) -> int | None:
    """An elastic policy's count, None when unset or below ``least`` (told at its field)."""
    value = integer(elastic.get(key))
    if value is not None and value < least:
        what = " node" if key.endswith("Replicas") else ""
        tr.add(f"spec.elasticPolicy.{key}", f"expected at least {least}{what}, got {value}")
        return None
    return value


def _choice(value: str, allowed: tuple[str, ...]) -> str:
    close = [a for a in allowed if a.lower() == value.lower()]
    if not close:
        import difflib

        close = difflib.get_close_matches(value, allowed, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"expected one of {', '.join(allowed)}, got {value!r}{hint}"
