"""Aligned snapshots: a restore starts at the newest delivered cut, not at the last flush."""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.engine import _resume as resume
from tests.engine._dedupe import DedupeOp
from zephon import Dataset, MixtureSpec, Pipeline, StaticMixtureWorkSource
from zephon._engine.plan.compile import compile as compile_run
from zephon._engine.state.snapshots import Role
from zephon._engine.state.stage import MarkerMode
from zephon._snapshot_codec import pack_state, unpack_state
from zephon.checkpoints import refetch_counts, seal
from zephon.errors import CheckpointError
from zephon.ops import Rebuild
from zephon.types import SampleBatch

TEXTS = [{"id": i, "text": "alpha beta " * (1 + i % 7) + f"doc {i}"} for i in range(420)]
OTHER = [{"id": 1000 + i, "text": "gamma " * (1 + i % 3)} for i in range(260)]
RECORD_STATES = ("3", "4", "5")  # pack_flat, shuffle, ensure_mixture in the configuration


def build(
    algorithm: str = "best_fit",
    *,
    shuffle: str = "streaming",
    every: int = 1,
    records: int | None = None,
    weight_by: Any = "samples",
    **options: Any,
) -> Pipeline:
    source = StaticMixtureWorkSource(
        [
            Dataset.from_records("a", TEXTS, shard_size=50),
            Dataset.from_records("b", OTHER, shard_size=40),
        ],
        mixture=MixtureSpec({"a": 0.6, "b": 0.4}),
        chunk_size=32,
        seed=2,
    )
    opts = {
        "runner": "inline",
        "canonical_replicas": 2,
        "flush_every_k_chunks": 4,
        "snapshot_every_chunks": every,
        "snapshot_every_records": records,
        **options,
    }
    return (
        Pipeline(source)
        .decode_text()
        .tokenize("bytes", max_length=48)
        .pack_flat(64, 0, num_bins=4, algorithm=algorithm)  # type: ignore[arg-type]
        .shuffle(24, seed=4, algorithm=shuffle)  # type: ignore[arg-type]
        .ensure_mixture(max_buffer_size=16, weight_by=weight_by)
        .batch(3)
        .options(**opts)
    )


def key(batch: Any) -> Any:
    assert isinstance(batch, SampleBatch)
    return [(r.meta.cursor, r.payload["input_ids"].tobytes()) for r in batch.records]


@pytest.fixture(scope="module")
def reference() -> list[Any]:
    return [key(b) for b in build(every=0)]


def checkpoint_after(pipe: Pipeline, n: int) -> dict[str, Any]:
    it = iter(pipe)
    for _ in range(n):
        next(it)
    state = json.loads(json.dumps(pipe.checkpoint()))
    it.close()  # type: ignore[attr-defined]
    return state


@pytest.mark.parametrize("records", [None, 5])
@pytest.mark.parametrize("every", [1, 3])
def test_snapshot_settings_never_change_the_output(reference, every, records):
    assert [key(b) for b in build(every=every, records=records)] == reference
    threads = build(every=every, records=records, runner="threads", max_inflight=3)
    assert [key(b) for b in threads] == reference


@pytest.mark.parametrize("algorithm", ["first_fit", "best_fit", "wrap", "best_fit_wrap"])
def test_every_stop_point_restores_exactly(algorithm):
    full = [key(b) for b in build(algorithm)]
    for stop in range(1, len(full), 2):
        got = resume.run_with_stops(lambda: build(algorithm, records=7), key, [stop])
        assert got == full, f"stop {stop}"


@pytest.mark.parametrize("runner", ["inline", "threads", "process"])
def test_restore_again_and_again_on_every_runner(reference, runner):
    stops = [1, 2, 9, 10, 11, 30, 31, 58] if runner != "process" else [9, 31]
    got = resume.run_with_stops(lambda: build(runner=runner, records=6), key, stops)
    assert got == reference


def test_restore_with_the_engine_in_a_child_process(reference):
    """Positions travel with every item; buffer states only when a newer snapshot is passed."""
    got = resume.run_with_stops(lambda: build(engine_process=True, records=6), key, [9, 31])
    assert got == reference


@pytest.mark.parametrize(("taken", "restored"), [(12, 5), (5, 12), (12, None)])
def test_a_checkpoint_restores_exactly_under_another_snapshot_interval(reference, taken, restored):
    """The interval is no part of the configuration: a checkpoint taken with one interval
    restores exactly under another, the default included."""
    offsets = set()
    for stop in (7, 20, 33, 46):
        state = checkpoint_after(build(records=taken), stop)
        offsets.update(lane.get("start_offset", 0) for lane in state["lanes"].values())
        assert [key(b) for b in build(records=restored).restore(state)] == reference[stop:]
    assert offsets - {0}, "no checkpoint restarted inside a chunk"


