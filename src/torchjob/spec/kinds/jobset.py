"""``jobset.x-k8s.io/v1alpha2`` ``JobSet``, read as JobSet's controller and the Job controller run it.

What they do (kubernetes-sigs/jobset ``pkg/controllers``, Kubernetes ``pkg/controller/job``) and
what the Volcano Job torchjob runs does for it:

- each replicated job ``R`` of ``replicas`` Jobs ``<set>-R-<j>``, each Job Indexed with one pod
  per completion index, ``<set>-R-<j>-<p>``: one task ``R-<j>`` of ``completions`` pods, in
  order (so the task's order is JobSet's global Job index); the ``jobset`` plugin puts JobSet's and
  the Job's labels, annotations and ``JOB_COMPLETION_INDEX`` on each pod; pod templates without a
  ``restartPolicy`` get ``OnFailure`` and the set's subdomain (its name unless ``network`` says);
- a Job fails when its pods failed more than ``backoffLimit`` times (6 unless given): under
  ``restartPolicy: OnFailure`` its task's ``maxRetry`` (container restarts of its running pods,
  ``TaskFailed``), under ``Never`` the first failed pod here (the Job would replace it);
- a failed Job: without a ``failurePolicy`` the set fails; with one, the first rule that matches
  the Job's replicated job and reason (``BackoffLimitExceeded``) acts: ``FailJobSet`` fails it,
  ``RestartJobSet`` (also when no rule matches) restarts every Job, ``maxRestarts`` times
  (``maxRetry`` = ``maxRestarts + 1`` and ``RestartJob``);
- ``successPolicy``: ``All`` of the set's Jobs (Volcano's own rule: every pod succeeded), ``Any``
  of the targeted ones (``TaskCompleted -> CompleteJob`` on each), or all of the targeted ones;
- ``startupPolicy: InOrder`` and a replicated job's ``dependsOn`` with ``status: Ready``: its
  tasks depend on every task of the replicated jobs before it (``dependsOn``, all).
"""

from __future__ import annotations

import re

from torchjob.errors import Issue
from torchjob.spec.kinds.common import (
    INT32_MAX,
    at,
    copy,
    fail_on,
    integer,
    items,
    mapping,
    restart_job_on,
    start,
    text,
)
from torchjob.spec.kinds.setsize import pods_per_job, sizes_fit
from torchjob.spec.names import is_dns1123_label, label_problem
from torchjob.spec.parse import type_name
from torchjob.spec.podschema import check_kind, check_template
from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from torchjob.spec.kinds.translation import Translation
    from torchjob.spec.source import Document

    # A path inside the JobSet spec -> where it was written (document, path)
    Place = Callable[[str], tuple[Document, str]]

DEFAULT_BACKOFF_LIMIT = 6  # batch/v1
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


def read(tr: Translation, runtimes: Any = None) -> None:
    tr.schema(check_kind(tr.source.data, "JobSet"))
    spec, source = start(tr)
    translate_set(tr, spec, source, lambda path: (tr.source, f"spec.{path}" if path else "spec"))


