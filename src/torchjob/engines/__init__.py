"""Engines run a job somewhere. The interface is :mod:`torchjob.engine_api.base`; find one by name with
:func:`torchjob.engine_api.registry.get_engine`. Nothing here imports an engine."""
