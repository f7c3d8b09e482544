"""A JobSet's rules for the whole set, as Volcano policies of the tasks ``jobset.py`` made (one per Job).

- a failed Job: without a ``failurePolicy`` the set fails; with one, the first rule that matches
  the Job's replicated job and reason (``BackoffLimitExceeded``) acts: ``FailJobSet`` fails it,
  ``RestartJobSet`` (also when no rule matches) restarts every Job, ``maxRestarts`` times
  (``maxRetry`` = ``maxRestarts + 1`` and ``RestartJob``); the rules JobSet's webhook refuses are told;
- ``successPolicy``: ``All`` of the set's Jobs (Volcano's own rule: every pod succeeded), ``Any``
  of the targeted ones (``TaskCompleted -> CompleteJob`` on each), or all of the targeted ones;
- ``startupPolicy: InOrder`` and a replicated job's ``dependsOn``: its tasks depend on every task
  of the replicated jobs before it (``dependsOn``, all); those named with ``status: Complete``
  must have completed (``Translation.completes``), the others run (``Ready``).

A path of the JobSet's spec is told where it was written (``Place``: the JobSet, or the runtime
of a TrainJob), through ``add`` and ``warn``.
"""

from __future__ import annotations

import re

from torchjob.spec.kinds.common import INT32_MAX, at, fail_on, integer, items, mapping, restart_job_on, text
from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from torchjob.spec.kinds.translation import Translation
    from torchjob.spec.source import Document

    # A path inside the JobSet spec -> where it was written (document, path)
    Place = Callable[[str], tuple[Document, str]]

