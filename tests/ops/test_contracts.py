"""The runner enforces the sentinel contract; stalling stays per lane and drops nothing early."""

from __future__ import annotations

from collections import defaultdict

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.ops._helpers import PAD, ListSource, packing, sequential_pointers, token_rows
from zephon import Dataset, Pipeline
from zephon.errors import ContractError
from zephon.ops import Accumulator, BaseOp, OpTraits
from zephon.types import SampleBatch

# -- custom accumulators that break the contract on purpose -------------------------------


class LaneBuffers(Accumulator):
    """Buffers everything per lane and never emits on its own."""

    def __init__(self) -> None:
        self.buffers: dict[int, list] = defaultdict(list)

    def push_many(self, elems):
        for e in elems:
            self.buffers[e.meta.lane_id].append(e)
        return []

    def flush(self, *, reset=False, lane_id=None):
        lanes = sorted(self.buffers) if lane_id is None else [lane_id]
        return [self.buffers.pop(lane) for lane in lanes if self.buffers.get(lane)]

    def has_pending_data(self, lane_id=None):
        if lane_id is None:
            return any(self.buffers.values())
        return bool(self.buffers.get(lane_id))


class FlushesEveryLane(LaneBuffers):
    def flush(self, *, reset=False, lane_id=None):
        return super().flush(reset=reset, lane_id=None)


class LeavesResidue(LaneBuffers):
    def flush(self, *, reset=False, lane_id=None):
        out = super().flush(reset=reset, lane_id=lane_id)
        if lane_id is not None and out and len(out[0]) > 1:
            self.buffers[lane_id] = [out[0].pop()]  # keeps one record across the boundary
        return out


class ClearsEveryLane(LaneBuffers):
    """Emits the sentinel's lane but silently forgets every other lane's buffer."""

    def flush(self, *, reset=False, lane_id=None):
        out = super().flush(reset=reset, lane_id=lane_id)
        if lane_id is not None:
            self.buffers.clear()
        return out


class Holding(BaseOp):
    def __init__(self, acc_type: type[LaneBuffers]) -> None:
        super().__init__(name=f"holding_{acc_type.__name__}")
        self.acc_type = acc_type

    def accumulator(self, *, deterministic, ctx):
        return self.acc_type()

    def traits(self):
        return OpTraits(preserves_cursor_order=False)

    def process_many(self, elems):
        return elems


def contract_pipe(acc_type, runner="inline"):
    # chunks of 100 are fed 64 pointers at a time per lane, so when lane 0's sentinel
    # arrives, lane 1 has records buffered
    ds = Dataset.from_records("d", [{"id": i} for i in range(400)])
    return (
        Pipeline(ListSource([ds], sequential_pointers([ds]), 100))
        .add_op(Holding(acc_type))
        .options(runner=runner, canonical_replicas=2, flush_every_k_chunks=1)
    )


@pytest.mark.timeout(60)
@pytest.mark.parametrize("runner", ["inline", "threads"])
def test_flushing_every_lane_at_one_lanes_sentinel_is_caught(runner):
    match = r"emitted a lane 1 element at a flush sentinel of lane 0"
    with pytest.raises(ContractError, match=match):
        list(contract_pipe(FlushesEveryLane, runner))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("runner", ["inline", "threads"])
def test_residue_after_a_reset_flush_is_caught(runner):
    with pytest.raises(ContractError, match=r"still has pending data for lane 0 after flush"):
        list(contract_pipe(LeavesResidue, runner))


def test_well_behaved_buffering_passes():
    assert len(list(contract_pipe(LaneBuffers))) == 400


def test_silently_resetting_other_lanes_is_caught():
    try:
        delivered = len(list(contract_pipe(ClearsEveryLane)))
    except ContractError:
        return
    raise AssertionError(f"not detected: {delivered} of 400 records delivered")


# -- stalling with lanes at different speeds -----------------------------------------------


def stalling_pipe(lengths, chunk, replicas, k, batch, **opts):
    ds = Dataset.from_records("docs", token_rows(lengths))
    pipe = Pipeline(ListSource([ds], sequential_pointers([ds]), chunk)).pack_flat(
        24, PAD, algorithm="best_fit", num_bins=3
    )
    if batch:
        pipe = pipe.batch(batch, drop_last=True)
    return pipe.options(
        runner="inline", canonical_replicas=replicas, flush_every_k_chunks=k, **opts
    )


def rows_by_lane(items):
    lanes = defaultdict(list)
    for item in items:
        records = item.records if isinstance(item, SampleBatch) else [item]
        for r in records:
            lanes[r.meta.lane_id].append((r.meta.cursor, packing(r)["segments"]))
    return lanes


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(1, 120),
    chunk=st.integers(1, 12),
    replicas=st.integers(2, 3),
    k=st.integers(1, 3),
    batch=st.integers(1, 4),
    slow=st.integers(1, 24),
)
def test_stalling_batches_are_full_lane_pure_and_lane_independent(
    n, chunk, replicas, k, batch, slow
):
    # lane 0 gets long documents (few rows per chunk), the others short ones: lanes fill
    # batches at different speeds, and drop_last=True stalls sentinels instead of emitting
    # partial batches.
    lengths = [slow if (i // chunk) % replicas == 0 else 2 for i in range(n)]
    items = list(stalling_pipe(lengths, chunk, replicas, k, batch))
    assert all(len(b) == batch for b in items)
    batched = rows_by_lane(items)
    unbatched = rows_by_lane(stalling_pipe(lengths, chunk, replicas, k, None))
    for lane, rows in unbatched.items():
        full = len(rows) // batch * batch
        # a stalled sentinel drops nothing: every row leaves, except the final partial batch
        assert batched.get(lane, []) == rows[:full]
    for rank in range(replicas):
        alone = rows_by_lane(
            stalling_pipe(lengths, chunk, replicas, k, batch, dp_world_size=replicas, dp_rank=rank)
        )
        assert alone.get(rank, []) == batched.get(rank, [])
