"""Bin decisions of the packers, for one lane: which record (piece) goes into which bin.

Pure bookkeeping over lengths; payloads are only carried along. Each algorithm object holds one
lane's open state, takes records in stream order (``add``) and returns the bins that closed;
``drain`` closes everything (a flush). Decisions depend only on the lane's input order, never on
timing or on other lanes, which is what makes packing identical for any runner and worker count.

* ``first_fit``: the oldest open bin with room; ``best_fit``: the fullest bin with room. Both
  keep whole records, at most ``num_bins`` open bins, and evict by ``fifo`` (oldest) or
  ``fullest`` when a record fits nowhere.
* ``wrap``: one window filled in stream order; a record crossing the window edge is split there
  and its remainder starts the next window.
* ``best_fit_wrap``: a pool of candidates; each bin takes the oldest candidate once it is too
  old, then the largest candidates that fit, then at most one cut (the head of the smallest
  candidate that does not fit) to fill the bin exactly.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from typing import Any, Literal

from zephon.types import SampleRecord

PackingAlgorithm = Literal["first_fit", "best_fit", "wrap", "best_fit_wrap"]
FlushStrategy = Literal["fifo", "fullest"]
ALGORITHMS: tuple[str, ...] = ("first_fit", "best_fit", "wrap", "best_fit_wrap")

Segment = list[Any]
"""``[record, start, stop, is_last_segment_of_record]``: tokens ``[start, stop)`` of a record.
A list in the saved form already and never changed once put, so a snapshot shares it: taking
one at every cut copies each open bin's list of segments, not every segment."""


class Bin:
    __slots__ = ("_saved", "images", "opened", "segments", "used", "vision")

    def __init__(self, opened: int) -> None:
        self.opened = opened
        self.segments: list[Segment] = []
        self.used = 0
        self.images = 0  # counted only when the limits cap images per bin
        self.vision = 0  # vision tokens, counted only when the limits cap them
        self._saved: list[Any] | None = None  # state() since the last put

    def put(
        self,
        record: SampleRecord,
        start: int,
        stop: int,
        last: bool,
        images: int = 0,
        vision: int = 0,
    ) -> None:
        self.segments.append([record, start, stop, last])
        self.used += stop - start
        self.images += images
        self.vision += vision
        self._saved = None

    def state(self) -> list[Any]:
        """The saved form, shared by every snapshot until the next put (nothing changes it):
        a cut copies only the bins that changed since the one before."""
        saved = self._saved
        if saved is None:
            saved = self._saved = [self.opened, self.segments.copy()]
        return saved

    @classmethod
    def from_state(cls, state: list[Any], limits: Limits | None = None) -> Bin:
        """The bin saved as ``state``; ``limits`` recounts its images and vision tokens
        (not saved)."""
        opened, segments = state
        b = cls(opened)
        for record, start, stop, last in segments:
            b.put(record, start, stop, last, *(limits.counts(record) if limits else (0, 0)))
        return b


class Limits:
    """The knobs every algorithm shares."""

    __slots__ = (
        "images_of",
        "max_images",
        "max_length",
        "max_sequences",
        "max_vision",
        "min_remaining",
        "num_bins",
        "strategy",
        "vision_of",
    )

    def __init__(
        self,
        max_length: int,
        num_bins: int,
        min_sequence_length: int,
        max_sequences_per_bin: int | None,
        strategy: FlushStrategy,
        max_images_per_bin: int | None = None,
        images_of: Callable[[SampleRecord], int] | None = None,
        max_vision_per_bin: int | None = None,
        vision_of: Callable[[SampleRecord], int] | None = None,
    ) -> None:
        self.max_length = max_length
        self.num_bins = num_bins
        self.min_remaining = min_sequence_length
        self.max_sequences = max_sequences_per_bin or max_length + 1
        self.strategy = strategy
        # images per bin are counted (first_fit and best_fit only) when capped
        self.max_images = max_images_per_bin
        self.images_of = images_of if max_images_per_bin is not None else None
        # and so are vision tokens per bin
        self.max_vision = max_vision_per_bin
        self.vision_of = vision_of if max_vision_per_bin is not None else None

    def counts(self, record: SampleRecord) -> tuple[int, int]:
        """``record``'s images and vision tokens, where the limits cap them (else 0)."""
        images = self.images_of(record) if self.images_of is not None else 0
        return images, self.vision_of(record) if self.vision_of is not None else 0

    def room(self, b: Bin, images: int, vision: int) -> bool:
        """Whether ``b`` can take that many more images and vision tokens."""
        return (self.max_images is None or b.images + images <= self.max_images) and (
            self.max_vision is None or b.vision + vision <= self.max_vision
        )

    def full(self, b: Bin) -> bool:
        return (
            self.max_length - b.used < self.min_remaining
            or len(b.segments) >= self.max_sequences
            or (self.max_images is not None and b.images >= self.max_images)
            or (self.max_vision is not None and b.vision >= self.max_vision)
        )


