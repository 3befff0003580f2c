"""Packing: no token lost, duplicated or reordered; bins within max_length; lanes never mix."""

from __future__ import annotations

import itertools
import logging
from collections import defaultdict

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.ops._helpers import PAD, STRIDE, ListSource, packing, sequential_pointers, token_rows
from zephon import Dataset, Pipeline
from zephon._ops.pack import PackFlatOp, PackSequencesOp
from zephon.errors import ConfigError, DataError
from zephon.types import SampleMeta, SampleRecord

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


SHARD = 17


def doc_of(cursor) -> int:
    _, shard, index = cursor.sample_id
    return shard * SHARD + index


def source(lengths, chunk, mask=False):
    ds = Dataset.from_records("docs", token_rows(lengths, mask=mask), shard_size=SHARD)
    return ListSource([ds], sequential_pointers([ds]), chunk)


def flat(lengths, chunk=7, replicas=2, k=2, runner="inline", mask=False, **kw):
    kw.setdefault("max_length", 32)
    pipe = (
        Pipeline(source(lengths, chunk, mask))
        .pack_flat(pad_token_id=PAD, **kw)
        .options(runner=runner, canonical_replicas=replicas, flush_every_k_chunks=k)
    )
    return list(pipe), pipe.stats()


def check_flat(out, lengths, max_length, chunk, replicas, splits):
    """Every structural promise of pack_flat, checked against the token ids themselves."""
    covered = defaultdict(list)  # doc -> [(start, stop)]
    closes = defaultdict(int)
    for rec in out:
        tokens = rec.payload["input_ids"]
        pos = rec.payload["positions"]
        docs = rec.payload["document_ids"]
        info = packing(rec)
        assert tokens.shape == (max_length,) and tokens.dtype == np.int64
        pad = info["padding_length"]
        assert pad == max_length - info["total_length"] >= 0
        assert (tokens[max_length - pad :] == PAD).all() and (docs[max_length - pad :] == -1).all()
        assert (tokens[: max_length - pad] >= 0).all()
        offset = 0
        for i, (cursor, start, stop) in enumerate(info["segments"]):
            doc = doc_of(cursor)
            seg = tokens[offset : offset + stop - start]
            assert (seg == doc * STRIDE + np.arange(start, stop)).all()  # order inside doc kept
            assert (pos[offset : offset + stop - start] == np.arange(stop - start)).all()
            assert (docs[offset : offset + stop - start] == i).all()
            # lane purity: the document came from this record's lane
            assert (doc // chunk) % replicas == rec.meta.lane_id
            covered[doc].append((start, stop))
            offset += stop - start
        assert offset == info["total_length"] == max_length - pad
        for ref in rec.meta.contributors:
            if ref.is_last_child:
                closes[doc_of(ref.cursor)] += 1
    for doc, n in enumerate(lengths):
        pieces = sorted(covered.get(doc, []))
        dropped = n == 0 or (n > max_length and not splits)
        if dropped:
            assert pieces == [] and closes[doc] == 0
            continue
        # the pieces tile [0, n) exactly once: nothing lost, nothing duplicated
        assert pieces[0][0] == 0 and pieces[-1][1] == n
        assert all(a[1] == b[0] for a, b in itertools.pairwise(pieces))
        assert closes[doc] == 1, f"doc {doc} closed {closes[doc]} times"
        if not splits:
            assert len(pieces) == 1


@SETTINGS
@given(
    lengths=st.lists(st.integers(0, 80), min_size=1, max_size=90),
    max_length=st.integers(8, 48),
    algorithm=st.sampled_from(["first_fit", "best_fit", "wrap", "best_fit_wrap"]),
    num_bins=st.integers(1, 5),
    max_seqs=st.one_of(st.none(), st.integers(1, 4)),
    min_seq=st.integers(1, 6),
    strategy=st.sampled_from(["fifo", "fullest"]),
    chunk=st.integers(2, 15),
    replicas=st.integers(1, 3),
    k=st.integers(1, 3),
    pool=st.integers(1, 9),
)
def test_pack_flat_properties(
    lengths, max_length, algorithm, num_bins, max_seqs, min_seq, strategy, chunk, replicas, k, pool
):
    out, stats = flat(
        lengths,
        chunk=chunk,
        replicas=replicas,
        k=k,
        max_length=max_length,
        algorithm=algorithm,
        num_bins=num_bins,
        max_sequences_per_bin=max_seqs,
        min_sequence_length=min(min_seq, max_length),
        flush_strategy=strategy,
        candidate_pool_size=pool,
    )
    splits = algorithm in ("wrap", "best_fit_wrap")
    check_flat(out, lengths, max_length, chunk, replicas, splits)
    for rec in out:
        n = packing(rec)["num_sequences"]
        assert max_seqs is None or n <= max_seqs
        if algorithm in ("first_fit", "best_fit"):
            # an open bin holds at most num_bins at once, so a lane never needs more memory
            assert n >= 1
    dropped = sum(1 for n in lengths if n == 0 or (n > max_length and not splits))
    assert stats.tombstones == dropped


@SETTINGS
@given(
    lengths=st.lists(st.integers(1, 60), min_size=1, max_size=60),
    algorithm=st.sampled_from(["first_fit", "best_fit", "wrap", "best_fit_wrap"]),
)
def test_pack_sequences_envelopes_hold_the_original_payloads(lengths, algorithm):
    ds = Dataset.from_records("docs", token_rows(lengths, mask=True))
    pipe = (
        Pipeline(ListSource([ds], sequential_pointers([ds]), 5))
        .pack_sequences(40, algorithm=algorithm, candidate_pool_size=4)
        .options(runner="inline", canonical_replicas=2, flush_every_k_chunks=1)
    )
    pieces = defaultdict(list)
    for rec in pipe:
        samples = rec.payload["packed_samples"]
        info = packing(rec)
        assert info["total_length"] == sum(len(s["input_ids"]) for s in samples) <= 40
        assert info["padding_length"] == 0
        for sample, (cursor, start, stop) in zip(samples, info["segments"], strict=True):
            assert sample["id"] == cursor.sample_id[2]
            assert len(sample["loss_mask"]) == len(sample["input_ids"]) == stop - start
            pieces[sample["id"]].append((start, sample))
    for doc, n in enumerate(lengths):
        if n > 40 and algorithm in ("first_fit", "best_fit"):
            assert doc not in pieces
            continue
        got = [s for _, s in sorted(pieces[doc], key=lambda p: p[0])]
        rebuilt = np.concatenate([s["input_ids"] for s in got])
        assert (rebuilt == doc * STRIDE + np.arange(n)).all()
        mask = np.concatenate([s["loss_mask"] for s in got])
        assert (mask == (np.arange(n) % 3 != 0)).all()


def test_aligned_fields_are_packed_alongside_with_zero_padding():
    out, _ = flat([5, 9, 3, 30], chunk=10, replicas=1, max_length=16, mask=True)
    for rec in out:
        tokens, mask = rec.payload["input_ids"], rec.payload["loss_mask"]
        real = tokens >= 0
        assert mask.dtype == np.uint8 and (mask[~real] == 0).all()
        assert ((mask[real] == 1) == ((tokens[real] % STRIDE) % 3 != 0)).all()


def test_best_fit_fills_bins_tighter_than_first_fit():
    rng = np.random.default_rng(3)
    lengths = rng.integers(1, 200, size=600).tolist()
    eff = {}
    for algo in ("first_fit", "best_fit", "best_fit_wrap"):
        out, _ = flat(
            lengths, chunk=600, replicas=1, k=None, max_length=256, algorithm=algo, num_bins=8
        )
        eff[algo] = sum(packing(r)["total_length"] for r in out) / (256 * len(out))
    assert eff["best_fit"] >= eff["first_fit"]
    assert eff["best_fit"] > 0.93
    assert eff["best_fit_wrap"] > 0.99


def test_first_fit_and_best_fit_choose_the_documented_bin():
    # bins after [10, 25]: 22 and 7 tokens free of 32. A 7-token record: first_fit takes
    # the oldest bin (10 used), best_fit the fullest that fits (25 used, closes exactly).
    for algo, expect in (("first_fit", [[0, 2], [1]]), ("best_fit", [[1, 2], [0]])):
        out, _ = flat([10, 25, 7], chunk=3, replicas=1, k=None, algorithm=algo, num_bins=4)
        groups = [[doc_of(c) for c, _, _ in packing(r)["segments"]] for r in out]
        assert sorted(groups) == sorted(expect), algo


def test_flush_strategy_picks_the_evicted_bin():
    # num_bins=2; third record fits nowhere: fifo evicts the oldest bin, fullest the fuller.
    for strategy, first_out in (("fifo", 0), ("fullest", 1)):
        out, _ = flat(
            [20, 25, 30], chunk=3, replicas=1, k=None, num_bins=2, flush_strategy=strategy
        )
        assert doc_of(packing(out[0])["segments"][0][0]) == first_out, strategy


def test_wrap_splits_at_the_window_edge_with_child_lineage():
    out, _ = flat([20, 20, 20], chunk=3, replicas=1, k=None, algorithm="wrap", max_length=32)
    segs = [[(doc_of(c), a, b) for c, a, b in packing(r)["segments"]] for r in out]
    assert segs == [[(0, 0, 20), (1, 0, 12)], [(1, 12, 20), (2, 0, 20)]]
    # the second row starts with a piece of doc 1: its cursor is doc 1's cursor + start 12
    assert out[1].meta.sample_id == (0, 0, 1) and out[1].meta.lineage == (12,)
    refs = {(r.cursor.chunk_offset, r.is_last_child) for r in out[0].meta.contributors}
    assert refs == {(0, True), (1, False)}  # doc 1 closes only with its last piece
    assert {(r.cursor.chunk_offset, r.is_last_child) for r in out[1].meta.contributors} == {
        (1, True),
        (2, True),
    }
    # component counts are charged on the closing segment only
    assert out[0].meta.counts == {0: 1} and out[1].meta.counts == {0: 2}


def test_oversized_records_are_dropped_with_a_warning_or_raise(caplog):
    with caplog.at_level(logging.WARNING, logger="zephon"):
        out, stats = flat([10, 50, 12], replicas=1, k=None, algorithm="best_fit")
    assert stats.tombstones == 1
    assert "50 tokens > max_length=32" in caplog.text
    assert sorted(doc_of(c) for r in out for c, _, _ in packing(r)["segments"]) == [0, 2]
    with pytest.raises(DataError, match=r"record \(0, 0, 1\) has 50 tokens.*drop_oversized"):
        flat([10, 50, 12], replicas=1, k=None, drop_oversized=False)


def test_sentinel_flush_emits_partial_bins_of_that_lane_only():
    # chunk 2, 2 lanes, a sentinel after every chunk: no bin may span two chunks of a lane.
    lengths = [3] * 24
    out, _ = flat(lengths, chunk=2, replicas=2, k=1, max_length=32, algorithm="first_fit")
    for rec in out:
        chunks = {c.chunk_id for c, _, _ in packing(rec)["segments"]}
        assert len(chunks) == 1
        assert packing(rec)["num_sequences"] == 2
    assert len(out) == 12


def test_config_errors_name_the_option():
    ds = Dataset.from_records("d", token_rows([3]))
    pipe = Pipeline(ListSource([ds], [(0, 0, 0)], 1))
    with pytest.raises(ConfigError, match="algorithm must be one of"):
        pipe.pack_flat(16, 0, algorithm="next_fit")
    with pytest.raises(ConfigError, match="min_sequence_length must be in"):
        pipe.pack_flat(16, 0, min_sequence_length=17)
    with pytest.raises(ConfigError, match="pad_token_id must be an int"):
        pipe.pack_flat(16, None)
    with pytest.raises(ConfigError, match="length_fn cannot be combined"):
        pipe.pack_sequences(16, algorithm="wrap", length_fn=len)


def test_missing_token_field_names_the_record():
    ds = Dataset.from_records("d", [{"id": 0, "text": "abc"}])
    pipe = Pipeline(ListSource([ds], [(0, 0, 0)], 1)).pack_flat(16, 0).options(runner="inline")
    with pytest.raises(KeyError, match=r"record \(0, 0, 0\) has none of the token fields"):
        list(pipe)


def test_records_disagreeing_on_aligned_fields_fail_clearly():
    rows = token_rows([4, 4], mask=False)
    rows[1]["loss_mask"] = np.ones(4, dtype=np.uint8)
    ds = Dataset.from_records("d", rows)
    pipe = (
        Pipeline(ListSource([ds], sequential_pointers([ds]), 2))
        .pack_flat(16, 0)
        .options(runner="inline")
    )
    with pytest.raises(DataError, match="disagree on their aligned fields"):
        list(pipe)


def test_packed_records_are_plain_sample_records():
    out, _ = flat([4, 5], replicas=1, k=None)
    assert all(type(r) is SampleRecord for r in out)


# -- what pack_flat reads of a payload (the projection worker stages apply) -----------------


def _record(payload):
    return SampleRecord(SampleMeta((0, 0, 0), 0, 0, 0), payload)


def _payload():
    ids = np.arange(5, dtype=np.int32)
    return {"text": "abcde", "input_ids": ids, "mask": [1, 0, 1, 1, 0], "n": 5, "short": [1]}


def test_pack_flat_projection_keeps_tokens_and_aligned_fields_in_payload_order():
    op = PackFlatOp(16, PAD)
    payload = _payload()
    projected = op.input_projection()(payload)
    assert list(projected) == ["input_ids", "mask"]
    assert op.extract(_record(projected)) == op.extract(_record(payload))


def test_pack_flat_projection_keeps_named_aligned_and_group_fields():
    op = PackFlatOp(16, PAD, aligned_fields=["mask"], homogeneity="group", groups="n")
    projected = op.input_projection()(_payload())
    assert list(projected) == ["input_ids", "mask", "n"]


@pytest.mark.parametrize(
    "kwargs, payload",
    [
        ({"aligned_fields": ["absent"]}, _payload()),  # pack_flat's own error names all fields
        ({"tokens_field": "tokens"}, _payload()),
        ({}, {"text": "no tokens yet"}),
        ({}, {"input_ids": np.arange(3), "mask": [0, 1, 1]}),  # nothing to leave out
    ],
)
def test_pack_flat_projection_returns_what_it_cannot_shrink_as_it_is(kwargs, payload):
    project = PackFlatOp(16, PAD, **kwargs).input_projection()
    assert project(payload) is payload


def test_pack_sequences_reads_whole_payloads():
    assert PackSequencesOp(16).input_projection() is None


@pytest.mark.parametrize("runner", ["threads", "process"])
def test_packing_assembles_bins_on_the_driver_thread(runner):
    """Shipping a bin to a worker and its row back costs the engine more than assembling it."""
    pipe = Pipeline(source([3, 4, 5], 2))
    pipe = pipe.pack_flat(16, PAD, parallelism=4).pack_sequences(32, parallelism=4)
    stages = pipe.options(runner=runner).explain().stages
    assert [(s.op_name, s.runner, s.parallelism) for s in stages[1:3]] == [
        ("pack_flat", "driver", 1),
        ("pack_sequences", "driver", 1),
    ]


def test_every_row_owns_its_positions_and_document_ids():
    """Rows are built from one cached ramp of positions: writing into one row's arrays changes
    neither the next row nor the ramp."""
    out, _ = flat([5, 32, 7, 12, 3], max_length=32)
    first, second = out[0].payload, out[1].payload
    assert first["positions"].dtype == np.int32 and first["document_ids"].dtype == np.int32
    expected = second["positions"].copy()
    first["positions"][:] = -7
    first["document_ids"][:] = -7
    assert (second["positions"] == expected).all()
    again, _ = flat([5, 32, 7, 12, 3], max_length=32)
    assert [r.payload["positions"].tolist() for r in again[1:]] == [
        r.payload["positions"].tolist() for r in out[1:]
    ]
    assert again[0].payload["positions"].min() == 0