def translate_set(tr: Translation, spec: dict[str, Any], source: dict[str, Any], place: Place) -> list[str]:
    """Fill the Volcano Job's ``spec`` from a JobSet's spec ``source``; returns the task names.
    ``place`` says where a path of the JobSet spec was written (told for every problem)."""
    name = text(at(tr.data, "metadata", "name"))
    network = mapping(source.get("network"))
    subdomain = text(network.get("subdomain")) or name
    hostnames = network.get("enableDNSHostnames") is not False
    rjobs = _unique([(r, mapping(rjob)) for r, rjob in enumerate(items(source.get("replicatedJobs")))])
    if not sizes_fit(tr, rjobs, place):  # told before a task is made: one per Job of the set
        tr.complete = False
        return []
    tasks_of: dict[str, list[str]] = {}
    for r, rjob in rjobs:
        tasks_of[text(rjob.get("name"), f"job{r}")] = _rjob_tasks(
            tr, spec, r, rjob, place, subdomain, hostnames
        )
    _failure(tr, spec, source, place, rjobs, tasks_of)
    _success(tr, spec, source, place, tasks_of)
    _startup(tr, spec, source, place, rjobs, tasks_of)
    total = sum(t["replicas"] for t in spec.get("tasks", []))
    spec["minAvailable"] = min(total, INT32_MAX)  # past it: a replicated job's count is told
    where, path = place("replicatedJobs")
    if where is tr.source:  # a TrainJob tells its pods in all at its own fields
        tr.route("spec.tasks", path, whole=True)
        tr.route("spec.minAvailable", path, whole=True)
    ttl = integer(source.get("ttlSecondsAfterFinished"))
    if ttl is not None:
        spec["ttlSecondsAfterFinished"] = ttl
    for key, words in (
        ("suspend", "JobSet creates no Job of a suspended set until it is resumed; here it runs"),
        ("managedBy", "another controller than JobSet's runs this set on a cluster; here torchjob does"),
        ("volumeClaimPolicies", "JobSet makes these claims on a cluster; here they are not made"),
    ):
        if source.get(key) not in (None, False, ""):
            where, path = place(key)
            _warn(tr, where, path, words)
    if not hostnames:
        where, path = place("network.enableDNSHostnames")
        _warn(tr, where, path, "the pods have no DNS names on a cluster; here their names resolve")
    flags = [f"--subdomain={subdomain}"] if subdomain != name else []
    coordinator = _coordinator(tr, mapping(source.get("coordinator")), place, tasks_of, spec)
    if coordinator:
        flags.append(f"--coordinator={coordinator}")
    spec.setdefault("plugins", {})["jobset"] = flags
    tr.route("spec.plugins", place("")[1], place("")[0], whole=True)
    if not rjobs and not tr.broken("spec.replicatedJobs"):
        where, path = place("replicatedJobs")
        _add(tr, where, path, "expected at least one replicated job")
    return [t for names in tasks_of.values() for t in names]


def _unique(rjobs: list[tuple[int, dict[str, Any]]]) -> list[tuple[int, dict[str, Any]]]:
    """The replicated jobs, each name once: the list is keyed by name (its schema tells a second
    one), so only the first of a name makes tasks."""
    seen: set[str] = set()
    kept = []
    for r, rjob in rjobs:
        name = text(rjob.get("name"), f"job{r}")
        if name not in seen:
            seen.add(name)
            kept.append((r, rjob))
    return kept


def _add(tr: Translation, document: Document, path: str, message: str) -> None:
    if document is tr.source:
        tr.add(path, message)
    else:
        tr.elsewhere.append(document.problem(path, message))


def _warn(tr: Translation, document: Document, path: str, message: str) -> None:
    if document is tr.source:
        tr.warn(path, message)
    else:  # a runtime's field: told at the TrainJob's runtimeRef
        tr.warn("spec.runtimeRef", f"runtime field {path}: {message}")


