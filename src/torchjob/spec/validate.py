"""Rules Volcano's validating webhook and CRD schema enforce, plus torchjob's stricter ones.

Runs on a defaulted job and returns every problem at once as :class:`~torchjob.errors.Issue` records. A
pod template's names are :mod:`.podrules`', its fields the schema's (:mod:`.podschema`); plugin
flags are checked by the plugins themselves (:func:`torchjob.plugins.check_plugins`).

``broken`` holds the paths parsing already complained about; a rule that would read such a field
is skipped, so one mistake gives one message, not a cascade of follow-on ones.
"""

from __future__ import annotations

from collections.abc import Iterable

from torchjob.errors import Issue
from torchjob.spec import names, podfields
from torchjob.spec.model import Job, Policy, Task, pod_name
from torchjob.spec.podrules import check_metadata, check_template_names
from torchjob.spec.podschema import check_template
from torchjob.spec.source import child, parent
from torchjob.spec.units import parse_duration

Issues = list[Issue]

# Events a policy may name (the webhook rejects the controller's internal events).
POLICY_EVENTS = (
    "*", "PodFailed", "PodEvicted", "PodPending", "Unknown", "TaskCompleted", "TaskFailed", "JobUpdated",
)  # fmt: skip
_VALID_EVENTS = ", ".join(POLICY_EVENTS)
# Events the CRD lists but only the controller raises; users get a message saying so.
INTERNAL_EVENTS = ("PodRunning", "OutOfSync", "CommandIssued")
POLICY_ACTIONS = (
    "AbortJob", "RestartJob", "RestartTask", "RestartPod", "RestartPartition", "TerminateJob",
    "CompleteJob", "ResumeJob",
)  # fmt: skip
# A container's exit status is one byte; a policy for any other code could never fire.
EXIT_CODE_MAX = 255
# Plugins that make a Service named after the job (Service names must start with a letter).
SERVICE_PLUGINS = ("svc",)
# Kubernetes' documented scalability limit for a whole cluster; a job beyond it is a typo.
MAX_PODS = 150_000


class Broken:
    """The field paths parsing found wrong; a path is broken if it or a parent is."""

    def __init__(self, paths: Iterable[str] = ()) -> None:
        self.paths = set(paths)

    def has(self, path: str) -> bool:
        while True:
            if path in self.paths:
                return True
            if not path:
                return False
            path = parent(path)

    def under(self, path: str) -> bool:
        """Whether anything at or below ``path`` is broken."""
        return any(p == path or p.startswith((path + ".", path + "[")) for p in self.paths) or self.has(path)


def validate_policies(policies: list[Policy], path: str, broken: Broken | None = None) -> Issues:
    """A policy list's rules, one function each; ``seen`` gathers events and exit codes across it."""
    broken = broken or Broken()
    issues: Issues = []
    seen: dict[str | int, str] = {}
    star = ""
    for i, policy in enumerate(policies):
        p = child(path, i)
        if broken.under(p):
            continue
        issues += _check_policy_trigger(policy, p)
        issues += _check_policy_events(policy, p, seen)
        issues += _check_policy_exit_code(policy.exit_code, f"{p}.exitCode", p, seen)
        issues += _check_policy_action_and_timeout(policy, p)
        if "*" in policy.events:
            star = star or p
    if star and len(policies) > 1:
        issues.append(Issue(star, "a policy for event '*' must be the only policy in its list"))
    return issues


def _check_policy_trigger(policy: Policy, p: str) -> Issues:
    if policy.events and policy.exit_code is not None:
        return [Issue(p, "give either event(s) or exitCode, not both")]
    if not policy.events and policy.exit_code is None:
        return [Issue(p, "expected an event, events or exitCode")]
    return []


def _event_key(policy: Policy, k: int) -> str:
    """How the user wrote the k-th event: ``event``, ``events[k]``."""
    if k < len(policy.event_keys):
        return policy.event_keys[k]
    return "event" if k == 0 else f"events[{k}]"


