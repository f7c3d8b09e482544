"""The ``@task`` decorator and :class:`Task`: a function plus how to run it distributed.

A Task stays callable: calling it runs the function the way its config says (directly, under
torch's elastic launcher, or as pods of the local engine) and returns rank 0's value.
``with_overrides`` gives a new Task and never changes the one it was called on.
"""

from __future__ import annotations

import copy
import functools
import inspect
import os
from collections.abc import Callable
from typing import Any, Generic, ParamSpec, TypeVar, overload

from torchjob.errors import SpecError
from torchjob.sdk import scope
from torchjob.sdk.config import Elastic, PyTorch, Resources
from torchjob.spec.model import Job

P = ParamSpec("P")
R = TypeVar("R")


class _Unset:
    """Marks an override that was not given (None is a meaningful value)."""

    def __repr__(self) -> str:
        return "<unset>"


UNSET: Any = _Unset()


def _check(task_config: Any, image: Any, requests: Any, limits: Any, env: Any) -> None:
    if task_config is not None and not isinstance(task_config, PyTorch | Elastic):
        raise ValueError(
            "task_config must be torchjob.PyTorch(...) or torchjob.Elastic(...), "
            f"got {type(task_config).__name__}"
        )
    if image is not None and (not isinstance(image, str) or not image):
        raise ValueError(f"image must be a non-empty string, got {image!r}")
    for name, value in (("requests", requests), ("limits", limits)):
        if value is not None and not isinstance(value, Resources):
            raise ValueError(f"{name} must be torchjob.Resources(...), got {type(value).__name__}")
    if env is not None and (
        not isinstance(env, dict)
        or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())
    ):
        raise ValueError(f"env must be a dict of strings to strings, got {env!r}")


class Task(Generic[P, R]):
    """A Python function with a distributed-run configuration."""

    preload_module = True  # the warm pool imports the function's module (not for flytekit's)
    # Each rank imports the function's module itself, with its pod's environment, as Flyte's pods
    # do: module-level code reads WORLD_SIZE or RANK there, not the caller's values (flytekit's).
    import_in_pod = False

    def __init__(
        self,
        function: Callable[P, R],
        *,
        task_config: PyTorch | Elastic | None = None,
        image: str | None = None,
        requests: Resources | None = None,
        limits: Resources | None = None,
        env: dict[str, str] | None = None,
        ref: str | None = None,
        warm: bool = True,
    ) -> None:
        if not callable(function):
            raise ValueError(f"@task must decorate a function, got {type(function).__name__}")
        _check(task_config, image, requests, limits, env)
        self.function = function
        self.task_config = task_config
        self.image = image
        self.requests = requests
        self.limits = limits
        self.env = dict(env or {})
        self._ref = ref
        self.warm = warm  # later local calls fork their ranks from this process's warm pool
        functools.update_wrapper(self, function)
        # Build the job once now so every problem (names, images, env) shows at decoration time.
        try:
            self.to_job()
        except SpecError as err:
            raise ValueError(f"task {self.name}: " + "; ".join(p.format() for p in err.problems)) from None

    @property
    def name(self) -> str:
        return str(getattr(self.function, "__name__", "task"))

    @property
    def ref(self) -> str:
        """How a pod finds this task: ``package.module:name``, or ``file.py:name`` for scripts."""
        if self._ref:
            return self._ref
        module = getattr(self.function, "__module__", None) or "__main__"
        if module == "__main__" or module.startswith("torchjob_sdk_file_"):
            try:
                path = inspect.getsourcefile(self.function) or "main.py"
            except TypeError:
                path = "main.py"
            return f"{os.path.basename(path)}:{self.name}"
        return f"{module}:{self.name}"

    def __repr__(self) -> str:
        return f"Task({self.ref}, task_config={self.task_config!r})"

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        from torchjob.sdk.loader import refuse_call_while_importing

        refuse_call_while_importing(self.name)
        collector = scope.current()
        if collector is not None:  # inside a @workflow: a node that runs when its value is needed
            promise: R = collector.add(self, args, kwargs)
            return promise
        scope.refuse_override_of_value(self.name)
        from torchjob.sdk.launch import run_task  # lazy: launching may import torch

        return run_task(self, args, kwargs)

    def with_overrides(
        self,
        *,
        task_config: PyTorch | Elastic | None = UNSET,
        image: str | None = UNSET,
        requests: Resources | None = UNSET,
        limits: Resources | None = UNSET,
        env: dict[str, str] | None = UNSET,
    ) -> Task[P, R]:
        """A new task with the given settings replaced; this task is left exactly as it was."""

        def pick(new: Any, old: Any) -> Any:
            return copy.deepcopy(old if new is UNSET else new)

        return Task(
            self.function,
            task_config=pick(task_config, self.task_config),
            image=pick(image, self.image),
            requests=pick(requests, self.requests),
            limits=pick(limits, self.limits),
            env=pick(env, self.env),
            ref=self._ref,
        )

    def job_request(self, target: list[str] | None = None, **extra: Any) -> Any:
        from torchjob.sdk.tojob import JobRequest, job_name

        return JobRequest(
            name=extra.pop("name", None) or job_name(self.name),
            config=self.task_config,
            image=self.image,
            requests=self.requests,
            limits=self.limits,
            env=dict(self.env),
            target=target if target is not None else ["--task", self.ref],
            **extra,
        )

    def to_job(self) -> Job:
        """The torchjob Job a cluster would run for this task (validated like a YAML job)."""
        from torchjob.sdk.tojob import build_job

        job, _ = build_job(self.job_request())
        return job


@overload
def task(function: Callable[P, R], /) -> Task[P, R]: ...


@overload
def task(
    *,
    task_config: PyTorch | Elastic | None = None,
    image: str | None = None,
    requests: Resources | None = None,
    limits: Resources | None = None,
    env: dict[str, str] | None = None,
    warm: bool = True,
) -> Callable[[Callable[P, R]], Task[P, R]]: ...


def task(
    function: Callable[P, R] | None = None,
    /,
    *,
    task_config: PyTorch | Elastic | None = None,
    image: str | None = None,
    requests: Resources | None = None,
    limits: Resources | None = None,
    env: dict[str, str] | None = None,
    warm: bool = True,
) -> Task[P, R] | Callable[[Callable[P, R]], Task[P, R]]:
    """Make a function a torchjob task: ``@task`` or ``@task(task_config=Elastic(nproc_per_node=2))``."""
    _check(task_config, image, requests, limits, env)

    def wrap(fn: Callable[P, R]) -> Task[P, R]:
        return Task(
            fn, task_config=task_config, image=image, requests=requests, limits=limits, env=env, warm=warm
        )

    return wrap(function) if function is not None else wrap
