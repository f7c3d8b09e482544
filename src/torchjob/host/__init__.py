"""What the engines read of the host they run on: Linux's /proc (``procfs``: processes, their
start times, parents, environments and commands) and its TCP tables (``tcp``: who listens on a
port, the kernel's ephemeral range). One reader of each fact, below the engines, so that engines
that may not import each other need no copy of their own. Standard library only; it imports
nothing of torchjob above it."""
