"""What every integration needs from the distributed job: this rank's view and one global state."""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

from zephon.errors import ConfigError
from zephon.torch_loader import merge_loader_states

if TYPE_CHECKING:
    from zephon.pipeline import Pipeline
    from zephon.torch_loader import PipelineDataLoader


def rank_view(pipeline: Pipeline, rank: int, world_size: int) -> Pipeline:
    """``pipeline`` as rank ``rank`` of ``world_size`` data-parallel ranks reads it.

    A pipeline built for one rank (the default ``dp_world_size=1``) is narrowed to this rank's
    lanes; one built with ``dp_rank``/``dp_world_size`` must agree with the job.
    """
    opts = pipeline.runtime_options
    if opts.dp_world_size == 1 and world_size > 1:
        if opts.canonical_replicas % world_size:
            raise ConfigError(
                f"canonical_replicas={opts.canonical_replicas} cannot be split over "
                f"{world_size} ranks; use a multiple of the world size"
            )
        return copy.copy(pipeline).options(dp_rank=rank, dp_world_size=world_size)
    if (opts.dp_rank, opts.dp_world_size) != (rank, world_size):
        raise ConfigError(
            f"the pipeline was built for rank {opts.dp_rank} of {opts.dp_world_size} but this "
            f"process is rank {rank} of {world_size}; build it without dp_rank/dp_world_size "
            "(the integration narrows it to this rank) or with this process's rank"
        )
    return pipeline


def _group_size(group: Any = None) -> int:
    try:
        import torch.distributed as dist
    except ImportError:  # pragma: no cover - torch is a dependency of every integration
        return 1
    if dist.is_available() and dist.is_initialized():
        return int(dist.get_world_size(group))
    return 1


def global_state(
    loader: PipelineDataLoader,
    upto: int | None = None,
    *,
    group: Any = None,
    dp_rank: int | None = None,
) -> dict[str, Any]:
    """Every rank's loader state (after item ``upto``, by default the last handed out) merged
    into one pipeline checkpoint (a collective: every rank of ``group``, by default the whole
    job, calls it at the same step). Any world size restores the result.

    With ``dp_rank``, ranks that share a data-parallel rank (tensor, pipeline or context
    parallel peers, which read the same lanes) count once: the state of the first of them."""
    state = loader.state_dict(upto=upto)
    world = _group_size(group)
    if world == 1:
        return merge_loader_states([state])
    import torch.distributed as dist

    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, (dp_rank, state), group=group)
    if dp_rank is None:
        return merge_loader_states([each for _, each in gathered])
    by_rank: dict[int, Any] = {}
    for rank, each in gathered:
        by_rank.setdefault(rank, each)
    return merge_loader_states([by_rank[rank] for rank in sorted(by_rank)])


def max_over_ranks(value: int, *, group: Any = None) -> int:
    """The largest ``value`` of all ranks of ``group`` (by default the whole job; a collective
    when a process group is running)."""
    if _group_size(group) == 1:
        return value
    import torch
    import torch.distributed as dist

    device = "cuda" if dist.get_backend(group) == "nccl" else "cpu"  # nccl: GPU tensors only
    tensor = torch.tensor([value], dtype=torch.int64, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=group)
    return int(tensor.item())


def accumulation_steps(
    *,
    global_batch_size: int,
    micro_batch_size: int,
    data_parallel_size: int,
    option: str = "--global-batch-size",
) -> int:
    """The micro-batches per rank and step: ``global = micro x DP x accumulation``, refused
    unless it divides exactly (the framework would otherwise train another batch than
    configured); ``option`` names the framework's setting in the error."""
    per_step = micro_batch_size * data_parallel_size
    if micro_batch_size < 1 or global_batch_size < per_step or global_batch_size % per_step:
        raise ConfigError(
            f"global_batch_size={global_batch_size} is not micro_batch_size={micro_batch_size} "
            f"x data-parallel size {data_parallel_size} x a whole number of accumulation steps; "
            f"use a multiple of {max(per_step, 1)} (e.g. {option} "
            f"{max(per_step, 1) * max(1, global_batch_size // max(per_step, 1))})"
        )
    return global_batch_size // per_step


def settle_collectives() -> None:
    """Wait until the process group has finished every collective started so far.

    torch's gloo backend destroys a finished all-gather on its own thread and needs the GIL to
    do so; if the job exits while one is pending, the process group's destructor (holding the
    GIL) joins that thread and the process hangs. A barrier after training lets it finish.
    """
    if _group_size() > 1:
        import torch.distributed as dist

        dist.barrier()
