"""Starting worker processes: the multiprocessing context, the environment a worker adopts,
the guards around a start (a script without a main guard, a Ctrl-C mid-start), and what an
exit status says about how a worker ended."""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.util  # registers its exit hook before ours, so ours runs first
import os
import signal
import sys
import threading
from collections.abc import Iterator, Mapping
from multiprocessing import resource_tracker
from multiprocessing.context import ForkServerContext, SpawnContext
from typing import Any

from zephon._engine.plan import cores
from zephon._engine.workers import oom
from zephon.errors import ZephonError

#: Exit status of a worker process that found itself started while its parent's main module
#: was being imported (a script without an ``if __name__ == "__main__":`` guard).
MAIN_GUARD_EXIT = 87
WORKER_NAME_PREFIX = "zephon-worker-"


def check_not_bootstrapping() -> None:
    """Refuse to run a pipeline while a spawned process is importing its parent's main module.

    Spawned workers import the main script of the process that started them. A script that
    starts a pipeline at import time (no main guard) would start one in every worker, which
    would spawn workers of its own. A zephon worker exits at once with ``MAIN_GUARD_EXIT`` (its
    parent reports the fix); any other spawned process gets the same advice as an error.
    """
    process = multiprocessing.current_process()
    if not getattr(process, "_inheriting", False):
        return
    if process.name.startswith(WORKER_NAME_PREFIX):
        os._exit(MAIN_GUARD_EXIT)
    raise ZephonError(
        "a pipeline was started while this spawned process was importing its parent's main "
        'script; put the code that runs the pipeline under `if __name__ == "__main__":`'
    )


def describe_exit(exitcode: int | None) -> str:
    """How a worker process with ``exitcode`` ended, for an error message."""
    if exitcode is None:
        return "stopped responding"
    if exitcode == -signal.SIGKILL:
        return f"was killed by SIGKILL{oom.sigkill_hint()}"
    if exitcode < 0:
        try:
            return f"was killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"was killed by signal {-exitcode}"
    return f"exited with code {exitcode}"


def main_script() -> str:
    main = sys.modules.get("__main__")
    return str(getattr(main, "__file__", None) or "your main script")


def main_guard_message() -> str:
    """Why workers exited with ``MAIN_GUARD_EXIT``, and the fix."""
    return (
        f"runner='process' starts worker processes that import {main_script()}, "
        "and that script starts a pipeline when it is imported; put the code that "
        f"runs the pipeline in {main_script()} under "
        '`if __name__ == "__main__":`'
    )


def retries_spent_message(
    how: str, crashes: int, max_retries: int, *, stalled: bool, starting: bool
) -> str:
    """Why a micro-batch failed after its worker died ``crashes`` times (``how``: the last
    death), and what to do about it."""
    if stalled:
        return (
            f"a worker process {how}, on the same micro-batch {crashes} time(s) "
            f"(max_worker_retries={max_retries}); the operator hangs on it (a "
            "stalled read, a deadlock) or needs longer: fix it, or raise "
            "worker_deadline_s in pipeline.options()"
        )
    if starting:
        return (
            f"a worker process {how} while starting, before its operators were set "
            f"up ({crashes} time(s)); its traceback is on stderr. A script that "
            "starts a pipeline with runner='process' needs an "
            "`if __name__ == '__main__':` guard (worker processes import it)"
        )
    return (
        f"a worker process {how} while running a micro-batch {crashes} "
        f"time(s) (max_worker_retries={max_retries}); the micro-batch "
        "probably crashes the worker (out of memory, a segfault in a native "
        "library, an os._exit). Fix the operator, or raise max_worker_retries in "
        "pipeline.options() if the crashes are transient"
    )


def worker_context() -> ForkServerContext | SpawnContext:
    """The multiprocessing context that starts process workers.

    ``forkserver`` with zephon, numpy and tokenizers preloaded: the server pays the interpreter
    start and the imports once per engine process, and each worker is a fork of it. Platforms
    without a forkserver spawn every worker, and so does a process forked (``os.fork``, a
    DataLoader worker) from one that may have started a forkserver: it inherits the handle of
    a server that is not its child, which multiprocessing cannot use from there.
    """
    global _SERVER_OWNER
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    if _SERVER_OWNER not in (None, os.getpid()):
        return multiprocessing.get_context("spawn")
    _SERVER_OWNER = os.getpid()
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(_PRELOAD)
    return context


#: The process that asked for the forkserver context (so may own the server), if any.
_SERVER_OWNER: int | None = None


#: Imported once by the forkserver, so forked workers start with them (not ``__main__``: a
#: script without a main guard would run its pipeline in the server).
_PRELOAD = ["zephon._engine.workers.process_pool", "tokenizers"]


#: The thread count of the tokenizers' pool (Rayon) in each worker: the cores divided by the
#: workers of the fleet unless set. Without it every worker starts a pool as wide as the
#: machine (on 2 cores with 2 workers a run was 17% slower).
THREADS_VARIABLE = "RAYON_NUM_THREADS"


def native_threads(workers: int) -> dict[str, str]:
    """The tokenizers' pool size for each of ``workers`` processes that share the cores this
    process may use (affinity and cgroup quota), or nothing when the user set one."""
    if THREADS_VARIABLE in os.environ:
        return {}
    return {THREADS_VARIABLE: str(max(1, cores.usable_cores().count // max(1, workers)))}


def adopt_environment(environ: Mapping[str, str]) -> None:
    """Make this worker's environment the engine process's as of the worker's start.

    A forked worker inherits the forkserver's environment from when the server started;
    operators must see what the engine process has now, as a spawned worker would.
    Variables a library read when the forkserver imported it (numpy's BLAS thread counts)
    keep their values from then.
    """
    for key in set(os.environ) - set(environ):
        del os.environ[key]
    for key, value in environ.items():
        if os.environ.get(key) != value:
            os.environ[key] = value


def start_deaf_to_ctrl_c(proc: Any) -> None:
    """Start ``proc`` with SIGINT blocked, a mask it keeps across fork and exec.

    Ctrl-C reaches the whole foreground process group. A forkserver still importing its
    preload modules, or a worker not yet in its loop, would die of it with a traceback on the
    terminal while the engine winds down; the engine decides when its workers stop. The
    resource tracker starts first: starting it unblocks SIGINT in the calling thread.
    """
    resource_tracker.ensure_running()
    with _ctrl_c_held():
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            proc.start()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


@contextlib.contextmanager
def _ctrl_c_held() -> Iterator[None]:
    """Hold a Ctrl-C that arrives in the block until it ends, then deliver it.

    Blocking SIGINT in this thread does not keep it out: another thread of the process (the
    tokenizers' pool) takes it, and Python raises KeyboardInterrupt in the main thread in
    the middle of a worker's start, after the fork and before its set-up was sent; the
    forked worker then dies of ``EOFError`` with a traceback on the terminal. Only the main
    thread runs Python's signal handlers, so only there is anything to hold.
    """
    if threading.current_thread() is not threading.main_thread() or (
        signal.getsignal(signal.SIGINT) is None  # set outside Python: not ours to swap
    ):
        yield
        return
    arrived: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, _frame: arrived.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if arrived:
            signal.raise_signal(signal.SIGINT)  # to the handler the program had set