class LanePacker:
    """One lane's open bins. ``add`` returns bins that closed, in closing order."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self._opened = 0

    def _new_bin(self) -> Bin:
        self._opened += 1
        return Bin(self._opened)

    def add(self, record: SampleRecord, length: int) -> list[Bin]:
        raise NotImplementedError

    def drain(self) -> list[Bin]:
        raise NotImplementedError

    def pending(self) -> bool:
        raise NotImplementedError

    def state(self) -> dict[str, Any]:
        """The open bins (records by reference) and counters, in fresh containers."""
        return {"opened": self._opened, **self._open_state()}

    def load(self, state: dict[str, Any]) -> None:
        self._opened = int(state["opened"])
        self._load_open(state)

    def _open_state(self) -> dict[str, Any]:
        raise NotImplementedError

    def _load_open(self, state: dict[str, Any]) -> None:
        raise NotImplementedError


class FitPacker(LanePacker):
    """``first_fit`` and ``best_fit`` over at most ``num_bins`` open bins of whole records."""

    def __init__(self, limits: Limits, *, best: bool) -> None:
        super().__init__(limits)
        self.best = best
        self.bins: list[Bin] = []

    def _evict(self) -> Bin:
        bins = self.bins
        if self.limits.strategy == "fifo":
            return bins.pop(0)
        best_i = 0
        best_used = -1
        for i, b in enumerate(bins):
            if b.used > best_used:
                best_i, best_used = i, b.used
        return bins.pop(best_i)

    def add(self, record: SampleRecord, length: int) -> list[Bin]:
        limits = self.limits
        capacity = limits.max_length - length
        bins = self.bins
        images, vision = counts = limits.counts(record)
        capped = limits.images_of is not None or limits.vision_of is not None
        chosen = -1
        if self.best:
            best_used = -1
            for i, b in enumerate(bins):
                used = b.used
                if best_used < used <= capacity and (not capped or limits.room(b, *counts)):
                    chosen, best_used = i, used
        else:
            for i, b in enumerate(bins):
                if b.used <= capacity and (not capped or limits.room(b, *counts)):
                    chosen = i
                    break
        closed: list[Bin] = []
        if chosen < 0:
            if len(bins) >= limits.num_bins:
                closed.append(self._evict())
            target = self._new_bin()
            bins.append(target)
            chosen = len(bins) - 1
        else:
            target = bins[chosen]
        target.put(record, 0, length, True, images, vision)
        if limits.full(target):
            del bins[chosen]
            closed.append(target)
        return closed

    def drain(self) -> list[Bin]:
        out = [b for b in self.bins if b.segments]
        self.bins = []
        return out

    def pending(self) -> bool:
        return bool(self.bins)

    def _open_state(self) -> dict[str, Any]:
        return {"bins": [b.state() for b in self.bins]}

    def _load_open(self, state: dict[str, Any]) -> None:
        self.bins = [Bin.from_state(b, self.limits) for b in state["bins"]]


class SortedFitPacker(FitPacker):
    """``best_fit`` without image or vision caps (every text pipeline): the open bins are also
    kept sorted by fill, so the fullest bin with room is one bisect away instead of a scan of
    every open bin; this runs once per record on the engine's serial path. It decides every
    bin exactly as :class:`FitPacker` does and saves the same state."""

    def __init__(self, limits: Limits) -> None:
        super().__init__(limits, best=True)
        # (used, -opened) of each open bin, ascending: the last key with used <= room is the
        # fullest bin that fits and, among equally full ones, the first opened (FitPacker's
        # scan keeps the first of equals, and bins are in opening order)
        self._keys: list[tuple[int, int]] = []
        self._open: dict[int, Bin] = {}

    def add(self, record: SampleRecord, length: int) -> list[Bin]:
        limits = self.limits
        keys = self._keys
        closed: list[Bin] = []
        i = bisect.bisect_right(keys, (limits.max_length - length, 0)) - 1
        if i >= 0:
            target = self._open[-keys.pop(i)[1]]
        else:
            if len(self.bins) >= limits.num_bins:
                closed.append(self._evict())
            target = self._new_bin()
            self.bins.append(target)
            self._open[target.opened] = target
        target.put(record, 0, length, True)
        if limits.full(target):
            self.bins.remove(target)
            del self._open[target.opened]
            closed.append(target)
        else:
            bisect.insort(keys, (target.used, -target.opened))
        return closed

    def _evict(self) -> Bin:
        if self.limits.strategy == "fifo":
            b = self.bins.pop(0)
            self._keys.remove((b.used, -b.opened))
        else:  # the fullest, the first opened of equals: the last key
            b = self._open[-self._keys.pop()[1]]
            self.bins.remove(b)
        del self._open[b.opened]
        return b

    def drain(self) -> list[Bin]:
        self._keys, self._open = [], {}
        return super().drain()

    def _load_open(self, state: dict[str, Any]) -> None:
        super()._load_open(state)
        self._open = {b.opened: b for b in self.bins}
        self._keys = sorted((b.used, -b.opened) for b in self.bins)


class WrapPacker(LanePacker):
    """One window filled in stream order; records are split at the window edge."""

    def __init__(self, limits: Limits) -> None:
        super().__init__(limits)
        self.current: Bin | None = None

    def add(self, record: SampleRecord, length: int) -> list[Bin]:
        limits = self.limits
        max_length = limits.max_length
        closed: list[Bin] = []
        start = 0
        while start < length:
            b = self.current
            if b is None:
                b = self.current = self._new_bin()
            take = min(length - start, max_length - b.used)
            b.put(record, start, start + take, start + take == length)
            start += take
            if limits.full(b):
                closed.append(b)
                self.current = None
        return closed

    def drain(self) -> list[Bin]:
        b, self.current = self.current, None
        return [b] if b is not None and b.segments else []

    def pending(self) -> bool:
        return self.current is not None

    def _open_state(self) -> dict[str, Any]:
        return {"current": None if self.current is None else self.current.state()}

    def _load_open(self, state: dict[str, Any]) -> None:
        current = state["current"]
        self.current = None if current is None else Bin.from_state(current)


class _Candidate:
    __slots__ = ("arrival", "record", "start", "stop")

    def __init__(self, record: SampleRecord, start: int, stop: int, arrival: int) -> None:
        self.record = record
        self.start = start
        self.stop = stop
        self.arrival = arrival


class BestFitWrapPacker(LanePacker):
    """A candidate pool packed best-fit, with at most one cut per bin to fill it exactly."""

    def __init__(self, limits: Limits, pool_size: int, max_age: int) -> None:
        super().__init__(limits)
        self.pool_size = pool_size
        self.max_age = max_age
        self._arrivals = 0
        # Sorted by (remaining length, -arrival): the rightmost entry <= space is the largest
        # fitting candidate and, among equal lengths, the oldest one.
        self._by_len: list[tuple[int, int]] = []
        self._by_arrival: dict[int, _Candidate] = {}

    def _insert(self, cand: _Candidate) -> None:
        bisect.insort(self._by_len, (cand.stop - cand.start, -cand.arrival))
        self._by_arrival[cand.arrival] = cand

    def _remove(self, cand: _Candidate) -> None:
        key = (cand.stop - cand.start, -cand.arrival)
        i = bisect.bisect_left(self._by_len, key)
        del self._by_len[i]
        del self._by_arrival[cand.arrival]

    def add(self, record: SampleRecord, length: int) -> list[Bin]:
        self._arrivals += 1
        self._insert(_Candidate(record, 0, length, self._arrivals))
        closed: list[Bin] = []
        while len(self._by_arrival) >= self.pool_size:
            closed.append(self._build())
        return closed

    def _place(self, b: Bin, cand: _Candidate, take: int) -> None:
        self._remove(cand)
        stop = cand.start + take
        b.put(cand.record, cand.start, stop, stop == cand.stop)
        if stop < cand.stop:
            cand.start = stop
            self._insert(cand)

    def _build(self) -> Bin:
        limits = self.limits
        max_length = limits.max_length
        b = self._new_bin()
        oldest = next(iter(self._by_arrival.values()))
        if self._arrivals - oldest.arrival > self.max_age:
            self._place(b, oldest, min(oldest.stop - oldest.start, max_length))
        by_len = self._by_len
        while by_len and not limits.full(b):
            space = max_length - b.used
            i = bisect.bisect_right(by_len, (space, 1)) - 1
            if i < 0:
                break
            length, neg_arrival = by_len[i]
            self._place(b, self._by_arrival[-neg_arrival], length)
        if by_len and not limits.full(b):
            space = max_length - b.used
            i = bisect.bisect_right(by_len, (space, 1))
            if i < len(by_len):
                _, neg_arrival = by_len[i]
                self._place(b, self._by_arrival[-neg_arrival], space)
        return b

    def drain(self) -> list[Bin]:
        out: list[Bin] = []
        while self._by_arrival:
            out.append(self._build())
        return out

    def pending(self) -> bool:
        return bool(self._by_arrival)

    def _open_state(self) -> dict[str, Any]:
        # in the pool's iteration order, which decides the "oldest" candidate
        pool = [[c.arrival, c.record, c.start, c.stop] for c in self._by_arrival.values()]
        return {"arrivals": self._arrivals, "pool": pool}

    def _load_open(self, state: dict[str, Any]) -> None:
        self._arrivals = int(state["arrivals"])
        self._by_len = []
        self._by_arrival = {}
        for arrival, record, start, stop in state["pool"]:
            self._insert(_Candidate(record, start, stop, arrival))


def make_packer(
    algorithm: PackingAlgorithm, limits: Limits, pool_size: int, max_age: int
) -> LanePacker:
    if algorithm == "first_fit":
        return FitPacker(limits, best=False)
    if algorithm == "best_fit":
        uncapped = limits.images_of is None and limits.vision_of is None
        return SortedFitPacker(limits) if uncapped else FitPacker(limits, best=True)
    if algorithm == "wrap":
        return WrapPacker(limits)
    return BestFitWrapPacker(limits, pool_size, max_age)
