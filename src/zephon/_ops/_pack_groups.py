"""Which records may share a packed row: the packers' ``homogeneity`` and ``groups``.

``none``: any records of a lane; ``full``: records of one dataset (mixture component);
``group``: records of one group, named by a payload field or by ``{dataset: group}`` (a
dataset left out is its own group). Each key gets its own open bins in the lane's state.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

from zephon.errors import ConfigError, DataError, MissingFieldError, did_you_mean
from zephon.types import SampleRecord

if TYPE_CHECKING:
    from zephon._ops.pack import PackOpBase

Homogeneity = Literal["none", "group", "full"]
ShuffleStrategy = Literal["none", "length"]
Groups = Mapping[str, str] | str | None
HOMOGENEITY: tuple[str, ...] = ("none", "group", "full")
SHUFFLE_STRATEGIES: tuple[str, ...] = ("none", "length")


def check_grouping(
    label: str,
    homogeneity: str,
    groups: Groups,
    shuffle_strategy: str,
    component_names: Sequence[str],
) -> None:
    """Refuse settings that cannot work, naming the operator and the option."""
    for what, value, choices in (
        ("homogeneity", homogeneity, HOMOGENEITY),
        ("shuffle_strategy", shuffle_strategy, SHUFFLE_STRATEGIES),
    ):
        if value not in choices:
            raise ConfigError(
                f"{label}: {what} must be one of {list(choices)}, got {value!r}"
                + did_you_mean(str(value), choices)
            )
    if homogeneity == "group" and groups is None:
        raise ConfigError(
            f"{label}: homogeneity='group' needs groups= (a payload field name, or "
            "{dataset name: group name})"
        )
    if homogeneity != "group" and groups is not None:
        raise ConfigError(f"{label}: groups= is only read with homogeneity='group'")
    if isinstance(groups, Mapping):
        unknown = [k for k in groups if k not in component_names]
        if unknown:
            raise ConfigError(
                f"{label}: groups names unknown dataset(s) {unknown}; the source's datasets "
                f"are {list(component_names)}"
                + (did_you_mean(unknown[0], component_names) if component_names else "")
            )


def group_key(op: PackOpBase, record: SampleRecord) -> Any:
    """The key of ``record``'s packer under ``op``'s homogeneity (None: one packer)."""
    if op.homogeneity == "none":
        return None
    component = record.meta.component_id
    if op.homogeneity == "full":
        return component
    groups = op.groups
    if isinstance(groups, Mapping):
        name = op.component_names[component]
        return groups.get(name, name)
    assert isinstance(groups, str)
    payload = record.payload
    try:
        value = payload[groups]
    except (KeyError, TypeError):
        fields = sorted(payload) if isinstance(payload, Mapping) else type(payload).__name__
        raise MissingFieldError(
            f"{op.name}: record {record.meta.sample_id} has no group field {groups!r} "
            f"(fields: {fields}); set groups= to the field naming its group"
        ) from None
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise DataError(
            f"{op.name}: group field {groups!r} of record {record.meta.sample_id} is "
            f"{type(value).__name__}, expected a str or int group name"
        )
    return value
