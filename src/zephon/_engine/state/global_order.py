"""Whether a restore on another rank layout keeps every later global step's batch set.

The global order numbers every lane's batches: lane ``l``'s ``i``-th batch has position
``i * canonical_replicas + l``. A run *follows* it when each global step takes the next
positions, which every rank layout with ``mapping="interleaved"`` (or a single rank) does: rank
``r`` of ``W`` deals its lanes ``r, r+W, ...`` in turn, so its ``k``-th batch is position
``k * W + r`` and the ranks' ``k``-th batches together are the next ``W`` positions. A
checkpoint taken at the end of a step of such a run is a prefix of that order (the first lanes
one batch ahead of the rest), and a resume that follows the order continues at the next
position, so with the same global batch every later step has the batches it would have had.
A lane ahead of the order stays ahead until the data ends, so a resume either regroups no
global step or every one of them. docs/guarantees.md states the same rule for users.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def follows_global_order(world_size: int, mapping: str, replicas: int) -> bool:
    """Whether every step of a run on this layout is the next stretch of the global order
    (with one lane per rank, or one rank, both mappings give the same lanes)."""
    return mapping == "interleaved" or world_size in (1, replicas)


def ahead_of_global_order(counts: Mapping[int, int]) -> list[int]:
    """The lanes that put ``counts`` (deliveries per lane still running) off the global
    order; empty when they are a prefix of it: the first lanes one batch ahead of the rest."""
    lanes = sorted(counts)
    if not lanes:
        return []
    low = min(counts.values())
    first_low = next(i for i, lane in enumerate(lanes) if counts[lane] == low)
    return [
        lane
        for i, lane in enumerate(lanes)
        if counts[lane] > low + 1 or (counts[lane] > low and i > first_low)
    ]


def _layout(world_size: int, mapping: str, replicas: int) -> tuple[int, str]:
    same = follows_global_order(world_size, mapping, replicas)
    return world_size, "interleaved" if same else mapping


def _contiguous_note(where: str, world_size: int, replicas: int) -> str:
    per_rank = replicas // world_size
    return (
        f"{where} {world_size} ranks with mapping='contiguous': global steps keep their batch "
        f"sets only if every rank takes a multiple of {per_rank} batches (its lane count) per "
        "step; otherwise every later global step is regrouped compared with an uninterrupted "
        "run. mapping='interleaved' (the default) keeps them for any split"
    )


def regrouping(
    saved_world: Mapping[str, Any],
    counts: Mapping[int, int],
    replicas: int,
    world_size: int,
    mapping: str,
) -> str | None:
    """Why a restore from a checkpoint (its ``world`` entry and the deliveries of the lanes
    still running) onto ``world_size`` ranks with ``mapping`` regroups every later global step
    of the same size, or None when it regroups none."""
    size, saved_mapping = saved_world.get("dp_world_size"), saved_world.get("mapping")
    saved = (
        (size, saved_mapping) if isinstance(size, int) and isinstance(saved_mapping, str) else None
    )
    if saved is not None and _layout(*saved, replicas) == _layout(world_size, mapping, replicas):
        return None  # the same layout: every rank continues its own rotation
    if not follows_global_order(world_size, mapping, replicas):
        return _contiguous_note("this restore runs on", world_size, replicas)
    if saved is not None and not follows_global_order(*saved, replicas):
        return _contiguous_note("the checkpoint was taken on", saved[0], replicas)
    ahead = ahead_of_global_order(counts)
    if ahead:
        shown = ", ".join(f"{lane}: {counts[lane]}" for lane in sorted(counts))
        return (
            f"lanes {ahead} are ahead of the global order (batches delivered per lane: "
            f"{shown}): every later global step is regrouped compared with an uninterrupted "
            "run. Checkpoint at the end of a step, on every rank, to keep them identical"
        )
    return None
