"""Move worker share between a run's ``parallelism="auto"`` units while it runs.

Compile splits the usable cores evenly among the ``"auto"`` units (a stage, or a fused group
holding one); which of them is the bottleneck shows only once data flows. Every
:data:`LOOK_EVERY` completed micro-batches this compares each unit's utilisation (the time its
workers ran micro-batches per worker share since the last look) and moves one share from the
least busy unit to the busiest, by raising or lowering the units' in-flight caps. On the
threads runner each unit's pool has threads for the largest share it can get; on the process
runner's shared worker set (``process_pool="shared"``) the shares split one fleet of workers
as wide as all of them together. Process stages with a pool each (``"per_op"``) keep their
compiled widths: growing one would mean starting more processes for every stage. Only how
many micro-batches run at once changes, never what they hold or the order they leave in, so
the output is the same whatever moves.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Protocol

from zephon._engine.plan.fusion import Unit
from zephon._engine.run.threaded import HELD_WINDOW
from zephon._engine.state.stage import StageCore
from zephon._engine.stats import OpStats

if TYPE_CHECKING:
    from zephon._engine.plan.plan import StagePlan

LOOK_EVERY = 8
"""Completed micro-batches (over all ``"auto"`` units) between two looks."""
MARGIN = 0.25
"""A share moves only when the busiest unit's utilisation exceeds the idlest's by this much."""


class Capped(Protocol):
    """What the rebalancer sets on a driver: its in-flight cap and held-result window."""

    max_inflight: int
    window: int


class Busy(Protocol):
    """A pool that says how long its workers ran micro-batches (waits for input and for
    downstream room excluded, which is what tells the bottleneck from a starved stage)."""

    def busy_ns(self) -> int: ...


@dataclass
class _Share:
    name: str
    stats: list[OpStats]
    """The unit's stages' counters (a fused unit's work is counted per stage; none when
    stats are not tracked)."""
    auto_stats: list[OpStats]
    share: int
    busy_seen: int = 0
    driver: Capped | None = field(default=None, repr=False)
    pool: Busy | None = field(default=None, repr=False)

    def busy(self) -> int:
        return 0 if self.pool is None else self.pool.busy_ns()


def pool_stages(
    units: Sequence[Unit],
    stages: Sequence[StagePlan],
    balancer: Rebalancer | None,
    *,
    shared_fleet: bool,
) -> list[StagePlan]:
    """Each unit's stage as its pool is built from: a thread pool wide enough for the largest
    share its unit may get, and a shared process fleet (``shared_fleet``) as wide as the
    shares of its ``"auto"`` units together (a fleet is as wide as its widest stage; the
    in-flight caps split its workers)."""
    auto = {u.first for u in units if any(stages[i].auto for i in range(u.first, u.last + 1))}
    on_fleet = {u.first for u in units if shared_fleet and u.stage.runner == "process"}
    fleet = sum(u.stage.parallelism for u in units if u.first in on_fleet and u.first in auto)
    out = []
    for unit in units:
        width = unit.stage.parallelism if balancer is None else balancer.pool_width(unit)
        if unit.first in on_fleet:
            width = max(width, fleet)
        out.append(replace(unit.stage, parallelism=width))
    return out


class Rebalancer:
    """The ``"auto"`` units of one run and their shares of the cores."""

    def __init__(self, shares: dict[int, _Share]) -> None:
        self._shares = shares
        self._total = sum(s.share for s in shares.values())
        self._lock = threading.Lock()
        self._done = 0
        self._since = time.perf_counter_ns()

    @classmethod
    def of(
        cls,
        units: Sequence[Unit],
        stages: Sequence[StagePlan],
        cores: Sequence[StageCore],
        *,
        shared_fleet: bool,
    ) -> Rebalancer | None:
        """One for ``units`` when two or more of them run ``"auto"`` stages on thread pools or
        on the process runner's shared fleet (``shared_fleet``); it reads the pools' busy
        times, and writes the stats where they are tracked."""
        movable = {"threads", "process"} if shared_fleet else {"threads"}
        shares: dict[int, _Share] = {}
        for unit in units:
            group = range(unit.first, unit.last + 1)
            if unit.stage.runner not in movable or not any(stages[i].auto for i in group):
                continue
            stats = [s for i in group if (s := cores[i].stats) is not None]
            auto_stats = [s for i in group if (s := cores[i].stats) is not None and stages[i].auto]
            name = " + ".join(stages[i].op_name for i in group if stages[i].auto)
            shares[unit.first] = _Share(name, stats, auto_stats, unit.stage.parallelism)
        return cls(shares) if len(shares) > 1 else None

    def pool_width(self, unit: Unit) -> int:
        """Threads for ``unit``'s pool: the largest share it can get."""
        if unit.first not in self._shares:
            return unit.stage.parallelism
        return self._total - (len(self._shares) - 1)

    def attach(self, first: int, driver: Capped, pool: Busy | None) -> None:
        """The driver and pool of the unit starting at stage ``first``."""
        if first in self._shares:
            self._shares[first].driver = driver
            self._shares[first].pool = pool
            driver.window = max(driver.window, HELD_WINDOW * 2 * self._total)

    def completed(self) -> None:
        """A micro-batch of an ``"auto"`` unit completed (called on its driver thread)."""
        with self._lock:
            self._done += 1
            if self._done % LOOK_EVERY == 0:
                self._look()

    def _look(self) -> None:
        now = time.perf_counter_ns()
        elapsed, self._since = max(1, now - self._since), now
        load: dict[int, float] = {}
        for first, share in self._shares.items():
            busy = share.busy()
            load[first] = (busy - share.busy_seen) / (share.share * elapsed)
            share.busy_seen = busy
        hot = max(load, key=lambda k: load[k])
        givers = [k for k in load if k != hot and self._shares[k].share > 1]
        if not givers:
            return
        cold = min(givers, key=lambda k: load[k])
        if load[hot] - load[cold] <= MARGIN:
            return
        self._move(self._shares[cold], self._shares[hot])

    def _move(self, cold: _Share, hot: _Share) -> None:
        cold.share -= 1
        hot.share += 1
        for unit in (cold, hot):
            if unit.driver is not None:
                unit.driver.max_inflight = 2 * unit.share
            why = f"auto: {unit.share} of {self._total} cores, moved toward the bottleneck"
            for stats in unit.stats:
                stats.parallelism = unit.share
            for stats in unit.auto_stats:
                stats.auto = f"{why} {hot.name}"
                stats.rebalanced += 1
