"""The Kubernetes engine as the registry lists it: its settings, declared without importing the
engine (nor the kubernetes client)."""

from __future__ import annotations

from torchjob.engine_api.base import EngineInfo, Setting
from torchjob.targets import target_names

_ALL = ("run", "submit", "status", "logs", "wait", "delete", "prune", "queue")

ENGINE = EngineInfo(
    factory="torchjob.engines.kubernetes.engine:KubernetesEngine",
    submits=True,
    settings=(
        Setting(
            "kubeconfig",
            "kubeconfig file (default: $KUBECONFIG, ~/.kube/config)",
            metavar="FILE",
            commands=_ALL,
        ),
        Setting("context", "kubeconfig context (default: the current one)", metavar="NAME", commands=_ALL),
        Setting(
            "namespace",
            "namespace (default: the job's, else the context's, else default)",
            flags=("-n", "--namespace"),
            metavar="NS",
            commands=_ALL,
        ),
        Setting(
            "target",
            "kubernetes: how the cluster runs the job (default: the first of volcano, kubeflow, "
            "jobset, trainjob it has)",
            choices=target_names,  # targets.MODULES, read when the flags are built
            commands=("run", "submit"),
        ),
        Setting(
            "runtime",
            "kubernetes: the Trainer runtime for --target trainjob; a FILE: the TrainingRuntimes "
            "the file's TrainJobs name (any engine)",
            metavar="NAME|FILE",
            commands=("run", "submit"),
        ),
        Setting(
            "replace",
            "kubernetes: delete a job of the same name first",
            type="bool",
            default=False,
            commands=("run", "submit"),
        ),
        Setting(
            "pending_timeout",
            "kubernetes: fail when the job stays unscheduled this long (run, submit --wait/--follow; "
            "default 300)",
            type="float",
            default=300.0,
            metavar="SECONDS",
            minimum=0,
            invalid="expected a non-negative, finite number of seconds, got {value}",
            commands=("run", "submit"),
        ),
    ),
)