def test_a_mid_epoch_checkpoint_restarts_at_the_snapshot_with_records_by_meta(reference):
    state = checkpoint_after(build(records=8), 20)
    lane = state["lanes"]["0"]
    k = state["config"]["flush_every_k_chunks"]
    assert (lane["start_chunk_id"], lane.get("start_offset", 0)) > (
        lane["start_chunk_id"] // k * k,
        0,
    ), "the restart point must be newer than the last flush"
    text = json.dumps({k: unpack_state(v) for k, v in lane["operator_state"].items()})
    assert "$zrec" in text and "input_ids" not in text  # records by meta, never payloads
    counts = refetch_counts(state)
    assert 0 < counts[0] <= len(TEXTS) + len(OTHER)
    restored = [key(b) for b in build(records=8).restore(state)]
    assert restored == reference[20:]


def test_a_restore_reads_far_less_than_an_epoch_replay():
    """Records the source hands out between restore and the first batch: snapshot vs replay."""

    def read_to_first_batch(every: int, stop: int) -> int:
        state = checkpoint_after(build(every=every, records=4), stop)
        pipe = build(every=every, records=4).restore(state)
        it = iter(pipe)
        next(it)
        stats = pipe.stats()
        it.close()  # type: ignore[attr-defined]
        assert stats is not None
        return stats.samples_read

    # 38 batches in: late in an epoch, where a replay from the flush is longest
    assert 3 * read_to_first_batch(1, 38) < read_to_first_batch(0, 38)


def full(batch: Any) -> Any:
    """Every record's whole meta (tags, packing metadata, contributors) and its tokens."""
    assert isinstance(batch, SampleBatch)
    return [(r.meta, r.payload["input_ids"].tobytes()) for r in batch.records]


@pytest.mark.parametrize("runner", ["inline", "threads"])
def test_restored_records_keep_every_tag_exactly(runner):
    """Restored records' packing metadata is decoded late, when their payload is rebuilt:
    what reaches the consumer, and what a later checkpoint saves, is still exact."""
    expected = [full(b) for b in build(every=0, runner=runner)]
    got = resume.run_with_stops(lambda: build(records=4, runner=runner), full, [13, 14, 38])
    assert got == expected


def weigh_one(payload: Any) -> float:
    return 1.0


def refetched_to_first_batch(weight_by: Any, stop: int) -> tuple[int, int]:
    """Source records a restore re-read until its first batch, and those its state names."""
    reference = [key(b) for b in build(every=0, weight_by=weight_by)]
    state = checkpoint_after(build(records=4, weight_by=weight_by), stop)
    pipe = build(records=4, weight_by=weight_by).restore(state)
    it = iter(pipe)
    first = key(next(it))
    stats = pipe.stats()
    assert stats is not None
    refetched = stats.samples_refetched
    assert [first, *(key(b) for b in it)] == reference[stop:]
    return refetched, sum(refetch_counts(state).values())


def test_restored_records_are_rebuilt_only_where_a_payload_is_read():
    """Shuffled records that the mixture corrector queues by meta, or the replay filter drops,
    get no payload until the batch reads one; a corrector that weighs payloads reads them."""
    by_meta, named = refetched_to_first_batch("samples", 38)
    by_payload, _ = refetched_to_first_batch(weigh_one, 38)
    assert 0 < by_meta < named / 2
    assert by_meta < by_payload


def as_version_2(state: dict[str, Any]) -> dict[str, Any]:
    """The checkpoint as the previous format wrote it: no buffer states, restart at a flush."""
    old = json.loads(json.dumps(state))
    old["version"] = 2
    for lane in old["lanes"].values():
        for key_ in RECORD_STATES:
            (lane.get("operator_state") or {}).pop(key_, None)
    return seal(old)


def test_a_version_2_checkpoint_still_restores_by_replay(reference):
    state = checkpoint_after(build(every=0), 25)
    assert all(lane.get("start_offset", 0) == 0 for lane in state["lanes"].values())
    restored = [key(b) for b in build().restore(as_version_2(state))]
    assert restored == reference[25:]


def test_a_version_2_checkpoint_cut_inside_an_epoch_is_refused_without_its_state():
    state = checkpoint_after(build(records=8), 20)
    with pytest.raises(CheckpointError, match="holds no state of operator 'pack_flat'"):
        list(build(records=8).restore(as_version_2(state)))


def test_damaged_record_state_is_refused_with_a_clear_error():
    state = checkpoint_after(build(records=8), 20)
    saved = {k: unpack_state(v) for k, v in state["lanes"]["0"]["operator_state"].items()}
    key_ = next(k for k in RECORD_STATES if "$zrec" in json.dumps(saved[k]))
    # the first named record now points into a dataset the source does not have
    text = re.sub(r'"\$zrec": \[\[\d+', '"$zrec": [[7', json.dumps(saved[key_]), count=1)
    state["lanes"]["0"]["operator_state"][key_] = pack_state(json.loads(text))
    with pytest.raises(CheckpointError, match=r"could not be rebuilt .*IndexError"):
        list(build(records=8).restore(seal(state)))


