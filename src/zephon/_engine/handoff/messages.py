"""The engine's messages: one frozen struct per kind, one union per channel.

Channels: a worker process's requests (:data:`WorkerRequest`) and replies
(:data:`WorkerReply`; a Ray actor answers a :data:`RunReply`), the queues between the threads
of a threaded run (:data:`ThreadMessage`) and the hand-off from an engine process to its
consumer (:data:`HandoffMessage`). Receivers ``match`` on the union and end with
``assert_never``, so mypy flags a kind a receiver does not handle. They match the bare class
(``case Data():``) and read fields as attributes: a class pattern with positional captures
(``case Data(items, parts):``) costs about three times as much per message.

Across a pipe a message travels as the plain tuple ``(tag, *fields)`` (see :class:`Codec`),
never as the struct: a pickled struct names its class, and looking that up costs the sender
and the receiver a few microseconds per message, more than pickling the tuple itself. What
is inside (records, numpy arrays through shared memory) is pickled as before.

Structs that may hold an exception (whose traceback can lead back to the message) stay
tracked by the cyclic garbage collector; the others are not (``gc=False``), like
:class:`~zephon.types.SampleMeta`.
"""

from __future__ import annotations

import reprlib
from collections.abc import Mapping
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, Generic, TypeAlias, TypeVar

import msgspec
from msgspec.structs import astuple

from zephon.errors import ZephonError
from zephon.types import StreamItem

if TYPE_CHECKING:
    from zephon._engine.state.position import Position
    from zephon._engine.stats import RunStats


class MessageError(ZephonError, RuntimeError):
    """A channel carried something that is not one of its messages (a corrupt pipe, or a
    worker of another zephon version)."""


# -- worker processes ------------------------------------------------------------------------


class Load(msgspec.Struct, frozen=True, gc=False):
    """Set up an engine's operators (the first request of every worker, and of a reused one).

    ``blobs``: stage -> (operator name, pickle of ``(op, ctx)``); ``prefix``/``min_bytes``:
    the engine's shared-memory session; ``environ``: the environment the worker adopts.
    """

    blobs: Mapping[int, tuple[str, bytes]]
    worker_index: int
    prefix: str
    min_bytes: int
    environ: Mapping[str, str]


class Unload(msgspec.Struct, frozen=True, gc=False):
    """Tear the operators down and wait to be reused (the worker answers :class:`Unloaded`)."""


class Run(msgspec.Struct, frozen=True, gc=False):
    """Run one micro-batch through the operator of ``stage``."""

    stage: int
    elems: list[StreamItem]


class Ready(msgspec.Struct, frozen=True, gc=False):
    """The operators of a :class:`Load` are set up."""

    pid: int


class Unloaded(msgspec.Struct, frozen=True, gc=False):
    """The operators are torn down; the worker may be reused."""

    pid: int


class Ok(msgspec.Struct, frozen=True, gc=False):
    """A micro-batch's output. ``counts``: a fused chain's ``(in, out, ns)`` per operator;
    ``io``: what reading datasets cost the worker (None when nothing)."""

    out: list[StreamItem]
    counts: list[tuple[int, int, int]] | None = None
    io: dict[str, int] | None = None


class Failed(msgspec.Struct, frozen=True):
    """An error, raised where it is received (already annotated with its operator)."""

    error: BaseException


WorkerRequest: TypeAlias = Load | Unload | Run
"""Engine -> worker process. An empty message (no bytes) stops the worker."""

WorkerReply: TypeAlias = Ready | Unloaded | Ok | Failed
"""Worker process -> engine."""

RunReply: TypeAlias = Ok | Failed
"""A Ray actor's answer to a micro-batch (Ray pickles it)."""


# -- threads of a threaded run ---------------------------------------------------------------


class Data(msgspec.Struct, frozen=True, gc=False):
    """Released items holding ``parts`` micro-batches (each took a channel slot)."""

    items: list[StreamItem]
    parts: int = 1


class Done(msgspec.Struct, frozen=True):
    """The worker pool finished the task of sequence number ``seq``."""

    seq: int
    future: Future[list[StreamItem]]


class End(msgspec.Struct, frozen=True, gc=False):
    """The producer sent everything."""


class Stop(msgspec.Struct, frozen=True, gc=False):
    """The consumer closed the pipeline: the driver stops at once."""


ThreadMessage: TypeAlias = Data | Done | End | Failed | Stop
"""A driver's inbox and the run's output channel (``Failed`` is passed on to the consumer)."""


# -- engine process -> consumer --------------------------------------------------------------


class HandoffItem(msgspec.Struct, frozen=True, gc=False):
    """A delivered item (or the model inputs the consumer's transform made of it), the
    consumer position right after it, statistics now and then, and the item's lane."""

    item: Any
    position: Position
    stats: RunStats | None = None
    lane: int = -1
    """The lane the item came from (a transformed item no longer says)."""


class HandoffEnd(msgspec.Struct, frozen=True, gc=False):
    """The run ended: its final position and statistics."""

    position: Position
    stats: RunStats


class HandoffError(msgspec.Struct, frozen=True):
    """The run failed (statistics when the engine got far enough to have them)."""

    error: BaseException
    stats: RunStats | None = None


HandoffMessage: TypeAlias = HandoffItem | HandoffEnd | HandoffError
"""Engine process -> its consumer."""


# -- the wire --------------------------------------------------------------------------------

M = TypeVar("M", bound=msgspec.Struct)


class Codec(Generic[M]):
    """One channel's messages as tuples ``(tag, *fields)``; the tag is the kind's index."""

    def __init__(self, channel: str, *kinds: type[M]) -> None:
        self.channel = channel
        self._kinds = dict(enumerate(kinds))
        self._tags = {kind: tag for tag, kind in enumerate(kinds)}

    def wire(self, message: M) -> tuple[Any, ...]:
        """What to pickle for ``message``."""
        return (self._tags[type(message)], *astuple(message))

    def read(self, wire: Any) -> M:
        """The message an unpickled ``wire`` tuple stands for; MessageError if it is none."""
        if type(wire) is tuple:
            try:
                return self._kinds[wire[0]](*wire[1:])
            except (LookupError, TypeError):  # no such tag, or too many or too few fields
                pass
        raise MessageError(f"not a {self.channel} message: {reprlib.repr(wire)}")


REQUESTS: Codec[WorkerRequest] = Codec("worker request", Load, Unload, Run)
REPLIES: Codec[WorkerReply] = Codec("worker reply", Ready, Unloaded, Ok, Failed)
HANDOFF: Codec[HandoffMessage] = Codec("hand-off", HandoffItem, HandoffEnd, HandoffError)
