"""What a pod's processes see: its env as the kubelet resolves it, and the ranks torchrun gives them.

``pod_env(pod, container)`` is a container's environment as the kubelet builds it
(``pkg/kubelet/kuberuntime`` ``makeEnvironmentVariables``): each ``value`` with ``$(VAR)``
expanded from the variables before it, each ``fieldRef`` read from the pod (name, namespace,
uid, node, a label or annotation), each ``configMapKeyRef`` from the cluster's ConfigMap.
``command(pod, container)`` is its command and args with ``$(VAR)`` expanded the same way.

``processes(pod)`` is what the training processes of a pod's first container see: a plain command
is one process reading ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT`` (Volcano's pytorch
plugin, the training operator); a command that runs torchrun (``torchrun``, ``python -m
torch.distributed.run``) starts ``nproc`` processes whose ranks torchrun derives, as
``torch/distributed/run.py`` does, from its flags or their ``PET_*`` variables: ``--nnodes``,
``--node-rank``, ``--nproc-per-node`` (``auto``: one per GPU asked for, else one per CPU of the
node), ``--master-addr``/``--master-port`` for a static rendezvous. Node CPUs are ``NODE_CPUS``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kubeapi import FakeKubeAPI

NODE_CPUS = 8  # what the simulated nodes have: torchrun's "auto" on a CPU pod starts this many
_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")
_FIELD = re.compile(r"metadata\.(labels|annotations)\['([^']+)'\]\Z")


def expand(text: str, env: dict[str, str]) -> str:
    """``$(VAR)`` replaced by VAR's value when it is defined (``$$`` escapes), as the kubelet does."""
    return _REF.sub(lambda m: "$" if m.group(1) is None else env.get(m.group(1), m.group(0)), text)


def _field(pod: dict[str, Any], path: str) -> str | None:
    meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    simple = {
        "metadata.name": meta.get("name"),
        "metadata.namespace": meta.get("namespace"),
        "metadata.uid": meta.get("uid"),
        "spec.nodeName": spec.get("nodeName"),
        "spec.serviceAccountName": spec.get("serviceAccountName"),
        "status.podIP": status.get("podIP"),
        "status.hostIP": status.get("hostIP"),
    }
    if path in simple:
        value = simple[path]
        return None if value is None else str(value)
    found = _FIELD.match(path)
    if found:
        value = (meta.get(found.group(1)) or {}).get(found.group(2))
        return None if value is None else str(value)
    raise AssertionError(f"the kubelet cannot resolve fieldPath {path!r}")


def _container(pod: dict[str, Any], name: str | None) -> dict[str, Any]:
    spec = pod.get("spec") or {}
    every = [*(spec.get("containers") or []), *(spec.get("initContainers") or [])]
    if name is None:
        return dict(every[0])
    return dict(next(c for c in every if c.get("name") == name))


def pod_env(
    pod: dict[str, Any], container: str | None = None, api: FakeKubeAPI | None = None
) -> dict[str, str]:
    """A container's environment as the kubelet resolves it (the first container by default);
    ``api`` is needed for ``configMapKeyRef``."""
    env: dict[str, str] = {}
    namespace = (pod.get("metadata") or {}).get("namespace", "default")
    for var in _container(pod, container).get("env") or []:
        name = str(var["name"])
        if "value" in var:
            env[name] = expand(str(var["value"]), env)
            continue
        source = var.get("valueFrom") or {}
        if "fieldRef" in source:
            value = _field(pod, str(source["fieldRef"]["fieldPath"]))
        elif "configMapKeyRef" in source and api is not None:
            ref = source["configMapKeyRef"]
            config = api.get("v1", "ConfigMap", ref["name"], namespace) or {}
            value = (config.get("data") or {}).get(ref["key"])
        else:
            value = None
        if value is not None:
            env[name] = value
    return env


