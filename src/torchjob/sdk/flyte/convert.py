"""A flytekit task becomes a torchjob :class:`~torchjob.sdk.task.Task`, read from what flytekit
serializes for it, so that it runs as the PyTorchJob Flyte's backend would make of it.

- ``PyTorchFunctionTask``: ``get_custom`` gives the master and worker replica specs (replicas,
  image, resources, restart policy) and the run policy, as the backend receives them: an unset
  restart policy is ``Never``, a replica's own resources replace the task's when it has any.
- ``PytorchElasticFunctionTask``: ``get_custom`` gives the worker count (``max_nodes``), min and
  max nodes, processes per node, max restarts and the run policy; what flytekit uses only at run
  time (``rdzv_configs``, ``start_method``, ``monitor_interval``) comes from the task's config.
  ``nnodes=1`` serializes as a plain task (``python-task``): one node, no PyTorchJob.
- a ``PythonFunctionTask`` without a config: a plain task, called once.

The task's image (when it names one), environment and resources apply to every replica, with a
workflow node's ``with_overrides`` (resources, image) on top where the caller passes them.
"""

from __future__ import annotations

import functools
import os
import sys
from dataclasses import dataclass, field
from typing import Any

from torchjob.sdk.config import (
    CleanPodPolicy,
    Elastic,
    Master,
    PyTorch,
    Resources,
    RestartPolicy,
    RunPolicy,
    Worker,
)
from torchjob.sdk.task import Task

FLYTE_MONITOR_DEFAULT = 5  # seconds: kfpytorch's Elastic.monitor_interval default
MONITOR_INTERVAL = 0.1  # torchrun's default, what torchjob runs flytekit's default as

_RESOURCE_NAMES = {"CPU": "cpu", "MEMORY": "mem", "GPU": "gpu", "EPHEMERAL_STORAGE": "ephemeral_storage"}
_RESTART = {"RESTART_POLICY_ON_FAILURE": RestartPolicy.FAILURE, "RESTART_POLICY_ALWAYS": RestartPolicy.ALWAYS}
_CLEAN = {"CLEANPOD_POLICY_ALL": CleanPodPolicy.ALL, "CLEANPOD_POLICY_RUNNING": CleanPodPolicy.RUNNING}


class Unsupported(ValueError):
    """A flytekit entity torchjob does not run as a task (another plugin's, a container task...)."""


@dataclass
class NodeOverrides:
    """A workflow node's ``with_overrides``, as flytekit serializes them (``TaskNodeOverrides``)."""

    requests: dict[str, str] = field(default_factory=dict)
    limits: dict[str, str] = field(default_factory=dict)
    image: str | None = None


@dataclass
class Converted:
    """The torchjob task of a flytekit task, and what is worth saying about the conversion."""

    task: Task[Any, Any]
    kind: str  # "pytorch", "elastic" or "plain"
    notes: list[str]


@functools.lru_cache(maxsize=1)
def settings() -> Any:
    """The serialization settings every task is read with (flytekit's default image config)."""
    from flytekit.configuration import ImageConfig, SerializationSettings

    return SerializationSettings(image_config=ImageConfig.auto_default_image())


def kind_of(task: Any) -> str | None:
    """``pytorch``, ``elastic``, ``plain``, ``dynamic``; None for what torchjob does not run."""
    from flytekit.core.python_function_task import PythonFunctionTask

    if not isinstance(task, PythonFunctionTask):
        return None
    if task.execution_mode == PythonFunctionTask.ExecutionBehavior.DYNAMIC:
        return "dynamic"
    if task.execution_mode != PythonFunctionTask.ExecutionBehavior.DEFAULT:
        return None
    try:
        from flytekitplugins.kfpytorch.task import PytorchElasticFunctionTask, PyTorchFunctionTask
    except ImportError:  # no kfpytorch installed: only plain tasks can exist
        return "plain" if task.task_config is None else None
    if isinstance(task, PyTorchFunctionTask):
        return "pytorch"
    if isinstance(task, PytorchElasticFunctionTask):
        return "elastic"
    return "plain" if task.task_config is None and type(task) is PythonFunctionTask else None


