"""The other kinds torchjob reads, each turned into the Volcano Job torchjob runs.

- ``kubeflow.org/v1`` ``PyTorchJob`` (``pytorchjob.py``): Kubeflow's training operator v1;
- ``jobset.x-k8s.io/v1alpha2`` ``JobSet`` (``jobset.py``, its set-wide policies ``setrules.py``);
- ``trainer.kubeflow.org/v1alpha1`` ``TrainJob`` (``trainjob.py``) with its ``TrainingRuntime`` or
  ``ClusterTrainingRuntime`` (``runtimes.py``; ``torch-distributed`` is known without one).

A reader checks the document against its CRD's schema (``schemas/kinds.json``) and its
controller's own rules, and writes the Volcano Job that behaves as that controller would: the
pods it makes (their names, labels and env, through the controller's plugin: ``kubeflow``,
``trainer``, ``jobset``), and its restart and success rules as Volcano policies. What the
controller does that a run here does not is a warning (``validate --local``). ``run --set`` speaks
the kind's names (``overrides.py``).
"""

from __future__ import annotations

from torchjob.errors import Issue
from torchjob.spec.model import API_VERSION, KIND
from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any

    from torchjob.spec.kinds.runtimes import Runtimes
    from torchjob.spec.kinds.translation import Translation
    from torchjob.spec.source import Document

# (apiVersion, kind) -> reader module, the target that renders it; the runtimes are read for
# TrainJobs, never run.
JOB_KINDS: dict[tuple[str, str], tuple[str, str]] = {
    ("kubeflow.org/v1", "PyTorchJob"): ("torchjob.spec.kinds.pytorchjob", "kubeflow"),
    ("trainer.kubeflow.org/v1alpha1", "TrainJob"): ("torchjob.spec.kinds.trainjob", "trainjob"),
    ("jobset.x-k8s.io/v1alpha2", "JobSet"): ("torchjob.spec.kinds.jobset", "jobset"),
}
RUNTIME_KINDS = {
    ("trainer.kubeflow.org/v1alpha1", "TrainingRuntime"),
    ("trainer.kubeflow.org/v1alpha1", "ClusterTrainingRuntime"),
}
# The origin annotation (spec.model.ORIGIN) of a job read from each kind.
ORIGINS = {"PyTorchJob": "pytorchjob", "TrainJob": "trainjob", "JobSet": "jobset"}


def kind_of(data: Any) -> tuple[str, str]:
    """A document's (apiVersion, kind), each "" when missing or not text."""
    if not isinstance(data, dict):
        return "", ""
    api, kind = data.get("apiVersion"), data.get("kind")
    return (api if isinstance(api, str) else ""), (kind if isinstance(kind, str) else "")


def is_runtime(data: Any) -> bool:
    return kind_of(data) in RUNTIME_KINDS


def is_job_kind(data: Any) -> bool:
    """A PyTorchJob, TrainJob or JobSet (not Volcano's Job)."""
    return kind_of(data) in JOB_KINDS


def readable() -> str:
    """The kinds torchjob reads, for messages."""
    kinds = [(API_VERSION, KIND), *JOB_KINDS]
    text = ", ".join(f"{api} {kind}" for api, kind in kinds)
    return f"{text} (and the TrainingRuntime or ClusterTrainingRuntime of a TrainJob)"


def unknown_kind(data: Any) -> list[Issue] | None:
    """Problems of a document that is none of the kinds torchjob reads; None for one it reads.

    A Volcano ``apiVersion`` or ``kind`` alone is left to the Volcano Job's own checks (which
    name the field); a kind torchjob knows under another apiVersion names the one it reads."""
    api, kind = kind_of(data)
    if (api, kind) in JOB_KINDS or (api, kind) in RUNTIME_KINDS or not isinstance(data, dict):
        return None
    if not kind and (api or not isinstance(data.get("apiVersion"), str)):
        missing = _missing_kind(data, api)
        if missing is not None:
            return [missing]
    if api == API_VERSION or kind == KIND or not (api or kind):
        return None
    known = {k: a for a, k in [*JOB_KINDS, *RUNTIME_KINDS]}
    if kind in known:
        return [
            Issue(
                "apiVersion",
                f"expected {known[kind]!r} for a {kind} (torchjob reads {readable()}), got {api!r}",
            )
        ]
    import difflib

    close = difflib.get_close_matches(kind, [*known, KIND], n=1, cutoff=0.75)
    hint = f"did you mean {close[0]!r}? " if close else ""
    what = f"kind {kind!r}" if kind else "a document without a kind"
    return [
        Issue(
            "kind",
            f"{what} (apiVersion {api!r}) is not a job torchjob reads; {hint}torchjob reads {readable()}",
        )
    ]


# A field of the spec only one kind has: a document without its kind is told as that kind's.
SPEC_FIELDS = {
    "pytorchReplicaSpecs": ("kubeflow.org/v1", "PyTorchJob"),
    "replicatedJobs": ("jobset.x-k8s.io/v1alpha2", "JobSet"),
    "runtimeRef": ("trainer.kubeflow.org/v1alpha1", "TrainJob"),
    "trainer": ("trainer.kubeflow.org/v1alpha1", "TrainJob"),
    "mlPolicy": ("trainer.kubeflow.org/v1alpha1", "TrainingRuntime' or 'ClusterTrainingRuntime"),
}


def _missing_kind(data: dict[str, Any], api: str) -> Issue | None:
    """A PyTorchJob, TrainJob or JobSet without its ``kind`` (and perhaps its ``apiVersion``),
    known by its spec's fields: told as that kind's, not checked as a Volcano Job of no tasks."""
    spec = data.get("spec")
    fields = [f for f in SPEC_FIELDS if isinstance(spec, dict) and f in spec]
    only = [k for a, k in [*JOB_KINDS, *RUNTIME_KINDS] if a == api]
    if not fields and len(only) == 1:  # the one kind of its apiVersion
        return Issue("kind", f"required field is missing: expected {only[0]!r} for apiVersion {api!r}")
    if not fields or (api and api != SPEC_FIELDS[fields[0]][0]):
        return None
    wanted_api, wanted = SPEC_FIELDS[fields[0]]
    also = "" if api else f" and apiVersion {wanted_api!r}"
    whose = "a runtime" if fields[0] == "mlPolicy" else f"a {wanted}"
    return Issue(
        "kind",
        f"required field is missing: expected '{wanted}'{also} (spec.{fields[0]} is {whose}'s)",
    )


def translate(document: Document, runtimes: Runtimes | None = None) -> Translation:
    """The Volcano Job a PyTorchJob, TrainJob or JobSet document stands for (see the modules)."""
    import importlib

    from torchjob.spec.kinds.translation import Translation

    api, kind = kind_of(document.data)
    module, target = JOB_KINDS[(api, kind)]
    translation = Translation(document, kind, api, target, runtimes=runtimes)
    reader = importlib.import_module(module)
    reader.read(translation, runtimes)
    return translation