def _rjob_tasks(
    tr: Translation,
    spec: dict[str, Any],
    r: int,
    rjob: dict[str, Any],
    place: Place,
    subdomain: str,
    hostnames: bool,
) -> list[str]:
    """One task per Job of replicated job ``r``, its pod policies and its failure threshold."""
    rname = text(rjob.get("name"), f"job{r}")
    base = f"replicatedJobs[{r}]"
    where, path = place(f"{base}.name")
    if isinstance(rjob.get("name"), str) and not is_dns1123_label(rname) and not tr.broken(path):
        _add(tr, where, path, label_problem(rname))  # the name given, not its Jobs' (rname-0, ...)
    job_spec = mapping(at(rjob, "template", "spec"))
    completions = integer(job_spec.get("completions"))
    pods, parallelism = pods_per_job(rjob)
    if parallelism is not None and completions is not None and parallelism < completions:
        where, path = place(f"{base}.template.spec.parallelism")
        _warn(
            tr, where, path, f"a Job runs {parallelism} of its {completions} pods at a time; here all at once"
        )
    if job_spec.get("completionMode") == "NonIndexed":
        where, path = place(f"{base}.template.spec.completionMode")
        _warn(tr, where, path, "a NonIndexed Job's pods have no completion index; here each has one")
    for key, words in (
        ("activeDeadlineSeconds", "the Job's own deadline is not kept here (give the job a --timeout)"),
        ("podFailurePolicy", "its rules are not applied here: every failure counts towards backoffLimit"),
        ("backoffLimitPerIndex", "here failures count for the whole Job (backoffLimit)"),
        ("successPolicy", "here the Job succeeds once every index succeeded"),
    ):
        if job_spec.get(key) is not None:
            where, path = place(f"{base}.template.spec.{key}")
            _warn(tr, where, path, words)
    count = integer(rjob.get("replicas"), 1) or 0  # within bounds (setsize.py)
    limit = integer(job_spec.get("backoffLimit"), DEFAULT_BACKOFF_LIMIT)
    given = job_spec.get("template")
    where, path = place(f"{base}.template.spec.template")
    if given is not None and not isinstance(given, dict) and not tr.broken(path):
        message = f"expected a mapping (a pod template), got {type_name(given)}"
        if where is tr.source:  # as the schema's: nothing under it is told again
            tr.schema([Issue(path, message)])
        else:
            _add(tr, where, path, message)
    elif count == 0:  # no Job, no task: the template is checked here, as the API server does
        for issue in check_template(given, path, tr.broken):
            _add(tr, where, issue.path, issue.message)
    template = copy(mapping(given))
    pod = template.get("spec")
    if isinstance(pod, dict):
        policy = pod.setdefault("restartPolicy", "OnFailure")  # JobSet's webhook
        where, path = place(f"{base}.template.spec.template.spec.restartPolicy")
        if policy not in ("OnFailure", "Never") and isinstance(policy, str) and not tr.broken(path):
            # the API server refuses a Job whose pods restart Always (batch/v1 validation)
            _add(tr, where, path, f"a Job's pods restart OnFailure or Never, got {policy!r}")
        if hostnames:
            pod.setdefault("subdomain", subdomain)
    else:
        policy = "OnFailure"
    if policy == "Never" and limit:
        where, path = place(f"{base}.template.spec.backoffLimit")
        message = (
            f"the Job replaces a failed pod up to {limit} times; here the first failed pod fails the Job"
        )
        _warn(tr, where, path, message)
    spots = {key: place(f"{base}{key}") for key in ("", ".template.spec.template", ".name")}
    spots[".replicas"] = place(f"{base}.template.spec.completions")
    spots[".maxRetry"] = place(f"{base}.template.spec.backoffLimit")
    names = []
    for j in range(count):
        index = len(spec.setdefault("tasks", []))
        task: dict[str, Any] = {"name": f"{rname}-{j}", "replicas": pods, "template": copy(template)}
        spec["tasks"].append(task)
        for key, (document, path) in spots.items():
            job_path = f"spec.tasks[{index}]" + (".template" if key == ".template.spec.template" else key)
            tr.route(job_path, path, document, whole=key in (".name", ".replicas", ".maxRetry"))
        if policy != "Never":
            task["maxRetry"] = max(limit or 0, 1)  # limit 0: the first restart fails the Job
        task["_failure"] = "PodFailed" if policy == "Never" else "TaskFailed"
        names.append(task["name"])
    return names


