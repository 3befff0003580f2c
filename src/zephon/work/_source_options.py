"""The options of a :class:`StaticMixtureWorkSource`, checked once as passed (any value may
arrive from YAML) and resolved to one value per dataset where an option may differ by dataset."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

import msgspec

from zephon.errors import ConfigError

if TYPE_CHECKING:
    from zephon.io import Dataset

ExhaustedPolicy = Literal["stop", "repeat", "redistribute"]
LaneAssignment = Literal["permute", "modulo"]
_POLICIES = ("stop", "repeat", "redistribute")


class _Unset:
    def __repr__(self) -> str:
        return "<unset>"


UNSET: Any = _Unset()


def _per_dataset(value: Any, names: Sequence[str], option: str, default: Any) -> list[Any]:
    """Expand a scalar-or-dict option to one value per dataset; unknown keys are errors."""
    if isinstance(value, Mapping):
        unknown = [k for k in value if k not in names]
        if unknown:
            raise ConfigError(
                f"{option} names unknown dataset(s) {unknown}; datasets are {list(names)}"
            )
        return [value.get(n, default) for n in names]
    return [default if value is None else value for _ in names]


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def checked_datasets(datasets: Sequence[Dataset]) -> list[Dataset]:
    """At least one dataset, unique names, none empty."""
    out = list(datasets)
    if not out:
        raise ConfigError("StaticMixtureWorkSource needs at least one dataset")
    names = [d.name for d in out]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ConfigError(f"dataset names must be unique; repeated: {dupes}")
    for d in out:
        if d.total() == 0:
            raise ConfigError(f"dataset {d.name!r} has no rows; remove it from the source")
    return out


def _checked_policies(value: Any, names: Sequence[str]) -> tuple[str, ...]:
    policies = _per_dataset(value, names, "exhausted_policy", "repeat")
    for n, p in zip(names, policies, strict=True):
        if p not in _POLICIES:
            raise ConfigError(f"exhausted_policy for {n!r} must be one of {_POLICIES}, got {p!r}")
    return tuple(policies)


def _checked_repeats(value: Any, names: Sequence[str]) -> tuple[int | None, ...]:
    repeats = _per_dataset(value, names, "max_repeats", None)
    for n, r in zip(names, repeats, strict=True):
        if r is not None and not (is_int(r) and r >= 0):
            raise ConfigError(f"max_repeats for {n!r} must be an integer >= 0, got {r!r}")
    return tuple(repeats)


def _checked_passes(
    value: Any, names: Sequence[str], policies: Sequence[str], repeats: Sequence[int | None]
) -> int | None:
    """``stop_after_passes``: a positive int or None, and only with plain ``repeat``."""
    if value is None:
        return None
    if not (is_int(value) and value >= 1):
        raise ConfigError(f"stop_after_passes must be a positive integer or None, got {value!r}")
    bad = [
        n
        for n, p, r in zip(names, policies, repeats, strict=True)
        if p != "repeat" or r is not None
    ]
    if bad:
        raise ConfigError(
            f"stop_after_passes cannot be combined with 'stop'/'redistribute' policies "
            f"or max_repeats (datasets {bad}); use one or the other"
        )
    return int(value)


def block_sizes(
    value: int | str | None, datasets: Sequence[Dataset], totals: Sequence[int]
) -> list[int | None]:
    """The shuffle block of each dataset's read order (None: no block shuffle)."""
    if value is None:
        return [None] * len(datasets)
    if value == "auto":
        return [8 * max(max(d.counts()) for d in datasets)] * len(datasets)
    if value == "global":
        return list(totals)
    if is_int(value) and int(value) >= 1:
        return [int(value)] * len(datasets)
    raise ConfigError(
        f"shuffle_block_size must be None, a positive integer, 'auto' or 'global', got {value!r}"
    )


class SourceOptions(msgspec.Struct, frozen=True):
    """The validated options of a :class:`StaticMixtureWorkSource`, one value per dataset
    where an option may differ by dataset. Built once by :meth:`validated`."""

    chunk_size: int
    seed: int
    shuffle_shards: bool
    shuffle_within_shard: bool
    shuffle_block_size: int | str | None
    policies: tuple[str, ...]
    max_repeats: tuple[int | None, ...]
    stop_after_passes: int | None
    lane_assignment: str
    reshuffle_on_repeat: bool

    @classmethod
    def validated(
        cls,
        names: Sequence[str],
        *,
        chunk_size: Any,
        seed: Any,
        shuffle_shards: Any,
        shuffle_within_shard: Any,
        shuffle_block_size: Any,
        exhausted_policy: Any,
        max_repeats: Any,
        stop_after_passes: Any,
        lane_assignment: Any,
        reshuffle_on_repeat: Any,
    ) -> SourceOptions:
        """Check every option (as passed, so any value may arrive from YAML) and resolve the
        per-dataset ones; raise ConfigError naming the option."""
        if not (is_int(chunk_size) and chunk_size >= 1):
            raise ConfigError(f"chunk_size must be a positive integer, got {chunk_size!r}")
        if not is_int(seed):
            raise ConfigError(f"seed must be an integer, got {seed!r}")
        if lane_assignment not in ("permute", "modulo"):
            raise ConfigError(
                f"lane_assignment must be 'permute' or 'modulo', got {lane_assignment!r}"
            )
        if stop_after_passes is UNSET:
            explicit = exhausted_policy is not None or max_repeats is not None
            stop_after_passes = None if explicit else 1
        policies = _checked_policies(exhausted_policy, names)
        repeats = _checked_repeats(max_repeats, names)
        return cls(
            chunk_size=chunk_size,
            seed=seed,
            shuffle_shards=bool(shuffle_shards),
            shuffle_within_shard=bool(shuffle_within_shard),
            shuffle_block_size=shuffle_block_size,
            policies=policies,
            max_repeats=repeats,
            stop_after_passes=_checked_passes(stop_after_passes, names, policies, repeats),
            lane_assignment=lane_assignment,
            reshuffle_on_repeat=bool(reshuffle_on_repeat),
        )
