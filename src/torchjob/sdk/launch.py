"""Calling a task: pick how to run it from its config, run it, return rank 0's value.

- no config, or ``Elastic`` on one node with one process: a direct call, no launcher, no pickling;
- ``Elastic`` on one node with several processes: torch's elastic launcher in this process;
- ``Elastic`` on several nodes, or ``PyTorch``: the task's Job on an engine (the local one), one process
  tree per pod, the same env a cluster gives; rendezvous progress is shown while nodes join.

An exception in any rank becomes a :class:`~torchjob.sdk.results.RemoteError` naming the rank.
"""

from __future__ import annotations

import logging
import os
import secrets
import shlex
import sys
import threading
from typing import TYPE_CHECKING, Any, TypeVar

from torchjob import scratch
from torchjob.engine_api.lastrun import calls_root, remember
from torchjob.logs import configure, get_logger
from torchjob.sdk.config import Elastic, PyTorch
from torchjob.sdk.results import PROGRESS_FILE, Finish, TaskFailed, dump_call, first_error, read_value

logger = get_logger()

if TYPE_CHECKING:
    from torchjob.engine_api.base import EngineInfo
    from torchjob.sdk.task import Task

R = TypeVar("R")
SCRATCH = "torchjob-sdk-"  # a call's directory under the temporary directory (scratch.py)


def run_task(
    task: Task[Any, R], args: tuple[Any, ...], kwargs: dict[str, Any], finish: Finish | None = None
) -> R:
    """Rank 0's value (a rank's error raised); ``finish``, when ranks run apart from this process,
    is what rank 0 does with its value before it comes back (results.run_call)."""
    if os.environ.get("TORCHJOB_LOG") and not logger.handlers:
        configure()
    config = task.task_config
    if config is None or (isinstance(config, Elastic) and config.single_node and config.nproc_per_node == 1):
        logger.debug("task %s: single node, one process: calling the function directly", task.name)
        return task.function(*args, **kwargs)
    if isinstance(config, Elastic) and config.single_node:
        logger.debug(
            "task %s: single node, %d processes: torch elastic launcher in this process",
            task.name, config.nproc_per_node,
        )  # fmt: skip
        value: R = _run_single_node(task, config, args, kwargs, finish)
        return value
    if isinstance(config, Elastic):
        logger.debug(
            "task %s: multi-node elastic (%s nodes, %d per node): one local-engine pod per node",
            task.name, config.nnodes_text, config.nproc_per_node,
        )  # fmt: skip
    elif isinstance(config, PyTorch):
        logger.debug("task %s: PyTorch master + %d worker(s) on the local engine", task.name, config.workers)
    result: R = _run_pods(task, args, kwargs, finish)
    return result


def _run_single_node(
    task: Task[Any, Any],
    config: Elastic,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    finish: Finish | None,
) -> Any:
    from torchjob.sdk.elastic import DeadlinePassed, LaunchFailed, LaunchSettings, launch

    policy = config.run_policy
    deadline = float(policy.active_deadline_seconds) if policy and policy.active_deadline_seconds else None
    results = str(scratch.make(SCRATCH))  # a killed caller's is removed by the next call
    try:
        settings = LaunchSettings(
            min_nodes=1,
            max_nodes=1,
            nproc_per_node=config.nproc_per_node,
            run_id=f"{task.name}-{secrets.token_hex(4)}",
            rdzv_endpoint="localhost:0",  # port 0: the store binds a free port, nothing fixed
            rdzv_configs=dict(config.rdzv_configs),
            max_restarts=config.max_restarts,
            monitor_interval=float(config.monitor_interval),
            start_method=config.start_method,
            deadline=deadline,
            warm=warm_wanted(task),
            caller=True,
        )
        try:
            payload = dump_call(task.function, args, kwargs, task.import_in_pod, finish)
            _, value = launch(payload, results, settings)
        except DeadlinePassed:
            raise TaskFailed(
                f"task {task.name}: active deadline of {deadline:g}s passed; every process was stopped"
            ) from None
        except LaunchFailed as err:
            error = first_error(results)
            if _interrupted(error):  # a Ctrl-C that the ranks saw first, or alone: the caller's too
                raise KeyboardInterrupt from None
            if error is None:
                raise TaskFailed(str(err)) from None
            raise _with_source(error) from error.original
        return value
    finally:
        scratch.remove(results)