def _entries(items: Any) -> dict[str, str]:
    """``[{"name": "CPU", "value": "1"}]`` (flytekit's resource entries) as Resources fields."""
    out: dict[str, str] = {}
    for item in items or []:
        name = _RESOURCE_NAMES.get(str(item.get("name")))
        if name is not None and "value" in item:
            out[name] = str(item["value"])
    return out


def _serialized(model: Any) -> dict[str, Any]:
    from google.protobuf.json_format import MessageToDict

    return dict(MessageToDict(model.to_flyte_idl()))


def task_resources(task: Any) -> tuple[dict[str, str], dict[str, str]]:
    """The task's requests and limits as flytekit serializes them (``@task(requests=, limits=,
    resources=)``)."""
    from flytekit.core.resources import convert_resources_to_resource_model

    spec = task.resources
    model = convert_resources_to_resource_model(requests=spec.requests, limits=spec.limits)
    data = _serialized(model)
    return _entries(data.get("requests")), _entries(data.get("limits"))


def node_overrides(overrides: Any) -> NodeOverrides:
    """A serialized node's ``TaskNodeOverrides`` (None: no overrides)."""
    if overrides is None:
        return NodeOverrides()
    out = NodeOverrides(image=getattr(overrides, "container_image", None) or None)
    if getattr(overrides, "resources", None) is not None:
        data = _serialized(overrides.resources)
        out.requests, out.limits = _entries(data.get("requests")), _entries(data.get("limits"))
    return out


def _resources(values: dict[str, str]) -> Resources | None:
    return Resources(**values) if values else None


def _replica_resources(spec: dict[str, Any]) -> tuple[Resources | None, Resources | None]:
    """A replica's own resources replace the task's entirely when it has any (Flyte's backend);
    empty Resources then keep the task's from filling in the half it left out."""
    data = spec.get("resources") or {}
    requests, limits = _entries(data.get("requests")), _entries(data.get("limits"))
    if not requests and not limits:
        return None, None
    return Resources(**requests), Resources(**limits)


def _run_policy(data: dict[str, Any] | None) -> RunPolicy | None:
    """The serialized ``runPolicy`` (zero values are left out by flytekit, hence unset here)."""
    if data is None:
        return None
    return RunPolicy(
        clean_pod_policy=_CLEAN.get(str(data.get("cleanPodPolicy"))),
        ttl_seconds_after_finished=_int(data.get("ttlSecondsAfterFinished")),
        active_deadline_seconds=_int(data.get("activeDeadlineSeconds")),
        backoff_limit=_int(data.get("backoffLimit")),
    )


def _int(value: Any) -> int | None:
    return None if value is None else int(value)


def _shared_memory(task: Any) -> bool:
    """kfpytorch's ``increase_shared_mem`` or flytekit's ``@task(shared_memory=...)``."""
    return bool(getattr(task.task_config, "increase_shared_mem", False) or task.shared_memory)


def _pytorch(task: Any, custom: dict[str, Any]) -> PyTorch:
    master, worker = custom.get("masterReplicas") or {}, custom.get("workerReplicas") or {}
    master_requests, master_limits = _replica_resources(master)
    worker_requests, worker_limits = _replica_resources(worker)
    return PyTorch(
        master=Master(
            image=master.get("image") or None,
            requests=master_requests,
            limits=master_limits,
            restart_policy=_RESTART.get(str(master.get("restartPolicy"))),
        ),
        worker=Worker(
            image=worker.get("image") or None,
            requests=worker_requests,
            limits=worker_limits,
            replicas=int(worker.get("replicas", 0)),  # proto3 leaves 0 out
            restart_policy=_RESTART.get(str(worker.get("restartPolicy"))),
        ),
        run_policy=_run_policy(custom.get("runPolicy")),
        increase_shared_mem=_shared_memory(task),
    )


