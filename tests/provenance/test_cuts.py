"""Documents a truncating tokenize cut: provenance shows their whole length and the cut, in
``batch.provenance()`` and ``zephon trace``, after a checkpoint and resume too."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from zephon import Dataset, Pipeline, StaticMixtureWorkSource
from zephon.checkpoints import checkpoint_path, save_checkpoint
from zephon.cli import main
from zephon.config import load_config
from zephon.provenance import Segment, trace
from zephon.types import SampleBatch

MAX_LENGTH = 24
DOCS = 90

PIPELINE_YAML = """\
datasets:
  - name: web
    path: web
source:
  chunk_size: 16
  seed: 3
  stop_after_passes: 1
operators:
  - op: map_transform
    fn: 'tests.provenance.test_cuts:shout'
  - op: tokenize
    tokenizer: bytes
    max_length: {max_length}
  - op: shuffle
    buffer_size: 12
    seed: 5
  - pack_flat: {{max_length: 40, pad_token_id: 0, algorithm: {algorithm}}}
  - op: batch
    microbatch_size: 2
runner: {runner}
options:
  canonical_replicas: 2
"""


def shout(row: dict[str, Any]) -> dict[str, Any]:
    """Doubles every document before tokenize: a length read from the file alone is wrong."""
    return {**row, "text": row["text"] * 2}


def text_of(i: int) -> str:
    return f"doc{i} " + "ab" * (i % 13)


def make(folder: Path, *, algorithm: str = "best_fit", runner: str = "inline") -> Path:
    (folder / "web").mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"id": i, "text": text_of(i)}) for i in range(DOCS)]
    (folder / "web" / "part-0.jsonl").write_text("\n".join(lines) + "\n")
    path = folder / "pipeline.yaml"
    path.write_text(PIPELINE_YAML.format(max_length=MAX_LENGTH, algorithm=algorithm, runner=runner))
    return path


def whole(seg: Segment) -> int:
    """The document's token count as the pipeline made it, before any cut: its shouted
    text's bytes plus BOS and EOS."""
    return len(shout({"text": text_of(seg.source_row)})["text"].encode()) + 2


def check(batch: SampleBatch) -> int:
    """Every segment's whole length and cut; returns how many segments were cut."""
    cut = 0
    for record, segments in zip(batch.records, batch.provenance(), strict=True):
        ids = np.asarray(record.payload["input_ids"])
        for seg in segments:
            n = whole(seg)
            assert seg.source_length == n, seg
            assert seg.cut_tokens == max(0, n - MAX_LENGTH), seg
            kept = min(n, MAX_LENGTH)
            assert seg.source_end <= kept and len(ids[seg.start : seg.end]) == seg.length
            assert seg.is_piece == (seg.source_start > 0 or seg.source_end < kept), seg
            cut += seg.cut_tokens > 0
    return cut


@pytest.mark.parametrize("algorithm", ["best_fit", "wrap"])
def test_a_cut_document_shows_its_whole_length_and_the_cut(tmp_path: Path, algorithm: str) -> None:
    pipe = load_config(make(tmp_path, algorithm=algorithm)).build()
    batches = list(pipe)
    cut = sum(check(b) for b in batches)
    assert cut > DOCS // 3  # most documents are longer than max_length
    segments = [s for b in batches for _, _, s in b.provenance().segments()]
    assert any(s.cut_tokens == 0 for s in segments)  # the short ones are whole
    if algorithm == "wrap":  # a cut document split across rows: its pieces, not whole
        assert any(s.cut_tokens and s.is_piece for s in segments)