def test_a_plan_that_cannot_snapshot_says_why_and_restores_from_the_flush(reference):
    pipe = build(shuffle="block")
    assert "snapshots off" in str(pipe.explain()) and "'shuffle'" in str(pipe.explain())
    full = [key(b) for b in build(shuffle="block")]
    state = checkpoint_after(build(shuffle="block"), 20)
    k = state["config"]["flush_every_k_chunks"]
    assert all(lane["start_chunk_id"] % k == 0 for lane in state["lanes"].values())
    assert [key(b) for b in build(shuffle="block").restore(state)] == full[20:]
    assert "snapshots every 1 chunk" in str(build().explain())


# -- checkpoints with held payloads --------------------------------------------------------


def taken(pipe: Pipeline, n: int, *, held_records: bool) -> dict[str, Any]:
    it = iter(pipe)
    for _ in range(n):
        next(it)
    state = json.loads(json.dumps(pipe.checkpoint(held_records=held_records)))
    it.close()  # type: ignore[attr-defined]
    return state


def rest_of(state: dict[str, Any], **options: Any) -> tuple[list[Any], Any]:
    """Every batch after restoring ``state``, and the run's statistics."""
    pipe = build(records=6, **options).restore(state)
    out = [key(b) for b in pipe]
    return out, pipe.stats()


@pytest.mark.parametrize("runner", ["inline", "threads", "process"])
def test_held_records_restore_exactly_on_every_runner(reference, runner):
    """Stops at many points, a stop repeated (a restored pipeline checkpointed before it runs
    passes the held payloads on), each restored from a checkpoint with held payloads."""
    stops = [1, 2, 2, 9, 10, 31, 58] if runner != "process" else [9, 9, 31]
    got = resume.run_with_stops(
        lambda: build(runner=runner, records=6), key, stops, held_records=True
    )
    assert got == reference


@pytest.mark.parametrize("stop", [7, 20, 33, 46])
def test_held_records_are_read_back_not_fetched_again(reference, stop):
    """The same batches as the checkpoint without payloads restores, with no record fetched
    again for the open state."""
    held = taken(build(records=6), stop, held_records=True)
    lean = taken(build(records=6), stop, held_records=False)
    assert (held["version"], lean["version"]) == (5, 4)
    assert set(refetch_counts(held).values()) == {0} and sum(refetch_counts(lean).values()) > 0
    for lane in held["lanes"].values():
        text = json.dumps({k: unpack_state(v) for k, v in lane["operator_state"].items()})
        assert "$zrp" in text and "$zrec" not in text  # every held record with its payload
    got_held, stats_held = rest_of(held)
    got_lean, stats_lean = rest_of(lean)
    assert got_held == got_lean == reference[stop:]
    assert stats_held.samples_refetched == 0 < stats_lean.samples_refetched
    assert stats_held.samples_read == stats_lean.samples_read  # the replay, the same both ways


def test_held_records_with_the_engine_in_a_child_process_are_written_by_meta(reference):
    """The child sends operator states by meta: such a checkpoint rebuilds its records."""
    state = taken(build(records=6, engine_process=True), 20, held_records=True)
    assert state["version"] == 4
    assert sum(refetch_counts(state).values()) > 0
    assert rest_of(state)[0] == reference[20:]


@pytest.mark.parametrize("after", [0, 1, 3])
def test_a_held_checkpoint_after_a_lean_restore_restores_exactly(reference, after):
    """Records restored by meta get their payloads only as they leave: a checkpoint with
    held payloads taken before then writes those still waiting by meta, the others whole
    (before the first batch, it is the restored checkpoint itself)."""
    lean = taken(build(records=6), 20, held_records=False)
    pipe = build(records=6).restore(lean)
    it = iter(pipe)
    seen = [key(next(it)) for _ in range(after)]
    held = json.loads(json.dumps(pipe.checkpoint(held_records=True)))
    it.close()  # type: ignore[attr-defined]
    text = json.dumps([unpack_state(v) for lane in held["lanes"].values()
                       for v in lane["operator_state"].values()])  # fmt: skip
    assert ("$zrp" in text, held["version"]) == ((False, 4) if after == 0 else (True, 5))
    assert seen + rest_of(held)[0] == reference[20:]


# -- a stateful operator before a buffer -----------------------------------------------------

FLUSH_FIXTURE = "dedupe-before-shuffle-flush.json"  # written at 25 batches
DUPLICATED = [{"id": i, "text": "delta " * (1 + i % 5) + f"doc {i % 97}"} for i in range(400)]


