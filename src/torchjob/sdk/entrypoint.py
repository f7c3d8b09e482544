"""The in-pod runner: ``python -m torchjob.sdk.entrypoint (--task REF | --payload FILE) [...]``.

Every pod of an SDK job runs this. It loads the function (by reference from the image, or from a
cloudpickle payload the local caller wrote), then either calls it once (``PyTorch`` replicas; rank
from ``RANK``) or hands it to torch's elastic launcher (``--elastic``). Rank 0's return value and
any rank's exception go to ``--results`` so the caller can return or re-raise them.

The rendezvous endpoint of a multi-node launch is ``PET_RDZV_ENDPOINT`` when set (as Kubeflow
does; the pod that endpoint names hosts the c10d store, as torch tells by host name), else the
master pod's ``MASTER_ADDR:MASTER_PORT`` from the pytorch plugin, and the master pod hosts it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import traceback
from collections.abc import Callable, Sequence
from typing import NoReturn

from torchjob.errors import Problem, SpecError
from torchjob.logs import configure, get_logger
from torchjob.sdk.quick_exit import exit_now
from torchjob.sdk.results import (
    dump_call,
    read_value,
    run_call,
    shown,
    user_traceback,
    write_error,
    write_value,
)

logger = get_logger()

EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m torchjob.sdk.entrypoint", description=__doc__)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--task", metavar="REF", help="the task: package.module:name or file.py:name")
    source.add_argument("--payload", metavar="FILE", help="a cloudpickle payload written by a local caller")
    parser.add_argument(
        "--task-args",
        metavar="JSON",
        help="the --task's arguments as a JSON list of --NAME VALUE tokens, read from its signature",
    )
    parser.add_argument("--results", metavar="DIR", help="where rank 0's value and rank errors are written")
    parser.add_argument("--elastic", action="store_true", help="run under torch's elastic launcher")
    parser.add_argument("--nnodes", default="1:1", help="MIN:MAX nodes")
    parser.add_argument("--nproc-per-node", type=int, default=1)
    parser.add_argument("--max-restarts", type=int, default=0)
    parser.add_argument("--start-method", default="spawn")
    parser.add_argument(
        "--warm-ranks",
        action="store_true",
        help="fork the default (spawn) workers from a fork server of this agent (a local SDK call)",
    )
    parser.add_argument("--monitor-interval", type=float, default=0.1)
    parser.add_argument("--rdzv-backend", default="c10d", choices=("c10d",))
    parser.add_argument("--rdzv-configs", default="{}", help="JSON object of rendezvous settings")
    parser.add_argument("--run-id", default="torchjob")
    return parser


def _payload(args: argparse.Namespace) -> bytes:
    if args.payload:
        with open(args.payload, "rb") as handle:
            return handle.read()
    from torchjob.sdk.loader import load_task

    task = load_task(args.task)
    if not args.task_args:
        return dump_call(task.function, (), {})
    from torchjob.sdk.workflow_cli import parse_arguments

    tokens = json.loads(args.task_args)
    if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
        raise SpecError([Problem("--task-args", "expected a JSON list of strings", args.task)])
    positional, keywords = parse_arguments(task, tokens, args.task)
    return dump_call(task.function, tuple(positional), keywords)


def _endpoint(multi_node: bool) -> tuple[str, bool | None]:
    """The rendezvous endpoint and whether this pod hosts its store (None: torch tells by host name)."""
    if os.environ.get("PET_RDZV_ENDPOINT"):
        # Kubeflow points every pod at the first worker (<job>-worker-0:29400); torch's c10d
        # backend hosts the store on the pod whose host name or address that is.
        return os.environ["PET_RDZV_ENDPOINT"], None
    if multi_node and os.environ.get("MASTER_ADDR") and os.environ.get("MASTER_PORT"):
        return f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}", os.environ.get("RANK") == "0"
    # One node: port 0 lets the store bind a free port itself, so there is no race for it.
    return "localhost:0", True


def _run_elastic(args: argparse.Namespace, payload: bytes, results: str) -> int:
    from torchjob.sdk.elastic import LaunchFailed, LaunchSettings, launch, node_joins, watch_rendezvous

    low, _, high = args.nnodes.partition(":")
    min_nodes, max_nodes = int(low), int(high or low)
    rdzv_configs = json.loads(args.rdzv_configs)
    if max_nodes == 1 and args.nproc_per_node == 1:
        logger.debug("single node, one process: calling the function without a launcher")
        return _run_once(payload, results, rank=0)
    endpoint, is_host = _endpoint(max_nodes > 1)
    start_method, server_dir = args.start_method, None
    if args.warm_ranks and start_method == "spawn":  # a start method the task chose is kept, cold
        from torchjob.sdk.warm_elastic import serve_from_here

        # Before any thread of ours starts.
        start_method, server_dir = serve_from_here(args.nproc_per_node, results)
    if max_nodes > 1 and is_host is not None:
        rdzv_configs.setdefault("is_host", is_host)
    settings = LaunchSettings(
        min_nodes=min_nodes,
        max_nodes=max_nodes,
        nproc_per_node=args.nproc_per_node,
        run_id=args.run_id,
        rdzv_endpoint=endpoint,
        rdzv_configs=rdzv_configs,
        max_restarts=args.max_restarts,
        monitor_interval=args.monitor_interval,
        start_method=start_method,
    )
    stop = threading.Event()
    if max_nodes > 1 and is_host:  # the caller's progress, read from the results (never the store)
        watcher = threading.Thread(target=watch_rendezvous, args=(results, max_nodes, stop), daemon=True)
        watcher.start()
    if max_nodes > 1:
        node_joins(results)
    try:
        has_rank0, value = launch(payload, results, settings)
    except LaunchFailed as err:
        print(f"torchjob: elastic launch failed: {err}", file=sys.stderr)
        return EXIT_FAILED
    finally:
        stop.set()
        if server_dir is not None:
            shutil.rmtree(server_dir, ignore_errors=True)
    if has_rank0:
        write_value(results, value)
    return 0


def _run_once(payload: bytes, results: str, rank: int) -> int:
    try:  # loading, running and pickling the value: any failure is this rank's error
        value = run_call(payload)
        if rank == 0:
            write_value(results, value)
    except BaseException as err:
        write_error(results, rank, err)
        print(user_traceback(err), end="", file=sys.stderr, flush=True)  # as a local call shows it
        if isinstance(err, SystemExit) and isinstance(err.code, int) and 0 < err.code < 256:
            return err.code  # a failing exit code of the task's own: keep it for the pod
        return EXIT_FAILED
    return 0


def _run(args: argparse.Namespace, payload: bytes, results: str) -> int:
    if args.elastic:
        return _run_elastic(args, payload, results)
    return _run_once(payload, results, rank=int(os.environ.get("RANK", "0")))


def main(argv: Sequence[str] | None = None) -> int:
    configure()
    args = _parser().parse_args(argv)
    try:
        payload = _payload(args)
    except SpecError as err:  # a bad --task reference: one line, like the CLI
        for problem in err.problems:
            print(f"torchjob: {problem.format()}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.results:
        os.makedirs(args.results, exist_ok=True)
        return _run(args, payload, args.results)
    # No caller is waiting for the value (a cluster pod, `torchjob run`): show it in the log instead.
    with tempfile.TemporaryDirectory(prefix="torchjob-results-") as results:
        code = _run(args, payload, results)
        found, value = read_value(results)
        if found:
            print(f"torchjob: rank 0 returned {shown(value)}", flush=True)
        return code


def run_and_exit(run: Callable[[], int]) -> NoReturn:
    """Run ``run`` and end the process with its code, without the interpreter's finalization."""
    code = EXIT_FAILED
    try:
        code = run()
    except SystemExit as err:  # argparse's exits, and any sys.exit outside the task
        if isinstance(err.code, int) or err.code is None:
            code = err.code or 0
        else:
            print(err.code, file=sys.stderr)
    except KeyboardInterrupt:
        code = EXIT_INTERRUPTED
    except BaseException:
        traceback.print_exc()
    finally:
        exit_now(code)  # see torchjob.sdk.quick_exit: torch may abort a finalizing interpreter


if __name__ == "__main__":
    run_and_exit(main)
