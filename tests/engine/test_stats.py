from __future__ import annotations

import logging

import pytest

from tests.engine._sources import RangeSource
from zephon import Dataset, Pipeline
from zephon._engine.stats import RunStats

ROWS = [{"id": i, "text": f"row {i} " * (1 + i % 3)} for i in range(300)]


def build(**options) -> Pipeline:
    ds = Dataset.from_records("rows", ROWS, shard_size=40)
    return (
        Pipeline(RangeSource([ds], chunk_size=16))
        .decode_text()
        .filter(lambda p: "7" not in p["text"])
        .tokenize("bytes", parallelism=2)
        .batch(4)
        .options(canonical_replicas=2, **options)
    )


@pytest.mark.parametrize("runner", ["inline", "threads"])
def test_stats_count_operators_and_lanes(runner):
    pipe = build(runner=runner)
    batches = list(pipe)
    stats = pipe.stats()
    assert stats is not None
    by_name = {op.name: op for op in stats.operators}
    assert list(by_name) == ["fetch", "decode_text", "filter", "tokenize", "replay_filter", "batch"]
    assert by_name["fetch"].elements_in == len(ROWS)
    assert by_name["decode_text"].elements_in == len(ROWS)
    kept = sum(1 for r in ROWS if "7" not in str(r["id"]))
    assert by_name["filter"].elements_out == len(ROWS)  # kept records plus tombstones
    assert by_name["tokenize"].elements_in == kept
    assert by_name["batch"].elements_out == len(batches)
    assert by_name["tokenize"].worker_ns > 0 and by_name["tokenize"].micro_batches > 0
    assert by_name["fetch"].accumulator_ns > 0
    assert stats.delivered == len(batches)
    assert sum(lp.delivered for lp in stats.lanes.values()) == len(batches)
    assert all(lp.finished for lp in stats.lanes.values())
    assert stats.tombstones == len(ROWS) - 4 * len(batches)
    assert stats.items_per_s > 0


def test_stats_are_live_during_iteration():
    pipe = build(runner="threads")
    it = iter(pipe)
    next(it)
    next(it)
    live = pipe.stats()
    assert live is not None and live.delivered == 2
    assert sum(lp.delivered for lp in live.lanes.values()) == 2
    it.close()  # type: ignore[attr-defined]


@pytest.mark.parametrize("runner", ["inline", "threads", "process"])
def test_samples_done_counts_each_source_sample_once_where_items_are_delivered(runner):
    ds = Dataset.from_records("rows", ROWS, shard_size=40)
    pipe = (
        Pipeline(RangeSource([ds], chunk_size=16))
        .decode_text()
        .filter(lambda p: "7" not in p["text"])  # dropped: done too
        .tokenize("bytes", max_length=6, split_long_samples=True)  # one sample, many rows
        .shuffle(buffer_size=64, seed=1)  # holds records it has read, not done yet
        .pack_flat(max_length=16, pad_token_id=0)  # many samples, one row
        .batch(2)
        .options(canonical_replicas=2, runner=runner)
    )
    it = iter(pipe)
    next(it)
    early = pipe.stats()
    assert early is not None and early.samples_done < 64 <= early.samples_read
    rest = sum(1 for _ in it)
    stats = pipe.stats()
    assert rest > 0 and stats is not None and stats.samples_done == len(ROWS)
    assert stats.to_dict()["samples_done"] == len(ROWS)


def _dropping(runner: str, shuffle: bool) -> Pipeline:
    """Drops among held rows: a filter's tombstones overtake the rows ``batch`` (and the
    shuffle) hold, and come before earlier rows."""
    ds = Dataset.from_records("rows", ROWS, shard_size=40)
    pipe = Pipeline(RangeSource([ds], chunk_size=16)).decode_text()
    if shuffle:
        pipe = pipe.shuffle(buffer_size=24, seed=3)
    return (
        pipe.filter(lambda p: "7" not in p["text"])
        .tokenize("bytes")
        .batch(4, drop_last=False)
        .options(canonical_replicas=2, runner=runner)
    )


