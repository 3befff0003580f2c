"""tokenize(split_long_samples=True) and the run summary's account of every token lost.

A long document becomes consecutive child records of at most ``max_length`` tokens whose
concatenation is the document's untruncated ids (BOS on the first piece, EOS on the last);
truncation, packing drops and filters are counted in ``pipeline.stats().dropped``.
"""

from __future__ import annotations

import numpy as np
import pytest

from zephon import Dataset, Pipeline
from zephon import StaticMixtureWorkSource as Source
from zephon.cli._report import drop_line
from zephon.errors import ConfigError
from zephon.testing import check_operator
from zephon.types import SampleRecord

LENGTHS = np.random.default_rng(7).integers(5, 700, 100).tolist()
DOCS = [{"id": i, "text": f"{i:03d}" + "abcdefghij" * (n // 10) + "z" * (n % 10)}
        for i, n in enumerate(LENGTHS)]  # fmt: skip
BOS, EOS = 256, 257


def source(docs: list[dict[str, object]] = DOCS, chunk_size: int = 16) -> Source:
    return Source([Dataset.from_records("d", docs, shard_size=40)], chunk_size=chunk_size, seed=3)


def text_ids(doc: dict[str, object]) -> list[int]:
    return [BOS, *str(doc["text"]).encode(), EOS]


def by_document(records: list[SampleRecord]) -> dict[int, list[list[int]]]:
    out: dict[int, list[list[int]]] = {}
    for r in records:
        out.setdefault(int(r.payload["id"]), []).append(r.payload["input_ids"].tolist())
    return out


def test_pieces_concatenate_to_the_whole_document_with_bos_first_and_eos_last():
    pipe = Pipeline(source()).tokenize("bytes", max_length=256, split_long_samples=True)
    records = list(pipe)
    pieces = by_document(records)
    assert sorted(pieces) == list(range(len(DOCS)))
    for doc in DOCS:
        parts = pieces[int(doc["id"])]  # type: ignore[call-overload]
        assert [x for p in parts for x in p] == text_ids(doc)
        assert all(0 < len(p) <= 256 for p in parts)
        assert all(len(p) == 256 for p in parts[:-1])
        assert sum(p.count(BOS) for p in parts) == 1 and parts[0][0] == BOS
        assert sum(p.count(EOS) for p in parts) == 1 and parts[-1][-1] == EOS
    # the peer's probe shape: 100 documents, here 5..700 bytes -> this many pieces
    expected = sum(-(-(n + 2) // 256) for n in (len(str(d["text"])) for d in DOCS))
    assert len(records) == expected > len(DOCS)
    stats = pipe.stats()
    assert stats is not None and stats.dropped.cut_tokens == 0 == stats.dropped.tokens


def test_pieces_are_children_and_only_the_last_closes_the_document():
    records = list(Pipeline(source()).tokenize("bytes", max_length=128, split_long_samples=True))
    families: dict[tuple[int, ...], list[SampleRecord]] = {}
    for r in records:
        families.setdefault(tuple(r.meta.sample_id), []).append(r)
    for family in families.values():
        if len(family) == 1:
            assert family[0].meta.lineage == ()  # a short document is left as it was
            continue
        assert [r.meta.lineage[-1] for r in family] == list(range(len(family)))
        closing = [ref.is_last_child for r in family for ref in r.meta.contributors]
        assert closing == [False] * (len(family) - 1) + [True]


def test_split_then_pack_delivers_every_token_once_through_stops_and_restores():
    def build() -> Pipeline:
        return (
            Pipeline(source())
            .tokenize("bytes", max_length=96, split_long_samples=True)
            .pack_flat(128, 0, num_bins=4)
            .options(canonical_replicas=2)
        )

    report = check_operator(build, runners=("inline", "threads", "process"), workers=(1, 2, 4))
    assert report.items > 100
    rows = [r.payload for r in build()]
    got = np.concatenate([row["input_ids"][row["document_ids"] >= 0] for row in rows])
    want = np.concatenate([np.asarray(text_ids(d)) for d in DOCS])
    assert sorted(got.tolist()) == sorted(want.tolist())


def test_split_long_samples_passes_check_operator():
    def build() -> Pipeline:
        return (
            Pipeline(source())
            .tokenize("bytes", max_length=200, split_long_samples=True)
            .options(canonical_replicas=2)
        )

    report = check_operator(build, runners=("inline", "threads"), workers=(2,))
    assert report.items > len(DOCS)


def test_truncation_packing_drops_and_filters_are_counted():
    total = sum(len(text_ids(d)) for d in DOCS)
    cut = Pipeline(source()).tokenize("bytes", max_length=256)
    kept = sum(len(r.payload["input_ids"]) for r in cut)
    stats = cut.stats()
    assert stats is not None
    assert stats.dropped.cut_tokens == total - kept > 0
    assert stats.dropped.cut_records == sum(len(text_ids(d)) > 256 for d in DOCS)
    assert stats.dropped.records == 0 and stats.tombstones == 0
    assert f"cut {stats.dropped.cut_records} records" in stats.summary()
    assert "_cut_tokens_total " + str(total - kept) in stats.to_prometheus()

    packed = Pipeline(source()).tokenize("bytes").pack_flat(256, 0)
    rows = list(packed)
    delivered = sum(int((r.payload["document_ids"] >= 0).sum()) for r in rows)
    stats = packed.stats()
    assert stats is not None
    assert stats.dropped.tokens == total - delivered > 0
    assert stats.dropped.by_reason == {"pack": sum(len(text_ids(d)) > 256 for d in DOCS)}

    filtered = Pipeline(source()).tokenize("bytes").filter(lambda p: p["id"] % 2 == 0)
    delivered = sum(len(r.payload["input_ids"]) for r in filtered)
    stats = filtered.stats()
    assert stats is not None and stats.dropped.tokens == total - delivered
    line = drop_line(stats.to_dict()["dropped"])
    assert line is not None and line.startswith(f"dropped: 50 records ({total - delivered:,} ")

    batched = Pipeline(source()).tokenize("bytes").batch(7)  # partial batches dropped
    delivered = sum(len(r.payload["input_ids"]) for b in batched for r in b.records)
    stats = batched.stats()
    assert stats is not None and stats.dropped.tokens == total - delivered > 0
    assert set(stats.dropped.by_reason) == {"drop_last"}


def test_split_long_samples_settings_are_checked():
    with pytest.raises(ConfigError, match="split_long_samples=True needs max_length"):
        Pipeline(source()).tokenize("bytes", split_long_samples=True)
    with pytest.raises(ConfigError, match="exclude each other"):
        Pipeline(source()).tokenize(
            "bytes", max_length=64, truncation=True, split_long_samples=True
        )
    a = Pipeline(source()).tokenize("bytes", max_length=64).operators()[-1].config()
    b = Pipeline(source()).tokenize("bytes", max_length=64, split_long_samples=True)
    assert a != b.operators()[-1].config()
