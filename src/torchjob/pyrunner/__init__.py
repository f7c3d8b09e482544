"""torchjob's python runner: what the engines start inside a container's own interpreter.

``pyrun.py`` is how an engine starts it (the boot code, the rank guard's shim); ``warmstart.py``
is the runner itself and ``agentbarrier.py`` the exit barrier it gives a torchrun agent. Those two
are never imported by torchjob: they are loaded by path in a bare ``python -I -S``, so they use
the standard library only. This package imports nothing of torchjob; the engines import it.
"""