def _elastic(task: Any, custom: dict[str, Any] | None, notes: list[str]) -> Elastic:
    config = task.task_config
    interval = config.monitor_interval
    if interval == FLYTE_MONITOR_DEFAULT:
        interval = MONITOR_INTERVAL
    runtime: dict[str, Any] = {
        "start_method": config.start_method,
        "monitor_interval": interval,
        "rdzv_configs": dict(config.rdzv_configs),
        "increase_shared_mem": _shared_memory(task),
    }
    if custom is None:  # nnodes == 1: a plain pod on a cluster, torch's launcher inside it
        return Elastic(
            nnodes=1, nproc_per_node=config.nproc_per_node, max_restarts=config.max_restarts, **runtime
        )
    elastic = custom.get("elasticConfig") or {}
    low, high = int(elastic.get("minReplicas", 0)), int(elastic.get("maxReplicas", 0))
    nnodes = config.nnodes
    if (low, high) != _nnodes(nnodes):
        notes.append(
            f"task_config nnodes={nnodes!r} but flytekit serializes {low}:{high} nodes (fixed when the "
            "task was defined; with_overrides(task_config=...) does not change them): "
            f"torchjob runs {low}:{high}, as a cluster would"
        )
    return Elastic(
        nnodes=f"{low}:{high}",
        nproc_per_node=int(elastic.get("nprocPerNode", 0)),
        max_restarts=int(elastic.get("maxRestarts", 0)),
        run_policy=_run_policy(custom.get("runPolicy")),
        **runtime,
    )


def _nnodes(nnodes: Any) -> tuple[int, int] | None:
    from torchjob.sdk.config import parse_nnodes

    try:
        return parse_nnodes(nnodes if isinstance(nnodes, int) else str(nnodes))
    except ValueError:
        return None


def _image(task: Any, overrides: NodeOverrides) -> str | None:
    if overrides.image:
        return overrides.image
    if task.container_image is None:
        return None  # the SDK's default image (and its warning on render)
    return str(task.get_image(settings()))


def typed(function: Any) -> Any:
    """``function`` whose value, in rank 0, is converted to the declared output type as flytekit
    converts a task's outputs (a mismatch raises flytekit's own error there), where flytekit is
    loaded: in a pod, which imported the task's file; not in the processes torch's elastic agent
    starts, which would import it for that alone (a second or two each call)."""

    @functools.wraps(function)
    def call(*args: Any, **kwargs: Any) -> Any:
        value = function(*args, **kwargs)
        if os.environ.get("RANK", "0") != "0" or "flytekit" not in sys.modules:
            return value
        from torchjob.sdk.flyte.values import as_declared

        return as_declared(function, value)

    return call


def convert(
    task: Any, *, ref: str | None = None, typed_value: bool = False, overrides: NodeOverrides | None = None
) -> Converted:
    """The torchjob task of flytekit task ``task``; :class:`Unsupported` for what torchjob does not
    run as a task, ValueError for a config torchjob cannot run (naming the task)."""
    kind = kind_of(task)
    name = getattr(task, "name", type(task).__name__)
    if kind is None or kind == "dynamic":
        what = "a @dynamic task" if kind == "dynamic" else f"a flytekit {type(task).__name__}"
        raise Unsupported(
            f"{name!r} is {what}; torchjob runs as a task a flytekit @task without task_config or "
            "with kfpytorch's PyTorch or Elastic (workflows and @dynamic tasks run with `torchjob run`)"
        )
    overrides = overrides or NodeOverrides()
    notes: list[str] = []
    config: PyTorch | Elastic | None = None
    try:
        if kind == "pytorch":
            config = _pytorch(task, task.get_custom(settings()))
        elif kind == "elastic":
            config = _elastic(task, task.get_custom(settings()), notes)
            if config.max_nodes == 1 and task.task_type == "python-task":
                notes.append(
                    "nnodes=1: Flyte runs this task as one plain pod (python-task), not a PyTorchJob; "
                    "--target pods shows that pod"
                )
        requests, limits = task_resources(task)
        requests.update(overrides.requests)
        limits.update(overrides.limits)
        function = task.task_function
        converted = Task(
            typed(function) if typed_value else function,
            task_config=config,
            image=_image(task, overrides),
            requests=_resources(requests),
            limits=_resources(limits),
            env={str(k): str(v) for k, v in (task.environment or {}).items()},
            ref=ref,
        )
    except ValueError as err:
        raise ValueError(f"flytekit task {name}: {err}") from None
    # Importing a flytekit module warns (kfpytorch's increase_shared_mem), which the warm pool's
    # server refuses; the function is pickled by value and needs no import of its module.
    converted.preload_module = False
    converted.import_in_pod = True
    return Converted(converted, kind, notes)
