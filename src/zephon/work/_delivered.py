"""What a mixture delivered, next to its target: samples and tokens per dataset.

A mixture weighted in samples is not one weighted in tokens (70/30 by samples is 30/70 by
tokens when one dataset's documents are five times longer), so a run counts both, and every
place a run describes itself (``pipeline.stats()``, ``zephon run``'s summary and ``--json``,
metrics, ``zephon checkpoint inspect``) shows them beside the configured weights and unit.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any


def _shares(counts: Mapping[str, int]) -> dict[str, float] | None:
    total = sum(counts.values())
    return {k: v / total for k, v in counts.items()} if total else None


@dataclass(frozen=True)
class MixtureStats:
    """A mixture's target and what was delivered of it, by dataset (component) name.

    ``weights``: the configured proportions, normalised (empty for a source without a
    target); ``unit``: what they are proportions of, ``"samples"`` or ``"tokens"``;
    ``samples`` / ``tokens``: delivered per dataset, in component order. A sample counts
    where its source record is delivered whole, tokens where they are delivered (a packed row
    splits its tokens by dataset). Shares are ``None`` while nothing (or, before
    ``tokenize``, no token) was delivered.
    """

    unit: str
    weights: Mapping[str, float]
    samples: Mapping[str, int] = field(default_factory=dict)
    tokens: Mapping[str, int] = field(default_factory=dict)

    @classmethod
    def target(cls, names: Sequence[str], weights: Mapping[str, float], unit: str) -> MixtureStats:
        """Nothing delivered yet of ``weights`` over the datasets ``names`` (component order)."""
        zeros = dict.fromkeys(names, 0)
        return cls(unit, {n: float(weights[n]) for n in names if n in weights}, zeros, zeros)

    @property
    def components(self) -> list[str]:
        """Dataset names by component id."""
        return list(self.samples)

    def counted(self, samples: Sequence[int], tokens: Sequence[int]) -> MixtureStats:
        """This target with ``samples`` and ``tokens`` delivered (by component id)."""
        names = self.components
        return replace(
            self,
            samples={n: int(samples[i]) for i, n in enumerate(names)},
            tokens={n: int(tokens[i]) for i, n in enumerate(names)},
        )

    @property
    def sample_shares(self) -> dict[str, float] | None:
        return _shares(self.samples)

    @property
    def token_shares(self) -> dict[str, float] | None:
        return _shares(self.tokens)

    def to_dict(self) -> dict[str, Any]:
        """Target, counts and shares as JSON data (``zephon run --json``'s ``mixture``)."""
        return {
            "unit": self.unit,
            "weights": dict(self.weights),
            "samples": dict(self.samples),
            "tokens": dict(self.tokens),
            "sample_shares": self.sample_shares,
            "token_shares": self.token_shares,
        }

    def target_json(self) -> dict[str, Any]:
        """The target as a checkpoint records it (its lanes record the counts)."""
        return {"components": self.components, "weights": dict(self.weights), "unit": self.unit}

    @classmethod
    def from_target_json(cls, raw: Mapping[str, Any]) -> MixtureStats:
        names = [str(n) for n in raw.get("components", [])]
        weights = raw.get("weights")
        clean = (
            {str(k): float(v) for k, v in weights.items()} if isinstance(weights, Mapping) else {}
        )
        return cls.target(names, clean, str(raw.get("unit", "samples")))
