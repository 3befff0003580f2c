"""The ``mixture`` section of a YAML pipeline: plain weights, a token mixture or a schedule.

* ``{web: 3, code: 1}``: sample weights (every dataset needs one).
* ``{weights: {...}, unit: tokens, tokens_per_sample: {...} | calibration: {...}}``: a
  :class:`~zephon.MixtureSpec`. With neither estimate, the pipeline's ``tokenize`` operator
  measures them.
* ``{schedule: [{at: 0, weights: {...}}, ...], by: samples|tokens, unit: ..., ...}``: a
  :class:`~zephon.MixtureSchedule`.

``calibration`` holds the keyword arguments of :class:`~zephon.TokenCalibration`. Every error
names the key path (``mixture.schedule[1].weights.web``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from zephon._config_values import ConfigFileError, check_call, check_value
from zephon.errors import ConfigError
from zephon.work import MixtureSchedule, MixtureSpec, TokenCalibration

SPEC_KEYS = ("weights", "unit", "tokens_per_sample", "calibration")
SCHEDULE_KEYS = ("schedule", "by", "unit", "tokens_per_sample", "calibration")


def _weights(raw: Any, key: str, names: Sequence[str], *, allow_zero: bool) -> dict[str, float]:
    weights: dict[str, float] = check_value(raw, dict[str, float], key)
    for name, weight in weights.items():
        if name not in names:
            raise ConfigFileError(
                f"{key}.{name}", f"no dataset is named {name!r}; datasets are {list(names)}"
            )
        if weight < 0 or (weight == 0 and not allow_zero):
            raise ConfigFileError(f"{key}.{name}", f"weight must be > 0, got {weight}")
    return weights


def _estimates(raw: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if raw.get("unit") is not None:
        out["unit"] = check_value(raw["unit"], str, "mixture.unit")
    if raw.get("tokens_per_sample") is not None:
        out["tokens_per_sample"] = check_value(
            raw["tokens_per_sample"], dict[str, float], "mixture.tokens_per_sample"
        )
    if raw.get("calibration") is not None:
        params = check_value(raw["calibration"], dict[str, Any], "mixture.calibration")
        checked = check_call(TokenCalibration, params, "mixture.calibration", what="calibration")
        out["calibration"] = TokenCalibration(**checked)
    return out


def _unknown(raw: dict[str, Any], known: Sequence[str]) -> None:
    for k in raw:
        if k not in known:
            raise ConfigFileError(f"mixture.{k}", f"unknown key (known: {', '.join(known)})")


def _schedule(raw: dict[str, Any], names: Sequence[str]) -> MixtureSchedule:
    _unknown(raw, SCHEDULE_KEYS)
    phases_raw = raw["schedule"]
    if not isinstance(phases_raw, list) or not phases_raw:
        raise ConfigFileError("mixture.schedule", "expected a list of {at: N, weights: {...}}")
    phases = []
    for i, phase in enumerate(phases_raw):
        key = f"mixture.schedule[{i}]"
        if not isinstance(phase, dict) or set(phase) != {"at", "weights"}:
            raise ConfigFileError(key, "expected {at: N, weights: {dataset: weight, ...}}")
        at = check_value(phase["at"], int, f"{key}.at")
        phases.append((at, _weights(phase["weights"], f"{key}.weights", names, allow_zero=True)))
    by = check_value(raw.get("by", "samples"), str, "mixture.by")
    return MixtureSchedule(phases, by=by, **_estimates(raw))  # type: ignore[arg-type]


def parse_mixture(
    raw: Any, names: Sequence[str]
) -> dict[str, float] | MixtureSpec | MixtureSchedule | None:
    """The mixture described by ``raw`` (see the module docstring)."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ConfigFileError("mixture", f"expected a mapping, got {raw!r}")
    try:
        if isinstance(raw.get("schedule"), list):
            return _schedule(raw, names)
        if isinstance(raw.get("weights"), dict):
            _unknown(raw, SPEC_KEYS)
            weights = _weights(raw["weights"], "mixture.weights", names, allow_zero=False)
            spec = MixtureSpec(weights, **_estimates(raw))
            missing = [n for n in names if n not in weights]
            if missing:
                raise ConfigFileError("mixture.weights", f"dataset(s) {missing} have no weight")
            return spec
    except ConfigFileError:
        raise
    except ConfigError as exc:
        raise ConfigFileError("mixture", str(exc)) from None
    weights = _weights(raw, "mixture", names, allow_zero=False)
    missing = [n for n in names if n not in weights]
    if missing:
        raise ConfigFileError("mixture", f"dataset(s) {missing} have no weight")
    return weights
