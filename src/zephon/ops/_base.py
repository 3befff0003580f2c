"""The operator contract: a serial accumulator plus a stateless, parallel ``process_many``."""

from __future__ import annotations

import inspect
import logging
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from zephon.errors import ConfigError
from zephon.ops.accumulators import Accumulator, PassthroughAccumulator
from zephon.ops.state import Rebuild
from zephon.types import StreamItem


@dataclass(frozen=True, kw_only=True)
class OpTraits:
    """What the planner needs to know about an operator.

    ``preserves_cursor_order``: outputs leave in input cursor order. A plan with any operator
    that does not (packing, shuffling, mixture correction) gets per-lane flush sentinels.
    ``parallelism``: default worker count; ``"auto"`` (CPU-heavy work) takes a share of the
    cores this process may use, split among the pipeline's ``"auto"`` stages at compile and
    moved toward the busiest one while running. ``runs_in_driver``: the work is trivial, so the
    runner calls ``process_many`` on the driver thread instead of shipping it to a worker.
    ``elementwise``: ``process_many`` returns, in order, what each element alone becomes, so
    how the elements are grouped into micro-batches cannot change the output; with a plain
    counting or passthrough accumulator the runner may then fuse the operator with its
    element-wise neighbours into one worker task. A subclass that changes ``process_many``
    must say again whether this still holds.

    ``rebuild``: how a record that left this operator is rebuilt when a restored snapshot
    names it (:class:`~zephon.ops.state.Rebuild`); ``None`` derives it: ``RERUN`` for an
    element-wise operator with a plain counting or passthrough accumulator, else none, and a
    plan whose reordering operator has no way to rebuild (nor lane state) takes no snapshots.
    ``stalls_sentinels``: the accumulator may hold a lane's flush sentinel back until its
    buffer empties (``try_epoch_reset``), as ``batch(drop_last=True)`` does for its partial
    batch. ``batches``: the operator turns records into batches; the engine drops records
    replayed after a restore right before it, so a checkpoint falls between whole batches. If
    its accumulator keeps lane state (``batch`` keeps its partial batch), the engine counts on
    the lane's next batch taking everything it holds, in order: a checkpoint taken after that
    batch was delivered names no state for it.
    """

    preserves_cursor_order: bool
    parallelism: int | Literal["auto"] = 1
    runs_in_driver: bool = False
    elementwise: bool = False
    rebuild: Rebuild | None = None
    stalls_sentinels: bool = False
    batches: bool = False


@dataclass(frozen=True)
class OpContext:
    """Runtime facts handed to ``setup`` and ``accumulator``.

    ``op_index``: the operator's stage (0 is fetch). ``worker_index`` / ``num_workers``: which
    copy this is. ``runner``: where ``process_many`` runs (inline, driver, threads, process,
    ray). ``seed``: derived from the work source's seed and the operator's stage and name, so
    two operators (or two runs with another source seed) never share random streams, and keyed
    by ``epoch`` (the pass over the data, ``Pipeline.set_epoch``) from epoch 1 on. ``lanes``:
    the lanes this rank runs. ``services``: ``"logger"``, a ``logging.Logger`` named
    ``zephon.op.<name>``; in the accumulator's context (the driver) also ``"stats"``, the
    operator's live counters (``OpStats``: ``elements_in``, ``elements_out``, ...), or absent
    when ``track_stats`` is off.
    """

    op_name: str
    op_index: int
    worker_index: int = 0
    num_workers: int = 1
    deterministic: bool = True
    runner: str = "inline"
    seed: int = 0
    services: Mapping[str, Any] = field(default_factory=dict)
    lanes: tuple[int, ...] = ()
    epoch: int = 0

    @property
    def logger(self) -> logging.Logger:
        logger = self.services.get("logger")
        if isinstance(logger, logging.Logger):
            return logger
        return logging.getLogger(f"zephon.op.{self.op_name}")


def constructor_arguments(op: BaseOp) -> dict[str, Any]:
    """``{argument: value}`` for each argument of ``type(op).__init__``, read from ``op``."""
    init = type(op).__init__
    if init is BaseOp.__init__:
        return {}
    out: dict[str, Any] = {}
    for name, param in inspect.signature(init).parameters.items():
        if name in ("self", "name") or name in op.config_exclude:
            continue
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        if not hasattr(op, name):
            raise ConfigError(
                f"operator {op.name!r} ({type(op).__name__}): constructor argument {name!r} is "
                f"not kept as self.{name}, so the checkpoint fingerprint cannot describe it; "
                "store it under that name, or override config()"
            )
        value = getattr(op, name)
        if callable(value) and not isinstance(value, type | BaseOp):
            value = getattr(value, "__qualname__", None) or repr(value)
        elif isinstance(value, type):
            value = f"{value.__module__}.{value.__qualname__}"
        out[name] = value
    return out


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower().removesuffix("_op")


class BaseOp:
    """Base class of every operator. Subclass, implement ``process_many`` and ``traits``.

    ``process_many`` must not depend on anything left over from an earlier call: the runner
    hands calls to any worker in any order. State across calls belongs in the accumulator.
    """

    name: str = ""

    def __init__(self, *, name: str | None = None) -> None:
        self.name = name or self.name or _snake(type(self).__name__)

    def accumulator(self, *, deterministic: bool, ctx: OpContext) -> Accumulator:
        """The accumulator that cuts this operator's micro-batches (default: passthrough)."""
        return PassthroughAccumulator()

    def setup(self, ctx: OpContext) -> None:
        """Called once per worker copy before any data arrives."""

    def teardown(self) -> None:
        """Called once per worker copy when the runner closes."""

    def process_many(self, elems: list[StreamItem]) -> Sequence[StreamItem]:
        """Transform a micro-batch; return ``SampleRecord`` s (or ``SampleBatch`` es)."""
        raise NotImplementedError(f"operator {self.name!r} must implement process_many")

    def process_one(self, elem: StreamItem) -> Sequence[StreamItem]:
        return self.process_many([elem])

    def traits(self) -> OpTraits:
        return OpTraits(preserves_cursor_order=True)

    def input_projection(self) -> Callable[[Any], Any] | None:
        """A function giving the part of an input payload this operator reads (None: it may
        read all of it). Where the stage before runs in worker processes, the workers apply
        it to what they send back, so fields nothing downstream reads never cross the pipe.
        It must not change what the operator emits, and should return a payload it cannot
        handle as it is (the operator then raises its own error)."""
        return None

    #: Constructor arguments that cannot change the output (left out of the default config()).
    config_exclude: tuple[str, ...] = ()

    #: Constructor arguments added after checkpoints of the operator existed: an override of
    #: config() leaves them out while they keep the value those checkpoints ran with, so the
    #: checkpoints still restore, and describes them once they are set.
    config_when_set: tuple[str, ...] = ()

    def config(self) -> Mapping[str, Any]:
        """Settings that change the output; part of the pipeline fingerprint.

        The default describes every constructor argument by the attribute of the same name
        (callables by their qualified name), so a restore with a changed parameter is refused.
        Override it to describe them otherwise; list arguments that cannot change the output
        in ``config_exclude``.
        """
        return constructor_arguments(self)

    def describe(self) -> str:
        """A short note for ``pipeline.explain()`` (decisions made from the settings)."""
        return ""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"
