"""A torchrun agent's exit barrier, when torchjob's runner runs the agent: the store's owner leaves last.

This file is not imported by torchjob: ``warmstart.py`` loads it into the process of a container
whose program is torchrun's agent (``python -m torch.distributed.run``), before the agent runs.
Standard library only, besides the torch the agent imports anyway.
"""

from __future__ import annotations

from typing import Any


def store_owner_leaves_last() -> None:
    """In a torchrun agent: its exit barrier never outlives the store it waits on.

    The agents of a static rendezvous (torchrun ``--master-addr``, quick mode's) meet at the end in
    a barrier kept in the store of the node-rank 0 agent. Each adds itself to a count; the last
    one sets a key, and every agent, the last one too, then waits for that key. The owner, woken
    by the key, leaves at once and its store with it: the last agent's wait, sent just after its
    own ``set``, then meets a closed connection (a C++ trace, "Error waiting on exit barrier",
    and seconds more in its teardown) although every agent had arrived. So an agent other than the
    owner does not wait for the key it has just set itself: there is nothing left to wait for. The
    owner still waits (its own ``set`` is answered by its own store), and those that arrived
    earlier are woken before the owner is. Any other rendezvous keeps torch's own barrier.
    """
    try:
        from torch.distributed.elastic.agent.server import api
    except Exception:  # not the torch this was written for: torch's own way
        return
    original: Any = api.SimpleElasticAgent._exit_barrier

    def exit_barrier(agent: Any) -> None:
        store = agent._store
        try:
            group = agent._worker_group
            owner = group.group_rank == 0 or group.spec.rdzv_handler.get_backend() != "static"
        except Exception:
            owner = True
        if owner:
            original(agent)
            return
        agent._store = _SetThenLeave(store)
        try:
            original(agent)
        finally:
            agent._store = store

    setattr(api.SimpleElasticAgent, "_exit_barrier", exit_barrier)  # noqa: B010 - a method


class _SetThenLeave:
    """An agent's store during its exit barrier: a ``wait`` for keys this agent set returns at once."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self._set: set[str] = set()

    def set(self, key: str, value: Any) -> None:
        self._store.set(key, value)
        self._set.add(key)

    def wait(self, keys: list[str], *timeout: Any) -> None:
        if not set(keys) <= self._set:
            self._store.wait(keys, *timeout)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)
