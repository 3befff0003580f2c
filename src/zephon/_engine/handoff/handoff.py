"""The hand-off between an engine process and its consumer: one duplex pipe, shared memory.

Every message is a pickle whose large numpy arrays travel in shared-memory segments (see
``shm.py``): arrays that workers wrote pass on as the same segment, so token arrays are never
copied on their way to the consumer. The consumer acknowledges what it has received (every
``window // 2`` messages). That bounds what the engine runs ahead to ``window`` messages, tells
it which segments the consumer has mapped, so it stops keeping them alive, and names the
segments of which the consumer holds no view any more: the engine writes later messages into
them, so the consumer maps each segment once, not once per message. Closing the
pipe is how the consumer says it is done; the engine process then stops.
"""

from __future__ import annotations

import contextlib
import select
import threading
import time
from collections import deque
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from zephon._engine.handoff import shm
from zephon._engine.handoff.messages import HANDOFF, HandoffMessage

_ACK_BYTES = 8

WAIT_SLICE_S = 0.25
"""How long the consumer blocks before it looks at the clock and at the caller's check."""


class Sender:
    """The engine side: sends messages within the window, drops segments once acknowledged."""

    def __init__(self, conn: Connection, encoder: shm.Encoder, window: int) -> None:
        self._conn = conn
        self._encoder = encoder
        self.window = max(1, window)
        self._cond = threading.Condition()
        self._sent = 0
        self._acked = 0
        self._keep: deque[tuple[int, list[Any]]] = deque()
        self.stopped = False

    def serve(self) -> None:
        """Read acknowledgements until the consumer closes the pipe (a thread of its own)."""
        while True:
            try:
                data = self._conn.recv_bytes()
            except (EOFError, OSError):
                data = b""
            with self._cond:
                if len(data) >= _ACK_BYTES:
                    self._acked = int.from_bytes(data[:_ACK_BYTES], "little")
                    if len(data) > _ACK_BYTES:
                        self._encoder.release(data[_ACK_BYTES:].decode().split("\0"))
                    while self._keep and self._keep[0][0] <= self._acked:
                        self._keep.popleft()
                else:
                    self.stopped = True
                self._cond.notify_all()
            if self.stopped:
                return

    def send(self, message: HandoffMessage) -> bool:
        """Send ``message`` once the window has room; False when the consumer has stopped."""
        data, keep = self._encoder.dumps(HANDOFF.wire(message))
        with self._cond:
            while self._sent - self._acked >= self.window and not self.stopped:
                self._cond.wait()
            if self.stopped:
                return False
            self._sent += 1
            if keep:
                self._keep.append((self._sent, keep))
        try:
            self._conn.send_bytes(data)
        except OSError:  # the consumer went away
            with self._cond:
                self.stopped = True
            return False
        return True

    def wait_closed(self) -> None:
        """Until the consumer closes the pipe (it has mapped everything it received)."""
        with self._cond:
            while not self.stopped:
                self._cond.wait()


class Receiver:
    """The consumer side: receives and decodes messages, acknowledges them in groups."""

    def __init__(self, conn: Connection, window: int) -> None:
        self._conn = conn
        self._poll = select.poll()  # one poller for the run: Connection.poll builds one a call
        self._poll.register(conn.fileno(), select.POLLIN)
        self._every = max(1, window // 2)
        self._received = 0
        self._acked = 0
        self.released: list[str] = []
        """Recycled segments the consumer holds no view of (``shm.loads_resolved`` appends
        them); each acknowledgement hands them back to the sender."""

    def recv(
        self,
        decode: Callable[[bytes], Any] = shm.loads,
        idle: Callable[[float], None] | None = None,
    ) -> HandoffMessage:
        """The next message (its arrays mapped); EOFError when the engine process is gone.
        ``idle(waited)`` is called every ``WAIT_SLICE_S`` while none comes (it may raise)."""
        try:
            if idle is not None:
                since = time.monotonic()
                while not self._poll.poll(WAIT_SLICE_S * 1000):
                    idle(time.monotonic() - since)
            data = self._conn.recv_bytes()
        except OSError as exc:
            raise EOFError(str(exc)) from exc
        message = HANDOFF.read(decode(data))
        self._received += 1
        if self._received - self._acked >= self._every:
            self._acked = self._received
            names = self.released[:]  # callbacks may append meanwhile
            del self.released[: len(names)]
            ack = self._acked.to_bytes(_ACK_BYTES, "little") + "\0".join(names).encode()
            with contextlib.suppress(OSError):  # gone: the next recv says so
                self._conn.send_bytes(ack)
        return message

    @property
    def received(self) -> int:
        return self._received