def _check_policy_events(policy: Policy, p: str, seen: dict[str | int, str]) -> Issues:
    issues: Issues = []
    for k, event in enumerate(policy.events):
        epath = f"{p}.{_event_key(policy, k)}"
        if event in INTERNAL_EVENTS:
            message = f"{event!r} is an event only the controller raises; valid events are {_VALID_EVENTS}"
            issues.append(Issue(epath, message))
        elif event not in POLICY_EVENTS:
            issues.append(Issue(epath, f"invalid policy event {event!r}; valid events are {_VALID_EVENTS}"))
        elif event in seen:
            issues.append(Issue(epath, f"event {event!r} already has a policy ({seen[event]})"))
        else:
            seen[event] = p
    return issues


def _check_policy_exit_code(code: int | None, cpath: str, p: str, seen: dict[str | int, str]) -> Issues:
    if code is None:
        return []
    if code == 0:
        return [Issue(cpath, "0 is not a failure exit code; expected an exit code from 1 to 255")]
    if not 1 <= code <= EXIT_CODE_MAX:
        return [Issue(cpath, f"expected an exit code from 1 to 255, got {code}")]
    if code in seen:
        return [Issue(cpath, f"exit code {code} already has a policy ({seen[code]})")]
    seen[code] = p
    return []


def _check_policy_action_and_timeout(policy: Policy, p: str) -> Issues:
    issues: Issues = []
    if policy.action not in POLICY_ACTIONS:
        message = f"invalid policy action {policy.action!r}; valid actions are {', '.join(POLICY_ACTIONS)}"
        issues.append(Issue(f"{p}.action", message))
    if policy.timeout is not None and not _is_duration(policy.timeout):
        message = f"expected a duration such as '30s' or '5m' (at most 2562047h), got {policy.timeout!r}"
        issues.append(Issue(f"{p}.timeout", message))
    return issues


def _is_duration(text: str) -> bool:
    try:
        parse_duration(text)
    except ValueError:
        return False
    return True


def validate_job(job: Job, broken: Broken | None = None) -> Issues:
    """Every cross-field problem of a defaulted job, one rule per function, in document order."""
    broken = broken or Broken()
    issues = _check_job_name(job, broken) + _check_namespace(job, broken)
    issues += check_metadata(job.metadata.labels, job.metadata.annotations, "metadata")
    issues += podfields.check_annotations(job.metadata.annotations, "metadata")
    issues += podfields.check_nul(job.metadata.annotations, "metadata.annotations")
    issues += _validate_job_names(job)
    if not job.spec.tasks:
        return issues
    seen: dict[str, str] = {}
    last = _TemplateMemo()
    for i in range(len(job.spec.tasks)):
        issues += _check_task(job, i, broken, seen, last)
    counts_ok = _counts_known(job, broken)
    issues += _check_total(job, counts_ok)
    issues += _check_job_min_available(job, broken, counts_ok, issues)
    issues += _check_min_success(job, counts_ok)
    issues += validate_policies(job.spec.policies, "spec.policies", broken)
    if not any(broken.has(f"spec.tasks[{i}].name") for i in range(len(job.spec.tasks))):
        issues += _validate_dependencies(job, broken)
    return issues


def _name_ok(job: Job, broken: Broken) -> bool:
    """The job's name is known and a DNS-1123 label: pod names can be derived from it."""
    return not broken.has("metadata.name") and names.is_dns1123_label(job.name)


def _check_job_name(job: Job, broken: Broken) -> Issues:
    if broken.has("metadata.name"):
        return []
    if not names.is_dns1123_label(job.name):
        return [Issue("metadata.name", names.label_problem(job.name))]
    if any(p in job.spec.plugins for p in SERVICE_PLUGINS) and not names.is_dns1035_label(job.name):
        return [
            Issue(
                "metadata.name",
                f"{job.name!r} must start with a letter: the svc plugin names a Service after the job",
            )
        ]
    return []


def _check_namespace(job: Job, broken: Broken) -> Issues:
    namespace = job.metadata.namespace
    if broken.has("metadata.namespace") or names.is_dns1123_label(namespace):
        return []
    return [Issue("metadata.namespace", names.label_problem(namespace))]


def _counts_known(job: Job, broken: Broken) -> bool:
    """Every task's replicas is known (parsing found nothing wrong with the task or its count)."""
    return not any(
        broken.has(tpath) or broken.has(f"{tpath}.replicas")
        for tpath in (child("spec.tasks", i) for i in range(len(job.spec.tasks)))
    )


