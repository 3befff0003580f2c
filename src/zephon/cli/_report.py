"""What ``zephon run`` shows: its progress and its summary, written to read well in a log file.

Outside a terminal nothing is hard-wrapped (a line is as long as it is; tables get 200
columns), so the summary is one line and the progress bar's last frame is whole. Progress counts
source samples done against the samples the pass reads (see ``zephon._progress.WorkCount``),
also after a resume (the samples done before the checkpoint count as done, so the ETA is for
what is left), and never passes 100 %; with ``--max-batches`` it counts items against it.
"""

from __future__ import annotations

import logging
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


class ConsoleHandler(logging.Handler):
    """Log records printed by a rich console: while its progress bar is live, each record is a
    line of its own above the bar (a plain stream handler would write into the bar's line)."""

    def __init__(self, out: Any) -> None:
        super().__init__()
        self.out = out

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.out.print(self.format(record), markup=False, highlight=False, soft_wrap=True)
        except Exception:
            self.handleError(record)


def done_before(state: Mapping[str, Any] | None) -> int | None:
    """Samples done before the checkpoint ``state`` (0 for a fresh start), as the run that
    wrote it counted them; None when it does not say (another writer)."""
    if state is None:
        return 0
    run = state.get("run")
    done = run.get("samples_done") if isinstance(run, Mapping) else None
    return done if isinstance(done, int) and not isinstance(done, bool) and done >= 0 else None


def show(progress: Any, task: Any, done: int, counts: tuple[int, int], elapsed: float) -> None:
    """Move the bar to ``done`` with the items and token rate. Work past the total means the
    total was wrong: the bar drops it (a count without a total) instead of stopping at 100 %."""
    items, tokens = counts
    shown = next(t for t in progress.tasks if t.id == task)
    if shown.total is not None and done > shown.total:
        shown.total = shown.finished_time = None  # rich's update() cannot unset a total
        progress.update(task, of="")
    rate = elapsed if elapsed > 0 else 1e-9
    rates = f"· {items:,} items · {tokens / rate:,.0f} tokens/s"
    progress.update(task, completed=done, rates=rates)


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


def _percent(share: float | None) -> str:
    return "-" if share is None else f"{share:.1%}"


def mixture_target_line(mixture: Mapping[str, Any] | None) -> str | None:
    """``mixture by tokens: web 70.0%, code 30.0%`` (None: no mixture; weights as
    configured, normalised, in the unit the source mixes by)."""
    if not mixture:
        return None
    weights = mixture.get("weights")
    if not weights:
        return f"mixture: no target weights (the work source has none); by {mixture['unit']}"
    parts = ", ".join(f"{name} {_percent(w)}" for name, w in weights.items())
    return f"mixture by {mixture['unit']}: {parts}"


def mixture_line(mixture: Mapping[str, Any] | None) -> str | None:
    """``mixture by samples: web target 70.0%, delivered 70.0% of samples / 35.1% of
    tokens; code ...``: the target and the shares delivered, by samples and by tokens."""
    if not mixture:
        return None
    weights = mixture.get("weights") or {}
    by_samples = mixture.get("sample_shares") or {}
    by_tokens = mixture.get("token_shares") or {}
    parts = []
    for name in mixture["samples"]:
        target = f"target {_percent(weights.get(name))}, " if weights else ""
        parts.append(
            f"{name} {target}delivered {_percent(by_samples.get(name))} of samples / "
            f"{_percent(by_tokens.get(name))} of tokens"
        )
    return f"mixture by {mixture['unit']}: " + "; ".join(parts)


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
    mixture = mixture_line(summary.get("mixture"))
    if mixture is not None:
        since = " (the pass so far, before the resume included)" if summary["resumed_from"] else ""
        out.print(escape(mixture + since), highlight=False)
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
