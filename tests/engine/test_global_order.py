"""Elastic resume keeps global steps: the engine's rule (docs/guarantees.md#elastic-resume),
checked against what real pipelines deliver on 1, 2 and 4 ranks."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

from tests.engine._stateful import REFERENCE_CFG, build, key
from zephon import merge_checkpoints
from zephon._engine.state.global_order import ahead_of_global_order, regrouping


def rank_streams(world: int, steps: int, grad_accum: int, **opts: Any) -> list[list[Any]]:
    """Each rank's first ``steps * grad_accum`` batches."""
    out = []
    for rank in range(world):
        it = iter(build(REFERENCE_CFG, runner="inline", dp_rank=rank, dp_world_size=world, **opts))
        out.append([key(next(it)) for _ in range(steps * grad_accum)])
        it.close()  # type: ignore[attr-defined]
    return out


def global_steps(streams: list[list[Any]], grad_accum: int) -> list[frozenset[Any]]:
    """The set of batches each optimizer step trains on: ``grad_accum`` from every rank."""
    steps = min(len(s) for s in streams) // grad_accum
    return [
        frozenset(b for s in streams for b in s[i * grad_accum : (i + 1) * grad_accum])
        for i in range(steps)
    ]


def saved_at(world: int, batches: int, **opts: Any) -> dict[str, Any]:
    """Every rank takes ``batches`` batches and checkpoints; the merged checkpoint."""
    states = []
    for rank in range(world):
        pipe = build(REFERENCE_CFG, runner="inline", dp_rank=rank, dp_world_size=world, **opts)
        it = iter(pipe)
        for _ in range(batches):
            next(it)
        states.append(json.loads(json.dumps(pipe.checkpoint())))
        it.close()  # type: ignore[attr-defined]
    return merge_checkpoints(states)


def resumed(state: dict[str, Any], world: int, batches: int, **opts: Any) -> list[list[Any]]:
    out = []
    for rank in range(world):
        pipe = build(REFERENCE_CFG, runner="inline", dp_rank=rank, dp_world_size=world, **opts)
        it = iter(pipe.restore(state))
        out.append([key(next(it)) for _ in range(batches)])
        it.close()  # type: ignore[attr-defined]
    return out


def zephon_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name.startswith("zephon")]


@pytest.mark.timeout(120)
def test_the_default_mapping_keeps_every_later_step_across_rank_counts(caplog):
    # 2 ranks x grad-accum 1 over 4 lanes, checkpoint after step 3: lanes 0 and 1 are ahead
    reference = global_steps(rank_streams(2, 9, 1), 1)
    state = saved_at(2, 3)
    with caplog.at_level(logging.WARNING, logger="zephon"):
        one = global_steps(resumed(state, 1, 12), 2)  # 1 rank x grad-accum 2
        four = global_steps(resumed(state, 4, 3), 1)  # 4 ranks: steps of 4 batches
    assert one == reference[3:9]
    assert four == [reference[3 + 2 * i] | reference[4 + 2 * i] for i in range(3)]
    assert zephon_warnings(caplog) == []  # nothing is regrouped, so nothing is said


@pytest.mark.timeout(120)
def test_four_ranks_resume_on_two_with_the_same_global_batch(caplog):
    reference = global_steps(rank_streams(4, 6, 1), 1)  # 4 ranks x grad-accum 1
    with caplog.at_level(logging.WARNING, logger="zephon"):
        two = global_steps(resumed(saved_at(4, 3), 2, 6), 2)  # 2 ranks x grad-accum 2
    assert two == reference[3:6]
    assert zephon_warnings(caplog) == []


@pytest.mark.timeout(120)
def test_contiguous_lanes_regroup_the_steps_and_the_restore_says_so(caplog):
    reference = global_steps(rank_streams(2, 9, 1, mapping="contiguous"), 1)
    state = saved_at(2, 3, mapping="contiguous")
    with caplog.at_level(logging.WARNING, logger="zephon"):
        one = global_steps(resumed(state, 1, 12, mapping="contiguous"), 2)
    kept = sum(a == b for a, b in zip(one, reference[3:9], strict=True))
    assert kept == 0  # every later step is grouped differently
    [warning] = set(zephon_warnings(caplog))
    assert "the checkpoint was taken on 2 ranks with mapping='contiguous'" in warning
    assert "every later global step is regrouped" in warning
    assert "multiple of 2 batches" in warning and "mapping='interleaved'" in warning


def test_ranks_checkpointed_at_different_steps_regroup_every_later_step(caplog):
    first = saved_at(2, 3)
    second = saved_at(2, 4)
    ranks = [json.loads(json.dumps(s)) for s in (first, second)]
    for lane in ("1", "3"):  # rank 1 of 2 owns lanes 1 and 3: it went one step further
        ranks[0]["lanes"][lane] = ranks[1]["lanes"][lane]
    from zephon.checkpoints import seal

    state = seal(ranks[0])
    with caplog.at_level(logging.WARNING, logger="zephon"):
        resumed(state, 1, 1)
    [warning] = zephon_warnings(caplog)
    assert "lanes [3] are ahead of the global order" in warning
    assert "0: 2, 1: 2, 2: 1, 3: 2" in warning
    assert "every later global step is regrouped" in warning


def test_the_same_layout_never_warns():
    world = {"dp_world_size": 2, "mapping": "contiguous"}
    assert regrouping(world, {0: 2, 1: 1, 2: 2, 3: 1}, 4, 2, "contiguous") is None


def test_one_lane_per_rank_is_the_global_order_under_either_mapping():
    counts = {0: 2, 1: 2, 2: 1, 3: 1}
    assert (
        regrouping({"dp_world_size": 4, "mapping": "contiguous"}, counts, 4, 2, "interleaved")
        is None
    )
    assert (
        regrouping({"dp_world_size": 2, "mapping": "interleaved"}, counts, 4, 4, "contiguous")
        is None
    )


def test_a_contiguous_restore_names_the_condition():
    why = regrouping({}, {0: 1, 1: 1, 2: 1, 3: 1}, 8, 2, "contiguous")
    assert why is not None and "this restore runs on 2 ranks" in why
    assert "multiple of 4 batches" in why


@pytest.mark.parametrize(
    ("counts", "ahead"),
    [
        ({0: 3, 1: 3, 2: 3, 3: 3}, []),
        ({0: 4, 1: 4, 2: 3, 3: 3}, []),  # a prefix: the first lanes one ahead
        ({0: 4, 1: 3, 2: 4, 3: 3}, [2]),
        ({0: 5, 1: 3, 2: 3, 3: 3}, [0]),  # two ahead
        ({1: 4, 3: 3}, []),  # lanes 0 and 2 ended
        ({}, []),
    ],
)
def test_the_global_order_prefix(counts, ahead):
    assert ahead_of_global_order(counts) == ahead