class _TemplateMemo:
    """The last task's pod template and what its checks found: the next task of an equal
    template (a JobSet's Jobs, one task each, share their replicated job's) gets the same
    verdict at its own path, without checking the template again."""

    def __init__(self) -> None:
        self.raw: object = None
        self.path = ""
        self.issues: Issues = []

    def check(self, task: Task, path: str, broken: Broken) -> Issues:
        raw = task.template.raw
        if broken.paths:  # what parsing refused decides what is checked: no reuse
            return _check_template(task, path, broken)
        if self.path and raw == self.raw:  # a message may name a field of the template too
            return [
                Issue(
                    path + issue.path[len(self.path) :],
                    issue.message.replace(self.path, path),
                    issue.severity,
                )
                for issue in self.issues
            ]
        found = _check_template(task, path, broken)
        if all(issue.path == path or issue.path.startswith((path + ".", path + "[")) for issue in found):
            self.raw, self.path, self.issues = raw, path, found
        else:
            self.path = ""
        return found


def _check_template(task: Task, path: str, broken: Broken) -> Issues:
    return check_template_names(task.template.raw, path) + _check_template_fields(task, path, broken)


def _check_task(job: Job, i: int, broken: Broken, seen: dict[str, str], last: _TemplateMemo) -> Issues:
    """One task's own rules; ``seen`` gathers task names for the duplicate check, ``last`` the
    previous task's template verdict."""
    task = job.spec.tasks[i]
    tpath = child("spec.tasks", i)
    if broken.has(tpath):  # not a mapping at all
        return []
    replicas_ok = not broken.has(f"{tpath}.replicas")
    issues: Issues = []
    if not broken.has(f"{tpath}.name"):
        issues += _validate_task_name(job, i, _name_ok(job, broken) and replicas_ok, seen)
    if replicas_ok and not broken.has(f"{tpath}.minAvailable"):
        issues += _check_task_min_available(task, tpath)
    if replicas_ok and not broken.under(f"{tpath}.partitionPolicy"):
        issues += _validate_partitions(task, tpath)
    issues += validate_policies(task.policies, f"{tpath}.policies", broken)
    issues += last.check(task, f"{tpath}.template", broken)
    return issues


def _check_task_min_available(task: Task, tpath: str) -> Issues:
    if task.min_available is None or task.min_available <= task.replicas:
        return []
    return [
        Issue(
            f"{tpath}.minAvailable", f"expected at most replicas ({task.replicas}), got {task.min_available}"
        )
    ]


def _check_template_fields(task: Task, path: str, broken: Broken) -> Issues:
    """The fields the engines read, then the pod schema on what those checks did not refuse."""
    engine_read = podfields.check_template(task.template.raw, path)
    # The schema's verdict on a field the engine-read checks already refused would be a second line.
    refused = {issue.path for issue in engine_read}
    schema = check_template(task.template.raw, path, broken.has if broken.paths else None)
    return engine_read + [issue for issue in schema if issue.path not in refused]


def _check_total(job: Job, counts_ok: bool) -> Issues:
    total = job.total_replicas
    if not counts_ok or total <= MAX_PODS:
        return []
    return [
        Issue(
            "spec.tasks",
            f"the tasks have {total} replicas in all; expected at most {MAX_PODS}, "
            "the most pods one Kubernetes cluster is built for",
        )
    ]


def _check_job_min_available(job: Job, broken: Broken, counts_ok: bool, found: Issues) -> Issues:
    spec = job.spec
    total = job.total_replicas
    # A task minAvailable over its replicas also inflates the job's defaulted sum: report it once.
    derived = spec.min_available == sum(t.min_available or 0 for t in spec.tasks)
    if derived and any(issue.path.endswith(".minAvailable") for issue in found):
        return []
    if not counts_ok or broken.has("spec.minAvailable") or spec.min_available <= total:
        return []
    return [
        Issue(
            "spec.minAvailable",
            f"expected at most the total replicas of all tasks ({total}), got {spec.min_available}",
        )
    ]


def _check_min_success(job: Job, counts_ok: bool) -> Issues:
    total = job.total_replicas
    min_success = job.spec.min_success
    if not counts_ok or min_success is None or min_success <= total:
        return []
    return [
        Issue(
            "spec.minSuccess",
            f"expected at most the total replicas of all tasks ({total}), got {min_success}",
        )
    ]


