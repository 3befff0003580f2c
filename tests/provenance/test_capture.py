"""Provenance of capture trajectories: each segment names its rollout and captured calls, and
its span holds exactly that trajectory's tokens, also after a restore."""

from __future__ import annotations

import uuid

import numpy as np

from tests.capture.test_dataset import fill
from zephon import Pipeline
from zephon.capture.dataset import CaptureSource


def _pipe(source: CaptureSource) -> Pipeline:
    return (
        Pipeline(source)
        .pack_flat(16, pad_token_id=0)
        .batch(2, drop_last=False)
        .options(runner="inline")
    )


def test_trajectory_segments_name_rollouts_and_calls() -> None:
    url = f"memory://prov-{uuid.uuid4().hex}"
    ids, expect = fill(url, 9)
    source = CaptureSource(url, ids, chunk_size=2)
    batches = list(_pipe(source))
    seen = set()
    for batch in batches:
        for record, segments in zip(batch.records, batch.provenance(), strict=True):
            tokens = np.asarray(record.payload["input_ids"])
            for seg in segments:
                assert seg.extra is not None
                rid = seg.extra["rollout_id"]
                assert seg.extra["call_ids"] == ["a", "b"]
                want = expect[rid][0][seg.source_start : seg.source_end]
                assert tokens[seg.start : seg.end].tolist() == want
                seen.add(rid)
    assert seen == set(ids)
    restored = _pipe(CaptureSource(url, ids, chunk_size=2))
    first = _pipe(CaptureSource(url, ids, chunk_size=2))
    it = iter(first)
    next(it)
    state = first.checkpoint()
    it.close()
    restored.restore(state)
    assert [b.provenance() for b in restored] == [b.provenance() for b in batches[1:]]
