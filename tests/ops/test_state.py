"""``zephon.ops.state``: the built-in accumulators implement the public hooks, and a half-done
or misspelled hook is refused, naming the operator, before any record moves."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests.ops._user_ops import GreedyPackOp, WindowSortOp
from zephon import Dataset, Pipeline, StaticMixtureWorkSource
from zephon.errors import ContractError
from zephon.ops import (
    Accumulator,
    BaseOp,
    HoldsRecords,
    LaneStateful,
    LazyPayloads,
    OpContext,
    OpTraits,
    PassthroughAccumulator,
    Reassembles,
    Rebuild,
    check_accumulator,
)
from zephon.ops.state import holds_records, payloads_lazy

ROWS = [{"text": f"row {i}"} for i in range(40)]


def source() -> StaticMixtureWorkSource:
    return StaticMixtureWorkSource([Dataset.from_records("d", ROWS)], chunk_size=8)


def last_op(add: Callable[[Pipeline], Pipeline]) -> BaseOp:
    """The operator ``add`` appends to a fresh tokenizing pipeline."""
    return add(Pipeline(source()).decode_text().tokenize("bytes"))._specs[-1].op


def accumulator_of(op: BaseOp) -> Accumulator:
    return op.accumulator(deterministic=True, ctx=OpContext(op.name, 1))


def test_the_builtin_buffers_declare_their_hooks_like_user_operators() -> None:
    pack, shuffle = last_op(lambda p: p.pack_flat(32, 0)), last_op(lambda p: p.shuffle(8, seed=1))
    assert isinstance(accumulator_of(pack), HoldsRecords)
    assert not payloads_lazy(accumulator_of(pack))
    assert isinstance(accumulator_of(shuffle), LazyPayloads)
    assert payloads_lazy(accumulator_of(shuffle))
    assert pack.traits().rebuild is Rebuild.REASSEMBLE and isinstance(pack, Reassembles)
    assert shuffle.traits().rebuild is Rebuild.UNCHANGED
    batch = last_op(lambda p: p.batch(4, drop_last=True)).traits()
    assert batch.batches and batch.stalls_sentinels
    assert not last_op(lambda p: p.batch(4, drop_last=False)).traits().stalls_sentinels
    tokenize = last_op(lambda p: p)
    assert tokenize.traits().rebuild is None  # derived: element-wise, plain accumulator
    assert not isinstance(accumulator_of(tokenize), LaneStateful)
    assert not holds_records(accumulator_of(tokenize))


def test_the_user_operators_are_typed_the_same_way() -> None:
    for op in (WindowSortOp(4), GreedyPackOp(64)):
        acc = op.accumulator(deterministic=True, ctx=OpContext(op.name, 1))
        assert isinstance(acc, LazyPayloads) and holds_records(acc)
        check_accumulator(acc, op.name)
    assert isinstance(GreedyPackOp(64), Reassembles)


class _HalfStateful(PassthroughAccumulator):
    def state_dict(self, lane_id: int) -> Any:
        return {}


class _Misspelled(PassthroughAccumulator):
    def load_state(self, lane_id: int, state: Any) -> None:
        pass


class _FlagOnly(PassthroughAccumulator):
    state_holds_records = True


@pytest.mark.parametrize(
    ("acc", "message"),
    [
        (_HalfStateful(), "defines state_dict but not load_state_dict"),
        (_Misspelled(), "did you mean 'load_state_dict'"),
        (_FlagOnly(), "sets state_holds_records but has no lane state"),
    ],
)
def test_a_half_implemented_hook_is_refused_naming_the_operator(
    acc: Accumulator, message: str
) -> None:
    with pytest.raises(ContractError, match=message) as err:
        check_accumulator(acc, "my_op")
    assert "'my_op'" in str(err.value)
    check_accumulator(PassthroughAccumulator(), "my_op")  # a plain one is fine


class _HalfStatefulOp(BaseOp):
    name = "half_stateful"

    def accumulator(self, *, deterministic: bool, ctx: OpContext) -> Accumulator:
        return _HalfStateful()

    def traits(self) -> OpTraits:
        return OpTraits(preserves_cursor_order=True)

    def process_many(self, elems: list[Any]) -> list[Any]:
        return elems


def test_a_run_refuses_an_operator_with_a_half_implemented_hook() -> None:
    pipe = Pipeline(source()).add_op(_HalfStatefulOp())
    with pytest.raises(ContractError, match=r"'half_stateful'.*load_state_dict"):
        next(iter(pipe))
