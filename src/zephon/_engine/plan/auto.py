"""``parallelism="auto"``: worker counts from the cores this process may use.

The usable cores (:mod:`~zephon._engine.plan.cores`) are split among the stages configured
``"auto"``: CPU-heavy work (decode, tokenize, operators whose traits say ``"auto"``). The split
is only where a run starts: the threads runner, and the process runner's shared worker set,
move shares toward the busiest stage while they run (:mod:`~zephon._engine.run.rebalance`).
Output never depends on worker counts, so no choice made here can change what a run delivers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Literal

from zephon._engine.plan.cores import UsableCores
from zephon._engine.plan.plan import OpSpec
from zephon.errors import ConfigError

Parallelism = int | Literal["auto"]
"""A worker count, or ``"auto"``: a share of the usable cores."""

AUTO = "auto"

_PER_OP_KEPT = "kept while running (process_pool='per_op': each stage has its own workers)"


def checked_width(name: str, parallelism: Parallelism | None, default: Parallelism) -> int | None:
    """The configured worker count of operator ``name`` (``default``: its traits'), or None
    for ``"auto"``; anything else is a ``ConfigError`` saying what to write."""
    width = default if parallelism is None else parallelism
    if width == AUTO:
        return None
    if isinstance(width, bool) or not isinstance(width, int) or width < 1:
        raise ConfigError(
            f"{name}: parallelism must be a worker count >= 1 or 'auto', got {width!r}"
        )
    return width


def split(cores: int, stages: int) -> list[int]:
    """``cores`` split as evenly as whole workers allow, at least one each; the earlier
    stages take the remainder (the stage that feeds the others decides how busy they are)."""
    base, extra = divmod(max(cores, stages), stages)
    return [base + (1 if i < extra else 0) for i in range(stages)]


def _units(auto: list[int], fused: Sequence[Sequence[int]]) -> list[list[int]]:
    """The ``auto`` stages grouped as they run: a fused group runs as one worker task, so
    its ``"auto"`` stages take one share between them."""
    group_of = {i: tuple(g) for g in fused for i in g}
    units: dict[tuple[int, ...], list[int]] = {}
    for i in auto:
        units.setdefault(group_of.get(i, (i,)), []).append(i)
    return list(units.values())


def _same_for_all(specs: list[OpSpec], auto: list[int], width: int, why: str) -> list[OpSpec]:
    out = list(specs)
    for i in auto:
        out[i] = replace(specs[i], parallelism=width, why=why)
    return out


def resolve_auto(
    specs: list[OpSpec],
    cores: UsableCores,
    runner: str,
    fused: Sequence[Sequence[int]] = (),
    *,
    shared_pool: bool = False,
) -> list[OpSpec]:
    """``specs`` with each ``"auto"`` stage's worker count and why it was chosen; ``fused``:
    the plan's fused groups of stage indices, once known. ``shared_pool``: the process
    runner's one worker set serves every stage; the shares are then the stages' in-flight
    caps on it (moved while running), else each stage's own workers (kept as compiled)."""
    auto = [i for i, spec in enumerate(specs) if spec.auto]
    if not auto:
        return specs
    found = f"{cores.count} usable core{'s' if cores.count != 1 else ''} ({cores.why})"
    if runner == "inline":
        return _same_for_all(specs, auto, 1, f"auto: inline runs one copy; {found}")
    out = list(specs)
    units = _units(auto, fused)
    names = [" + ".join(specs[i].op.name for i in unit) for unit in units]
    for unit, name, share in zip(units, names, split(cores.count, len(units)), strict=True):
        others = [n for n in names if n != name]
        shared = f", shared with {', '.join(others)}" if others else ""
        why = f"auto: {share} of {found}{shared}"
        if runner == "process" and not shared_pool and others:
            why += f"; {_PER_OP_KEPT}"
        for i in unit:
            out[i] = replace(specs[i], parallelism=share, why=why)
    return out
