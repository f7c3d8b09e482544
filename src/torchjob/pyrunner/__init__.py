"""torchjob's python runner: what the engines start inside a container's own interpreter.

``pyrun.py`` is how an engine starts it (the boot code, the rank guard's shim), ``pycommand.py``
which containers it starts and how their end is read, one rule for every engine; ``warmstart.py``
is the runner itself, ``agentbarrier.py`` the exit barrier it gives a torchrun agent and
``mainguard.py`` the check it gives every program (a spawn start that would rejoin the process
group, refused). Those three are never imported by torchjob: they are loaded by path in a bare
``python -I -S`` or the program's interpreter, so they use the standard library only. This
package imports nothing of torchjob outside it; the engines import it.
"""
