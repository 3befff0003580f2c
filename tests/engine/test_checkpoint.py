"""Checkpoint and restore: uninterrupted == stop + restore, batch for batch."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.engine import _resume as resume
from tests.engine._sources import RangeSource
from zephon import Dataset, Pipeline, StaticMixtureWorkSource, merge_checkpoints
from zephon.checkpoints import seal
from zephon.errors import CheckpointError
from zephon.io import InMemoryShard
from zephon.ops import Accumulator, BaseOp, OpTraits
from zephon.types import SampleBatch, SampleRecord

ROWS = [{"id": i, "text": f"doc {i} " + "abc " * (i % 9)} for i in range(700)]


def keep(payload: dict[str, Any]) -> bool:
    return int(payload["id"]) % 5 != 2


class ReverseGroupsAccumulator(Accumulator):
    """Order-changing on purpose: emits each lane's records in groups of 5, reversed."""

    def __init__(self) -> None:
        self.buf: dict[int, list[Any]] = {}

    def push_many(self, elems):
        out = []
        for e in elems:
            b = self.buf.setdefault(e.meta.lane_id, [])
            b.append(e)
            if len(b) == 5:
                out.append(b[::-1])
                self.buf[e.meta.lane_id] = []
        return out

    def flush(self, *, reset=False, lane_id=None):
        lanes = sorted(self.buf) if lane_id is None else [lane_id]
        return [self.buf.pop(lane)[::-1] for lane in lanes if self.buf.get(lane)]

    def has_pending_data(self, lane_id=None):
        if lane_id is None:
            return any(self.buf.values())
        return bool(self.buf.get(lane_id))


class ReverseGroups(BaseOp):
    name = "reverse_groups"

    def accumulator(self, *, deterministic, ctx):
        return ReverseGroupsAccumulator()

    def traits(self) -> OpTraits:
        return OpTraits(preserves_cursor_order=False)

    def process_many(self, elems):
        return [SampleRecord(e.meta, {**e.payload, "seen": True}) for e in elems]


def build(cfg: dict[str, Any], **options: Any) -> Pipeline:
    ds = Dataset.from_records("docs", ROWS[: cfg["rows"]], shard_size=60)
    pipe = Pipeline(RangeSource([ds], chunk_size=cfg["chunk"])).decode_text()
    if cfg["filter"]:
        pipe = pipe.filter(keep)
    if cfg["reorder"]:
        pipe = pipe.add_op(ReverseGroups())
    pipe = pipe.tokenize("bytes", max_length=12)
    if cfg["batch"]:
        pipe = pipe.batch(cfg["batch"], drop_last=cfg["drop_last"])
    opts = {"canonical_replicas": cfg["replicas"], "flush_every_k_chunks": cfg["k"], **options}
    return pipe.options(**opts)


def key(item: Any) -> Any:
    if isinstance(item, SampleBatch):
        return (
            "B",
            item.lane_id,
            tuple((r.meta.cursor, r.payload["input_ids"].tobytes()) for r in item),
        )
    return ("R", item.meta.cursor, item.payload["input_ids"].tobytes())


def run_with_stops(cfg: dict[str, Any], stops: list[int], **options: Any) -> list[Any]:
    """Consume, checkpoint through JSON, restore in a fresh pipeline, repeat."""
    return resume.run_with_stops(lambda: build(cfg, **options), key, stops)


CONFIGS = st.fixed_dictionaries(
    {
        "rows": st.integers(min_value=1, max_value=300),
        "chunk": st.integers(min_value=1, max_value=40),
        "filter": st.booleans(),
        "reorder": st.booleans(),
        "batch": st.sampled_from([None, 1, 3, 4]),
        "drop_last": st.booleans(),
        "replicas": st.sampled_from([1, 2, 3]),
        "k": st.sampled_from([None, 1, 2, 3]),
    }
)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(CONFIGS, st.lists(st.integers(min_value=0, max_value=120), min_size=1, max_size=3))
def test_uninterrupted_equals_stop_and_restore(cfg, stops):
    reference = [key(x) for x in build(cfg, runner="inline")]
    stops = sorted(min(s, len(reference)) for s in stops)
    got = run_with_stops(cfg, stops, runner="inline")
    assert got == reference


