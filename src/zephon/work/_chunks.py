"""The global chunk sequence of a :class:`StaticMixtureWorkSource` and the cursor that walks it.

Chunk ``g`` takes per-dataset quotas (:mod:`zephon.work._mixture`) from each dataset's read
order (:mod:`zephon.work._order`) and interleaves them smoothly; the quotas depend only on
the cursor (samples consumed per dataset, quota debts, retired datasets, the phase), so the
cursor can be advanced over chunks with integer arithmetic alone (batched when no dataset can
run out in between) and pointers are built only for the chunks that are emitted.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from zephon.work._base import WorkChunk
from zephon.work._mixture import allocate, can_batch
from zephon.work._order import DatasetOrder
from zephon.work._source_options import block_sizes

if TYPE_CHECKING:
    from zephon.io import Dataset
    from zephon.work._schedule import Phase
    from zephon.work._source_options import SourceOptions


class ChunkSequence:
    """The global chunks of one configuration (``options``, ``phases``, ``epoch``) and a cursor
    at chunk ``g``. A fresh sequence (:meth:`fresh`) starts at chunk 0; nothing depends on
    lanes, which only choose the chunks they emit."""

    def __init__(
        self,
        datasets: Sequence[Dataset],
        options: SourceOptions,
        phases: Sequence[Phase],
        unit: str,
        epoch: int = 0,
    ) -> None:
        self.datasets = datasets
        self.options = options
        self.phases = phases
        self.unit = unit
        self.epoch = epoch
        self.totals = [d.total() for d in datasets]
        self.limits: list[int | None] = [
            None if p == "repeat" and r is None else rows * (1 + (r or 0))
            for p, r, rows in zip(options.policies, options.max_repeats, self.totals, strict=True)
        ]
        self.block_sizes = block_sizes(options.shuffle_block_size, datasets, self.totals)
        self._orders: list[DatasetOrder] | None = None
        k = len(datasets)
        self.phase = 0
        self.weights = phases[0].weights
        self.g = 0  # next global chunk index to compute
        self.pos = [0] * k  # samples consumed per dataset (over all passes)
        self.debts = [0] * k  # quota debts in units of 1/sum(active weights)
        self.active = [True] * k
        self.done = False

    def fresh(
        self, *, phases: Sequence[Phase] | None = None, epoch: int | None = None
    ) -> ChunkSequence:
        """This sequence at chunk 0 (with other ``phases`` or ``epoch`` where given)."""
        return ChunkSequence(
            self.datasets,
            self.options,
            self.phases if phases is None else phases,
            self.unit,
            self.epoch if epoch is None else epoch,
        )

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_orders"] = None  # caches are rebuilt on demand
        return state

    # -- cursor ---------------------------------------------------------------------------------

    def cursor(self) -> dict[str, Any]:
        """The cursor as JSON-safe values (keys as a source state names them)."""
        return {
            "global_index": self.g,
            "positions": list(self.pos),
            "debts": list(self.debts),
            "active": list(self.active),
            "done": self.done,
            "phase": self.phase,
        }

    def restore(
        self, g: int, pos: list[int], debts: list[int], active: list[bool], done: bool, phase: int
    ) -> None:
        """Move the cursor to a checked saved position."""
        self.pos, self.debts, self.active = pos, debts, active
        self.g, self.done = g, done
        self.phase, self.weights = phase, self.phases[phase].weights

    # -- one chunk ------------------------------------------------------------------------------

    def order(self, k: int) -> DatasetOrder:
        if self._orders is None:
            self._orders = [
                DatasetOrder(
                    d.counts(),
                    seed=self.options.seed,
                    dataset_id=i,
                    shuffle_shards=self.options.shuffle_shards,
                    shuffle_within_shard=self.options.shuffle_within_shard,
                    block_size=self.block_sizes[i],
                    reshuffle_on_repeat=self.options.reshuffle_on_repeat,
                    epoch=self.epoch,
                )
                for i, d in enumerate(self.datasets)
            ]
        return self._orders[k]

    def active_weights(self) -> list[int]:
        return [w if a else 0 for w, a in zip(self.weights, self.active, strict=True)]

    def next_switch(self) -> int | None:
        """Global sample index where the next phase starts (None: no later phase)."""
        nxt = self.phase + 1
        return self.phases[nxt].start if nxt < len(self.phases) else None

    def enter_phase(self) -> None:
        """Switch to every phase whose start has been reached (fresh apportionment)."""
        here = sum(self.pos)
        while (start := self.next_switch()) is not None and here >= start:
            self.phase += 1
            self.weights = self.phases[self.phase].weights
            self.debts = [0] * len(self.debts)

    def _target(self, weights: list[int]) -> dict[str, float]:
        """The chunk's target mixture in the mixture's unit, over the datasets drawn now."""
        unit = self.phases[self.phase].unit_weights
        live = {d.name: float(w) for d, w in zip(self.datasets, weights, strict=True) if w}
        if self.unit == "tokens":
            live = {n: unit[n] for n in live}
        total = sum(live.values())
        return {n: w / total for n, w in live.items()}

    def _quotas(self, weights: list[int]) -> tuple[list[int], list[int]]:
        """This chunk's per-dataset quotas (cut at the phase end and at each dataset's limit)
        and the quota debts after it."""
        size = self.options.chunk_size
        switch = self.next_switch()
        if switch is not None:
            size = min(size, switch - sum(self.pos))  # the chunk ends where the phase does
        quotas, debts = allocate(self.debts, weights, size)
        for k, limit in enumerate(self.limits):
            if limit is not None and self.active[k]:
                quotas[k] = min(quotas[k], limit - self.pos[k])
        return quotas, debts

    def _cap_at_passes(self, quotas: list[int]) -> bool:
        """With ``stop_after_passes``: when this chunk completes every dataset's passes, top up
        the lagging datasets to their last pass (in place) and say it is the final chunk."""
        sap = self.options.stop_after_passes
        if sap is None or not all(
            p + q >= sap * n for p, q, n in zip(self.pos, quotas, self.totals, strict=True)
        ):
            return False
        for k, n in enumerate(self.totals):
            if self.pos[k] < sap * n:
                quotas[k] = sap * n - self.pos[k]
        return True

    def step(self, generate: bool) -> WorkChunk | None:
        """Compute global chunk ``g``; build its pointers only when ``generate``."""
        self.enter_phase()
        weights = self.active_weights()
        if not any(weights):  # every dataset of this phase has been retired
            self.done = True
            return None
        policies = self.options.policies
        target = self._target(weights)
        quotas, debts = self._quotas(weights)
        final = self._cap_at_passes(quotas)
        exhausted = [
            k
            for k, limit in enumerate(self.limits)
            if limit is not None and self.active[k] and self.pos[k] + quotas[k] >= limit
        ]
        retire = any(policies[k] == "redistribute" for k in exhausted)
        final = final or any(policies[k] != "redistribute" for k in exhausted)
        chunk: WorkChunk | None = None
        if generate:
            chunk = self._build(quotas, target, exhausted, final)
        for k, q in enumerate(quotas):
            self.pos[k] += q
        self.debts = debts
        if retire:
            for k in exhausted:
                if policies[k] == "redistribute":
                    self.active[k] = False
            self.debts = [0] * len(self.debts)  # a new phase with renormalised weights
            if not any(self.active):
                final = True
        self.g += 1
        self.done = final
        return chunk

    def _build(
        self, quotas: list[int], target: dict[str, float], exhausted: list[int], final: bool
    ) -> WorkChunk:
        parts = []
        for k, q in enumerate(quotas):
            if q > 0:
                shard_ids, rows = self.order(k).pointers(self.pos[k], q)
                parts.append((k, q, shard_ids, rows))
        n = sum(q for _, q, _, _ in parts)
        pointers = np.empty((n, 3), dtype=np.int64)
        if len(parts) == 1:
            k, _, shard_ids, rows = parts[0]
            pointers[:, 0] = k
            pointers[:, 1] = shard_ids
            pointers[:, 2] = rows
        elif parts:
            # Smooth interleave: the j-th of q samples sits at ideal position (j + 1/2) / q; ties
            # keep component order (stable sort over the components concatenated in id order).
            ideal = np.concatenate([(2.0 * np.arange(q) + 1.0) / (2.0 * q) for _, q, _, _ in parts])
            order = np.argsort(ideal, kind="stable")
            pointers[:, 0] = np.repeat([k for k, _, _, _ in parts], [q for _, q, _, _ in parts])[
                order
            ]
            pointers[:, 1] = np.concatenate([s for _, _, s, _ in parts])[order]
            pointers[:, 2] = np.concatenate([r for _, _, _, r in parts])[order]
        names = [self.datasets[k].name for k in exhausted]
        if final:
            names += [
                d.name for k, d in enumerate(self.datasets) if self.active[k] and k not in exhausted
            ]
        return WorkChunk(
            pointers=pointers,
            global_index=self.g,
            target_mixture=target,
            source_exhausted=tuple(names),
        )

    # -- many chunks ----------------------------------------------------------------------------

    def safe_batch(self, n: int) -> int:
        """How many of the next ``n`` chunks can be allocated in one step (no event inside)."""
        weights = self.active_weights()
        c = self.options.chunk_size
        if not can_batch(weights, c):
            return 0
        s = sum(weights)
        m = n
        switch = self.next_switch()
        if switch is not None:
            m = min(m, (switch - sum(self.pos)) // c)

        def chunks_below(k: int, bound: int) -> int:
            # Largest m with pos + A_k(m) < bound guaranteed, using A_k(m) <= (d + W m C)/S + 1.
            room = (bound - self.pos[k] - 1) * s - self.debts[k]
            return max(0, (room - 1) // (weights[k] * c)) if room > 0 else 0

        for k, limit in enumerate(self.limits):
            if limit is not None and weights[k]:
                m = min(m, chunks_below(k, limit))
        sap = self.options.stop_after_passes
        if sap is not None:
            m = min(
                m,
                max(
                    (
                        chunks_below(k, sap * n_k)
                        for k, n_k in enumerate(self.totals)
                        if weights[k] and self.pos[k] < sap * n_k
                    ),
                    default=0,
                ),
            )
        return m

    def advance(self, m: int) -> None:
        """Allocate the next ``m`` chunks in one step (``m`` no more than :meth:`safe_batch`)."""
        quotas, self.debts = allocate(self.debts, self.active_weights(), self.options.chunk_size, m)
        for k, q in enumerate(quotas):
            self.pos[k] += q
        self.g += m

    def skip(self, n: int) -> None:
        """Advance the cursor over ``n`` chunks without building pointers."""
        while n > 0 and not self.done:
            self.enter_phase()
            m = self.safe_batch(n)
            if m >= 1:
                self.advance(m)
                n -= m
            else:
                self.step(generate=False)
                n -= 1

    def endless(self) -> bool:
        """No pass limit, no later phase and every dataset drawn now repeats without limit."""
        weights = self.active_weights()
        return (
            self.options.stop_after_passes is None
            and self.next_switch() is None
            and all(limit is None for limit, w in zip(self.limits, weights, strict=True) if w)
        )
