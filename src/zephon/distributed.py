"""Gather per-rank checkpoints into one that any world size can restore.

Every rank calls :func:`gather_checkpoints` at the same step with its own
``pipeline.checkpoint()``; each gets back the merged checkpoint (all lanes). Two transports:
``torch.distributed`` when a process group is initialised, or a shared folder (any path all
ranks can see: a network file system, or a local folder for ranks on one machine).
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NoReturn

from zephon._atomic import write_atomic
from zephon.checkpoints import merge_checkpoints
from zephon.errors import CheckpointError

__all__ = ["exit_rank"]


def _torch_group_ready() -> bool:
    try:
        import torch.distributed as dist
    except ImportError:
        return False
    return bool(dist.is_available() and dist.is_initialized())


def gather_checkpoints(
    state: Mapping[str, Any],
    *,
    folder: str | os.PathLike[str] | None = None,
    tag: str | int = "latest",
    rank: int | None = None,
    world_size: int | None = None,
    timeout_s: float = 300.0,
) -> dict[str, Any]:
    """All ranks' checkpoints merged (see :func:`zephon.merge_checkpoints`).

    With ``folder`` each rank writes ``<folder>/<tag>/rank-<r>.json`` atomically and waits
    until every rank's file is there (``rank`` and ``world_size`` default to the checkpoint's
    own). Without ``folder`` an initialised ``torch.distributed`` group is used.
    """
    world = state.get("world", {})
    rank = int(world.get("dp_rank", 0)) if rank is None else rank
    world_size = int(world.get("dp_world_size", 1)) if world_size is None else world_size
    if folder is None:
        if not _torch_group_ready():
            raise CheckpointError(
                "gather_checkpoints needs folder=... or an initialised torch.distributed group"
            )
        import torch.distributed as dist

        gathered: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(gathered, dict(state))
        return merge_checkpoints(gathered)
    round_dir = Path(folder) / str(tag)
    round_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(round_dir / f"rank-{rank:05d}.json", json.dumps(state))
    paths = [round_dir / f"rank-{r:05d}.json" for r in range(world_size)]
    deadline = time.monotonic() + timeout_s
    delay = 0.005
    while True:  # a file-system rendezvous has nothing to block on but the files themselves
        missing = [p.name for p in paths if not p.exists()]
        if not missing:
            break
        if time.monotonic() > deadline:
            raise CheckpointError(
                f"gather_checkpoints: after {timeout_s:.0f} s still missing {missing} in "
                f"{round_dir}; did every rank call it with the same tag?"
            )
        time.sleep(delay)
        delay = min(delay * 2, 0.2)
    states = [json.loads(p.read_text(encoding="utf-8")) for p in paths]
    return merge_checkpoints(states)


def exit_rank(code: int = 0) -> NoReturn:
    """End a rank's process once its work is written, without interpreter finalisation.

    PyTorch's gloo threads release each finished collective on their own thread, which takes
    the GIL; if the interpreter is finalising by then, that thread is torn down inside a C++
    destructor and the process aborts with "terminate called without an active exception"
    (SIGABRT), so the launcher reports a failed job that did all its work.
    ``destroy_process_group`` joins those threads, but a ``DistributedDataParallel`` model keeps
    its process group alive, and freeing the model joins them while holding the GIL that one of
    them may be waiting for (a hang). So call this last, while the model is still referenced:
    it runs the exit hooks (zephon's worker pools and shared memory among them) while the
    interpreter is whole, flushes stdout and stderr, and leaves.
    """
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
