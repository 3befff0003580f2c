"""Checkpoints of several ranks: merged into one, and what each lane has delivered.

Every data-parallel rank's checkpoint describes only its own lanes. :func:`merge_checkpoints`
puts them together into one that any world size dividing ``canonical_replicas`` restores;
:func:`delivered_counts` and :func:`refetch_counts` read one checkpoint per lane (where a rank's
round-robin continues, what a restore reads again).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from zephon.checkpoints.format import (
    FORMAT,
    LANE_EPOCHS_VERSION,
    PLAIN_VERSION,
    ParsedCheckpoint,
    fingerprint,
    first_difference,
    parse,
    seal,
)
from zephon.checkpoints.passes import any_pass
from zephon.errors import CheckpointError

__all__: list[str] = []  # its public names are exported by zephon.checkpoints


def merge_checkpoints(
    states: Sequence[Mapping[str, Any]], *, partial: bool = False
) -> dict[str, Any]:
    """Merge per-rank checkpoints into one that any world size can restore from.

    Every rank's checkpoint describes its own lanes; the merged one holds them all. The
    configurations must agree but for the pass (ranks of uneven lengths are in different
    passes at the same step): the merged checkpoint is in the earliest one, and each lane of a
    later pass carries its own (format version 6). Every lane must be described exactly once;
    ``partial=True`` merges views that hold only some of them (one rank's DataLoader
    workers), which only a view over those lanes restores.
    """
    if not states:
        raise CheckpointError("merge_checkpoints needs at least one checkpoint")
    parsed = [parse(s) for s in states]
    first = min(parsed, key=lambda p: p.epoch)
    lanes: dict[str, Any] = {}
    for index, (raw, p) in enumerate(zip(states, parsed, strict=True)):
        if p.epoch == first.epoch:
            diff = first_difference(first.config, p.config)
        else:
            diff = first_difference(any_pass(first.config), any_pass(p.config))
        if diff:
            raise CheckpointError(f"checkpoint #{index} has another configuration: {diff}")
        for key, value in raw["lanes"].items():
            value = _tagged(value, p, int(key), first.epoch)
            if key in lanes and lanes[key] != value:
                raise CheckpointError(
                    f"lane {key} appears in several checkpoints with different states; did "
                    "every rank take its checkpoint at the same step?"
                )
            lanes[key] = value
    missing = sorted(set(range(first.canonical_replicas)) - {int(k) for k in lanes})
    if missing and not partial:
        raise CheckpointError(f"merged checkpoints do not cover lanes {missing}")
    world: dict[str, Any] = {
        "canonical_replicas": first.canonical_replicas,
        "merged_from": len(states),
    }
    for key in ("dp_world_size", "mapping"):  # the layout that took them, when they agree
        values = {repr(p.world.get(key)) for p in parsed}
        if len(values) == 1 and first.world.get(key) is not None:
            world[key] = first.world[key]
    versions = [p.version for p in parsed]
    if any("epoch" in value for value in lanes.values()):
        versions.append(LANE_EPOCHS_VERSION)
    out = {
        "format": FORMAT,
        "version": max(PLAIN_VERSION, *versions),
        "fingerprint": fingerprint(first.config),
        "config": first.config,
        "world": world,
        "lanes": {k: lanes[k] for k in sorted(lanes, key=int)},
        "tail": {"lanes": [], "order": [], "turn": 0},
    }
    return seal({**out, **_mixture_target(states)})


def _mixture_target(states: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """``{"mixture": target}`` the lanes' mixture counts are shares of, or ``{}``."""
    for state in states:
        if state.get("mixture") is not None:
            return {"mixture": state["mixture"]}
    return {}


def _tagged(value: Mapping[str, Any], part: ParsedCheckpoint, lane: int, base: int) -> Any:
    """A lane's entry of ``part`` as the merged checkpoint (in pass ``base``) writes it: a lane
    of a later pass names that pass and the fingerprint of its configuration."""
    epoch = part.lane_epoch(lane)
    if epoch == base or "epoch" in value:
        return value  # unchanged, byte for byte
    return {**value, "epoch": epoch, "fingerprint": part.fingerprint}


def _parsed(state: Mapping[str, Any] | ParsedCheckpoint) -> ParsedCheckpoint:
    return state if isinstance(state, ParsedCheckpoint) else parse(state)


def delivered_counts(state: Mapping[str, Any] | ParsedCheckpoint) -> dict[int, int]:
    """Per lane still running in ``state``: how many items it has delivered (lanes whose data
    ended are left out). The counts say where each rank's round-robin continues."""
    parsed = _parsed(state)
    return {lane: lc.delivered for lane, lc in sorted(parsed.lanes.items()) if not lc.done}


def refetch_counts(state: Mapping[str, Any] | ParsedCheckpoint) -> dict[int, int]:
    """Per lane: how many source records a restore from ``state`` reads again to rebuild the
    open state its snapshot names (open pack bins, shuffle and mixture buffers).

    Records from the restart point to the last delivered one are replayed besides; both are
    bounded by the buffers and the snapshot interval, never by how far training has gone.
    """
    from zephon._snapshot_codec import named_sources  # numpy: only when asked, not for --help

    parsed = _parsed(state)
    return {
        lane: len(named_sources(lc.operator_state or {})) if not lc.done else 0
        for lane, lc in sorted(parsed.lanes.items())
    }
