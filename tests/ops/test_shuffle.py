"""Shuffle: a data-derived permutation per flush window, independent of micro-batch sizes."""

from __future__ import annotations

from collections import defaultdict

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.ops._helpers import ListSource, sequential_pointers, token_rows
from zephon import Dataset, Pipeline
from zephon._ops.shuffle import StreamingShuffleAccumulator
from zephon.errors import ConfigError
from zephon.types import SampleMeta, SampleRecord

SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
ALGOS = ["streaming", "block", "block_warmup"]


def rows(n):
    return [{"id": i} for i in range(n)]


def pipe_for(n, chunk, replicas, k, fetch_batch=64, **kw):
    ds = Dataset.from_records("docs", rows(n), shard_size=13)
    return (
        Pipeline(ListSource([ds], sequential_pointers([ds]), chunk))
        .fetch(max_batch=fetch_batch)
        .shuffle(**kw)
        .options(runner="inline", canonical_replicas=replicas, flush_every_k_chunks=k)
    )


def per_lane(records):
    lanes = defaultdict(list)
    for r in records:
        lanes[r.meta.lane_id].append(r)
    return lanes


@SETTINGS
@given(
    n=st.integers(1, 150),
    chunk=st.integers(1, 20),
    replicas=st.integers(1, 3),
    k=st.integers(1, 3),
    buffer_size=st.integers(1, 40),
    algorithm=st.sampled_from(ALGOS),
    seed=st.integers(0, 2**40),
    fetch_batches=st.lists(st.integers(1, 70), min_size=2, max_size=2),
)
def test_permutation_per_flush_window_and_independent_of_micro_batches(
    n, chunk, replicas, k, buffer_size, algorithm, seed, fetch_batches
):
    outs = [
        [
            (r.meta.lane_id, r.meta.cursor)
            for r in pipe_for(
                n, chunk, replicas, k, fb, buffer_size=buffer_size, seed=seed, algorithm=algorithm
            )
        ]
        for fb in fetch_batches
    ]
    assert outs[0] == outs[1]  # micro-batch boundaries upstream change nothing
    delivered = outs[0]
    assert sorted(c.sample_id for _, c in delivered) == sorted(
        (0, i // 13, i % 13) for i in range(n)
    )
    lanes = defaultdict(list)
    for lane, cursor in delivered:
        lanes[lane].append(cursor)
    for cursors in lanes.values():
        windows = [c.chunk_id // k for c in cursors]
        # a sentinel drains the buffer: no record of a later window overtakes an earlier one
        assert windows == sorted(windows)
        if algorithm == "block":
            # every block is a permutation of the corresponding input block
            by_window = defaultdict(list)
            for c in cursors:
                by_window[c.chunk_id // k].append(c)
            for group in by_window.values():
                ordered = sorted(group)
                for i in range(0, len(group), buffer_size):
                    assert sorted(group[i : i + buffer_size]) == ordered[i : i + buffer_size]


def test_shuffle_actually_shuffles_and_depends_on_the_seed():
    base = [r.meta.sample_id for r in pipe_for(300, 300, 1, None, buffer_size=64, seed=1)]
    again = [r.meta.sample_id for r in pipe_for(300, 300, 1, None, buffer_size=64, seed=1)]
    other = [r.meta.sample_id for r in pipe_for(300, 300, 1, None, buffer_size=64, seed=2)]
    assert base == again
    assert base != other
    assert base != sorted(base)
    displaced = sum(1 for i, s in enumerate(base) if s[1] * 13 + s[2] != i)
    assert displaced > 250


def test_block_warmup_starts_with_small_blocks():
    out = [
        r.meta.sample_id
        for r in pipe_for(200, 200, 1, None, buffer_size=64, algorithm="block_warmup")
    ]
    ids = [s[1] * 13 + s[2] for s in out]
    # warm-up block: max(1, min(128, 64 // 16)) = 4 records, then 6, 9, 14, ...
    assert sorted(ids[:4]) == [0, 1, 2, 3]
    assert sorted(ids[4:10]) == list(range(4, 10))
    assert sorted(ids[10:19]) == list(range(10, 19))


def test_streaming_reservoir_is_independent_of_push_grouping():
    recs = [
        SampleRecord(SampleMeta((0, 0, i), lane, i // 10, i % 10), None)
        for i in range(120)
        for lane in (0, 1)
    ]

    def run(group: int) -> list:
        acc = StreamingShuffleAccumulator(16, seed=5)
        out = []
        for phase, part in enumerate((recs[:120], recs[120:])):
            for i in range(0, len(part), group):
                for mb in acc.push_many(part[i : i + group]):
                    out.extend(mb)
            if phase == 0:  # a sentinel of lane 1 only
                for mb in acc.flush(reset=True, lane_id=1):
                    out.extend(mb)
                assert not acc.has_pending_data(1) and acc.has_pending_data(0)
        for mb in acc.flush():
            out.extend(mb)
        return [(r.meta.lane_id, r.meta.sample_id) for r in out]

    one, many = run(1), run(37)
    by_lane = [[s for lane_, s in one if lane_ == lane] for lane in (0, 1)]
    assert by_lane == [[s for lane_, s in many if lane_ == lane] for lane in (0, 1)]
    assert len(one) == 240


@pytest.mark.parametrize("algorithm", ALGOS)
def test_closing_flag_moves_to_the_last_fragment_to_leave(algorithm):
    # wrap-packing splits documents into pieces; the shuffle may reorder the pieces, and the
    # closer (is_last_child) must then be on whichever piece of a document leaves last.
    ds = Dataset.from_records("docs", token_rows([7, 30, 11, 25, 40, 9, 33, 18] * 6))
    pipe = (
        Pipeline(ListSource([ds], sequential_pointers([ds]), 48))
        .pack_sequences(16, algorithm="wrap")
        .shuffle(8, seed=3, algorithm=algorithm)
        .options(runner="inline")
    )
    out = list(pipe)
    last_seen = {}
    closers = defaultdict(list)
    moved = 0
    for pos, rec in enumerate(out):
        for ref in rec.meta.contributors:
            base = (ref.cursor.chunk_id, ref.cursor.chunk_offset)
            last_seen[base] = pos
            if ref.is_last_child:
                closers[base].append(pos)
    for base, pos in last_seen.items():
        assert closers[base] == [pos], base
    for rec in out:
        segs = rec.meta.tags["_packing_metadata"]["segments"]
        for ref, (_, _start, stop) in zip(rec.meta.contributors, segs, strict=True):
            full = stop == [7, 30, 11, 25, 40, 9, 33, 18][ref.cursor.chunk_offset % 8]
            moved += ref.is_last_child != full
    assert moved > 0  # the reordering did happen and flags were moved


def test_config_errors():
    ds = Dataset.from_records("d", rows(3))
    pipe = Pipeline(ListSource([ds], sequential_pointers([ds]), 3))
    with pytest.raises(ConfigError, match="buffer_size must be a positive int"):
        pipe.shuffle(0)
    with pytest.raises(ConfigError, match="algorithm must be 'streaming'"):
        pipe.shuffle(4, algorithm="global")
