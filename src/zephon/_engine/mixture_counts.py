"""Samples and tokens delivered per mixture component, counted as items reach the consumer.

Counted per lane like ``delivered``: a checkpoint carries each lane's counts, a merged
checkpoint keeps them, and a restored lane goes on from them (see ``zephon.work.MixtureStats``
for what they are shown as). Counting reads metadata and token lengths only and changes
nothing: delivered items are the same with or without it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from zephon.types import TAG_PACKING, SampleBatch, StreamItem, record_tokens

__all__ = ["MixtureCounts"]


class MixtureCounts:
    """Samples and tokens delivered per component, per lane (see the module docstring).

    A sample counts where its source record is delivered whole (a split record's last piece,
    a packed row's ``component_counts``); tokens count where they are delivered (a packed
    row's ``component_tokens``, else the record's token field, 0 before tokenization).
    """

    def __init__(
        self,
        components: int,
        lanes: Sequence[int],
        start: Mapping[int, tuple[Sequence[int], Sequence[int]]] | None = None,
    ) -> None:
        self.components = components
        self._lanes: dict[int, tuple[list[int], list[int]]] = {
            lane: ([0] * components, [0] * components) for lane in lanes
        }
        for lane, (samples, tokens) in (start or {}).items():
            if lane in self._lanes and len(samples) == len(tokens) == components:
                self._lanes[lane] = ([int(n) for n in samples], [int(n) for n in tokens])

    def add(self, item: StreamItem) -> None:
        """Count one delivered item (a record or a batch of one lane)."""
        records = item.records if isinstance(item, SampleBatch) else (item,)
        if not records:
            return
        samples, tokens = self._lanes[records[0].meta.lane_id]
        for record in records:
            meta = record.meta
            packing = meta.tags.get(TAG_PACKING) if meta.tags else None
            if packing is not None and "component_tokens" in packing:
                for comp, n in packing["component_tokens"].items():
                    tokens[comp] += n
            else:
                tokens[meta.component_id] += record_tokens(record)
            counts = meta.component_counts
            if counts is None:
                samples[meta.component_id] += 1
            else:
                for comp, n in counts.items():
                    samples[comp] += n

    def lane(self, lane: int) -> tuple[list[int], list[int]]:
        """``(samples, tokens)`` by component id that ``lane`` delivered (copies)."""
        samples, tokens = self._lanes[lane]
        return list(samples), list(tokens)

    def totals(self) -> tuple[list[int], list[int]]:
        """``(samples, tokens)`` by component id over every lane."""
        samples, tokens = [0] * self.components, [0] * self.components
        for lane_samples, lane_tokens in self._lanes.values():
            for i in range(self.components):
                samples[i] += lane_samples[i]
                tokens[i] += lane_tokens[i]
        return samples, tokens