def dedupe_before_shuffle(rebuild: Rebuild | None, **options: Any) -> Pipeline:
    """The docs' dedupe (lane state, tombstones for repeats) ahead of packing and shuffle."""
    source = StaticMixtureWorkSource(
        [Dataset.from_records("d", DUPLICATED, shard_size=50)], chunk_size=32, seed=3
    )
    opts = {
        "runner": "inline",
        "canonical_replicas": 2,
        "flush_every_k_chunks": 4,
        "snapshot_every_records": 6,
        **options,
    }
    return (
        Pipeline(source)
        .decode_text()
        .add_op(DedupeOp(rebuild=rebuild))
        .tokenize("bytes", max_length=48)
        .pack_flat(64, 0, num_bins=4)
        .shuffle(24, seed=4)
        .batch(3)
        .options(**opts)
    )


def test_a_stateful_operator_declaring_its_rebuild_keeps_snapshots_before_a_buffer():
    """``rebuild=UNCHANGED`` is trusted: the restart point is a snapshot, not the last flush,
    and a restore at every other stop point gives exactly the uninterrupted run."""
    build_it = functools.partial(dedupe_before_shuffle, Rebuild.UNCHANGED)
    assert "snapshots every 1 chunk and every 6 records" in str(build_it().explain())
    full = [key(b) for b in build_it()]
    assert len(full) > 40
    state = checkpoint_after(build_it(), 25)
    k = state["config"]["flush_every_k_chunks"]
    starts = [
        (lane["start_chunk_id"], lane.get("start_offset", 0)) for lane in state["lanes"].values()
    ]
    assert any(start != (start[0] // k * k, 0) for start in starts), "restarted at the flush"
    assert [key(b) for b in build_it().restore(state)] == full[25:]
    stops = list(range(1, len(full), 3))
    assert resume.run_with_stops(build_it, key, stops) == full
    assert resume.run_with_stops(build_it, key, stops[::4], held_records=True) == full


def test_a_stateful_operator_without_a_rebuild_trait_before_a_buffer_is_named():
    """Its output depends on state a rebuild does not replay: explain() names it, the buffer
    and the fix, and a restore replays from the last flush, exactly."""
    pipe = dedupe_before_shuffle(None)
    note = str(pipe.explain())
    assert (
        "snapshots off (stateful operator 'dedupe' feeds the buffering operator 'pack_flat'" in note
    )
    assert "OpTraits(rebuild=Rebuild.UNCHANGED)" in note
    full = [key(b) for b in dedupe_before_shuffle(None)]
    state = checkpoint_after(dedupe_before_shuffle(None), 25)
    k = state["config"]["flush_every_k_chunks"]
    assert all(lane["start_chunk_id"] % k == 0 for lane in state["lanes"].values())
    assert all(lane.get("start_offset", 0) == 0 for lane in state["lanes"].values())
    assert [key(b) for b in dedupe_before_shuffle(None).restore(state)] == full[25:]


def test_a_checkpoint_taken_while_that_rule_turned_snapshots_off_restores_exactly():
    """The fixture was written by the release whose planner turned snapshots off for this plan
    (it restarts at the last flush); the plan that keeps snapshots restores it exactly."""
    saved = json.loads((Path(__file__).with_name("fixtures") / FLUSH_FIXTURE).read_text())
    assert all(lane["start_chunk_id"] == 0 for lane in saved["lanes"].values())
    full = [key(b) for b in dedupe_before_shuffle(Rebuild.UNCHANGED)]
    restored = [key(b) for b in dedupe_before_shuffle(Rebuild.UNCHANGED).restore(saved)]
    assert restored == full[25:]


def test_each_stage_has_a_rebuild_role_and_a_marker_mode_with_snapshots_or_without():
    """Roles come from declared traits (derived only without one); modes only with snapshots."""
    pipe = dedupe_before_shuffle(Rebuild.UNCHANGED)
    run = compile_run(pipe.work_source, pipe._all_specs(), pipe._options)
    names = [s.op.name for s in run.specs]
    plan = run.snapshot_plan
    by_name = dict(zip(names, zip(plan.roles, plan.modes, strict=True), strict=True))
    assert by_name["dedupe"] == (Role.UNCHANGED, MarkerMode.SNAPSHOT)
    assert by_name["tokenize"] == (Role.RERUN, MarkerMode.FLUSH)
    assert by_name["pack_flat"] == (Role.REASSEMBLE, MarkerMode.SNAPSHOT)
    assert by_name["replay_filter"] == (Role.UNCHANGED, MarkerMode.REPLAY)
    off = dedupe_before_shuffle(None, snapshot_every_chunks=0)
    plan = compile_run(off.work_source, off._all_specs(), off._options).snapshot_plan
    assert (plan.enabled, plan.modes) == (False, [])
    assert plan.roles[names.index("dedupe")] is Role.STATEFUL
