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
- the set's failure, success and startup policies become the tasks' Volcano policies
  (``setrules.py``).
"""

from __future__ import annotations

from torchjob.errors import Issue
from torchjob.spec.kinds.common import INT32_MAX, at, copy, integer, items, mapping, start, text
from torchjob.spec.kinds.setrules import add, failure, startup, success, warn
from torchjob.spec.kinds.setsize import pods_per_job, sizes_fit
from torchjob.spec.names import is_dns1123_label, label_problem
from torchjob.spec.parse import type_name
from torchjob.spec.podschema import check_kind, check_template
from torchjob.typecheck import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any

    from torchjob.spec.kinds.setrules import Place
    from torchjob.spec.kinds.translation import Translation

DEFAULT_BACKOFF_LIMIT = 6  # batch/v1
# A Job's fields the API server refuses below 0 (batch/v1 validateJobSpec): JobSet's webhook lets
# them through, and the Job it then creates is refused, so the set never runs.
NONNEGATIVE = (
    "parallelism",
    "completions",
    "activeDeadlineSeconds",
    "backoffLimit",
    "backoffLimitPerIndex",
    "maxFailedIndexes",
    "ttlSecondsAfterFinished",
)


def read(tr: Translation, runtimes: Any = None) -> None:
    tr.schema(check_kind(rules_named(tr.source.data), "JobSet"))
    spec, source = start(tr)
    translate_set(tr, spec, source, lambda path: (tr.source, f"spec.{path}" if path else "spec"))


def rules_named(data: Any) -> Any:
    """``data`` with JobSet's webhook defaults on the failure policy's rules: an unnamed rule is
    ``failurePolicyRule<i>``. The webhook names them before the API server checks the CRD's schema,
    which requires a name, so JobSet's own examples leave it out."""
    rules = items(at(data, "spec", "failurePolicy", "rules"))
    unnamed = [k for k, rule in enumerate(rules) if isinstance(rule, dict) and rule.get("name") in (None, "")]
    if not unnamed:
        return data
    named = [
        {**rule, "name": f"failurePolicyRule{k}"} if k in unnamed else rule for k, rule in enumerate(rules)
    ]
    spec = data["spec"]
    return {**data, "spec": {**spec, "failurePolicy": {**spec["failurePolicy"], "rules": named}}}


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
    failure(tr, spec, source, place, rjobs, tasks_of)
    success(tr, spec, source, place, tasks_of)
    startup(tr, spec, source, place, rjobs, tasks_of)
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
            warn(tr, where, path, words)
    if not hostnames:
        where, path = place("network.enableDNSHostnames")
        warn(tr, where, path, "the pods have no DNS names on a cluster; here their names resolve")
    flags = [f"--subdomain={subdomain}"] if subdomain != name else []
    coordinator = _coordinator(tr, mapping(source.get("coordinator")), place, tasks_of, spec)
    if coordinator:
        flags.append(f"--coordinator={coordinator}")
    spec.setdefault("plugins", {})["jobset"] = flags
    tr.route("spec.plugins", place("")[1], place("")[0], whole=True)
    if not rjobs and not tr.broken("spec.replicatedJobs"):
        where, path = place("replicatedJobs")
        add(tr, where, path, "expected at least one replicated job")
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
        add(tr, where, path, label_problem(rname))  # the name given, not its Jobs' (rname-0, ...)
    job_spec = mapping(at(rjob, "template", "spec"))
    completions = integer(job_spec.get("completions"))
    pods, parallelism = pods_per_job(rjob)
    if parallelism is not None and completions is not None and parallelism < completions:
        where, path = place(f"{base}.template.spec.parallelism")
        warn(
            tr, where, path, f"a Job runs {parallelism} of its {completions} pods at a time; here all at once"
        )
    if job_spec.get("completionMode") == "NonIndexed":
        where, path = place(f"{base}.template.spec.completionMode")
        warn(tr, where, path, "a NonIndexed Job's pods have no completion index; here each has one")
    for key, words in (
        ("activeDeadlineSeconds", "the Job's own deadline is not kept here (give the job a --timeout)"),
        ("podFailurePolicy", "its rules are not applied here: every failure counts towards backoffLimit"),
        ("backoffLimitPerIndex", "here failures count for the whole Job (backoffLimit)"),
        ("successPolicy", "here the Job succeeds once every index succeeded"),
    ):
        if job_spec.get(key) is not None:
            where, path = place(f"{base}.template.spec.{key}")
            warn(tr, where, path, words)
    count = integer(rjob.get("replicas"), 1) or 0  # within bounds (setsize.py)
    for key in NONNEGATIVE if count else ():  # no Job is made of a replicated job of 0 replicas
        value = integer(job_spec.get(key))
        where, path = place(f"{base}.template.spec.{key}")
        if value is not None and value < 0 and not tr.broken(path):
            message = f"expected an integer >= 0, got {value} (the API server refuses such a Job)"
            add(tr, where, path, message)
    limit = integer(job_spec.get("backoffLimit"), DEFAULT_BACKOFF_LIMIT)
    given = job_spec.get("template")
    where, path = place(f"{base}.template.spec.template")
    if given is not None and not isinstance(given, dict) and not tr.broken(path):
        message = f"expected a mapping (a pod template), got {type_name(given)}"
        if where is tr.source:  # as the schema's: nothing under it is told again
            tr.schema([Issue(path, message)])
        else:
            add(tr, where, path, message)
    elif count == 0:  # no Job, no task: the template is checked here, as the API server does
        for issue in check_template(given, path, tr.broken):
            add(tr, where, issue.path, issue.message)
    template = copy(mapping(given))
    pod = template.get("spec")
    if isinstance(pod, dict):
        policy = pod.setdefault("restartPolicy", "OnFailure")  # JobSet's webhook
        where, path = place(f"{base}.template.spec.template.spec.restartPolicy")
        if policy not in ("OnFailure", "Never") and isinstance(policy, str) and not tr.broken(path):
            # the API server refuses a Job whose pods restart Always (batch/v1 validation)
            add(tr, where, path, f"a Job's pods restart OnFailure or Never, got {policy!r}")
        if hostnames:
            pod.setdefault("subdomain", subdomain)
    else:
        policy = "OnFailure"
    if policy == "Never" and limit:
        where, path = place(f"{base}.template.spec.backoffLimit")
        message = (
            f"the Job replaces a failed pod up to {limit} times; here the first failed pod fails the Job"
        )
        warn(tr, where, path, message)
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
        add(tr, where, path, f"no pod {pod_index} of Job {job_index} of replicated job {rname!r}")
        return ""
    return f"{task}-{pod_index}"
