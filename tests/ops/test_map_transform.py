"""map_transform: every payload type maps, and only a ``None`` result drops its record."""

from __future__ import annotations

import numpy as np

from zephon._ops.map_transform import MapTransformOp
from zephon.types import SampleMeta, SampleRecord


def records(n: int) -> list[SampleRecord]:
    return [SampleRecord(SampleMeta((0, 0, i), 0, 0, i), i) for i in range(n)]


def test_array_results_are_kept_and_none_results_become_tombstones():
    """Arrays compare elementwise, so the drop test must ask identity, never equality."""
    op = MapTransformOp(lambda i: None if i % 3 == 1 else np.arange(4) + i)
    out = op.process_many(records(6))
    dropped = [r.meta.is_tombstone for r in out]
    assert dropped == [False, True, False, False, True, False]
    kept = [r for r in out if not r.meta.is_tombstone]
    assert [int(r.payload[0]) for r in kept] == [0, 2, 3, 5]
    assert [r.meta.chunk_offset for r in out] == list(range(6))


def test_drop_none_false_keeps_none_payloads():
    out = MapTransformOp(lambda i: None, drop_none=False).process_many(records(3))
    assert [r.payload for r in out] == [None, None, None]
    assert not any(r.meta.is_tombstone for r in out)
