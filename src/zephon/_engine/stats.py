"""Per-operator counters, kept at micro-batch granularity so tracking costs almost nothing."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from zephon.io import SourceStats
from zephon.types import Tombstone
from zephon.work import MixtureStats

# The reason of the replay filter's tombstones: records a restore streams again and were
# delivered before it, so not drops.
REPLAYED = "replayed"


@dataclass
class OpStats:
    """What one operator did. Times are nanoseconds of wall clock.

    ``worker_ns``: time in ``process_many`` (threads/process: from dispatch to completion,
    so it includes waiting for a free worker). ``accumulator_ns``: time in the accumulator
    (push, flush). ``stall_ns``/``stalls``: time and count blocked handing results to a full
    downstream queue (backpressure). ``queue_depth``: inputs waiting, at snapshot time.
    ``bytes_fetched``/``requests``/``retries``/``cache_hits``: the dataset I/O the operator
    did (only ``fetch`` reads datasets), summed over its worker processes. ``auto``: how
    ``parallelism="auto"`` chose ``parallelism`` (its current share of the cores, as moved
    toward the bottleneck while running), and ``rebalanced``: how often its share moved.
    """

    name: str
    runner: str = "inline"
    parallelism: int = 1
    elements_in: int = 0
    elements_out: int = 0
    micro_batches: int = 0
    worker_ns: int = 0
    accumulator_ns: int = 0
    stall_ns: int = 0
    stalls: int = 0
    queue_depth: int = 0
    bytes_fetched: int = 0
    requests: int = 0
    retries: int = 0
    cache_hits: int = 0
    auto: str = ""
    rebalanced: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def set_io(self, io: SourceStats) -> None:
        """Take the I/O counters of ``io`` (what this operator read so far)."""
        self.bytes_fetched, self.requests = io.bytes_fetched, io.requests
        self.retries, self.cache_hits = io.retries, io.cache_hits


@dataclass
class LaneProgress:
    delivered: int = 0
    next_chunk_id: int = 0
    inflight_chunks: int = 0
    finished: bool = False


@dataclass
class DropCounts:
    """Records the operators dropped (tombstones, restore replays aside), the tokens they had
    (where the operator knew them) and the count per reason category (``pack``, ``skipped``,
    ``filtered``, ...: a tombstone reason up to its first colon). ``cut_records`` /
    ``cut_tokens``: records delivered shorter than they were (truncation) and the tokens cut,
    per category in ``cut_by_reason``; so no token leaves the run without a count."""

    records: int = 0
    tokens: int = 0
    by_reason: dict[str, int] = field(default_factory=dict)
    cut_records: int = 0
    cut_tokens: int = 0
    cut_by_reason: dict[str, int] = field(default_factory=dict)

    def count(self, tomb: Tombstone) -> None:
        """Count one tombstone (or cut note); returns nothing, replays are not drops."""
        reason = tomb.reason or "dropped"
        if reason == REPLAYED:
            return
        key = reason.split(":", 1)[0]
        cut = tomb.cut_tokens
        if cut is not None:
            self.cut_records += 1
            self.cut_tokens += cut
            self.cut_by_reason[key] = self.cut_by_reason.get(key, 0) + 1
            return
        self.records += 1
        self.tokens += tomb.dropped_tokens
        self.by_reason[key] = self.by_reason.get(key, 0) + 1

    def copy(self) -> DropCounts:
        return DropCounts(
            self.records,
            self.tokens,
            dict(self.by_reason),
            self.cut_records,
            self.cut_tokens,
            dict(self.cut_by_reason),
        )

    def describe(self) -> str:
        """``dropped 3 records (1,200 tokens), cut 2 records (96 tokens)``, or ``""``."""
        parts = []
        if self.records:
            parts.append(f"dropped {self.records:,} records ({self.tokens:,} tokens)")
        if self.cut_records:
            parts.append(f"cut {self.cut_records:,} records ({self.cut_tokens:,} tokens)")
        return ", ".join(parts)


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _mixture_lines(mixture: MixtureStats, prefix: str) -> list[str]:
    """Prometheus lines of the target weights, the samples and tokens delivered per dataset
    and their shares (a share is absent while nothing was delivered)."""
    unit = _label(mixture.unit)
    lines = [f"# TYPE {prefix}_mixture_weight gauge"]
    lines += [
        f'{prefix}_mixture_weight{{dataset="{_label(name)}",unit="{unit}"}} {weight}'
        for name, weight in mixture.weights.items()
    ]
    for metric, values, kind in (
        ("samples_total", mixture.samples, "counter"),
        ("tokens_total", mixture.tokens, "counter"),
        ("sample_share", mixture.sample_shares or {}, "gauge"),
        ("token_share", mixture.token_shares or {}, "gauge"),
    ):
        lines.append(f"# TYPE {prefix}_mixture_{metric} {kind}")
        lines += [
            f'{prefix}_mixture_{metric}{{dataset="{_label(name)}"}} {value}'
            for name, value in values.items()
        ]
    return lines


@dataclass
class RunStats:
    """A snapshot of one iteration: totals, per-operator counters and per-lane progress."""

    delivered: int = 0
    tombstones: int = 0
    dropped: DropCounts = field(default_factory=DropCounts)
    skipped: int = 0
    skipped_examples: list[str] = field(default_factory=list)
    samples_read: int = 0
    # source records read again after a restore, to rebuild the records its state names
    samples_refetched: int = 0
    # source samples all of whose outputs were delivered or dropped: the work done, counted
    # where items leave the engine (what is read ahead or held in a buffer is not in it)
    samples_done: int = 0
    chunks: int = 0
    elapsed_s: float = 0.0
    # dataset I/O of the run: this process's and every worker process's, summed
    io: SourceStats = field(default_factory=SourceStats)
    operators: list[OpStats] = field(default_factory=list)
    lanes: dict[int, LaneProgress] = field(default_factory=dict)
    # the target mixture and what this pass delivered of it, over this view's lanes and
    # across restores (None: the source mixes fewer than two datasets)
    mixture: MixtureStats | None = None

    @property
    def items_per_s(self) -> float:
        return self.delivered / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["items_per_s"] = self.items_per_s
        data["mixture"] = self.mixture.to_dict() if self.mixture is not None else None
        return data

    def to_prometheus(self, prefix: str = "zephon_pipeline") -> str:
        """Text exposition format for a Prometheus scrape."""
        lines = [
            f"# TYPE {prefix}_delivered_total counter",
            f"{prefix}_delivered_total {self.delivered}",
            f"# TYPE {prefix}_tombstones_total counter",
            f"{prefix}_tombstones_total {self.tombstones}",
            f"# TYPE {prefix}_dropped_records_total counter",
            f"{prefix}_dropped_records_total {self.dropped.records}",
            f"# TYPE {prefix}_dropped_tokens_total counter",
            f"{prefix}_dropped_tokens_total {self.dropped.tokens}",
            f"# TYPE {prefix}_cut_records_total counter",
            f"{prefix}_cut_records_total {self.dropped.cut_records}",
            f"# TYPE {prefix}_cut_tokens_total counter",
            f"{prefix}_cut_tokens_total {self.dropped.cut_tokens}",
            f"# TYPE {prefix}_samples_read_total counter",
            f"{prefix}_samples_read_total {self.samples_read}",
            f"# TYPE {prefix}_samples_refetched_total counter",
            f"{prefix}_samples_refetched_total {self.samples_refetched}",
        ]
        for name, value in self.io.to_dict().items():
            lines += [
                f"# TYPE {prefix}_io_{name}_total counter",
                f"{prefix}_io_{name}_total {value}",
            ]
        for name in (
            "elements_in",
            "elements_out",
            "micro_batches",
            "worker_ns",
            "accumulator_ns",
            "stall_ns",
            "stalls",
            "bytes_fetched",
            "requests",
            "retries",
            "cache_hits",
        ):
            lines.append(f"# TYPE {prefix}_op_{name}_total counter")
            for op in self.operators:
                lines.append(f'{prefix}_op_{name}_total{{op="{op.name}"}} {getattr(op, name)}')
        lines.append(f"# TYPE {prefix}_op_queue_depth gauge")
        for op in self.operators:
            lines.append(f'{prefix}_op_queue_depth{{op="{op.name}"}} {op.queue_depth}')
        lines.append(f"# TYPE {prefix}_lane_delivered_total counter")
        for lane, progress in sorted(self.lanes.items()):
            lines.append(f'{prefix}_lane_delivered_total{{lane="{lane}"}} {progress.delivered}')
        if self.mixture is not None:
            lines += _mixture_lines(self.mixture, prefix)
        return "\n".join(lines) + "\n"

    def summary(self) -> str:
        """One log line: totals and the busiest operator."""
        busiest = max(self.operators, key=lambda o: o.worker_ns, default=None)
        tail = f", busiest {busiest.name}" if busiest is not None and busiest.worker_ns else ""
        losses = self.dropped.describe()
        io = self.io
        if io.any():
            tail += (
                f", fetched {io.bytes_fetched} bytes in {io.requests} requests "
                f"({io.retries} retries, {io.cache_hits} cache hits)"
            )
        return (
            f"zephon: {self.delivered} items in {self.elapsed_s:.1f}s "
            f"({self.items_per_s:.0f}/s), {self.samples_read} samples read, "
            f"{self.tombstones} tombstones{', ' + losses if losses else ''}{tail}"
        )


_SUMMED_OP_FIELDS = tuple(
    f.name for f in fields(OpStats) if f.type in ("int", int) and f.name != "parallelism"
)
_SUMMED_RUN_FIELDS = (
    "tombstones",
    "skipped",
    "samples_read",
    "samples_refetched",
    "samples_done",
    "chunks",
)


def summed(parts: Sequence[RunStats], delivered: int) -> RunStats:
    """One run's statistics from those of processes that each ran some of its lanes
    (``lane_workers``): counters and worker counts add up, lanes are put together;
    ``delivered`` is what the consumer received (the processes may have sent more)."""
    total = RunStats(delivered=delivered)
    for part in parts:
        for name in _SUMMED_RUN_FIELDS:
            setattr(total, name, getattr(total, name) + getattr(part, name))
        total.dropped = _dropped_sum(total.dropped, part.dropped)
        total.skipped_examples.extend(part.skipped_examples)
        total.elapsed_s = max(total.elapsed_s, part.elapsed_s)
        total.io += part.io
        total.lanes.update(part.lanes)
        total.mixture = _mixture_sum(total.mixture, part.mixture)
        if not total.operators:
            total.operators = [
                OpStats(op.name, op.runner, 0, auto=op.auto) for op in part.operators
            ]
        for mine, theirs in zip(total.operators, part.operators, strict=False):
            mine.parallelism += theirs.parallelism
            for name in _SUMMED_OP_FIELDS:
                setattr(mine, name, getattr(mine, name) + getattr(theirs, name))
    return total


def _dropped_sum(a: DropCounts, b: DropCounts) -> DropCounts:
    total = a.copy()
    total.records += b.records
    total.tokens += b.tokens
    total.cut_records += b.cut_records
    total.cut_tokens += b.cut_tokens
    for mine, theirs in ((total.by_reason, b.by_reason), (total.cut_by_reason, b.cut_by_reason)):
        for key, count in theirs.items():
            mine[key] = mine.get(key, 0) + count
    return total


def _mixture_sum(a: MixtureStats | None, b: MixtureStats | None) -> MixtureStats | None:
    if a is None or b is None:
        return a or b
    return replace(
        a,
        samples={k: v + b.samples.get(k, 0) for k, v in a.samples.items()},
        tokens={k: v + b.tokens.get(k, 0) for k, v in a.tokens.items()},
    )
