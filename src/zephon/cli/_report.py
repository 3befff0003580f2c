"""What ``zephon run`` shows: its progress and its summary, written to read well in a log file.

Outside a terminal nothing is hard-wrapped (a line is as long as it is; tables get 200
columns), so the summary is one line and the progress bar's last frame is whole. Progress counts
samples against the pass's total, also after a resume (the samples before the checkpoint count
as done, so the ETA is for what is left), and never passes 100 %.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

LOG_WIDTH = 200  # columns for tables and the progress line when the output is not a terminal


def console(*, stderr: bool = False) -> Any:
    """A rich console: a terminal's own width, else soft wrap and :data:`LOG_WIDTH`."""
    from zephon._console import PipeConsole

    terminal = PipeConsole(stderr=stderr)
    if terminal.is_terminal:
        return terminal
    return PipeConsole(stderr=stderr, width=LOG_WIDTH, soft_wrap=True)


def total_reads(config: Any, pipe: Any) -> int | None:
    """Samples this rank will read, when the source makes exactly one pass."""
    src = config.source
    if any(src.get(k) is not None for k in ("exhausted_policy", "max_repeats")):
        return None
    passes = src.get("stop_after_passes", 1)
    if passes is None:
        return None
    total = sum(d.total() for d in pipe.work_source.datasets) * passes
    return int(total // max(1, pipe.runtime_options.dp_world_size))


def read_before(state: Mapping[str, Any], pipe: Any) -> int | None:
    """Samples this rank read before the restart points of a one-pass checkpoint, or None when
    the source does not say: the earliest unfinished lane's source position plus its offset
    in its restart chunk (a lower bound: other lanes may be further on)."""
    positions = []
    for lane in state.get("lanes", {}).values():
        source = lane.get("source_state")
        if lane.get("done"):
            continue
        if not isinstance(source, Mapping) or not isinstance(source.get("positions"), list):
            return None
        positions.append(
            sum(int(p) for p in source["positions"]) + int(lane.get("start_offset", 0))
        )
    if not positions:
        return None
    return int(min(positions) // max(1, pipe.runtime_options.dp_world_size))


def update(
    progress: Any, task: Any, pipe: Any, counts: tuple[int, int], elapsed: float, before: int
) -> None:
    """Move the bar: samples read (``before`` the resume included), items and token rate."""
    items, tokens = counts
    stats = pipe.stats()
    read = before + (stats.samples_read - stats.samples_refetched if stats is not None else 0)
    total = progress.tasks[0].total if progress.tasks else None
    rate = elapsed if elapsed > 0 else 1e-9
    progress.update(
        task,
        completed=read if total is None else min(read, total),
        rates=f"· {items:,} items · {tokens / rate:,.0f} tokens/s",
    )


def drop_line(dropped: Mapping[str, Any] | None) -> str | None:
    """``dropped: 173 records (1,234,567 tokens): pack 170, filtered 3; cut: 2 records (96
    tokens): tokenize 2`` (None: nothing dropped or cut)."""
    if not dropped:
        return None
    parts = []
    for word, records, tokens, reasons in (
        ("dropped", "records", "tokens", "by_reason"),
        ("cut", "cut_records", "cut_tokens", "cut_by_reason"),
    ):
        if not dropped.get(records):
            continue
        count = f" ({dropped[tokens]:,} tokens)" if dropped.get(tokens) else ""
        why = ", ".join(f"{k} {v:,}" for k, v in sorted(dropped.get(reasons, {}).items()))
        parts.append(f"{word}: {dropped[records]:,} records{count}: {why}")
    return "; ".join(parts) or None


def print_summary(summary: dict[str, Any], stats: Any) -> None:
    from rich.markup import escape
    from rich.table import Table

    out = console()
    line = (
        f"{summary['status']}: {summary['items']:,} items, {summary['samples']:,} samples, "
        f"{summary['tokens']:,} tokens in {summary['elapsed_s']:.2f} s "
        f"({summary['items_per_s']:,.1f} items/s, {summary['tokens_per_s']:,.0f} tokens/s)"
    )
    out.print(line, highlight=False)
    drops = drop_line(summary.get("dropped"))
    if drops is not None:
        out.print(escape(drops), highlight=False)
    io = summary.get("io")
    if io and any(io.values()):
        out.print(
            f"read {io['bytes_fetched']:,} bytes in {io['requests']:,} requests "
            f"({io['retries']:,} retries, {io['cache_hits']:,} cache hits)",
            highlight=False,
        )
    if summary["resumed_from"]:
        out.print(f"resumed from {escape(summary['resumed_from'])}", highlight=False)
    if summary["checkpoint"]:
        out.print(f"checkpoint: {escape(summary['checkpoint'])}", highlight=False)
    if stats is None:
        return
    table = Table(title="operators")
    cols = ("operator", "runner", "workers", "in", "out", "worker s", "acc s", "stalls", "bytes")
    for col in cols:
        table.add_column(col, justify="left" if col in ("operator", "runner") else "right")
    for op in stats.operators:
        table.add_row(
            escape(op.name),
            op.runner,
            str(op.parallelism),
            f"{op.elements_in:,}",
            f"{op.elements_out:,}",
            f"{op.worker_ns / 1e9:.2f}",
            f"{op.accumulator_ns / 1e9:.2f}",
            str(op.stalls),
            f"{op.bytes_fetched:,}",
        )
    out.print(table)
    lanes = Table(title="lanes")
    for col in ("lane", "delivered", "next chunk", "in flight", "finished"):
        lanes.add_column(col, justify="right")
    for lane, p in sorted(stats.lanes.items()):
        lanes.add_row(
            str(lane), f"{p.delivered:,}", str(p.next_chunk_id), str(p.inflight_chunks),
            str(p.finished),
        )  # fmt: skip
    out.print(lanes)
