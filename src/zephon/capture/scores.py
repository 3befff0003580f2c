"""Rewards attached to a captured rollout, with the verifier or environment that produced them.

Why a record of its own: a trainer must be able to prove which verifier scored a sample and
with what, after a crash as before it, so a score is put into the capture store next to the
rollout's entries (``await store.put_score(score)``) and validated like an entry: finite
numbers only, a named verifier. One score per (rollout, verifier); re-putting identical bytes
is a no-op, different bytes are refused.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import msgspec

from zephon.capture.records import canonical_json, validate_call_id, validate_rollout_id

__all__: list[str] = []  # its public names are exported by zephon.capture


def _finite(value: object, field: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{field} is {value!r}: a score must be a finite number")
    number = float(value)
    if not math.isfinite(number):
        raise ValueError(f"{field} is {number}: a score must be finite (not NaN or infinite)")
    return number


class RolloutScore(msgspec.Struct, frozen=True, kw_only=True):
    """One verifier's verdict on one rollout: the scalar ``reward`` and named ``details``."""

    rollout_id: str
    verifier: str
    reward: float
    details: dict[str, float] = msgspec.field(default_factory=dict)

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise ``ValueError`` naming the field unless every value can be stored and trained on.

        Called again by the store at put, because a frozen struct's fields can still be swapped
        by ``msgspec.structs.force_setattr`` or built unvalidated by a decoder.
        """
        validate_rollout_id(self.rollout_id)
        validate_call_id(self.verifier, field="verifier")
        _finite(self.reward, "reward")
        if not isinstance(self.details, Mapping):
            raise ValueError(f"details is {type(self.details).__name__}: use {{name: number}}")
        for name, value in self.details.items():
            validate_call_id(name, field="details key")
            _finite(value, f"details[{name!r}]")

    def canonical_bytes(self) -> bytes:
        """Sorted-key compact JSON: what "the same score" means for an idempotent re-put."""
        return canonical_json(self.to_dict())

    def to_dict(self) -> dict[str, Any]:
        return {
            "rollout_id": self.rollout_id,
            "verifier": self.verifier,
            "reward": float(self.reward),
            "details": {k: float(v) for k, v in self.details.items()},
        }

    @classmethod
    def from_json(cls, data: bytes) -> RolloutScore:
        return msgspec.json.decode(data, type=cls)
