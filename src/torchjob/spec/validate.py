"""Rules Volcano's validating webhook and CRD schema enforce, plus torchjob's stricter ones.

Runs on a defaulted job and returns every problem at once as ``(field path, message)``. Plugin
flags are checked by the plugins themselves (:func:`torchjob.plugins.check_plugins`).
"""

from __future__ import annotations

import re

from torchjob.spec import names
from torchjob.spec.model import Job, Policy, pod_name

Issues = list[tuple[str, str]]

# Events a policy may name (the webhook rejects the controller's internal events).
POLICY_EVENTS = (
    "*", "PodFailed", "PodEvicted", "PodPending", "Unknown", "TaskCompleted", "TaskFailed", "JobUpdated",
)  # fmt: skip
POLICY_ACTIONS = (
    "AbortJob", "RestartJob", "RestartTask", "RestartPod", "RestartPartition", "TerminateJob",
    "CompleteJob", "ResumeJob",
)  # fmt: skip
RESTART_POLICIES = ("Always", "OnFailure", "Never")


def validate_policies(policies: list[Policy], path: str) -> Issues:
    issues: Issues = []
    seen_events: set[str] = set()
    seen_codes: set[int] = set()
    has_any = False
    for i, policy in enumerate(policies):
        p = f"{path}[{i}]"
        if policy.events and policy.exit_code is not None:
            issues.append((p, "give either event(s) or exitCode, not both"))
        elif not policy.events and policy.exit_code is None:
            issues.append((p, "expected an event, events or exitCode"))
        for event in policy.events:
            if event not in POLICY_EVENTS:
                issues.append((f"{p}.event", f"invalid policy event {event!r}; valid events are {', '.join(POLICY_EVENTS)}"))
            elif event in seen_events:
                issues.append((f"{p}.event", f"event {event!r} already has a policy in this list"))
            seen_events.add(event)
            has_any = has_any or event == "*"
        if policy.exit_code is not None:
            if policy.exit_code == 0:
                issues.append((f"{p}.exitCode", "0 is not a failure exit code; expected a non-zero exit code"))
            elif policy.exit_code in seen_codes:
                issues.append((f"{p}.exitCode", f"exit code {policy.exit_code} already has a policy in this list"))
            seen_codes.add(policy.exit_code)
        if policy.action not in POLICY_ACTIONS:
            issues.append((f"{p}.action", f"invalid policy action {policy.action!r}; valid actions are {', '.join(POLICY_ACTIONS)}"))
        if policy.timeout is not None and not _is_duration(policy.timeout):
            issues.append((f"{p}.timeout", f"expected a duration such as '30s' or '5m', got {policy.timeout!r}"))
    if has_any and len(policies) > 1:
        issues.append((path, "a policy for event '*' must be the only policy in its list"))
    return issues


def _is_duration(text: str) -> bool:
    return bool(re.fullmatch(r"(\d+(\.\d+)?(ns|us|µs|ms|s|m|h))+", text))


