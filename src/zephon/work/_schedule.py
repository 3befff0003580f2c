"""Mixture weights that change at given points of the run, and how a source follows them.

A :class:`MixtureSchedule` is a list of ``(point, {dataset: weight})`` phases. Points count the
source's *global* sample sequence (the order chunks are generated in, before any operator
reorders records), or its tokens with ``by="tokens"``; token points are turned into sample
points once, with the per-dataset token estimates, so every lane and every restore computes the
same switch. A phase starts a fresh apportionment (no debt carries over) and the chunk that
would straddle a point is cut there, so sample ``p`` is the first one drawn with the new weights.

Only the past is fixed: a checkpoint records the resolved phases, and a restore accepts any
schedule whose phases up to the checkpoint's position are the same; later points may move, be
added or be removed (:func:`check_past`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from zephon.errors import CheckpointError, ConfigError
from zephon.work._calibration import check_estimates
from zephon.work._mixture import MixtureSpec, Unit, check_unit, check_weights, integer_weights

if TYPE_CHECKING:
    from zephon.io import Dataset
    from zephon.work._calibration import TokenCalibration

By = Literal["samples", "tokens"]


class MixtureSchedule:
    """Mixture weights by phase: ``MixtureSchedule([(0, {"web": 0.9, "code": 0.1}),
    (2_000_000, {"web": 0.6, "code": 0.4})])``.

    The first point must be 0 and points must increase. A dataset missing from a phase (or
    with weight 0) is not drawn during it. ``by``: points count samples or tokens; ``unit``:
    weights are proportions of samples or of tokens. Token points and token weights need
    ``tokens_per_sample`` or ``calibration`` (as in :class:`MixtureSpec`).
    """

    def __init__(
        self,
        points: Sequence[tuple[int, Mapping[str, float]]],
        *,
        by: By = "samples",
        unit: Unit = "samples",
        tokens_per_sample: Mapping[str, float] | None = None,
        calibration: TokenCalibration | None = None,
    ) -> None:
        if by not in ("samples", "tokens"):
            raise ConfigError(f"MixtureSchedule: by must be 'samples' or 'tokens', got {by!r}")
        if not points:
            raise ConfigError("MixtureSchedule needs at least one (point, weights) phase")
        phases: list[tuple[int, dict[str, float]]] = []
        for i, item in enumerate(points):
            try:
                point, weights = item
            except (TypeError, ValueError):
                raise ConfigError(
                    f"MixtureSchedule phase {i} must be (point, {{dataset: weight}}), got {item!r}"
                ) from None
            if isinstance(point, bool) or not isinstance(point, int) or point < 0:
                raise ConfigError(f"MixtureSchedule phase {i}: point must be an int >= 0")
            if phases and point <= phases[-1][0]:
                raise ConfigError(
                    f"MixtureSchedule phase {i}: points must increase ({point} after "
                    f"{phases[-1][0]})"
                )
            phases.append(
                (point, check_weights(weights, f"MixtureSchedule phase {i}", allow_zero=True))
            )
        if phases[0][0] != 0:
            raise ConfigError("MixtureSchedule: the first phase must start at point 0")
        self.phases = phases
        self.by: By = by
        self.unit: Unit = check_unit(unit, "MixtureSchedule")
        self.tokens_per_sample = dict(tokens_per_sample) if tokens_per_sample else None
        self.calibration = calibration

    def __repr__(self) -> str:
        return f"MixtureSchedule({self.phases!r}, by={self.by!r}, unit={self.unit!r})"

    def names(self) -> list[str]:
        seen: dict[str, None] = {}
        for _, weights in self.phases:
            seen.update(dict.fromkeys(weights))
        return list(seen)

    def needs_estimates(self) -> bool:
        return self.unit == "tokens" or self.by == "tokens"

    def first(self) -> MixtureSpec:
        """Phase 0 as a :class:`MixtureSpec` (what the run starts with)."""
        return MixtureSpec(
            {k: w for k, w in self.phases[0][1].items() if w > 0},
            unit=self.unit,
            tokens_per_sample=self.tokens_per_sample,
        )


@dataclass(frozen=True)
class Phase:
    """A resolved phase: first global sample, integer sample weights, weights in the unit."""

    start: int
    weights: list[int]
    unit_weights: dict[str, float]

    def to_json(self) -> list[Any]:
        return [self.start, self.weights]


def _sample_weights(
    weights: Mapping[str, float], unit: Unit, estimates: Mapping[str, float] | None
) -> dict[str, float]:
    if unit == "samples":
        return dict(weights)
    assert estimates is not None
    return {k: w / estimates[k] for k, w in weights.items() if w > 0}


def resolve(
    spec: MixtureSpec | MixtureSchedule,
    names: Sequence[str],
    estimates: Mapping[str, float] | None,
) -> list[Phase]:
    """The phases of ``spec`` in sample points and integer weights over ``names``."""
    if isinstance(spec, MixtureSpec):
        raw = spec.raw()
        ints = integer_weights(_sample_weights(raw, spec.unit, estimates), names)
        return [Phase(0, ints, raw)]
    phases: list[Phase] = []
    start = 0
    for i, (point, weights) in enumerate(spec.phases):
        ints = integer_weights(_sample_weights(weights, spec.unit, estimates), names)
        if i and spec.by == "tokens":
            assert estimates is not None
            prev_point, prev = spec.phases[i - 1][0], phases[-1].weights
            per_sample = sum(w * estimates[n] for w, n in zip(prev, names, strict=True)) / sum(prev)
            start = phases[-1].start + round((point - prev_point) / per_sample)
        elif i:
            start = point
        if phases and start <= phases[-1].start:
            raise ConfigError(
                f"MixtureSchedule phase {i}: token point {point} falls within the previous "
                "phase's first sample; move it later"
            )
        phases.append(Phase(start, ints, {k: w for k, w in weights.items() if w > 0}))
    return phases


def check_past(saved: Any, current: Sequence[Phase], position: int) -> None:
    """Refuse a restore whose schedule differs from the saved one up to ``position``."""
    now = [p.to_json() for p in current if p.start <= position]
    then = [list(p) for p in saved if p[0] <= position] if isinstance(saved, list) else None
    if then is None or [[int(a), [int(w) for w in b]] for a, b in then] != now:
        raise CheckpointError(
            f"the mixture schedule changed before the checkpoint's position (global sample "
            f"{position}): saved phases {then}, now {now} (as [first sample, integer weights]); "
            "only points after the checkpoint may change"
        )


def token_estimates(
    mixture: MixtureSpec | MixtureSchedule, datasets: Sequence[Dataset]
) -> dict[str, float] | None:
    """Tokens per sample by dataset when the mixture needs them: pinned or calibrated (None
    when neither is given: see ``needs_measuring``)."""
    needed = (
        mixture.needs_estimates()
        if isinstance(mixture, MixtureSchedule)
        else mixture.unit == "tokens"
    )
    if not needed:
        return None
    names = [d.name for d in datasets]
    if mixture.tokens_per_sample is not None:
        check_estimates(mixture.tokens_per_sample, names, "token mixture")
        return {n: float(mixture.tokens_per_sample[n]) for n in names}
    if mixture.calibration is None:
        return None  # measured later by the pipeline's tokenize (measure_tokens)
    return mixture.calibration.calibrate(datasets)


def needs_measuring(mixture: MixtureSpec | MixtureSchedule) -> bool:
    """A token mixture with neither pinned nor calibrated estimates: the pipeline's tokenize
    operator measures them."""
    needed = (
        mixture.needs_estimates()
        if isinstance(mixture, MixtureSchedule)
        else mixture.unit == "tokens"
    )
    return needed and mixture.tokens_per_sample is None and mixture.calibration is None
