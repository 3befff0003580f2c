"""Release micro-batch results in sequence order, whatever order workers finish in."""

from __future__ import annotations

from typing import Generic, TypeVar

from zephon.errors import ReorderError

T = TypeVar("T")


class ReorderBuffer(Generic[T]):
    """Holds out-of-order results and releases them once every earlier sequence number has.

    ``deterministic=False`` releases in completion order instead (no holding). A duplicate
    sequence number, one already released, or one never dispatched is an error, never a hang;
    ``close()`` reports sequence numbers that were dispatched but never completed.
    """

    __slots__ = (
        "_barriers",
        "_deterministic",
        "_dispatched",
        "_floor",
        "_next",
        "_pending",
        "_seen_unordered",
    )

    def __init__(self, *, deterministic: bool = True) -> None:
        self._deterministic = deterministic
        self._next = 0
        self._dispatched = 0
        self._pending: dict[int, T] = {}
        self._seen_unordered: set[int] = set()
        self._barriers: dict[int, T] = {}
        self._floor = 0  # lowest sequence number not yet released (completion-order mode)

    def dispatch(self) -> int:
        """Allocate the next sequence number."""
        seq = self._dispatched
        self._dispatched += 1
        return seq

    def expect(self, seq: int) -> None:
        """Register ``seq``, allocated elsewhere; sequence numbers must be consecutive."""
        if seq != self._dispatched:
            raise ReorderError(
                f"sequence number {seq} allocated out of order (expected {self._dispatched})"
            )
        self._dispatched += 1

    @property
    def outstanding(self) -> int:
        """Dispatched sequence numbers not yet released."""
        if self._deterministic:
            return self._dispatched - self._next
        return self._dispatched - len(self._seen_unordered)

    def put(self, seq: int, result: T, *, barrier: bool = False) -> list[T]:
        """Record ``seq``'s result; return the results now releasable, in order.

        In completion-order mode a ``barrier`` result (end-of-lane and epoch markers) is held
        until every earlier sequence number has been released, so markers never overtake the
        data they close.
        """
        if not 0 <= seq < self._dispatched:
            raise ReorderError(
                f"sequence number {seq} was never dispatched (next is {self._dispatched})"
            )
        if not self._deterministic:
            if seq in self._seen_unordered or seq in self._barriers:
                raise ReorderError(f"sequence number {seq} completed twice")
            if barrier and self._floor < seq:
                self._barriers[seq] = result
                return []
            return self._release_unordered(seq, result)
        if seq < self._next or seq in self._pending:
            raise ReorderError(f"sequence number {seq} completed twice")
        if seq != self._next:
            self._pending[seq] = result
            return []
        released = [result]
        self._next += 1
        pending = self._pending
        while self._next in pending:
            released.append(pending.pop(self._next))
            self._next += 1
        return released

    def _release_unordered(self, seq: int, result: T) -> list[T]:
        released = [result]
        self._seen_unordered.add(seq)
        while True:
            while self._floor in self._seen_unordered:
                self._floor += 1
            ready = [s for s in self._barriers if s <= self._floor]
            if not ready:
                return released
            for s in sorted(ready):
                released.append(self._barriers.pop(s))
                self._seen_unordered.add(s)

    def close(self) -> None:
        """Raise if any dispatched sequence number never completed."""
        if self.outstanding:
            if self._deterministic:
                missing = [s for s in range(self._next, self._dispatched) if s not in self._pending]
            else:
                missing = [s for s in range(self._dispatched) if s not in self._seen_unordered]
            raise ReorderError(
                f"{len(missing)} micro-batch(es) never completed, first missing sequence "
                f"number {missing[0]}"
            )