def command(pod: dict[str, Any], container: str | None = None, api: FakeKubeAPI | None = None) -> list[str]:
    """The container's command and args, ``$(VAR)`` expanded from its environment."""
    spec = _container(pod, container)
    env = pod_env(pod, container, api)
    return [expand(str(part), env) for part in [*(spec.get("command") or []), *(spec.get("args") or [])]]


@dataclass(frozen=True)
class Process:
    """One training process: where it is, and what torch.distributed will make of it."""

    pod: str
    rank: int | None
    world_size: int | None
    local_rank: int
    master_addr: str | None
    master_port: str | None


def _gpus(spec: dict[str, Any]) -> int:
    resources = spec.get("resources") or {}
    for table in (resources.get("limits") or {}, resources.get("requests") or {}):
        for key, value in table.items():
            if "gpu" in key:
                return int(value)
    return 0


def _torchrun_args(argv: list[str]) -> tuple[dict[str, str], bool] | None:
    """torchrun's own flags (names with dashes) if ``argv`` runs it; None for any other command."""
    if argv[:1] == ["torchrun"] or (argv[:1] and argv[0].endswith("/torchrun")):
        rest = argv[1:]
    elif len(argv) >= 3 and argv[0].startswith("python") and argv[1:3] == ["-m", "torch.distributed.run"]:
        rest = argv[3:]
    else:
        return None
    flags: dict[str, str] = {}
    no_python = False
    i = 0
    while i < len(rest) and rest[i].startswith("-"):
        name, eq, value = rest[i].lstrip("-").partition("=")
        name = name.replace("_", "-")
        if name in ("no-python", "standalone", "module", "m", "run-path"):
            no_python = no_python or name == "no-python"
            if name == "standalone":
                flags["standalone"] = "1"
            i += 1
            continue
        if not eq:
            i += 1
            value = rest[i] if i < len(rest) else ""
        flags[name] = value
        i += 1
    return flags, no_python


def _int(text: str | None) -> int | None:
    """A number as torch reads it; None for anything else (an unexpanded ``$(VAR)``, say)."""
    try:
        return None if text is None else int(text)
    except ValueError:
        return None


def processes(pod: dict[str, Any], api: FakeKubeAPI | None = None) -> list[Process]:
    """The training processes of the pod's first container, with what each will use (see above)."""
    name = str(pod["metadata"]["name"])
    env = pod_env(pod, None, api)
    argv = command(pod, None, api)
    parsed = _torchrun_args(argv)
    if parsed is None:
        return [
            Process(
                name,
                _int(env.get("RANK")),
                _int(env.get("WORLD_SIZE")),
                _int(env.get("LOCAL_RANK", "0")) or 0,
                env.get("MASTER_ADDR"),
                env.get("MASTER_PORT"),
            )
        ]
    flags, _ = parsed

    def flag(key: str, default: str | None) -> str | None:
        if key in flags:
            return flags[key]
        return env.get("PET_" + key.upper().replace("-", "_"), default)

    if flag("standalone", None):
        nnodes, node_rank, addr, port = "1", "0", "localhost", "29400"
    else:
        nnodes = flag("nnodes", "1") or "1"
        node_rank = flag("node-rank", "0") or "0"
        addr, port = flag("master-addr", "127.0.0.1"), flag("master-port", "29500")
    nproc_text = flag("nproc-per-node", "1") or "1"
    if nproc_text == "auto":  # torch.distributed.run: one per GPU, else one per CPU
        nproc = _gpus(_container(pod, None)) or NODE_CPUS
    elif nproc_text in ("cpu",):
        nproc = NODE_CPUS
    elif nproc_text == "gpu":
        nproc = _gpus(_container(pod, None))
    else:
        nproc = _int(nproc_text) or 0
    nodes, rank = _int(nnodes.split(":")[-1]), _int(node_rank)
    return [
        Process(
            name,
            None if rank is None else rank * nproc + local,
            None if nodes is None else nodes * nproc,
            local,
            addr,
            port,
        )
        for local in range(nproc)
    ]
