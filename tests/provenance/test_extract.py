"""Segments read from delivered records: a document truncated by ``tokenize`` shows its whole
length, packed or not, so a trace never shows it as whole."""

from __future__ import annotations

from typing import Any

import pytest

from zephon import Dataset, Pipeline, StaticMixtureWorkSource

LONG, LIMIT = 100, 16


def _pipe(rows: list[dict[str, Any]]) -> Pipeline:
    source = StaticMixtureWorkSource([Dataset.from_records("d", rows)], chunk_size=2)
    return Pipeline(source).options(runner="inline")


def _whole_length(rows: list[dict[str, Any]]) -> dict[int, int]:
    """Each document's tokens as the pipeline makes them without truncation."""
    batch = next(iter(_pipe(rows).decode_text().tokenize("bytes").batch(len(rows))))
    return {r.meta.sample_id[2]: len(r.payload["input_ids"]) for r in batch.records}


@pytest.mark.parametrize("pack", [False, True])
def test_a_truncated_document_shows_its_whole_length(pack: bool) -> None:
    rows = [{"text": "x" * LONG}, {"text": "short"}]
    whole = _whole_length(rows)
    pipe = _pipe(rows).decode_text().tokenize("bytes", max_length=LIMIT, truncation=True)
    pipe = pipe.pack_flat(max_length=2 * LIMIT, pad_token_id=0) if pack else pipe
    batch = next(iter(pipe.batch(1 if pack else 2)))
    segs = {seg.sample_id[2]: seg for _, _, seg in batch.provenance().segments()}
    assert (segs[0].source_start, segs[0].source_end) == (0, LIMIT)
    assert segs[0].source_length == whole[0] > LIMIT and segs[0].is_piece
    assert segs[1].source_end == segs[1].source_length == whole[1] and not segs[1].is_piece
