"""Which lanes a data-parallel rank owns. Lanes are the unit of determinism; ranks only run them."""

from __future__ import annotations

from typing import Literal

from zephon.errors import ConfigError

LaneMapping = Literal["contiguous", "interleaved"]


def lanes_for_rank(
    dp_rank: int, dp_world_size: int, canonical_replicas: int, mapping: LaneMapping = "interleaved"
) -> list[int]:
    """The lanes ``dp_rank`` runs. ``canonical_replicas`` must divide evenly across ranks."""
    if dp_world_size < 1:
        raise ConfigError(f"dp_world_size must be >= 1, got {dp_world_size}")
    if not 0 <= dp_rank < dp_world_size:
        raise ConfigError(f"dp_rank must be in [0, {dp_world_size}), got {dp_rank}")
    if canonical_replicas < 1:
        raise ConfigError(f"canonical_replicas must be >= 1, got {canonical_replicas}")
    if canonical_replicas % dp_world_size:
        raise ConfigError(
            f"canonical_replicas={canonical_replicas} is not divisible by "
            f"dp_world_size={dp_world_size}; choose canonical_replicas as a multiple of every "
            "world size you may resume on (for example 8 or 24)"
        )
    per_rank = canonical_replicas // dp_world_size
    if mapping == "contiguous":
        return list(range(dp_rank * per_rank, (dp_rank + 1) * per_rank))
    if mapping == "interleaved":
        return list(range(dp_rank, canonical_replicas, dp_world_size))
    raise ConfigError(f"mapping must be 'contiguous' or 'interleaved', got {mapping!r}")