def _validate_job_names(job: Job) -> Issues:
    """Names the job hands on to its pods: the queue becomes a label, the others pod fields."""
    spec = job.spec
    issues: Issues = []
    if not names.is_dns1123_label(spec.queue):
        issues.append(Issue("spec.queue", names.label_problem(spec.queue)))
    for path, value in (
        ("spec.schedulerName", spec.scheduler_name),
        ("spec.priorityClassName", spec.priority_class_name),
    ):
        if value and not (len(value) <= names.DNS1123_LABEL_MAX and names.is_dns1123_subdomain(value)):
            issues.append(
                Issue(
                    path,
                    f"{value!r} is not a valid name: lower-case letters, digits, '-' and '.', at most 63",
                )
            )
    return issues


def _validate_partitions(task: Task, tpath: str) -> Issues:
    """Volcano's webhook rules for a task split into partitions."""
    policy = task.extra.get("partitionPolicy")
    if not isinstance(policy, dict):
        return []
    numbers = [policy.get("totalPartitions"), policy.get("partitionSize"), policy.get("minPartitions", 0)]
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in numbers):
        return []  # parsing has reported it
    total, size, minimum = (int(v) for v in numbers)
    issues: Issues = []
    ppath = f"{tpath}.partitionPolicy"
    if task.replicas != total * size:
        issues.append(
            Issue(
                f"{tpath}.replicas",
                f"expected totalPartitions x partitionSize = {total * size} replicas, got {task.replicas}",
            )
        )
    if minimum > total:
        issues.append(
            Issue(f"{ppath}.minPartitions", f"expected at most totalPartitions ({total}), got {minimum}")
        )
    elif minimum > 0 and task.min_available is not None and task.min_available != minimum * size:
        issues.append(
            Issue(
                f"{tpath}.minAvailable",
                f"expected minPartitions x partitionSize = {minimum * size}, got {task.min_available}",
            )
        )
    return issues


def _validate_task_name(job: Job, i: int, check_length: bool, seen: dict[str, str]) -> Issues:
    task = job.spec.tasks[i]
    tpath = child("spec.tasks", i)
    if task.name in seen:
        return [Issue(f"{tpath}.name", f"duplicate task name {task.name!r} (also {seen[task.name]})")]
    seen[task.name] = tpath
    if not names.is_dns1123_label(task.name):
        return [Issue(f"{tpath}.name", names.label_problem(task.name))]
    if check_length and task.replicas > 0 and not task.template.hostname:
        longest = pod_name(job.name, task.name, task.replicas - 1)
        if len(longest) > names.DNS1123_LABEL_MAX:
            return [
                Issue(
                    f"{tpath}.name",
                    f"pod name {longest!r} is {len(longest)} characters; a pod's hostname allows at most "
                    f"{names.DNS1123_LABEL_MAX}: shorten the job or task name",
                )
            ]
    return []


def _validate_dependencies(job: Job, broken: Broken) -> Issues:
    issues: Issues = []
    task_names = {t.name for t in job.spec.tasks}
    graph: dict[str, list[str]] = {}
    for i, task in enumerate(job.spec.tasks):
        dpath = f"spec.tasks[{i}].dependsOn"
        if task.depends_on is None or broken.under(dpath):
            continue
        for j, dep in enumerate(task.depends_on.names):
            if dep not in task_names:
                issues.append(Issue(f"{dpath}.name[{j}]", f"no task named {dep!r} in this job"))
        graph[task.name] = [d for d in task.depends_on.names if d in task_names]
    cycle = _find_cycle(graph)
    if cycle:
        index = next(i for i, t in enumerate(job.spec.tasks) if t.name == cycle[0])
        issues.append(
            Issue(
                f"spec.tasks[{index}].dependsOn",
                f"dependsOn forms a cycle ({' -> '.join(cycle)}); expected a directed acyclic graph",
            )
        )
    return issues


def _find_cycle(graph: dict[str, list[str]]) -> list[str]:
    """One cycle of ``graph`` as ``[a, b, ..., a]``, or ``[]``; iterative, so depth is no limit."""
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    for start in graph:
        if state.get(start):
            continue
        path = [start]
        state[start] = 1
        stack = [iter(graph.get(start, []))]
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            elif not state.get(nxt):
                state[nxt] = 1
                path.append(nxt)
                stack.append(iter(graph.get(nxt, [])))
    return []
