"""Provenance of delivered batches: every segment re-read from its file and line, re-tokenized
and cut gives exactly the row's tokens, on every runner and after restores."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.provenance._mixture import check_batch, make_mixture
from zephon._engine.workers.worker_registry import shutdown_idle_workers
from zephon.config import load_config
from zephon.pipeline import Pipeline
from zephon.types import SampleBatch

DOCS = 600  # per dataset: 540 steps
SMALL_DOCS = 120


@pytest.fixture(scope="module")
def mixture(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_mixture(tmp_path_factory.mktemp("mixture"), DOCS)


@pytest.fixture(scope="module")
def reference(mixture: Path) -> list[Any]:
    return list(_pipe(mixture))


def _pipe(path: Path, **options: Any) -> Pipeline:
    pipe = load_config(path).build()
    return pipe.options(**options) if options else pipe


def _spread(total: int) -> list[int]:
    return sorted({round(i * (total - 1) / 9) for i in range(10)})


def test_every_segment_is_the_named_document_cut_at_its_span(
    mixture: Path, reference: list[Any]
) -> None:
    pipe = _pipe(mixture)
    batches = reference
    assert len(batches) >= 500
    steps = _spread(len(batches))
    assert len(steps) == 10
    datasets, pieces, lines = set(), 0, set()
    for step in steps:
        batch = batches[step]
        assert isinstance(batch, SampleBatch)
        assert check_batch(pipe, batch) > 0
        for _, _, seg in batch.provenance().segments():
            datasets.add(seg.dataset)
            pieces += seg.is_piece
            if seg.line is not None:
                lines.add(seg.line - seg.source_row)
    assert datasets == {"web", "books"}
    assert pieces > 0  # wrap splits documents: their pieces are checked too
    assert max(lines) > 1  # blank lines moved line numbers away from row numbers


def test_restored_twice_reports_the_same_segments(mixture: Path, reference: list[Any]) -> None:
    steps = _spread(len(reference))
    got: dict[int, Any] = {}
    pipe = _pipe(mixture)
    state: dict[str, Any] | None = None
    step = 0
    for stop in (len(reference) // 3, 2 * len(reference) // 3, len(reference)):
        pipe = _pipe(mixture)
        if state is not None:
            pipe.restore(state)
        for item in pipe:
            if step in steps:
                got[step] = item
            step += 1
            if step == stop:
                break
        state = pipe.checkpoint()
    assert sorted(got) == steps
    for s in steps:
        assert got[s].provenance() == reference[s].provenance()
        assert got[s].fingerprint() == reference[s].fingerprint()
        check_batch(pipe, got[s])


def _same_on_process_runner(path: Path, reference: list[Any]) -> None:
    pipe = _pipe(path, runner="process", reuse_workers=True)
    try:
        batches = list(pipe)
    finally:
        shutdown_idle_workers()  # the workers kept for reuse go with the test
    assert len(batches) == len(reference)
    for s in _spread(len(batches)):
        assert batches[s].provenance() == reference[s].provenance()
        assert batches[s].fingerprint() == reference[s].fingerprint()
        check_batch(pipe, batches[s])


def test_process_runner_reports_the_same_segments(tmp_path: Path) -> None:
    small = make_mixture(tmp_path, SMALL_DOCS)
    _same_on_process_runner(small, list(_pipe(small, runner="inline")))


@pytest.mark.slow
def test_process_runner_reports_the_same_segments_over_500_steps(
    mixture: Path, reference: list[Any]
) -> None:
    _same_on_process_runner(mixture, reference)


def test_fingerprint_tells_content_apart(reference: list[Any]) -> None:
    batches = reference[:50]
    prints = [b.fingerprint() for b in batches]
    assert len(set(prints)) == len(prints)
    first = batches[0]
    changed = SampleBatch(list(first.records))
    payload = dict(changed.records[0].payload)
    ids = np.array(payload["input_ids"], copy=True)
    ids[3] += 1
    payload["input_ids"] = ids
    changed.records[0] = type(first.records[0])(first.records[0].meta, payload)
    assert changed.fingerprint() != first.fingerprint()


def test_a_pickled_batch_resolves_names_with_its_pipeline(mixture: Path) -> None:
    import pickle

    pipe = _pipe(mixture)
    batch = next(iter(pipe))
    copy = pickle.loads(pickle.dumps(batch))
    assert copy.provenance().rows[0][0].dataset.startswith("dataset#")
    assert copy.provenance(pipe) == batch.provenance()


def test_trace_another_rank_from_its_checkpoint(tmp_path: Path) -> None:
    from zephon.checkpoints import checkpoint_path, save_checkpoint
    from zephon.provenance import trace

    yaml = make_mixture(tmp_path, SMALL_DOCS)
    yaml.write_text(yaml.read_text() + "  dp_world_size: 2\n")
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    delivered = {}
    for rank in (0, 1):
        pipe = _pipe(yaml, dp_rank=rank)
        for step, batch in enumerate(pipe):
            delivered[rank, step] = batch
            if step == 20:
                (ckpt / f"r{rank}").mkdir()
                save_checkpoint(checkpoint_path(ckpt / f"r{rank}", 21), pipe.checkpoint())
    for rank in (0, 1):
        got = trace(yaml, 30, rank=rank, checkpoint_dir=ckpt / f"r{rank}")
        assert got.rank == rank and got.replayed == 10
        assert got.provenance == delivered[rank, 30].provenance()
        assert got.fingerprint == delivered[rank, 30].fingerprint()
    assert delivered[0, 30].provenance() != delivered[1, 30].provenance()
    # another rank's checkpoint is never restored: rank 1 traced from rank 0's replays all
    other = trace(yaml, 30, rank=1, checkpoint_dir=ckpt / "r0")
    assert other.restored_from is None and other.replayed == 31
    assert other.fingerprint == delivered[1, 30].fingerprint()


def test_trace_previews_show_each_segments_own_text(tmp_path: Path) -> None:
    """A segment's preview is its own span decoded (a piece of a split document shows its
    middle, marked "…"), not the start of the document it was cut from."""
    from tests.provenance._mixture import source_text, tokenize_like
    from zephon.provenance import trace

    yaml = make_mixture(tmp_path, SMALL_DOCS, max_length=24)  # short rows: many pieces
    got = trace(yaml, 5)
    pipe = _pipe(yaml)
    pieces = 0
    for segments, previews in zip(got.provenance, got.previews, strict=True):
        for seg, preview in zip(segments, previews, strict=True):
            doc = tokenize_like(pipe, source_text(seg.source, seg.line, seg.source_row))
            span = doc[seg.source_start : seg.source_end]
            text = bytes(int(i) for i in span if i < 256).decode("utf-8", errors="replace")
            flat = " ".join(text.split())
            shown = flat if len(flat) <= 48 else flat[:47] + "…"
            assert preview == ("…" if seg.source_start else "") + shown, seg
            whole = " ".join(source_text(seg.source, seg.line, seg.source_row).split())
            if seg.source_start and not whole.startswith(flat):
                pieces += 1
    assert pieces  # the document's start would have been shown for these
