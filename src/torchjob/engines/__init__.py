"""Engines run a job somewhere. The interface is :mod:`torchjob.engines.base`; find one by name with
:func:`torchjob.engines.registry.get_engine`. Nothing here imports an engine."""
