"""Mixture weights and per-chunk quotas that converge exactly to them.

Weights are turned into exact integers (``W_k``, sum ``S``) so the quota arithmetic has no
floating-point drift. Each component carries a *debt* ``d_k`` in units of ``1/S`` samples (what
it is owed minus what it got). For a chunk of ``C`` samples the component is owed
``x_k = d_k + W_k*C``; it gets ``floor(x_k/S)`` and the leftover seats go to the largest
remainders (ties: lower component id). This is largest-remainder (Hamilton) apportionment of
the *cumulative* target, so after any number of chunks every component is within one sample of
``w_k * total``. When every ``W_k*C >= S`` (each component owed at least one sample per chunk)
no quota is ever clamped and ``m`` chunks can be allocated in one step (:func:`allocate` with
``chunks=m``), which is how a lane skips the other lanes' chunks in O(components).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import TYPE_CHECKING, Any, Literal

from zephon.errors import ConfigError

if TYPE_CHECKING:
    from zephon.work._calibration import TokenCalibration

_MAX_SCALE = 1 << 40
_FLOAT_EPS = Fraction(1, 1 << 50)  # 0.3 means 3/10, not its binary approximation


Unit = Literal["samples", "tokens"]


def check_weights(
    weights: Mapping[str, float], where: str, *, allow_zero: bool
) -> dict[str, float]:
    """Validated ``{name: weight}``: numbers, finite, positive (or zero when allowed)."""
    if not weights:
        raise ConfigError(f"{where} needs at least one {{dataset_name: weight}} entry")
    clean: dict[str, float] = {}
    for name, w in weights.items():
        if not isinstance(name, str) or not name:
            raise ConfigError(f"{where} keys must be dataset names, got {name!r}")
        if isinstance(w, bool) or not isinstance(w, int | float):
            raise ConfigError(f"mixture weight for {name!r} must be a number, got {w!r}")
        if not math.isfinite(w) or w < 0 or (w == 0 and not allow_zero):
            raise ConfigError(
                f"mixture weight for {name!r} must be positive and finite, got {w!r}; "
                "remove the dataset from the source instead of giving it weight 0"
            )
        clean[name] = float(w)
    if not any(w > 0 for w in clean.values()):
        raise ConfigError(f"{where} needs at least one positive weight")
    return clean


def check_unit(unit: Any, where: str) -> Unit:
    if unit not in ("samples", "tokens"):
        raise ConfigError(f"{where}: unit must be 'samples' or 'tokens', got {unit!r}")
    return unit  # type: ignore[no-any-return]


class MixtureSpec:
    """Target proportions of the datasets of a source, by dataset name.

    Weights must be positive and finite; they are normalised (``{"a": 3, "b": 1}`` means 75% /
    25%). Keys must match dataset names exactly. ``unit="tokens"`` makes them proportions of
    *tokens*: the source then draws samples in inverse proportion to each dataset's tokens per
    sample, pinned with ``tokens_per_sample={name: mean}`` or measured with
    ``calibration=TokenCalibration(...)`` (see docs/shuffle-and-mixture.md).
    """

    def __init__(
        self,
        weights: Mapping[str, float],
        *,
        unit: Unit = "samples",
        tokens_per_sample: Mapping[str, float] | None = None,
        calibration: TokenCalibration | None = None,
    ) -> None:
        clean = check_weights(weights, "MixtureSpec", allow_zero=False)
        self._raw = clean
        total = sum(clean.values())
        self.weights: dict[str, float] = {k: v / total for k, v in clean.items()}
        self.unit: Unit = check_unit(unit, "MixtureSpec")
        self.tokens_per_sample = dict(tokens_per_sample) if tokens_per_sample else None
        self.calibration = calibration
        if self.tokens_per_sample is not None and calibration is not None:
            raise ConfigError(
                "MixtureSpec: pass tokens_per_sample (pinned) or calibration (measured), not both"
            )

    def __repr__(self) -> str:
        extra = "" if self.unit == "samples" else ", unit='tokens'"
        return f"MixtureSpec({self._raw!r}{extra})"

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, MixtureSpec)
            and self.weights == other.weights
            and self.unit == other.unit
            and self.tokens_per_sample == other.tokens_per_sample
        )

    def __hash__(self) -> int:
        return hash((tuple(sorted(self.weights.items())), self.unit))

    def names(self) -> list[str]:
        return list(self._raw)

    def raw(self) -> dict[str, float]:
        return dict(self._raw)

    def integer_weights(self, names: Sequence[str]) -> list[int]:
        """Exact integer weights for ``names``, as small as the ratios allow (see
        :func:`integer_weights`)."""
        return integer_weights(self._raw, names)


def integer_weights(raw: Mapping[str, float], names: Sequence[str]) -> list[int]:
    """Exact integer weights for ``names`` (0 for a name without a positive weight).

    Integer or simple decimal weights (``0.3``, ``1/3``) keep their exact ratios; anything else
    is rounded to 40-bit fixed point of the normalised weight (relative error < 1e-12).
    """
    live = [n for n in names if raw.get(n, 0.0) > 0]
    fracs = [Fraction(raw[n]) for n in live]
    simple = [f.limit_denominator(1 << 20) for f in fracs]
    den = math.lcm(*(f.denominator for f in simple))
    exact = all(abs(a - b) <= a * _FLOAT_EPS for a, b in zip(fracs, simple, strict=True))
    if exact and den <= _MAX_SCALE:
        ints = [f.numerator * (den // f.denominator) for f in simple]
    else:
        total = sum(fracs)
        ints = [max(1, round(f / total * _MAX_SCALE)) for f in fracs]
    g = math.gcd(*ints)
    by_name = {n: i // g for n, i in zip(live, ints, strict=True)}
    return [by_name.get(n, 0) for n in names]


def allocate(
    debts: Sequence[int], weights: Sequence[int], chunk_size: int, chunks: int = 1
) -> tuple[list[int], list[int]]:
    """Quotas for ``chunks`` chunks of ``chunk_size`` and the debts after them.

    ``weights`` are exact integers (0 for inactive components), ``debts`` are in units of
    ``1/sum(weights)``. With ``chunks > 1`` the caller must ensure no clamping can happen
    (see :func:`can_batch`); the result then equals ``chunks`` single-chunk allocations.
    """
    s = sum(weights)
    total = chunk_size * chunks
    owed = [d + w * total if w else 0 for d, w in zip(debts, weights, strict=True)]
    quotas = [max(0, x // s) for x in owed]
    left = total - sum(quotas)
    if left > 0:
        # Largest remainder first; ties to the lower component id.
        order = sorted(
            (i for i, w in enumerate(weights) if w), key=lambda i: (-(owed[i] - quotas[i] * s), i)
        )
        for i in order[:left]:
            quotas[i] += 1
    elif left < 0:
        # Only after clamping a negative share (a component owed < 1 sample per chunk got ahead).
        order = sorted(
            (i for i, q in enumerate(quotas) if q > 0), key=lambda i: (owed[i] - quotas[i] * s, -i)
        )
        for i in order[:-left]:
            quotas[i] -= 1
    new_debts = [x - q * s if w else 0 for x, q, w in zip(owed, quotas, weights, strict=True)]
    return quotas, new_debts


def can_batch(weights: Sequence[int], chunk_size: int) -> bool:
    """Whether every active component is owed at least one sample per chunk (no clamping)."""
    s = sum(weights)
    return all(w * chunk_size >= s for w in weights if w)
