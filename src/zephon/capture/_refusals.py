"""Engine refusals in a build: place each on the one branch its request continued.

Why: a refused call produced no tokens, but it is evidence. Its request-time lineage (the
parent it continued, and whether that decision was proven) says which branch the harness was
on when the engine declined. A refusal whose parent is the leaf of a chain ends that chain; one
whose parent was extended anyway was a refused attempt the harness moved past; a refused root
starts nothing. A refusal whose parent is unproven or absent from the build cannot be placed,
so the builder cannot tell which branch it ended: that masks the rollout unless the terminal
chain was delivered.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from zephon.capture.records import EngineRefusalRecord, ParentResolutionStatus

if TYPE_CHECKING:
    from zephon.capture.builder import BuildOutput

__all__ = ["place_refusals"]


def _place(refusal: EngineRefusalRecord, out: BuildOutput) -> str:
    """The chain id the refusal ends, ``"root"``, ``"passed"``, or ``""`` (unplaceable)."""
    status, parent = refusal.parent_resolution, refusal.parent_call_id
    if status is ParentResolutionStatus.ROOT:
        return "root"
    if status is not ParentResolutionStatus.RESOLVED or not parent:
        return ""
    holders = [c for c in out.chains if parent in c.call_ids]
    ending = [c for c in holders if c.call_ids[-1] == parent]
    if len(ending) == 1:
        ending[0].refusals.append(refusal)
        return ending[0].chain_id
    return "passed" if holders else ""


def place_refusals(refusals: Sequence[EngineRefusalRecord], out: BuildOutput) -> list[str]:
    """Attach refusals to chains, note each decision; the ids that could not be placed."""
    unplaced: list[str] = []
    for refusal in refusals:
        where = _place(refusal, out)
        cid, parent = refusal.model_call_id, refusal.parent_call_id
        if where == "root":
            why = "a refused root: starts no chain"
        elif where == "passed":
            why = f"a refused continuation of {parent}, which a later call extended"
        elif where:
            why = f"ends chain {where} after {parent}"
        else:
            status = refusal.parent_resolution.value if refusal.parent_resolution else "unknown"
            why = f"cannot be placed (parent {parent or '-'}, {status}: not on any chain)"
            unplaced.append(cid)
        out.notes.decisions.append(f"engine refusal {cid} ({refusal.code}): {why}")
    out.notes.unplaced_refusals = unplaced
    return unplaced
