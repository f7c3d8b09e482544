"""The ``kubernetes`` engine: the same job on a cluster, through the training stack the cluster runs.

Modules, one job each: ``client`` (kubeconfig and raw JSON requests), ``errors`` (what the API
server said, as one line), ``kinds`` (the targets' top-level kinds and API discovery), ``submit``
(creating the rendered objects), ``phase`` (a target's status and its pods as a JobReport),
``follow`` (one watch per resource type), ``podlogs`` (log streams) and ``engine`` (the Engine).
The official ``kubernetes`` client is imported here only: ``pip install -e '.[kubernetes]'`` in a checkout.
"""
