"""Tokens per sample as a pipeline delivers them: sampled rows run through its own operators.

A token mixture without pinned or calibrated estimates is measured when the pipeline appends
its ``tokenize`` (or ``tokenize_chat``): the source's deterministic sample of rows goes through
copies of every operator appended so far, in order, and each row counts the tokens of
everything it became (pieces of a split document, turns of an expanded chat; 0 when filtered
or dropped). So specials, truncation, filters and templates are counted as in training.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

from zephon._ops.map_batch import MaterializeOp
from zephon._ops.shuffle import ShuffleOp
from zephon.errors import ConfigError
from zephon.ops import BaseOp, OpContext
from zephon.types import SampleMeta, SampleRecord, StreamItem, is_control

RowCounter = Callable[[list[Any]], list[int]]
# operators that leave payloads as they are: skipped when measuring
_PAYLOAD_KEEPING = (ShuffleOp, MaterializeOp)


def row_counter(ops: Sequence[BaseOp], output_field: str) -> RowCounter:
    """``rows -> tokens each row becomes`` through ``ops`` (the last one tokenizes into
    ``output_field``); refuses an operator whose output depends on more than one record."""
    chain: list[BaseOp] = []
    for op in ops:
        if isinstance(op, _PAYLOAD_KEEPING):
            continue
        if not op.traits().elementwise:
            raise ConfigError(
                f"token mixture: cannot measure tokens per sample through operator {op.name!r} "
                "(its output depends on more than one record); put it after tokenize, or pass "
                "tokens_per_sample={...} or calibration=TokenCalibration(...) to the MixtureSpec"
            )
        clone = copy.deepcopy(op)
        clone.setup(OpContext(op_name=op.name, op_index=len(chain) + 1))
        chain.append(clone)

    def count(rows: list[Any]) -> list[int]:
        items: list[StreamItem] = [
            SampleRecord(SampleMeta((0, 0, i), 0, 0, i), row) for i, row in enumerate(rows)
        ]
        for op in chain:
            items = [item for item in op.process_many(items) if not is_control(item)]
        counts = [0] * len(rows)
        for item in items:
            assert isinstance(item, SampleRecord)
            counts[item.meta.sample_id[2]] += len(item.payload[output_field])
        return counts

    return count
