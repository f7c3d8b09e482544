"""The Slurm engine's groundwork: a job as one Slurm allocation whose pods run as job steps.

``settings`` holds the engine's settings, ``plan`` turns a job into the allocation and each pod's
step (pure), ``steps`` talks to Slurm (sbatch, srun, squeue, scontrol, scancel). The engine itself,
which drives the steps with the engine-neutral controller, comes with that controller.
Nothing here is imported by the CLI or the SDK, and importing the package loads nothing.
"""