def _with_source(error: Exception) -> Exception:
    """Add the source lines a rank could not show: code defined in a notebook cell (or typed at a
    prompt) is pickled by value, and its file exists only in this process's linecache."""
    import linecache
    import re

    text = getattr(error, "remote_traceback", "")
    if not text:
        return error
    lines = text.splitlines()
    out: list[str] = []
    for i, line in enumerate(lines):
        out.append(line)
        found = re.fullmatch(r'  File "(.+)", line (\d+), in .+', line)
        has_source = i + 1 < len(lines) and lines[i + 1].startswith("    ")
        if found and not has_source:
            source = linecache.getline(found[1], int(found[2])).strip()
            if source:
                out.append(f"    {source}")
    error.remote_traceback = "\n".join(out) + ("\n" if text.endswith("\n") else "")  # type: ignore[attr-defined]
    return error


def _interrupted(error: Exception | None) -> bool:
    """The first rank to fail was stopped by a Ctrl-C (SIGINT): as the docs promise, the call
    raises KeyboardInterrupt then, whether or not the signal reached this process too."""
    if error is None:
        return False
    exc_type, message = getattr(error, "exc_type", ""), getattr(error, "message", "")
    return bool(exc_type == "KeyboardInterrupt" or message.endswith("with signal SIGINT"))


CALLED = "a Python call"  # who started a call's job, as `torchjob status` says it


def calls_place(info: EngineInfo) -> tuple[dict[str, Any], list[str]]:
    """The settings that keep a call's jobs apart from those ``torchjob run`` starts, where the
    engine has a state directory (the local one: ``$TORCHJOB_HOME/calls``), so that a notebook's
    hundred calls do not fill ``torchjob status``; and the flags that find them again."""
    state = next((s for s in info.settings if s.name == "state_dir"), None)
    if state is None:
        return {}, []
    folder = calls_root()
    return {"state_dir": folder}, [state.spellings[-1], str(folder)]


WARM_ENV = "TORCHJOB_WARM"  # 0: every call starts its ranks cold
_POOL_TURN = threading.Lock()  # held by the call whose pods fork from the warm pool


def warm_wanted(task: Task[Any, Any]) -> bool:
    """Whether calls may fork their ranks from this process's warm pool (docs/sdk.md)."""
    if os.environ.get(WARM_ENV, "1").strip().lower() in ("0", "false", "no", "off"):
        logger.debug("task %s: warm pool off (%s=%s)", task.name, WARM_ENV, os.environ[WARM_ENV])
        return False
    if not task.warm:
        logger.debug("task %s: warm pool off (@task(warm=False))", task.name)
        return False
    return True


def warm_modules(task: Task[Any, Any]) -> tuple[str, ...]:
    """What the warm pool's server imports for ``task``: torch, the ranks' entry point and the
    task's own module (a function defined in __main__ or a notebook is pickled by value)."""
    if not warm_wanted(task):
        return ()
    # The entry point's imports, not itself: `python -m` warns about a module already imported.
    modules = ["torch", "torchjob.sdk.results", "torchjob.sdk.quick_exit", "torchjob.errors"]
    module = getattr(task.function, "__module__", None)
    if not task.preload_module:  # its import is not silent (a flytekit module's warnings)
        module = None
    if module and module != "__main__" and not module.startswith("torchjob.") and _importable(module):
        modules.append(module)
    return tuple(modules)


def _importable(module: str) -> bool:
    """Whether a rank started cold would find ``module`` where this process did: under the working
    directory (a rank's sys.path[0]) or in site-packages. Another module (found through a path
    this process added) is imported by each rank, when the function is unpickled."""
    import importlib.machinery
    import sysconfig

    found = sys.modules.get(module)
    path = getattr(found, "__file__", None)
    if not path:
        return False
    top = module.split(".")[0]
    places = [os.getcwd(), sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]
    spec = importlib.machinery.PathFinder.find_spec(top, places)
    origin = spec.origin if spec is not None else None
    if origin is None or spec is None:
        return False
    root = os.path.dirname(origin) if spec.submodule_search_locations else origin
    return bool(os.path.realpath(path).startswith(os.path.realpath(root)))


