"""A problem of the Volcano Job a kind became, said in the kind's own words.

The Volcano Job's checks and the targets speak of tasks, the pytorch plugin and ``spec.tasks[i]``;
the user wrote a PyTorchJob, a TrainJob or a JobSet. :func:`say` rewords the few messages that can
reach a kind's document (its path may move to the field that holds what the message is about),
and every Volcano path quoted inside a message becomes the path the user wrote.
"""

from __future__ import annotations

import re

from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from torchjob.spec.kinds.translation import Translation

# A path of the Volcano Job's tasks quoted in a message ("duplicate container name 'x' (also ...)").
_TASK_PATH = re.compile(r"\bspec\.tasks\[\d+\](?:\.[A-Za-z_]\w*|\[\d+\])*")
_LONG_POD = re.compile(r"shorten the job or task name$")
_PODS_IN_ALL = re.compile(r"^the tasks have (\d+) replicas in all")
_NO_TASK = re.compile(r"^expected at least one task$")
_NO_MASTER = re.compile(
    r"^a job without the pytorch plugin cannot be expressed by target ('[^']*') "
    r"\(it needs to know which task is the master\)"
)
_DIFFERENT = re.compile(r"^a worker task whose pod template differs from the master's \('[^']*'\)")
_OTHER_TASK = re.compile(r"^task '([^']*)-\d+' \(neither the pytorch master nor worker\)")

# (kind, pattern, the Volcano Job's path to tell it at instead or "", the kind's words)
_RULES: tuple[tuple[str, re.Pattern[str], str, str], ...] = (
    ("PyTorchJob", _LONG_POD, "metadata.name", "shorten the PyTorchJob's name"),
    (
        "TrainJob",
        _LONG_POD,
        "metadata.name",
        "shorten the TrainJob's name (or the runtime's replicated job's)",
    ),
    ("JobSet", _LONG_POD, "", "shorten the JobSet's name or the replicated job's"),
    ("PyTorchJob", _PODS_IN_ALL, "", r"the replica specs make \1 pods in all"),
    ("JobSet", _NO_TASK, "", "expected at least one Job; every replicated job has replicas: 0"),
    (
        "JobSet",
        _NO_MASTER,
        "spec.tasks",
        r"a JobSet without one master pod and one replicated job of workers cannot be expressed by "
        r"target \1 (it needs to know them: MASTER_ADDR in the pods' env naming the first pod of the "
        "only replicated job, or of a replicated job of one pod beside one of workers)",
    ),
    (
        "JobSet",
        _OTHER_TASK,
        "",
        r"replicated job '\1' (neither the master's nor the workers')",
    ),
    ("PyTorchJob", _DIFFERENT, "", "a Worker whose pod template differs from the Master's"),
    ("JobSet", _DIFFERENT, "", "a replicated job whose pod template differs from the master's"),
)


def say(tr: Translation, path: str, message: str) -> tuple[str, str]:
    """``path`` and ``message`` of the Volcano Job as the kind's: (a path of the Job, the words)."""
    for kind, pattern, moved, words in _RULES:
        if kind == tr.kind and pattern.search(message):
            message = pattern.sub(words, message)
            path = moved or path
            break
    if "spec.tasks[" in message:
        message = _TASK_PATH.sub(lambda found: tr.locate(found[0])[1], message)
    return path, message