PINNED = [
    # stop inside an epoch of an order-changing plan, with a stalling batch
    (
        {
            "rows": 300,
            "chunk": 7,
            "filter": True,
            "reorder": True,
            "batch": 4,
            "drop_last": True,
            "replicas": 2,
            "k": 2,
        },
        [5, 17, 40],
    ),
    # stop right at the end of a pass
    (
        {
            "rows": 120,
            "chunk": 10,
            "filter": False,
            "reorder": False,
            "batch": 3,
            "drop_last": False,
            "replicas": 3,
            "k": None,
        },
        [13, 40],
    ),
    # records, no batch, sentinels every chunk
    (
        {
            "rows": 200,
            "chunk": 6,
            "filter": True,
            "reorder": True,
            "batch": None,
            "drop_last": True,
            "replicas": 1,
            "k": 1,
        },
        [1, 2, 3, 100],
    ),
]


@pytest.mark.timeout(180)
@pytest.mark.parametrize(("cfg", "stops"), PINNED)
@pytest.mark.parametrize(("runner", "workers"), [("inline", 1), ("threads", 3)])
def test_pinned_restores_for_every_runner(cfg, stops, runner, workers):
    reference = [key(x) for x in build(cfg, runner="inline")]
    got = run_with_stops(cfg, stops, runner=runner, max_inflight=workers)
    assert got == reference


@pytest.mark.timeout(180)
def test_pinned_restore_with_process_runner():
    cfg, stops = PINNED[0]
    reference = [key(x) for x in build(cfg, runner="inline")]
    assert run_with_stops(cfg, stops[1:], runner="process") == reference


def test_checkpoint_size_does_not_grow_with_progress():
    cfg = {
        "rows": 700,
        "chunk": 5,
        "filter": True,
        "reorder": True,
        "batch": 2,
        "drop_last": True,
        "replicas": 2,
        "k": 2,
    }
    pipe = build(cfg, runner="inline")
    sizes = {}
    for n, _ in enumerate(pipe, 1):
        if n in (10, 100, 250):
            sizes[n] = len(json.dumps(pipe.checkpoint()))
    assert max(sizes.values()) - min(sizes.values()) < 40  # only digits of counters change


def lane_streams(items: list[Any]) -> dict[int, list[Any]]:
    streams: dict[int, list[Any]] = {}
    for item in items:
        streams.setdefault(item[1], []).append(item)
    return streams


