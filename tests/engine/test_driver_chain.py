"""Driver chains: operators riding on another stage's driver thread, run back to back."""

from __future__ import annotations

from zephon._engine.plan.driver_chain import DriverChain
from zephon._engine.state.stage import StageCore
from zephon._ops.batch import BatchOp
from zephon._ops.map_transform import FilterOp
from zephon.ops import OpContext
from zephon.types import SampleBatch, SampleMeta, SampleRecord


def core(op, lanes=(0,)) -> StageCore:
    ctx = OpContext(op_index=0, op_name=op.name, worker_index=0, num_workers=1, runner="driver")
    acc = op.accumulator(deterministic=True, ctx=ctx)
    return StageCore(op, acc, stalls_sentinels=False, lanes=lanes)


def records(n: int) -> list[SampleRecord]:
    return [SampleRecord(SampleMeta((0, 0, i), 0, 0, i), i) for i in range(n)]


def test_push_runs_every_operator_in_order_and_finish_flushes_through_the_rest():
    chain = DriverChain(
        [core(FilterOp(lambda i: i % 2 == 0, max_batch=1)), core(BatchOp(2, drop_last=False))]
    )
    out = chain.push(records(7))  # 0 2 4 6 kept; the filter's tombstones pass through
    batches = [item for item in out if isinstance(item, SampleBatch)]
    assert [b.payloads for b in batches] == [[0, 2], [4, 6]]
    assert sum(item.meta.is_tombstone for item in out) == 3
    out = chain.push(records(9)[8:])
    assert not [item for item in out if isinstance(item, SampleBatch)]  # 8 waits for a second
    tail = chain.finish()
    assert [b.payloads for b in tail if isinstance(b, SampleBatch)] == [[8]]
    assert chain.next_deadline_ns() is None and chain.poll(0) == []
