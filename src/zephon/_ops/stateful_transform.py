"""stateful_transform: a per-lane state and a serial ``push`` function, saved in checkpoints.

The functional form of a stateful accumulator: ``push(state, payload) -> (state, outputs)``
runs on the driver, one record at a time in lane order, so a dedupe, a quota or a running
statistic is a few lines. The state is the accumulator's lane state (``state_dict``), so a
restore continues exactly.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from zephon.errors import ConfigError, ContractError
from zephon.ops import Accumulator, BaseOp, MicroBatch, OpContext, OpTraits
from zephon.types import SampleRecord, StreamItem, spawn_child, tombstone_meta

PushFn = Callable[[Any, Any], tuple[Any, Sequence[Any]]]
FlushFn = Callable[[Any], Any]


def _fn_name(fn: Callable[..., Any] | None) -> str | None:
    return None if fn is None else getattr(fn, "__qualname__", None) or repr(fn)


def _fresh(value: Any, name: str) -> Any:
    try:
        return json.loads(json.dumps(value))
    except (TypeError, ValueError) as exc:
        raise ConfigError(
            f"stateful_transform {name!r}: the state must be JSON-safe data (dicts, lists, str, "
            f"int, float, bool, None) so checkpoints can hold it: {exc}"
        ) from None


class StatefulTransformAccumulator(Accumulator):
    """Applies ``push`` record by record with one state per lane."""

    reads_payload = True

    def __init__(self, name: str, init_state: Any, push: PushFn, flush: FlushFn | None) -> None:
        self.name = name
        self.init_state = init_state
        self.push = push
        self.flush_fn = flush
        self.states: dict[int, Any] = {}

    def _state(self, lane: int) -> Any:
        if lane not in self.states:
            self.states[lane] = _fresh(self.init_state, self.name)
        return self.states[lane]

    def push_many(self, elems: Sequence[StreamItem]) -> list[MicroBatch]:
        out: MicroBatch = []
        for elem in elems:
            lane = elem.meta.lane_id
            result = self.push(self._state(lane), elem.payload)
            if not (isinstance(result, tuple) and len(result) == 2):
                raise ContractError(
                    f"stateful_transform {self.name!r}: push must return (state, outputs), got "
                    f"{type(result).__name__}"
                )
            self.states[lane], outputs = result
            out.extend(self._records(elem, list(outputs)))
        return [out] if out else []

    def _records(self, elem: StreamItem, outputs: list[Any]) -> list[StreamItem]:
        assert isinstance(elem, SampleRecord)
        if not outputs:
            return [SampleRecord(tombstone_meta(elem.meta, reason=f"dropped by {self.name}"), None)]
        if len(outputs) == 1:
            return [SampleRecord(elem.meta, outputs[0])]
        last = len(outputs) - 1
        return [spawn_child(elem, i, p, is_last=i == last) for i, p in enumerate(outputs)]

    def flush(self, *, reset: bool = False, lane_id: int | None = None) -> list[MicroBatch]:
        if self.flush_fn is not None:
            lanes = list(self.states) if lane_id is None else [lane_id]
            for lane in lanes:
                self.states[lane] = self.flush_fn(self._state(lane))
        return []  # nothing is buffered: every push answered at once

    def has_pending_data(self, lane_id: int | None = None) -> bool:
        return False

    def state_dict(self, lane_id: int) -> Any:
        return self._state(lane_id)

    def load_state_dict(self, lane_id: int, state: Any) -> None:
        self.states[lane_id] = state


class StatefulTransformOp(BaseOp):
    """The operator around :class:`StatefulTransformAccumulator` (work done on the driver)."""

    def __init__(
        self,
        name: str,
        *,
        init_state: Any,
        push: PushFn,
        flush: FlushFn | None = None,
        preserves_cursor_order: bool = True,
    ) -> None:
        if not name:
            raise ConfigError("stateful_transform needs a name (it names the state in checkpoints)")
        if not callable(push):
            raise ConfigError(f"stateful_transform {name!r}: push must be callable")
        if flush is not None and not callable(flush):
            raise ConfigError(f"stateful_transform {name!r}: flush must be callable or None")
        super().__init__(name=name)
        self.init_state = _fresh(init_state, name)
        self.push = push
        self.flush = flush
        self.preserves_cursor_order = preserves_cursor_order

    def accumulator(self, *, deterministic: bool, ctx: OpContext) -> Accumulator:
        return StatefulTransformAccumulator(self.name, self.init_state, self.push, self.flush)

    def traits(self) -> OpTraits:
        return OpTraits(preserves_cursor_order=self.preserves_cursor_order, runs_in_driver=True)

    def process_many(self, elems: list[StreamItem]) -> list[StreamItem]:
        return elems

    def config(self) -> Mapping[str, Any]:
        return {
            "init_state": self.init_state,
            "push": _fn_name(self.push),
            "flush": _fn_name(self.flush),
            "preserves_cursor_order": self.preserves_cursor_order,
        }
