"""A whole simulated cluster per target, and the pods its controllers make of created objects.

``for_target(api, target)`` are the controllers a cluster of that target runs (``pods``: a plain
cluster). ``pods_for(objects, target)`` creates the objects as a client would (every admission
step, ``fieldValidation=Strict``) on a server of its own, runs those controllers until nothing
changes (pods bound and started, never ended) and returns the pods they made, as the kubelet
started them. ``envs_for`` gives each pod's containers' environment, resolved as the kubelet
resolves it (envs.py), and ``processes_for`` what each training process will use.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from controllers import Controller, all_of
from controllers.batchjob import BatchJobs
from controllers.envs import Process, pod_env, processes
from controllers.jobset import JobSets
from controllers.kubeflow import PyTorchJobs
from controllers.kubelet import Kubelet
from controllers.scheduler import Scheduler, VolcanoScheduler
from controllers.storage import ClaimProtection
from controllers.trainjob import TrainJobs
from controllers.volcano import VolcanoJobs
from kubeapi import FakeKubeAPI

FOREVER = 10.0**9


def for_target(api: FakeKubeAPI, target: str, slots: int | None = None) -> list[Controller]:
    """The controllers a cluster of ``target`` runs (``pods``: a plain cluster, no Volcano)."""
    made: dict[str, list[Controller]] = {
        "volcano": [VolcanoJobs(api), VolcanoScheduler(api, slots)],
        "kubeflow": [PyTorchJobs(api), Scheduler(api, slots=slots)],
        "jobset": [JobSets(api), BatchJobs(api), Scheduler(api, slots=slots)],
        "trainjob": [TrainJobs(api), JobSets(api), BatchJobs(api), Scheduler(api, slots=slots)],
        "pods": [Scheduler(api, slots=slots)],
    }
    return [*made[target], ClaimProtection(api)]


def settle(api: FakeKubeAPI, controllers: list[Controller], rounds: int = 100) -> None:
    """Reconcile every controller in turn until a whole round changes nothing."""
    for _ in range(rounds):
        before = len(api.events)
        for controller in controllers:
            controller.reconcile()
        if len(api.events) == before:
            return
    raise AssertionError(f"the controllers did not settle in {rounds} rounds")


@contextlib.contextmanager
def simulated(
    objects: list[dict[str, Any]], target: str, namespace: str = "default"
) -> Iterator[FakeKubeAPI]:
    """A server (not listening) holding ``objects`` (created in order, as a client creates them)
    and all that ``target``'s controllers made of them, settled: pods bound and started."""
    api = FakeKubeAPI()
    try:
        for obj in objects:
            api.create(obj, namespace, "Strict")
        settle(api, [*for_target(api, target), Kubelet(api, seconds=FOREVER)])
        yield api
    finally:
        api.server.server_close()


def _pods(api: FakeKubeAPI) -> list[dict[str, Any]]:
    return sorted(all_of(api, "v1", "Pod"), key=lambda p: str(p["metadata"]["name"]))


def pods_for(objects: list[dict[str, Any]], target: str) -> list[dict[str, Any]]:
    """The pods ``target``'s controllers make of ``objects``, once started."""
    with simulated(objects, target) as api:
        return _pods(api)


def envs_for(objects: list[dict[str, Any]], target: str) -> dict[str, dict[str, dict[str, str]]]:
    """Pod name -> container name (init containers too) -> its environment as the kubelet resolves it."""
    with simulated(objects, target) as api:
        return {
            str(pod["metadata"]["name"]): {
                c["name"]: pod_env(pod, c["name"], api)
                for c in [*pod["spec"]["containers"], *(pod["spec"].get("initContainers") or [])]
            }
            for pod in _pods(api)
        }


def processes_for(objects: list[dict[str, Any]], target: str) -> list[Process]:
    """Every training process the pods start, with the rank, world size and master it uses."""
    with simulated(objects, target) as api:
        return [process for pod in _pods(api) for process in processes(pod, api)]
