"""Checkpoints whose lanes are in different passes over the data.

Data-parallel ranks hold lanes of different lengths, so their passes end at different steps: a
checkpoint taken at one step can find rank 1 in its second pass while rank 0 is still in its
first. The merged checkpoint then keeps the earliest pass as its epoch and tags each lane of a
later pass with its own (format version 6). A pipeline view restores it at that epoch: its lanes
of a later pass count as finished there (:func:`split_later`), are written back unchanged into
every checkpoint it takes meanwhile (:func:`with_lanes`), and continue from their saved state
when the view reaches their pass (:func:`start_of_pass`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from zephon.checkpoints.format import (
    LANE_EPOCHS_VERSION,
    LaneCheckpoint,
    ParsedCheckpoint,
    seal,
)
from zephon.errors import CheckpointError

__all__ = ["any_pass", "split_later", "start_of_pass", "with_lanes"]


def any_pass(config: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` without what changes from pass to pass: the epoch and the source's
    fingerprint (which covers it). A lane of a later pass keeps its pass's whole fingerprint."""
    out = {k: v for k, v in config.items() if k != "epoch"}
    source = out.get("source")
    if isinstance(source, Mapping):
        out["source"] = {k: v for k, v in source.items() if k != "fingerprint"}
    return out


def split_later(
    parsed: ParsedCheckpoint, lanes: Sequence[int]
) -> tuple[ParsedCheckpoint, dict[int, LaneCheckpoint]]:
    """``parsed`` as the view over ``lanes`` restores it at its epoch, and the view's lanes of
    a later pass (tagged with it), kept aside until that pass.

    Those lanes are finished for the checkpoint's epoch; their state in their own pass is not
    a state of this one, so the restored checkpoint holds them as done. A checkpoint without
    tagged lanes is returned as it is.
    """
    later = {
        lane: parsed.lanes[lane]
        for lane in lanes
        if lane in parsed.lanes and parsed.lanes[lane].epoch is not None
    }
    if not any(lc.epoch is not None for lc in parsed.lanes.values()):
        return parsed, later
    restored = {
        lane: (
            replace(
                lc,
                done=True,
                operator_state=None,
                held_payloads=False,
                epoch=None,
                fingerprint=None,
            )
            if lc.epoch is not None
            else lc
        )
        for lane, lc in parsed.lanes.items()
    }
    return replace(parsed, lanes=restored), later


def with_lanes(state: Mapping[str, Any], lanes: Mapping[int, LaneCheckpoint]) -> dict[str, Any]:
    """``state`` (a sealed checkpoint) with ``lanes`` in place of its own entries, resealed."""
    if not lanes:
        return dict(state)
    out = dict(state)
    out["lanes"] = {**state["lanes"], **{str(lane): lc.to_json() for lane, lc in lanes.items()}}
    out["lanes"] = {k: out["lanes"][k] for k in sorted(out["lanes"], key=int)}
    if any(lc.epoch is not None for lc in lanes.values()):
        out["version"] = max(int(state["version"]), LANE_EPOCHS_VERSION)
    return seal(out)


def start_of_pass(
    fresh: Mapping[str, Any], epoch: int, later: Mapping[int, LaneCheckpoint]
) -> dict[str, Any] | None:
    """Where a view starts pass ``epoch`` when some of its lanes were saved in later passes.

    ``fresh`` is the view's checkpoint at the start of that pass. Lanes saved in ``epoch``
    continue from their state; lanes saved in a pass after it stay tagged with theirs (finished
    for this one). Returns the checkpoint to restore (None when ``later`` is empty). A lane
    saved in a pass before ``epoch`` would lose the rest of that pass: refused.
    """
    if not later:
        return None
    behind = sorted(lane for lane, lc in later.items() if (lc.epoch or 0) < epoch)
    if behind:
        raise CheckpointError(
            f"set_epoch({epoch}): lanes {behind} are in the middle of epoch "
            f"{min(later[lane].epoch or 0 for lane in behind)}; set that epoch first so that "
            "they finish it"
        )
    for lane, lc in later.items():
        if lc.epoch == epoch and lc.fingerprint != fresh["fingerprint"]:
            raise CheckpointError(
                f"lane {lane} was saved in epoch {epoch} with another configuration than this "
                "pipeline's in that epoch; restore with the pipeline that took the checkpoint"
            )
    missing = sorted(set(later) - {int(key) for key in fresh["lanes"]})
    if missing:
        raise CheckpointError(f"lanes {missing} are not lanes of this pipeline view")
    lanes = {
        lane: replace(lc, epoch=None, fingerprint=None) if lc.epoch == epoch else lc
        for lane, lc in later.items()
    }
    # no saved turn: the lane that delivered the fewest items goes first, as after a merge
    return with_lanes({**fresh, "tail": {"lanes": [], "order": [], "turn": 0}}, lanes)
