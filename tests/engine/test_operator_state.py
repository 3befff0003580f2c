"""Accumulators with ``state_dict``/``load_state_dict`` restore exactly at any stop point."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.engine import _resume as resume
from tests.engine._dedupe import DedupeOp
from tests.engine._sources import RangeSource
from zephon import Dataset, Pipeline

ROWS = [{"id": i, "text": f"text {(i * 7) % 53}"} for i in range(400)]  # 53 distinct texts


def dedupe(runner: str = "inline", *, remember: bool = True, shuffle: bool = False) -> Pipeline:
    ds = Dataset.from_records("docs", ROWS, shard_size=100)
    pipe = Pipeline(RangeSource([ds], chunk_size=16, replicas=1)).add_op(
        DedupeOp(remember=remember)
    )
    if shuffle:  # an order-changing plan: restores start at epoch boundaries
        pipe = pipe.shuffle(24, seed=5)
    return pipe.options(runner=runner, flush_every_k_chunks=2 if shuffle else None)


def key(record: Any) -> Any:
    return (record.meta.sample_id, record.payload["text"])


def test_uninterrupted_dedupe_delivers_each_text_once():
    got = [key(r) for r in dedupe()]
    assert len(got) == 53 and len({text for _, text in got}) == 53


def test_a_hidden_state_breaks_restore_which_is_what_state_dict_fixes():
    expected = [key(r) for r in dedupe(remember=False)]
    broken = resume.run_with_stops(lambda: dedupe(remember=False), key, [30])
    assert len(broken) > len(expected)  # the seen set was lost: duplicates after the restore
    assert resume.run_with_stops(dedupe, key, [30]) == expected


@pytest.mark.timeout(120)
@pytest.mark.parametrize("shuffle", [False, True], ids=["monotone", "shuffled"])
def test_every_stop_point_restores_exactly_inline(shuffle):
    expected = [key(r) for r in dedupe(shuffle=shuffle)]
    for stop in range(len(expected) + 1):
        got = resume.run_with_stops(lambda: dedupe(shuffle=shuffle), key, [stop])
        assert got == expected, f"stopped after {stop}"


@pytest.mark.timeout(180)
@pytest.mark.parametrize("runner", ["threads", "process"])
@pytest.mark.parametrize("shuffle", [False, True], ids=["monotone", "shuffled"])
def test_stop_points_restore_exactly_on_every_runner(runner, shuffle):
    expected = [key(r) for r in dedupe(shuffle=shuffle)]
    stops = [0, 1, 7, 19, 30, 41, len(expected)]
    assert resume.run_with_stops(lambda: dedupe(runner, shuffle=shuffle), key, stops) == expected


def test_the_checkpoint_holds_the_lane_state_and_stays_small():
    pipe = dedupe()
    it = iter(pipe)
    for _ in range(30):
        next(it)
    state = json.loads(json.dumps(pipe.checkpoint()))
    it.close()
    saved = state["lanes"]["0"]["operator_state"]
    assert list(saved) == ["1"]  # stage 1: the dedupe (stage 0 is fetch)
    # the seen hashes at the start of the restart chunk (chunk 1: records 16..31 of 16 each)
    assert len(saved["1"]) == 16


def test_a_checkpoint_without_the_state_is_refused():
    pipe = dedupe()
    it = iter(pipe)
    next(it)
    state = pipe.checkpoint()
    it.close()
    del state["lanes"]["0"]["operator_state"]
    from zephon.checkpoints import seal

    with pytest.raises(Exception, match="holds no state of operator 'dedupe'"):
        list(dedupe().restore(seal(state)))