@pytest.mark.parametrize(("runner", "shuffle"), [("inline", False), ("threads", True)])
def test_samples_done_at_a_checkpoint_plus_the_resumed_run_count_every_sample_once(runner, shuffle):
    total = sum(1 for _ in _dropping("inline", shuffle))
    for stop in range(1, total, 3):
        pipe = _dropping(runner, shuffle)
        it = iter(pipe)
        for _ in range(stop):
            next(it)
        state = pipe.checkpoint()
        before = pipe.stats()
        it.close()  # type: ignore[attr-defined]
        resumed = _dropping(runner, shuffle).restore(state)
        rest = sum(1 for _ in resumed)
        after = resumed.stats()
        assert before is not None and after is not None and rest == total - stop
        # a drop counts once a restore starts after it, not when it reaches the tail
        assert before.samples_done + after.samples_done == len(ROWS), stop


def test_stats_can_be_turned_off():
    pipe = build(runner="threads", track_stats=False)
    n = sum(1 for _ in pipe)
    stats = pipe.stats()
    assert stats is not None and stats.delivered == n and stats.operators == []


def test_prometheus_text_and_log_line(caplog):
    pipe = build(runner="inline", log_every_s=1e-9)
    with caplog.at_level(logging.INFO, logger="zephon"):
        list(pipe)
    assert "items in" in caplog.text and "samples read" in caplog.text
    stats = pipe.stats()
    assert stats is not None
    text = stats.to_prometheus()
    assert f"zephon_pipeline_delivered_total {stats.delivered}" in text
    assert 'zephon_pipeline_op_elements_in_total{op="fetch"} 300' in text
    assert 'zephon_pipeline_lane_delivered_total{lane="1"}' in text


def _no_seven(payload: dict[str, object]) -> bool:
    return "7" not in str(payload["text"])


def dropping(**options) -> Pipeline:
    """Tombstones with reasons and tokens (filter, drop_last), cut notes (truncation),
    flush sentinels and snapshot markers (shuffle and pack), all made by workers."""
    ds = Dataset.from_records("rows", ROWS, shard_size=40)
    return (
        Pipeline(RangeSource([ds], chunk_size=16))
        .decode_text(parallelism=2)
        .filter(_no_seven, parallelism=2)
        .tokenize("bytes", max_length=20, parallelism=2)
        .shuffle(16, seed=3)
        .pack_flat(24, pad_token_id=0, drop_oversized=True)
        .batch(3, drop_last=True)
        .options(canonical_replicas=2, **options)
    )


@pytest.mark.parametrize(
    "options",
    [
        {"runner": "threads"},
        {"runner": "process"},
        {"runner": "threads", "engine_process": True},
    ],
)
def test_control_records_cross_threads_and_processes_intact(options):
    """Every drop is counted the same wherever the control records were made and pickled."""
    expected = build_and_count(runner="inline")
    assert expected[1]["records"] > 0 and expected[1]["cut_records"] > 0
    assert set(expected[1]["by_reason"]) == {"filtered", "drop_last"}
    assert build_and_count(**options) == expected


def build_and_count(**options) -> tuple[list[list[tuple[int, int, int]]], dict, int]:
    pipe = dropping(**options)
    batches = [b.ids for b in pipe]
    stats = pipe.stats()
    assert stats is not None
    return batches, stats.to_dict()["dropped"], stats.tombstones


def test_prometheus_text_has_the_mixture_with_escaped_dataset_names():
    from zephon.work import MixtureStats

    target = MixtureStats.target(['a "b"', "c"], {'a "b"': 0.5, "c": 0.5}, "tokens")
    text = RunStats(mixture=target.counted([1, 3], [30, 10])).to_prometheus()
    assert 'zephon_pipeline_mixture_weight{dataset="a \\"b\\"",unit="tokens"} 0.5\n' in text
    assert 'zephon_pipeline_mixture_samples_total{dataset="c"} 3\n' in text
    assert 'zephon_pipeline_mixture_token_share{dataset="c"} 0.25\n' in text
    assert "_share{" not in RunStats(mixture=target).to_prometheus()  # nothing delivered yet
