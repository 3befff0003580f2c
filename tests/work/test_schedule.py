"""Mixture schedules: the switch lands on its exact sample, survives restores next to it, and
only the future of a schedule may change on resume."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.engine._resume import run_with_stops
from tests.work._helpers import dataset
from zephon import MixtureSchedule, Pipeline, StaticMixtureWorkSource, merge_checkpoints
from zephon.errors import CheckpointError, ConfigError

SWITCH = 1000  # not a multiple of the chunk size


def datasets() -> list[Any]:
    return [dataset("a", [500, 700, 300]), dataset("b", [800, 400])]


def global_ids(source: StaticMixtureWorkSource, n: int) -> np.ndarray:
    parts, total = [], 0
    while total < n and (chunk := source.next_chunk()) is not None:
        parts.append(chunk.pointers)
        total += len(chunk)
    return np.concatenate(parts)[:n]


def source(schedule: MixtureSchedule, **kw: Any) -> StaticMixtureWorkSource:
    return StaticMixtureWorkSource(
        datasets(), schedule, chunk_size=64, exhausted_policy="repeat", max_repeats=1, **kw
    )


def test_switch_is_exact_by_samples():
    sched = MixtureSchedule([(0, {"a": 1.0}), (SWITCH, {"b": 1.0})])
    ids = global_ids(source(sched), 3000)
    assert (ids[:SWITCH, 0] == 0).all() and (ids[SWITCH:, 0] == 1).all()
    ratio = MixtureSchedule([(0, {"a": 0.9, "b": 0.1}), (SWITCH, {"a": 0.6, "b": 0.4})])
    ids = global_ids(source(ratio), 3000)
    assert abs(int((ids[:SWITCH, 0] == 1).sum()) - 100) <= 1
    assert abs(int((ids[SWITCH:, 0] == 1).sum()) - 800) <= 1


def test_token_points_use_the_estimates():
    sched = MixtureSchedule(
        [(0, {"a": 1.0, "b": 1.0}), (20_000, {"b": 1.0})],
        by="tokens",
        tokens_per_sample={"a": 10.0, "b": 30.0},
    )
    ids = global_ids(source(sched), 2000)  # 20 tokens per sample in phase 0
    assert (ids[1000:, 0] == 1).all() and (ids[:1000, 0] == 0).sum() == 500
    unmeasured = source(MixtureSchedule([(0, {"a": 1.0}), (10, {"b": 1.0})], by="tokens"))
    with pytest.raises(ConfigError, match=r"add \.tokenize\(\.\.\.\) to the pipeline"):
        unmeasured.next_chunk()


def test_every_lane_sees_the_same_global_schedule():
    sched = MixtureSchedule([(0, {"a": 1.0}), (SWITCH, {"b": 1.0})])
    whole = source(sched)
    reference = global_ids(whole, 4096)
    lanes = [source(sched).clone_for_lane(k, 3) for k in range(3)]
    seen = {}
    for lane in lanes:
        while (chunk := lane.next_chunk()) is not None and chunk.global_index < 64:
            seen[chunk.global_index] = chunk.pointers
    ordered = np.concatenate([seen[g] for g in sorted(seen)])
    assert np.array_equal(ordered[: len(reference)], reference[: len(ordered)])


def batches_pipe(sched: MixtureSchedule, replicas: int = 1) -> Pipeline:
    return Pipeline(source(sched)).batch(50).options(canonical_replicas=replicas)


def take(pipe: Pipeline, n: int) -> list[Any]:
    out = []
    it = iter(pipe)
    for item in it:
        out.append(item)
        if len(out) >= n:
            break
    it.close()  # type: ignore[attr-defined]
    return out


@pytest.mark.parametrize("replicas", [1, 2])
def test_restore_next_to_the_switch_is_exact(replicas):
    sched = MixtureSchedule([(0, {"a": 1.0}), (SWITCH, {"b": 1.0})])

    def key(batch: Any) -> Any:
        return json.dumps([list(i) for i in batch.ids])

    def build() -> Pipeline:
        return batches_pipe(sched, replicas)

    batches = list(build())
    whole = [key(b) for b in batches]
    step = SWITCH // 50  # the first batch of dataset b (one lane: batches follow the source)
    if replicas == 1:
        components = [{i[0] for i in b.ids} for b in batches]
        assert components[:step] == [{0}] * step and components[step : step + 9] == [{1}] * 9
    for stop in (step - 1, step + 1):
        assert run_with_stops(build, key, [stop]) == whole, stop


def test_future_points_may_change_on_resume_past_ones_may_not():
    first = MixtureSchedule([(0, {"a": 1.0}), (SWITCH, {"b": 1.0})])
    pipe = batches_pipe(first)
    done = take(pipe, 8)  # 400 samples: the checkpoint sits before the switch
    state = json.loads(json.dumps(pipe.checkpoint()))

    later = MixtureSchedule([(0, {"a": 1.0}), (2 * SWITCH, {"b": 1.0})])
    resumed = batches_pipe(later).restore(state)
    rest = [i for b in take(resumed, 40) for i in b.ids]
    components = [i[0] for b in done for i in b.ids] + [i[0] for i in rest]
    assert components.index(1) == 2 * SWITCH  # the moved point is honoured exactly

    for changed in (
        MixtureSchedule([(0, {"a": 1.0}), (100, {"b": 1.0})]),
        MixtureSchedule([(0, {"a": 1.0, "b": 1.0}), (SWITCH, {"b": 1.0})]),
    ):
        with pytest.raises(CheckpointError, match="schedule changed before the checkpoint"):
            list(batches_pipe(changed).restore(state))


def test_schedule_validation():
    with pytest.raises(ConfigError, match="first phase must start at point 0"):
        MixtureSchedule([(5, {"a": 1.0})])
    with pytest.raises(ConfigError, match="points must increase"):
        MixtureSchedule([(0, {"a": 1.0}), (0, {"b": 1.0})])
    with pytest.raises(ConfigError, match="at least one positive weight"):
        MixtureSchedule([(0, {"a": 0.0})])
    with pytest.raises(ConfigError, match="leaves out a dataset"):
        StaticMixtureWorkSource(datasets(), MixtureSchedule([(0, {"a": 1.0, "b": 1.0}),
                                                            (10, {"a": 1.0})]))  # fmt: skip


@pytest.mark.parametrize(("old_world", "new_world"), [(2, 1), (1, 4), (4, 2)])
def test_elastic_resume_keeps_the_schedule(old_world, new_world):
    sched = MixtureSchedule([(0, {"a": 1.0}), (SWITCH, {"b": 1.0})])

    def build(rank: int, world: int) -> Pipeline:
        return (
            Pipeline(source(sched))
            .batch(50)
            .options(runner="inline", canonical_replicas=4, dp_rank=rank, dp_world_size=world)
        )

    def lanes(batches: list[Any]) -> dict[int, list[Any]]:
        out: dict[int, list[Any]] = {}
        for b in batches:
            out.setdefault(b.lane_id, []).append([tuple(i) for i in b.ids])
        return out

    reference = lanes(list(build(0, 1)))
    states, before = [], []
    for rank in range(old_world):
        pipe = build(rank, old_world)
        it = iter(pipe)
        for _ in range(3 * (4 // old_world)):  # every owned lane delivers 3 batches
            before.append(next(it))
        states.append(json.loads(json.dumps(pipe.checkpoint())))
        it.close()  # type: ignore[attr-defined]
    merged = merge_checkpoints(states)
    after = [b for rank in range(new_world) for b in build(rank, new_world).restore(merged)]
    assert lanes(before + after) == reference
    a_ids = {i for batches in reference.values() for ids in batches for i in ids if i[0] == 0}
    assert len(a_ids) == SWITCH  # exactly the first SWITCH samples come from a, on any ranks


@settings(max_examples=40, deadline=None)
@given(
    chunk=st.integers(16, 97),
    gaps=st.lists(st.integers(1, 700), min_size=1, max_size=3),
    weights=st.lists(
        st.fixed_dictionaries({"a": st.integers(0, 3), "b": st.integers(0, 3)}).filter(
            lambda w: any(w.values())
        ),
        min_size=4,
        max_size=4,
    ),
)
def test_every_phase_gets_its_quota_on_its_own_samples(chunk, gaps, weights):
    starts = [0]
    for gap in gaps:
        starts.append(starts[-1] + gap)
    phases = [(s, {k: float(v) for k, v in w.items()}) for s, w in zip(starts, weights)]
    phases[-1] = (phases[-1][0], {"a": 1.0, "b": 1.0})
    sched = MixtureSchedule(phases)
    src = StaticMixtureWorkSource(datasets(), sched, chunk_size=chunk, exhausted_policy="repeat")
    ids = global_ids(src, starts[-1] + 300)[:, 0]
    bounds = [*starts, len(ids)]
    for (start, w), stop in zip(phases, bounds[1:]):
        segment = ids[start:stop]
        total = sum(w.values())
        for k, name in enumerate(("a", "b")):
            expected = w.get(name, 0.0) / total * len(segment)
            assert abs(int((segment == k).sum()) - expected) <= 1, (start, name)