def _failure(
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
        max_restarts = integer(policy.get("maxRestarts"), 0) or 0
        spec["maxRetry"] = min(max_restarts + 1, INT32_MAX) if restarts else 1
        where, path = place("failurePolicy.maxRestarts")
        tr.route("spec.maxRetry", path, where, whole=True)
        strategy = policy.get("restartStrategy")
        if strategy == "InPlaceRestart":
            where, path = place("failurePolicy.restartStrategy")
            _warn(tr, where, path, "here a restart makes every pod again (Recreate)")
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
                _add(tr, where, path, f"no replicated job named {target!r}")
        for i, reason in enumerate(items(rule.get("onJobFailureReasons"))):
            if isinstance(reason, str) and reason not in FAILURE_REASONS:
                where, path = place(f"{base}.onJobFailureReasons[{i}]")
                _add(tr, where, path, f"expected one of {', '.join(FAILURE_REASONS)}, got {reason!r}")
        name = rule.get("name")
        if not isinstance(name, str) or not name:
            continue
        where, path = place(f"{base}.name")
        if name in named:
            first = place(f"failurePolicy.rules[{named[name]}]")[1]
            _add(tr, where, path, f"rule name {name!r} is given twice (also {first})")
        elif len(name) > RULE_NAME_LIMIT:
            _add(tr, where, path, f"a rule name has at most {RULE_NAME_LIMIT} characters, got {len(name)}")
        elif not RULE_NAME.match(name):
            _add(
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
            _warn(tr, where, path, "here this restart counts towards maxRestarts like any other")
        elif action in ("RestartJob", "RestartJobAndIgnoreMaxRestarts"):
            _warn(tr, where, path, "here the whole set restarts (JobSet's RestartJob is an alpha feature)")
        return ("FailJobSet" if action == "FailJobSet" else "RestartJobSet"), f"failurePolicy.rules[{k}]"
    return "RestartJobSet", ""


def _matches(pattern: str, message: str) -> bool:
    try:
        return re.search(pattern, message) is not None
    except re.error:
        return False


def _success(
    tr: Translation,
    spec: dict[str, Any],
    source: dict[str, Any],
    place: Place,
    tasks_of: dict[str, list[str]],
) -> None:
    policy = mapping(source.get("successPolicy"))
    operator = text(policy.get("operator"), "All")
    targets = [text(t) for t in items(policy.get("targetReplicatedJobs"))] or list(tasks_of)
    where, path = place("successPolicy")
    for t, target in enumerate(targets):
        if target not in tasks_of and "targetReplicatedJobs" in policy:
            _add(tr, where, f"{path}.targetReplicatedJobs[{t}]", f"no replicated job named {target!r}")
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
    _warn(
        tr,
        where,
        path,
        f"here the set completes once {spec['minSuccess']} pods succeeded, which those of "
        f"{', '.join(targets)} are, unless pods of other replicated jobs succeed first",
    )


def _startup(
    tr: Translation,
    spec: dict[str, Any],
    source: dict[str, Any],
    place: Place,
    rjobs: list[tuple[int, dict[str, Any]]],
    tasks_of: dict[str, list[str]],
) -> None:
    """InOrder start and ``dependsOn`` as Volcano's dependsOn (a task waits for tasks that run)."""
    in_order = at(source, "startupPolicy", "startupPolicyOrder") == "InOrder"
    tasks = {t["name"]: t for t in spec.get("tasks", [])}
    names = list(tasks_of)
    depending = [r for r, rjob in rjobs if rjob.get("dependsOn") is not None]
    if in_order and depending:  # the CRD's rule
        where, path = place("startupPolicy.startupPolicyOrder")
        _add(
            tr,
            where,
            path,
            f"InOrder and a replicated job's dependsOn cannot be given together "
            f"({place(f'replicatedJobs[{depending[0]}].dependsOn')[1]})",
        )
    for position, (r, rjob) in enumerate(rjobs):
        rname = text(rjob.get("name"), f"job{r}")
        needs: list[str] = []
        if in_order and position > 0:
            needs += tasks_of.get(names[position - 1], [])
        if position == 0 and rjob.get("dependsOn") is not None:
            where, path = place(f"replicatedJobs[{r}].dependsOn")
            _add(tr, where, path, "the first replicated job cannot depend on another")
        for d, dep in enumerate(items(rjob.get("dependsOn"))):
            dep = mapping(dep)
            other = text(dep.get("name"))
            where, path = place(f"replicatedJobs[{r}].dependsOn[{d}]")
            if other not in tasks_of:
                _add(tr, where, f"{path}.name", f"no replicated job named {other!r}")
                continue
            if other not in names[: position + 1]:  # JobSet's webhook: one listed before it
                message = (
                    f"replicated job {rname!r} can depend only on the replicated jobs before it, "
                    f"not on {other!r}"
                )
                _add(tr, where, f"{path}.name", message)
                continue
            if dep.get("status") == "Complete":
                _here_error(
                    tr,
                    where,
                    f"{path}.status",
                    "torchjob starts a task once the tasks it depends on run (Ready), not once they complete",
                )
            needs += tasks_of[other]
        if needs:
            for name in tasks_of.get(rname, []):
                tasks[name]["dependsOn"] = {"name": list(dict.fromkeys(needs)), "iteration": "all"}


def _here_error(tr: Translation, document: Document, path: str, message: str) -> None:
    from torchjob.errors import Issue

    if document is tr.source:
        tr.here.append(Issue(path, message))
    else:
        tr.here.append(Issue("spec.runtimeRef", f"runtime field {path}: {message}"))


def _coordinator(
    tr: Translation,
    coordinator: dict[str, Any],
    place: Place,
    tasks_of: dict[str, list[str]],
    spec: dict[str, Any],
) -> str:
    if not coordinator:
        return ""
    rname = text(coordinator.get("replicatedJob"))
    job_index, pod_index = (
        integer(coordinator.get("jobIndex"), 0) or 0,
        integer(coordinator.get("podIndex"), 0) or 0,
    )
    where, path = place("coordinator")
    task = f"{rname}-{job_index}"
    found = next((t for t in spec.get("tasks", []) if t["name"] == task), None)
    if found is None or pod_index >= found["replicas"]:
        _add(tr, where, path, f"no pod {pod_index} of Job {job_index} of replicated job {rname!r}")
        return ""
    return f"{task}-{pod_index}"