@pytest.mark.timeout(120)
@pytest.mark.parametrize("old_world", [1, 2, 4])
@pytest.mark.parametrize("new_world", [1, 2, 4])
def test_elastic_restore_across_world_sizes(old_world, new_world):
    cfg = {
        "rows": 400,
        "chunk": 6,
        "filter": True,
        "reorder": True,
        "batch": 3,
        "drop_last": True,
        "replicas": 4,
        "k": 2,
    }
    reference = lane_streams([key(b) for b in build(cfg, runner="inline")])
    states, before = [], []
    for rank in range(old_world):
        pipe = build(cfg, runner="inline", dp_rank=rank, dp_world_size=old_world)
        it = iter(pipe)
        for _ in range(2 * (4 // old_world)):  # every owned lane delivers 2 batches
            before.append(key(next(it)))
        states.append(json.loads(json.dumps(pipe.checkpoint())))
        it.close()  # type: ignore[attr-defined]
    merged = merge_checkpoints(states)
    after = []
    for rank in range(new_world):
        pipe = build(cfg, runner="inline", dp_rank=rank, dp_world_size=new_world)
        pipe.restore(merged)
        after.extend(key(b) for b in pipe)
    got = lane_streams(before + after)
    assert got == reference  # every lane continues exactly: nothing skipped or repeated


def test_restore_refuses_another_configuration():
    cfg = {
        "rows": 50,
        "chunk": 5,
        "filter": False,
        "reorder": False,
        "batch": 2,
        "drop_last": True,
        "replicas": 2,
        "k": None,
    }
    state = build(cfg).checkpoint()
    with pytest.raises(
        CheckpointError,
        match=r"operators\[2\].config.max_length: checkpoint has 12, pipeline has 99",
    ):
        ds = Dataset.from_records("docs", ROWS[:50], shard_size=60)
        (
            Pipeline(RangeSource([ds], 5))
            .decode_text()
            .tokenize("bytes", max_length=99)
            .batch(2)
            .options(canonical_replicas=2)
            .restore(state)
        )
    with pytest.raises(CheckpointError, match="canonical_replicas: checkpoint has 2"):
        build({**cfg, "replicas": 1}).restore(state)


def seeded_pipeline(seed: int) -> Pipeline:
    ds = Dataset.from_records("docs", ROWS[:60], shard_size=20)
    source = StaticMixtureWorkSource([ds], chunk_size=5, seed=seed)
    return Pipeline(source).decode_text().tokenize("bytes").batch(2).options(runner="inline")


def test_restore_after_a_changed_source_setting_names_it_and_what_to_do():
    pipe = seeded_pipeline(7)
    it = iter(pipe)
    for _ in range(3):
        next(it)
    state = pipe.checkpoint()
    with pytest.raises(CheckpointError) as info:
        seeded_pipeline(8).restore(state)
    message = str(info.value)
    assert "source.seed: checkpoint has 7, pipeline has 8" in message
    assert "fingerprint" not in message and "start a new --checkpoint-dir" in message
    assert "\n" not in message


def test_a_changed_operator_setting_gets_the_same_advice():
    state = seeded_pipeline(7).checkpoint()
    ds = Dataset.from_records("docs", ROWS[:60], shard_size=20)
    other = Pipeline(StaticMixtureWorkSource([ds], chunk_size=5, seed=7)).decode_text()
    with pytest.raises(CheckpointError, match=r"pipeline has 99; .*start a new --checkpoint-dir"):
        other.tokenize("bytes", max_length=99).batch(2).options(runner="inline").restore(state)


SMALL_CFG: dict[str, Any] = {
    "rows": 50,
    "chunk": 5,
    "filter": False,
    "reorder": False,
    "batch": None,
    "drop_last": True,
    "replicas": 2,
    "k": None,
}


def test_restore_refuses_corrupt_truncated_and_newer_checkpoints():
    cfg = dict(SMALL_CFG)
    state = json.loads(json.dumps(build(cfg).checkpoint()))
    truncated = {k: v for k, v in state.items() if k != "lanes"}
    with pytest.raises(CheckpointError, match="does not match its checksum"):
        build(cfg).restore(truncated)
    with pytest.raises(CheckpointError, match="missing 'lanes'"):
        build(cfg).restore(seal(truncated))  # sealed again: the structure check still holds
    edited = json.loads(json.dumps(state))
    edited["lanes"]["0"]["delivered"] += 1
    with pytest.raises(CheckpointError, match="edited or damaged after it was written"):
        build(cfg).restore(edited)
    with pytest.raises(CheckpointError, match="has no checksum"):
        build(cfg).restore({k: v for k, v in state.items() if k != "checksum"})
    tampered = json.loads(json.dumps(state))
    tampered["config"]["canonical_replicas"] = 4
    with pytest.raises(CheckpointError, match="does not match its fingerprint"):
        build(cfg).restore(seal(tampered))
    newer = {**state, "version": 99}
    with pytest.raises(CheckpointError, match="version 99 is newer"):
        build(cfg).restore(newer)
    bad_lane = json.loads(json.dumps(state))
    bad_lane["lanes"]["0"]["replay_cursor"] = [1, 2]
    with pytest.raises(CheckpointError, match=r"lanes\[0\].replay_cursor is not a cursor"):
        build(cfg).restore(seal(bad_lane))
    with pytest.raises(CheckpointError, match="not a zephon pipeline checkpoint"):
        build(cfg).restore({"version": 1})


def test_a_version_1_checkpoint_without_checksum_still_restores():
    cfg = dict(SMALL_CFG)
    pipe = build(cfg)
    it = iter(pipe)
    first = [next(it).meta.sample_id for _ in range(7)]
    state = pipe.checkpoint()
    it.close()
    old = {k: v for k, v in state.items() if k != "checksum"} | {"version": 1}
    rest = [r.meta.sample_id for r in build(cfg).restore(old)]
    assert first + rest == [r.meta.sample_id for r in build(cfg)]


def test_restore_needs_every_lane_of_the_rank():
    cfg = {
        "rows": 80,
        "chunk": 5,
        "filter": False,
        "reorder": False,
        "batch": None,
        "drop_last": True,
        "replicas": 4,
        "k": None,
    }
    state = build(cfg, dp_rank=0, dp_world_size=2).checkpoint()
    with pytest.raises(
        CheckpointError, match=r"does not describe lanes \[1, 3\].*merge_checkpoints"
    ):
        build(cfg, dp_rank=1, dp_world_size=2).restore(state)
    with pytest.raises(CheckpointError, match=r"do not cover lanes \[1, 3\]"):
        merge_checkpoints([state])


def test_restore_while_iterating_is_an_error():
    cfg = {
        "rows": 80,
        "chunk": 5,
        "filter": False,
        "reorder": False,
        "batch": None,
        "drop_last": True,
        "replicas": 1,
        "k": None,
    }
    pipe = build(cfg, runner="threads")
    it = iter(pipe)
    next(it)
    state = pipe.checkpoint()
    with pytest.raises(RuntimeError, match="before iterating"):
        pipe.restore(state)
    it.close()  # type: ignore[attr-defined]


class CountingShard(InMemoryShard):
    def __init__(self, rows):
        super().__init__(rows)
        self.reads = 0

    def read(self, indices):
        self.reads += len(indices)
        return super().read(indices)


@pytest.mark.parametrize("reorder", [False, True])
def test_a_finished_lane_is_never_read_again_after_restore(reorder):
    shard = CountingShard(ROWS[:90])
    ds = Dataset("docs", [shard])
    pipe = Pipeline(RangeSource([ds], chunk_size=7)).decode_text()
    if reorder:
        pipe = pipe.add_op(ReverseGroups())
    pipe = pipe.tokenize("bytes").batch(2).options(canonical_replicas=3, runner="inline")
    list(pipe)
    final = json.loads(json.dumps(pipe.checkpoint()))
    assert all(lane["done"] for lane in final["lanes"].values())
    reads = shard.reads
    assert list(pipe.restore(final)) == []
    assert shard.reads == reads  # nothing regenerated for lanes that were finished
    assert all(lane["done"] for lane in pipe.checkpoint()["lanes"].values())


def test_a_version_3_checkpoint_with_the_json_module_checksum_still_restores():
    """Checkpoints written before the msgspec checksum (version 3) restore as they were."""
    import xxhash

    cfg = dict(SMALL_CFG)
    pipe = build(cfg)
    it = iter(pipe)
    first = [next(it).meta.sample_id for _ in range(7)]
    state = json.loads(json.dumps(pipe.checkpoint()))
    it.close()
    old = {k: v for k, v in state.items() if k != "checksum"} | {"version": 3}
    canonical = json.dumps(old, sort_keys=True, separators=(",", ":"))
    old["checksum"] = xxhash.xxh64(canonical.encode()).hexdigest()
    rest = [r.meta.sample_id for r in build(cfg).restore(old)]
    assert first + rest == [r.meta.sample_id for r in build(cfg)]
    old["lanes"]["0"]["delivered"] += 1  # and the old checksum still guards the content
    with pytest.raises(CheckpointError, match="does not match its checksum"):
        build(cfg).restore(old)


def _eight_lanes(seed: int = 3, **opts: Any) -> Pipeline:
    source = StaticMixtureWorkSource(
        [Dataset.from_records("docs", ROWS, shard_size=50)], chunk_size=20, seed=seed
    )
    pipe = Pipeline(source).decode_text().tokenize("bytes").batch(3)
    return pipe.options(canonical_replicas=8, **opts)


def _ids(batches: Any) -> list[str]:
    return sorted(str(b.ids) for b in batches)


def test_each_rank_checkpoint_names_the_source_settings_once_and_restores_on_any_rank_count():
    ranks = [_eight_lanes(dp_rank=r, dp_world_size=2) for r in range(2)]
    iters = [iter(p) for p in ranks]
    for _ in range(4):
        for it in iters:
            next(it)
    states = [json.loads(json.dumps(p.checkpoint())) for p in ranks]
    for rank, state in enumerate(states):
        lanes = state["lanes"]
        assert [k for k, lane in lanes.items() if "config" in lane["source_state"]] == [str(rank)]
        assert len({lane["source_state"]["fingerprint"] for lane in lanes.values()}) == 1
    rest = _ids(b for it in iters for b in it)
    merged = merge_checkpoints(states)
    for world in (1, 4):
        views = [_eight_lanes(dp_rank=r, dp_world_size=world) for r in range(world)]
        assert _ids(b for p in views for b in p.restore(merged)) == rest
    with pytest.raises(CheckpointError, match=r"source\.seed: checkpoint has 3, pipeline has 4"):
        _eight_lanes(seed=4, dp_rank=1, dp_world_size=2).restore(states[1])