def _run_pods(
    task: Task[Any, Any], args: tuple[Any, ...], kwargs: dict[str, Any], finish: Finish | None
) -> Any:
    from torchjob.engine_api.base import EngineError, StartOptions, ThisProcess
    from torchjob.engine_api.registry import DEFAULT_ENGINE, engine_info, get_engine
    from torchjob.sdk.tojob import build_job, job_name
    from torchjob.sdk.watch import JobWatcher

    config = task.task_config
    # The value may name a file in a rank's temporary directory (a path the function returned):
    # the engine keeps those directories until this process exits. (A flytekit task's files are
    # written out of it by rank 0: sdk/flyte/values.stored.)
    ThisProcess.reads_pod_files = True
    work = scratch.make(SCRATCH)  # the pickled arguments: a killed caller's are removed by the next call
    holds_pool = False
    try:
        payload = work / "payload.pkl"
        payload.write_bytes(dump_call(task.function, args, kwargs, task.import_in_pod, finish))
        results = work / "results"
        results.mkdir()
        # A random part makes the job's name unique, so the watcher can follow it by name.
        name = f"{job_name(task.name)[:33].rstrip('-')}-{secrets.token_hex(3)}"
        # TORCHJOB_ENGINE=slurm runs a task called from Python on that engine (with its settings).
        engine_name = os.environ.get("TORCHJOB_ENGINE") or DEFAULT_ENGINE
        try:
            info = engine_info(engine_name)
        except EngineError as err:  # say where the name came from
            raise EngineError(f"TORCHJOB_ENGINE={engine_name}: {err}") from None
        # The warm pool (engines/local/pool.py) where the engine keeps one ("warm" among its
        # settings); () when it cannot serve this task.
        warm = any(s.name == "warm" for s in info.settings)
        preload = warm_modules(task) if warm else ()
        # One call at a time forks from the pool: its server has one /etc/hosts view and one
        # request pipe. A call made meanwhile from another thread starts its ranks cold.
        holds_pool = bool(preload) and _POOL_TURN.acquire(blocking=False)
        if preload and not holds_pool:
            logger.debug("task %s: the warm pool serves another thread's call: ranks start cold", task.name)
            preload = ()
        target = ["--payload", str(payload), "--results", str(results)]
        if preload and isinstance(config, Elastic):
            target.append("--warm-ranks")  # each node's agent forks its ranks (warm_elastic.py)
        request = task.job_request(
            target=target,
            python=sys.executable,
            name=name,
            complete_with_master=False,  # return only once every rank has ended
        )
        job, _ = build_job(request)
        # Pods share this machine's cores: one OpenMP thread each unless the caller or task says
        # otherwise (extra_env comes last in a container's env, so only set what the task does not).
        env: dict[str, str] = {}
        if "OMP_NUM_THREADS" not in task.env:
            env["OMP_NUM_THREADS"] = os.environ.get("OMP_NUM_THREADS", "1")
        if os.environ.get("TORCHJOB_LOG"):
            env["TORCHJOB_LOG"] = os.environ["TORCHJOB_LOG"]
        timeout = None
        if config is not None and config.run_policy is not None and config.run_policy.active_deadline_seconds:
            timeout = float(config.run_policy.active_deadline_seconds)
        logger.debug(
            "task %s: job %s: %s",
            task.name,
            name,
            ", ".join(f"{t.name} x{t.replicas}" for t in job.spec.tasks),
        )
        # The engine's own output (pod logs, notes, status table) only when debugging; otherwise
        # the watcher is its sink and prints the pods' lines. The job stays for `torchjob logs <job>`.
        debugging = logger.isEnabledFor(logging.DEBUG)
        settings, flags = calls_place(info)
        engine = get_engine(engine_name, **settings)
        with JobWatcher(results / PROGRESS_FILE, name) as watcher:
            sink = None if debugging else watcher  # None: the engine's output as the CLI shows it
            options = StartOptions(
                timeout=timeout, extra_env=env, sink=sink, preload=preload, warm=bool(preload)
            )
            try:
                report = engine.start(engine.plan(job, options))
            except KeyboardInterrupt:
                remember([name], engine_name, flags, CALLED)
                raise
        remember([name, report.id], engine_name, flags, CALLED)
        on = ["--engine", engine_name] if engine_name != DEFAULT_ENGINE else []
        logs = shlex.join(["torchjob", "logs", report.id, *on, *flags])
        logger.debug("task %s: job %s %s; logs: %s", task.name, name, report.phase, logs)
        error = first_error(results)
        if error is not None:
            raise _with_source(error) from error.original
        if not report.ok:
            pods = "; ".join(f"{p.name}: {p.phase} (exit code {p.exit_code})" for p in report.pods)
            raise TaskFailed(f"job {report.id} {report.phase}: {report.reason}; pods: {pods}; logs: {logs}")
        found, value = read_value(results)
        if not found:
            raise TaskFailed(f"job {report.id} completed but rank 0 reported no value (logs: {logs})")
        return value
    finally:
        if holds_pool:
            _POOL_TURN.release()
        scratch.remove(work)
