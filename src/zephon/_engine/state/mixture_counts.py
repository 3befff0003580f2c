"""Samples and tokens delivered per mixture component, counted as items reach the consumer.

Counted per lane like ``delivered``: a checkpoint carries each lane's counts, a merged
checkpoint keeps them, and a restored lane goes on from them (see ``zephon.work.MixtureStats``
for what they are shown as). Counting reads metadata and token lengths only and changes
nothing: delivered items are the same with or without it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from zephon.types import (
    TAG_PACKING,
    TOKEN_FIELDS,
    SampleBatch,
    SampleRecord,
    StreamItem,
    record_tokens,
)

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
        self._field: str | None = None  # the payload field the token ids were found in
        self._lanes: dict[int, tuple[list[int], list[int]]] = {
            lane: ([0] * components, [0] * components) for lane in lanes
        }
        for lane, (samples, tokens) in (start or {}).items():
            if lane in self._lanes and len(samples) == len(tokens) == components:
                self._lanes[lane] = ([int(n) for n in samples], [int(n) for n in tokens])
        self._frozen: dict[int, tuple[tuple[int, ...], tuple[int, ...]]] = {}
        """lane -> its counts as tuples, until the lane's next item is counted"""

    def add(self, item: StreamItem) -> None:
        """Count one delivered item (a record or a batch of one lane)."""
        records: Sequence[SampleRecord] = item.records if isinstance(item, SampleBatch) else (item,)
        if not records:
            return
        lane = records[0].meta.lane_id
        samples, tokens = self._lanes[lane]
        self._frozen.pop(lane, None)
        field = self._field
        for record in records:
            meta = record.meta
            comp = meta.component_id
            if meta.tags and TAG_PACKING in meta.tags:
                self._add_packed(meta.tags[TAG_PACKING], tokens)
            else:
                try:  # the token field found before: one dict lookup
                    tokens[comp] += len(record.payload[field])  # type: ignore[arg-type]
                except (KeyError, TypeError, IndexError):
                    tokens[comp] += self._tokens(record)
            counts = meta.component_counts
            if counts is None:
                samples[comp] += 1
            else:
                for c, n in counts.items():
                    samples[c] += n

    @staticmethod
    def _add_packed(packing: Mapping[str, Any], tokens: list[int]) -> None:
        for comp, n in packing.get("component_tokens", {}).items():
            tokens[comp] += n

    def _tokens(self, record: SampleRecord) -> int:
        """The record's tokens, remembering which field held them (0 before tokenization)."""
        payload = record.payload
        if isinstance(payload, Mapping):
            for name in TOKEN_FIELDS:
                value = payload.get(name)
                if value is not None:
                    self._field = name
                    return record_tokens(record)
        return 0

    def lane(self, lane: int) -> tuple[list[int], list[int]]:
        """``(samples, tokens)`` by component id that ``lane`` delivered (copies)."""
        samples, tokens = self._lanes[lane]
        return list(samples), list(tokens)

    def frozen(self, lane: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """:meth:`lane` as tuples: the same object until the lane's next item is counted (a
        checkpoint compares it to the one it was built from)."""
        out = self._frozen.get(lane)
        if out is None:
            samples, tokens = self._lanes[lane]
            out = self._frozen[lane] = (tuple(samples), tuple(tokens))
        return out

    def totals(self) -> tuple[list[int], list[int]]:
        """``(samples, tokens)`` by component id over every lane."""
        samples, tokens = [0] * self.components, [0] * self.components
        for lane_samples, lane_tokens in self._lanes.values():
            for i in range(self.components):
                samples[i] += lane_samples[i]
                tokens[i] += lane_tokens[i]
        return samples, tokens
