"""The consumer's position in a run: what a checkpoint records of it, before encoding.

Below the engine that takes it and the hand-off that carries it out of an engine process."""

from __future__ import annotations

from dataclasses import dataclass

from zephon.checkpoints import format as ckpt


@dataclass(frozen=True)
class Position:
    """The consumer's position as a checkpoint records it, before encoding."""

    lanes: list[ckpt.LaneCheckpoint]
    order: list[int]
    turn: int
