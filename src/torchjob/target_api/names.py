"""Names each target's controller makes from the job's name, and the 63-character limit they share.

Spec validation already checks Volcano's own names (``<job>-<task>-<i>``). The other controllers
make longer ones, and a name the API server refuses means a job that never starts (a Service that
is never created leaves ``MASTER_ADDR`` unresolvable), so ``render`` refuses such a job up front,
naming the longest job name that would fit. Each target declares the names its controller makes
(``Target.generated``) and whether the job's name must be a DNS-1035 label (``Target.dns1035``).
"""

from __future__ import annotations

from torchjob.errors import Problem, SpecError
from torchjob.spec.model import Job
from torchjob.spec.names import DNS1123_LABEL_MAX, is_dns1035_label

# JobSet's webhook checks a pod name with a 5-character random suffix (jobset PR #409).
POD_SUFFIX = "-abcde"


def check(job: Job, target: str) -> None:
    """Refuse a job whose generated names ``target``'s controller could not create."""
    from torchjob.targets import get_target

    declared = get_target(target)
    problems: list[Problem] = []
    if declared.dns1035 and not is_dns1035_label(job.name):
        problems.append(
            Problem(
                "metadata.name",
                f"--target {target} needs a job name that starts with a letter (it names a "
                f"Service), got {job.name!r}",
            )
        )
    made = declared.generated(job) if declared.generated is not None else []
    longest = max(made, key=lambda item: len(item[2]), default=None)
    if longest is not None and len(longest[2]) > DNS1123_LABEL_MAX:
        path, what, name = longest
        fits = DNS1123_LABEL_MAX - (len(name) - len(job.name))
        hint = f"the longest job name that fits is {fits} characters" if fits > 0 else "shorten the task name"
        problems.append(
            Problem(
                "metadata.name" if fits > 0 else path,
                f"--target {target}: the controller would name a {what} {name!r} ({len(name)} "
                f"characters, more than {DNS1123_LABEL_MAX}); {hint}",
            )
        )
    if problems:
        raise SpecError(problems)