REASON = "BackoffLimitExceeded"  # why a Job fails here (the only way it does)
REASON_MESSAGE = "Job has reached the specified backoff limit"
# The reasons a failed Job's condition can give, the only ones JobSet's webhook takes in a rule.
FAILURE_REASONS = (
    "BackoffLimitExceeded",
    "DeadlineExceeded",
    "FailedIndexes",
    "MaxFailedIndexesExceeded",
    "PodFailurePolicy",
)
RULE_NAME = re.compile(r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")  # JobSet's webhook
RULE_NAME_LIMIT = 128


def add(tr: Translation, document: Document, path: str, message: str) -> None:
    if document is tr.source:
        tr.add(path, message)
    else:
        tr.elsewhere.append(document.problem(path, message))


def warn(tr: Translation, document: Document, path: str, message: str) -> None:
    if document is tr.source:
        tr.warn(path, message)
    else:  # a runtime's field: told at the TrainJob's runtimeRef
        tr.warn("spec.runtimeRef", f"runtime field {path}: {message}")


def failure(
    tr: Translation,
    spec: dict[str, Any],
    source: dict[str, Any],
    place: Place,
    rjobs: list[tuple[int, dict[str, Any]]],
    tasks_of: dict[str, list[str]],
) -> None:
    """Each task's policy for its Job's failure, as the set's failure policy decides it."""
    policy = source.get("failurePolicy")
    if isinstance(policy, dict):
        _check_rules(tr, items(policy.get("rules")), place, tasks_of)
    positions = {t["name"]: i for i, t in enumerate(spec.get("tasks", []))}
    tasks = {t["name"]: t for t in spec.get("tasks", [])}
    restarts = False
    for rname, names in tasks_of.items():
        action, rule = (
            _action(tr, mapping(policy), place, rname) if isinstance(policy, dict) else ("FailJobSet", "")
        )
        for task_name in names:
            task = tasks[task_name]
            event = task.pop("_failure")
            if isinstance(policy, dict):  # the task's failure rule is the policy's (or that rule)
                where, path = place(rule or "failurePolicy")
                tr.route(f"spec.tasks[{positions[task_name]}].policies", path, where, whole=True)
            if action == "FailJobSet":
                task.setdefault("policies", []).append(fail_on(event))
            else:
                task.setdefault("policies", []).append(restart_job_on(event))
                restarts = True
    if isinstance(policy, dict):
        # JobSet fails the set once its restarts reach maxRestarts: a negative one acts as 0
        max_restarts = max(integer(policy.get("maxRestarts"), 0) or 0, 0)
        spec["maxRetry"] = min(max_restarts + 1, INT32_MAX) if restarts else 1
        where, path = place("failurePolicy.maxRestarts")
        tr.route("spec.maxRetry", path, where, whole=True)
        strategy = policy.get("restartStrategy")
        if strategy == "InPlaceRestart":
            where, path = place("failurePolicy.restartStrategy")
            warn(tr, where, path, "here a restart makes every pod again (Recreate)")
    else:
        spec["maxRetry"] = 1


def _check_rules(tr: Translation, rules: list[Any], place: Place, tasks_of: dict[str, list[str]]) -> None:
    """What JobSet's webhook refuses in the failure policy's rules: a replicated job or a reason
    that does not exist, a rule name given twice or not of its pattern (an unnamed rule gets one)."""
    named: dict[str, int] = {}
    for k, rule in enumerate(rules):
        rule = mapping(rule)
        base = f"failurePolicy.rules[{k}]"
        for t, target in enumerate(items(rule.get("targetReplicatedJobs"))):
            if isinstance(target, str) and target not in tasks_of:
                where, path = place(f"{base}.targetReplicatedJobs[{t}]")
                add(tr, where, path, f"no replicated job named {target!r}")
        for i, reason in enumerate(items(rule.get("onJobFailureReasons"))):
            if isinstance(reason, str) and reason not in FAILURE_REASONS:
                where, path = place(f"{base}.onJobFailureReasons[{i}]")
                add(tr, where, path, f"expected one of {', '.join(FAILURE_REASONS)}, got {reason!r}")
        name = rule.get("name")
        if name in (None, ""):
            name = f"failurePolicyRule{k}"  # as JobSet's webhook names it
        if not isinstance(name, str):
            continue
        where, path = place(f"{base}.name")
        if name in named:
            first = place(f"failurePolicy.rules[{named[name]}]")[1]
            add(tr, where, path, f"rule name {name!r} is given twice (also {first})")
        elif len(name) > RULE_NAME_LIMIT:
            add(tr, where, path, f"a rule name has at most {RULE_NAME_LIMIT} characters, got {len(name)}")
        elif not RULE_NAME.match(name):
            add(
                tr,
                where,
                path,
                f"{name!r} is not a rule name: a letter, then letters, digits or '_,:', "
                "ending with a letter, digit or '_'",
            )
        named.setdefault(name, k)


def _action(tr: Translation, policy: dict[str, Any], place: Place, rname: str) -> tuple[str, str]:
    """The failure policy's action for a Job of ``rname`` failed for its backoff limit, and the
    rule that says it ("" for the policy's default)."""
    for k, rule in enumerate(items(policy.get("rules"))):
        rule = mapping(rule)
        reasons = [text(x) for x in items(rule.get("onJobFailureReasons"))]
        targets = [text(x) for x in items(rule.get("targetReplicatedJobs"))]
        patterns = [text(x) for x in items(rule.get("onJobFailureMessagePatterns"))]
        if (reasons and REASON not in reasons) or (targets and rname not in targets):
            continue
        if patterns and not any(_matches(p, REASON_MESSAGE) for p in patterns):
            continue
        action = text(rule.get("action"))
        where, path = place(f"failurePolicy.rules[{k}].action")
        if action == "RestartJobSetAndIgnoreMaxRestarts":
            warn(tr, where, path, "here this restart counts towards maxRestarts like any other")
        elif action in ("RestartJob", "RestartJobAndIgnoreMaxRestarts"):
            warn(tr, where, path, "here the whole set restarts (JobSet's RestartJob is an alpha feature)")
        return ("FailJobSet" if action == "FailJobSet" else "RestartJobSet"), f"failurePolicy.rules[{k}]"
    return "RestartJobSet", ""


def _matches(pattern: str, message: str) -> bool:
    try:
        return re.search(pattern, message) is not None
    except re.error:
        return False


def success(
    tr: Translation,
    spec: dict[str, Any],
    source: dict[str, Any],
    place: Place,
    tasks_of: dict[str, list[str]],
) -> None:
    policy = mapping(source.get("successPolicy"))
    operator = text(policy.get("operator"), "All")
    given = [text(t) for t in items(policy.get("targetReplicatedJobs"))]
    where, path = place("successPolicy")
    for t, target in enumerate(given):
        if target not in tasks_of:
            add(tr, where, f"{path}.targetReplicatedJobs[{t}]", f"no replicated job named {target!r}")
    # a target named twice is one replicated job still: its Jobs count once
    targets = list(dict.fromkeys(given)) or list(tasks_of)
    chosen = [name for target in targets for name in tasks_of.get(target, [])]
    if operator not in ("All", "Any") or not chosen:
        return  # told already (the schema's enum, the unknown targets)
    tasks = {t["name"]: t for t in spec.get("tasks", [])}
    if operator == "All" and set(targets) >= set(tasks_of):
        return  # every Job: Volcano's own rule, every pod succeeded
    if operator == "Any" or len(chosen) == 1:
        for name in chosen:
            tasks[name].setdefault("policies", []).append({"event": "TaskCompleted", "action": "CompleteJob"})
        return
    spec["minSuccess"] = sum(tasks[n]["replicas"] for n in chosen)
    tr.route("spec.minSuccess", path, where, whole=True)
    warn(
        tr,
        where,
        path,
        f"here the set completes once {spec['minSuccess']} pods succeeded, which those of "
        f"{', '.join(targets)} are, unless pods of other replicated jobs succeed first",
    )


def startup(
    tr: Translation,
    spec: dict[str, Any],
    source: dict[str, Any],
    place: Place,
    rjobs: list[tuple[int, dict[str, Any]]],
    tasks_of: dict[str, list[str]],
) -> None:
    """InOrder start and ``dependsOn`` as Volcano's dependsOn (a task waits for tasks that run, or
    with ``status: Complete`` for tasks whose pods all succeeded)."""
    in_order = at(source, "startupPolicy", "startupPolicyOrder") == "InOrder"
    tasks = {t["name"]: t for t in spec.get("tasks", [])}
    names = list(tasks_of)
    depending = [r for r, rjob in rjobs if rjob.get("dependsOn") is not None]
    if in_order and depending:  # the CRD's rule
        where, path = place("startupPolicy.startupPolicyOrder")
        add(
            tr,
            where,
            path,
            f"InOrder and a replicated job's dependsOn cannot be given together "
            f"({place(f'replicatedJobs[{depending[0]}].dependsOn')[1]})",
        )
    for position, (r, rjob) in enumerate(rjobs):
        rname = text(rjob.get("name"), f"job{r}")
        needs: list[str] = []
        complete: list[str] = []
        if in_order and position > 0:
            needs += tasks_of.get(names[position - 1], [])
        if position == 0 and rjob.get("dependsOn") is not None:
            where, path = place(f"replicatedJobs[{r}].dependsOn")
            add(tr, where, path, "the first replicated job cannot depend on another")
        for d, dep in enumerate(items(rjob.get("dependsOn"))):
            dep = mapping(dep)
            other = text(dep.get("name"))
            where, path = place(f"replicatedJobs[{r}].dependsOn[{d}]")
            if other not in tasks_of:
                add(tr, where, f"{path}.name", f"no replicated job named {other!r}")
                continue
            if other not in names[: position + 1]:  # JobSet's webhook: one listed before it
                message = (
                    f"replicated job {rname!r} can depend only on the replicated jobs before it, "
                    f"not on {other!r}"
                )
                add(tr, where, f"{path}.name", message)
                continue
            if dep.get("status") == "Complete":
                complete += tasks_of[other]
            needs += tasks_of[other]
        if needs:
            for name in tasks_of.get(rname, []):
                tasks[name]["dependsOn"] = {"name": list(dict.fromkeys(needs)), "iteration": "all"}
                if complete:
                    tr.completes[name] = list(dict.fromkeys(complete))
