"""expand_chat: one record per assistant turn, holding the conversation up to that turn.

A conversation with assistant turns at ``i1 < i2 < ...`` becomes children whose ``field`` is
``messages[: i_k + 1]``; they carry child lineage (``spawn_child``), so only the last child
closes the parent and checkpoints, replay and packing account for them like any fan-out. A
conversation without an assistant turn becomes a tombstone with its reason. Combine with
``tokenize_chat(loss_scope="last_span")`` to supervise each turn once, in its own context.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from zephon._ops._chat_messages import conversation
from zephon.ops import Accumulator, BaseOp, CountingAccumulator, OpContext, OpTraits
from zephon.types import SampleRecord, StreamItem, spawn_child, tombstone_meta

EXPAND_MICRO_BATCH = 64
EXPAND_LATENCY_MS = 3.0
NO_ASSISTANT = "expand_chat: conversation has no assistant turn"


class ExpandChatOp(BaseOp):
    """Fans each conversation out into its assistant-turn prefixes (see the module docstring)."""

    name = "expand_chat"
    # micro-batch sizes cannot change the output (every runner and worker count agree)
    config_exclude = ("max_batch", "max_latency_ms")

    def __init__(self, *, field: str = "messages", max_batch: int = EXPAND_MICRO_BATCH) -> None:
        super().__init__()
        self.field = field
        self.max_batch = max_batch

    def accumulator(self, *, deterministic: bool, ctx: OpContext) -> Accumulator:
        return CountingAccumulator(self.max_batch, None if deterministic else EXPAND_LATENCY_MS)

    def traits(self) -> OpTraits:
        return OpTraits(preserves_cursor_order=True, parallelism=1, elementwise=True)

    def config(self) -> Mapping[str, Any]:
        return {"field": self.field}

    def process_many(self, elems: list[StreamItem]) -> list[StreamItem]:
        field = self.field
        out: list[StreamItem] = []
        for elem in elems:
            assert isinstance(elem, SampleRecord)
            payload = elem.payload
            messages = conversation(payload, field, self.name, elem.meta.sample_id)
            ends = [
                i + 1
                for i, m in enumerate(messages)
                if isinstance(m, Mapping) and m.get("role") == "assistant"
            ]
            if not ends:
                out.append(SampleRecord(tombstone_meta(elem.meta, reason=NO_ASSISTANT), None))
                continue
            last = len(ends) - 1
            for k, end in enumerate(ends):
                child = dict(payload)
                child[field] = messages[:end]
                out.append(spawn_child(elem, k, child, is_last=k == last))
        return out