def test_trace_prints_the_cut_and_its_json_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    yaml = make(tmp_path)
    batch = list(load_config(yaml).build())[4]
    capsys.readouterr()
    assert main(["trace", str(yaml), "--step", "4", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)["segments"]
    expected = [s for _, _, s in batch.provenance().segments()]
    assert [(s["source_length"], s["cut_tokens"]) for s in shown] == [
        (s.source_length, s.cut_tokens) for s in expected
    ]
    assert any(s["cut_tokens"] for s in shown)
    assert main(["trace", str(yaml), "--step", "4", "--quiet"]) == 0
    table = capsys.readouterr().out
    for seg in expected:
        if seg.cut_tokens:
            assert f"{seg.source_start}-{seg.source_end}/{seg.source_length} (cut" in table


@pytest.mark.parametrize("held", [False, True])
def test_after_a_checkpoint_and_resume_the_same(tmp_path: Path, held: bool) -> None:
    """Restored buffers hold cut records by meta or with their payloads: both report what
    an uninterrupted run does, and so does a trace from the checkpoint."""
    yaml = make(tmp_path, runner="threads")
    reference = [b.provenance() for b in load_config(yaml).build()]
    pipe = load_config(yaml).build()
    it = iter(pipe)
    for _ in range(5):
        next(it)
    state = pipe.checkpoint(held_records=held)
    it.close()  # type: ignore[attr-defined]
    save_checkpoint(checkpoint_path(tmp_path / "ckpt", 5), state)
    resumed = load_config(yaml).build().restore(state)
    assert [b.provenance() for b in resumed] == reference[5:]
    got = trace(yaml, 7, checkpoint_dir=tmp_path / "ckpt")
    assert got.restored_from is not None and got.replayed == 3
    assert got.provenance == reference[7]
    assert any(s.cut_tokens for _, _, s in got.provenance.segments())


def test_a_document_that_cannot_be_read_again_is_left_unknown(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The source file is gone when provenance asks: the cut documents' length is unknown
    (never the cut length), one warning says why, and the batch is still described."""
    yaml = make(tmp_path)
    pipe = load_config(yaml).build()
    batch = next(iter(pipe))
    (tmp_path / "web" / "part-0.jsonl").unlink()
    with caplog.at_level(logging.WARNING, logger="zephon"):
        prov = batch.provenance()
        again = batch.provenance()
    assert prov == again
    segments = [s for _, _, s in prov.segments()]
    assert all(s.cut_tokens == 0 for s in segments)
    at_limit = [s for s in segments if s.source_end == MAX_LENGTH]
    assert at_limit and all(s.source_length is None for s in at_limit)
    assert all(s.source_length == s.source_end for s in segments if s not in at_limit)
    warnings = [r.getMessage() for r in caplog.records if "may have cut" in r.getMessage()]
    assert len(warnings) == 1 and "part-0.jsonl" in warnings[0], warnings


def test_a_pipeline_that_does_not_truncate_rebuilds_nothing(tmp_path: Path) -> None:
    rows = [{"text": text_of(i)} for i in range(20)]
    source = StaticMixtureWorkSource([Dataset.from_records("d", rows)], chunk_size=8)
    pipe = Pipeline(source).tokenize("bytes").batch(4)
    batch = next(iter(pipe))
    assert pipe.provenance_origin().cut_lengths() is None
    for seg in (s for _, _, s in batch.provenance().segments()):
        assert seg.cut_tokens == 0 and seg.source_length == seg.source_end


@pytest.mark.parametrize("shuffled", [False, True])
def test_a_plan_without_snapshots_still_shows_the_whole_length(shuffled: bool) -> None:
    """A plan that keeps source order (or takes no snapshots) re-runs cut documents as well:
    how to rebuild a record does not depend on whether snapshots are taken."""
    rows = [{"text": text_of(i) + "cd" * 12} for i in range(40)]
    source = StaticMixtureWorkSource([Dataset.from_records("d", rows)], chunk_size=8)
    pipe = Pipeline(source).map_transform(shout).tokenize("bytes", max_length=MAX_LENGTH)
    if shuffled:
        pipe = pipe.shuffle(6, seed=2).options(snapshot_every_chunks=0)
    batch = next(iter(pipe.batch(4).options(runner="inline")))
    segments = [s for _, _, s in batch.provenance().segments()]
    assert segments and all(s.cut_tokens > 0 for s in segments)
    for seg in segments:
        assert seg.source_length == len(shout(rows[seg.source_row])["text"].encode()) + 2