def validate_job(job: Job) -> Issues:
    """Every cross-field problem of a defaulted job."""
    issues: Issues = []
    spec = job.spec
    if not names.is_dns1123_label(job.name):
        issues.append(("metadata.name", names.label_problem(job.name)))
    if not names.is_dns1123_label(job.metadata.namespace):
        issues.append(("metadata.namespace", names.label_problem(job.metadata.namespace)))
    if not spec.tasks:
        return issues
    seen: dict[str, int] = {}
    for i, task in enumerate(spec.tasks):
        tpath = f"spec.tasks[{i}]"
        if task.name in seen:
            issues.append((f"{tpath}.name", f"duplicate task name {task.name!r} (also spec.tasks[{seen[task.name]}])"))
        seen.setdefault(task.name, i)
        if not names.is_dns1123_label(task.name):
            issues.append((f"{tpath}.name", names.label_problem(task.name)))
        elif names.is_dns1123_label(job.name) and task.replicas > 0:
            longest = pod_name(job.name, task.name, task.replicas - 1)
            if len(longest) > names.DNS1123_LABEL_MAX and not task.template.hostname:
                issues.append((
                    f"{tpath}.name",
                    f"pod name {longest!r} is {len(longest)} characters; a pod's hostname allows at most "
                    f"{names.DNS1123_LABEL_MAX}: shorten the job or task name",
                ))
        if task.min_available is not None and task.min_available > task.replicas:
            issues.append((f"{tpath}.minAvailable", f"expected at most replicas ({task.replicas}), got {task.min_available}"))
        issues += validate_policies(task.policies, f"{tpath}.policies")
        issues += _validate_template(task.template.raw, f"{tpath}.template")
    total = job.total_replicas
    if spec.min_available > total:
        issues.append(("spec.minAvailable", f"expected at most the total replicas of all tasks ({total}), got {spec.min_available}"))
    if spec.min_success is not None and spec.min_success > total:
        issues.append(("spec.minSuccess", f"expected at most the total replicas of all tasks ({total}), got {spec.min_success}"))
    issues += validate_policies(spec.policies, "spec.policies")
    issues += _validate_dependencies(job)
    return issues


def _validate_template(template: dict[str, object], path: str) -> Issues:
    issues: Issues = []
    spec = template.get("spec")
    if not isinstance(spec, dict):
        return issues
    restart = spec.get("restartPolicy")
    if isinstance(restart, str) and restart not in RESTART_POLICIES:
        issues.append((f"{path}.spec.restartPolicy", f"expected one of {', '.join(RESTART_POLICIES)}, got {restart!r}"))
    for key in ("hostname", "subdomain"):
        value = spec.get(key)
        if isinstance(value, str) and value and not names.is_dns1123_label(value):
            issues.append((f"{path}.spec.{key}", names.label_problem(value)))
    container_names: dict[str, str] = {}
    for key in ("initContainers", "containers"):
        containers = spec.get(key)
        if not isinstance(containers, list):
            continue
        for i, container in enumerate(containers):
            if not isinstance(container, dict):
                continue
            cpath = f"{path}.spec.{key}[{i}]"
            name = container.get("name")
            if isinstance(name, str):
                if not names.is_dns1123_label(name):
                    issues.append((f"{cpath}.name", names.label_problem(name)))
                elif name in container_names:
                    issues.append((f"{cpath}.name", f"duplicate container name {name!r} (also {container_names[name]})"))
                container_names.setdefault(name, cpath)
            image = container.get("image")
            if isinstance(image, str) and not names.is_image_reference(image):
                issues.append((f"{cpath}.image", f"{image!r} is not a valid image reference such as 'registry/name:tag'"))
            env = container.get("env")
            if isinstance(env, list):
                for j, var in enumerate(env):
                    if isinstance(var, dict) and isinstance(var.get("name"), str) and not names.is_env_name(var["name"]):
                        issues.append((f"{cpath}.env[{j}].name", f"{var['name']!r} is not a valid environment variable name"))
    return issues


def _validate_dependencies(job: Job) -> Issues:
    issues: Issues = []
    task_names = {t.name for t in job.spec.tasks}
    graph: dict[str, list[str]] = {}
    for i, task in enumerate(job.spec.tasks):
        if task.depends_on is None:
            continue
        for j, dep in enumerate(task.depends_on.names):
            if dep not in task_names:
                issues.append((f"spec.tasks[{i}].dependsOn.name[{j}]", f"no task named {dep!r} in this job"))
        graph[task.name] = [d for d in task.depends_on.names if d in task_names]
    # Depth-first search for a cycle.
    state: dict[str, int] = {}

    def visit(node: str) -> bool:
        state[node] = 1
        for nxt in graph.get(node, []):
            if state.get(nxt) == 1 or (state.get(nxt) is None and visit(nxt)):
                return True
        state[node] = 2
        return False

    if any(state.get(n) is None and visit(n) for n in list(graph)):
        issues.append(("spec.tasks", "dependsOn between tasks forms a cycle; expected a directed acyclic graph"))
    return issues
