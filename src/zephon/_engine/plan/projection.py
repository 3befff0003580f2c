"""Payload projection: a worker stage sends back only what the operator after it reads.

An operator may declare which part of a payload it reads (``BaseOp.input_projection``); when
the stage before it runs in worker processes, the workers apply that projection to their
output before pickling it. pack_flat, for one, reads the token field and the fields aligned
with it, so the source text tokenize keeps in every payload (two thirds of the bytes of a
tokenized document) never crosses the pipe. What the operator emits cannot change: it reads
the same values either way.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from zephon._engine.plan.fusion import FusedOp
from zephon.ops import Accumulator, BaseOp, OpContext, OpTraits
from zephon.types import SampleRecord, StreamItem


def project_items(items: list[StreamItem], project: Callable[[Any], Any]) -> list[StreamItem]:
    """``items`` with each record's payload projected (batches and tombstones as they are)."""
    out: list[StreamItem] = []
    for item in items:
        if type(item) is SampleRecord and type(item.payload) is dict:
            payload = project(item.payload)
            if payload is not item.payload:
                item = SampleRecord(item.meta, payload)
        out.append(item)
    return out


class ProjectedOp(BaseOp):
    """``inner`` (an operator or a fused chain) whose output payloads are projected.

    Only the copy shipped to worker processes is wrapped; the engine's own copy, its
    accumulator and its counters are the inner operator's.
    """

    def __init__(self, inner: BaseOp, project: Callable[[Any], Any]) -> None:
        super().__init__(name=inner.name)
        self.inner = inner
        self.project = project

    def traits(self) -> OpTraits:
        return self.inner.traits()

    def accumulator(self, *, deterministic: bool, ctx: OpContext) -> Accumulator:
        return self.inner.accumulator(deterministic=deterministic, ctx=ctx)

    def config(self) -> Mapping[str, Any]:
        return self.inner.config()

    def setup(self, ctx: OpContext) -> None:
        self.inner.setup(ctx)

    def teardown(self) -> None:
        self.inner.teardown()

    def process_many(self, elems: list[StreamItem]) -> Sequence[StreamItem]:
        out = self.inner.process_many(elems)
        return project_items(out if isinstance(out, list) else list(out), self.project)

    def process_one(self, elem: StreamItem) -> Sequence[StreamItem]:
        out = self.inner.process_one(elem)
        return project_items(out if isinstance(out, list) else list(out), self.project)

    def take_counts(self) -> list[tuple[int, int, int]] | None:
        """A fused chain's counts of its last micro-batch (``FusedOp.take_counts``)."""
        return self.inner.take_counts() if isinstance(self.inner, FusedOp) else None


def unwrapped(op: BaseOp) -> BaseOp:
    """The operator or fused chain inside ``op`` (``op`` itself when it is not projected)."""
    return op.inner if isinstance(op, ProjectedOp) else op


def projected(op: BaseOp, successor: BaseOp | None) -> BaseOp:
    """``op`` as shipped to workers: projected for ``successor`` when it reads only part of a
    payload."""
    project = successor.input_projection() if successor is not None else None
    return op if project is None else ProjectedOp(op, project)
