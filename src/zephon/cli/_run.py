"""``zephon run CONFIG.yaml``: run a YAML pipeline with progress, checkpoints and resume.

Checkpoints are the pipeline's own (``pipeline.checkpoint()``), written atomically as
``DIR/ckpt-<items delivered>.json``; ``--resume`` restores the newest one, so a run that was
stopped (``--max-batches``, Ctrl-C, a crash after the last checkpoint) continues exactly where
its last checkpoint says, with the same items it would have delivered uninterrupted.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

from zephon.cli._common import (
    EXIT_FAILURE,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    MetricsServer,
    checkpoint_files,
    checkpoint_path,
    fail,
    read_json,
    write_json_atomic,
)
from zephon.errors import CheckpointError, ConfigError, ZephonError

TOKEN_FIELDS = ("input_ids", "tokens", "token_ids", "ids")


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "run",
        help="run a pipeline described in YAML (progress, checkpoints, resume)",
        description="Run the pipeline of CONFIG (see docs/yaml.md). Exit codes: 0 done or "
        "stopped at --max-batches, 1 the run failed, 2 bad command line or config, "
        "130 interrupted.",
    )
    add_arguments(parser)
    parser.set_defaults(func=run)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", metavar="CONFIG.yaml", help="pipeline description")
    parser.add_argument(
        "--max-batches", type=int, default=None, metavar="N",
        help="stop after N items (batches when the pipeline ends with batch); checkpointed",
    )  # fmt: skip
    parser.add_argument("--checkpoint-dir", type=Path, default=None, metavar="DIR")
    parser.add_argument(
        "--checkpoint-every", type=int, default=0, metavar="N",
        help="also checkpoint every N items (default: only when the run stops)",
    )  # fmt: skip
    parser.add_argument("--keep", type=int, default=3, help="checkpoints to keep (3)")
    parser.add_argument(
        "--resume", action="store_true",
        help="restore the newest checkpoint of --checkpoint-dir (start fresh if there is none)",
    )  # fmt: skip
    parser.add_argument("--runner", default=None, help="override options.runner")
    parser.add_argument(
        "--record", type=Path, default=None, metavar="FILE",
        help="append one JSON line per item: its lane and sample ids (for audits and tests)",
    )  # fmt: skip
    parser.add_argument("--json", action="store_true", help="print a JSON summary on stdout")
    parser.add_argument("--stats", action="store_true", help="print per-operator statistics")
    parser.add_argument(
        "--log-every", type=float, default=None, metavar="S",
        help="log a progress line every S seconds (options.log_every_s)",
    )  # fmt: skip
    parser.add_argument(
        "--metrics-port", type=int, default=None, metavar="PORT",
        help="serve Prometheus text at http://127.0.0.1:PORT/metrics while running (0: any)",
    )  # fmt: skip
    parser.add_argument(
        "--prometheus-file", type=Path, default=None, metavar="PATH",
        help="write the Prometheus text to PATH at every checkpoint and at the end",
    )  # fmt: skip
    parser.add_argument("--quiet", action="store_true", help="no progress bar")


def item_stats(item: Any) -> tuple[int, int, list[list[int]], int]:
    """(samples, tokens, sample ids, lane) of one delivered item."""
    from zephon.types import TAG_PACKING, SampleBatch

    records = item.records if isinstance(item, SampleBatch) else [item]
    tokens = 0
    for rec in records:
        tags = rec.meta.tags
        packing = tags.get(TAG_PACKING) if tags else None
        if packing is not None and "total_length" in packing:
            tokens += int(packing["total_length"])
            continue
        payload = rec.payload
        if isinstance(payload, Mapping):
            for name in TOKEN_FIELDS:
                if name in payload:
                    tokens += len(payload[name])
                    break
    ids = [[int(x) for x in rec.meta.sample_id] for rec in records]
    lane = int(records[0].meta.lane_id) if records else -1
    return len(records), tokens, ids, lane


def _prune(directory: Path, keep: int) -> None:
    files = checkpoint_files(directory)
    for old in files[: max(0, len(files) - keep)]:
        old.unlink(missing_ok=True)


def _delivered(state: Mapping[str, Any]) -> int:
    return sum(int(lane.get("delivered", 0)) for lane in state.get("lanes", {}).values())


def _save(pipe: Any, args: argparse.Namespace) -> Path | None:
    if args.checkpoint_dir is None:
        return None
    state = pipe.checkpoint()
    path = checkpoint_path(args.checkpoint_dir, _delivered(state))
    write_json_atomic(path, state)
    _prune(args.checkpoint_dir, args.keep)
    if args.prometheus_file is not None:
        _write_prometheus(pipe, args.prometheus_file)
    return path


def _write_prometheus(pipe: Any, path: Path) -> None:
    stats = pipe.stats()
    if stats is None:
        return
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(stats.to_prometheus(), encoding="utf-8")
    tmp.replace(path)


def _total_reads(config: Any, pipe: Any) -> int | None:
    """Samples this rank will read, when the source makes exactly one pass."""
    src = config.source
    if any(src.get(k) is not None for k in ("exhausted_policy", "max_repeats")):
        return None
    passes = src.get("stop_after_passes", 1)
    if passes is None:
        return None
    total = sum(d.total() for d in pipe.work_source.datasets) * passes
    return int(total // max(1, pipe.runtime_options.dp_world_size))


def run(args: argparse.Namespace) -> int:
    from zephon.config import load_config

    if args.max_batches is not None and args.max_batches < 0:
        return fail("run", "--max-batches must be >= 0", EXIT_USAGE)
    if args.resume and args.checkpoint_dir is None:
        return fail("run", "--resume needs --checkpoint-dir DIR", EXIT_USAGE)
    if args.keep < 1:
        return fail("run", "--keep must be >= 1", EXIT_USAGE)
    try:
        config = load_config(args.config)
        pipe = config.build()
        if args.runner is not None:
            pipe.options(runner=args.runner)
        if args.log_every is not None:
            pipe.options(log_every_s=args.log_every)
    except ConfigError as exc:
        return fail("run", exc, EXIT_USAGE)
    except ZephonError as exc:
        return fail("run", f"{args.config}: {exc}", EXIT_USAGE)
    if args.log_every is not None:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
        log = logging.getLogger("zephon")
        log.addHandler(handler)
        log.setLevel(logging.INFO)

    resumed_from: Path | None = None
    if args.checkpoint_dir is not None:
        args.checkpoint_dir.mkdir(parents=True, exist_ok=True)
    if args.resume:
        files = checkpoint_files(args.checkpoint_dir)
        if files:
            resumed_from = files[-1]
            try:
                pipe.restore(read_json(resumed_from))
            except (CheckpointError, ValueError, OSError) as exc:
                return fail("run", f"cannot resume from {resumed_from}: {exc}", EXIT_USAGE)
        elif not args.quiet:
            print(
                f"zephon run: no checkpoint in {args.checkpoint_dir}; starting from the beginning",
                file=sys.stderr,
            )
    return _loop(args, config, pipe, resumed_from)


def _loop(args: argparse.Namespace, config: Any, pipe: Any, resumed_from: Path | None) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    metrics = None
    if args.metrics_port is not None:
        metrics = MetricsServer(lambda: _prometheus_text(pipe), port=args.metrics_port)
        console.print(f"metrics: {metrics.url}")
    record: TextIO | None = open(args.record, "a", encoding="utf-8") if args.record else None  # noqa: SIM115
    total = None if resumed_from is not None else _total_reads(config, pipe)
    items = samples = tokens = 0
    status, checkpoint = "completed", None
    error: Exception | None = None
    start = time.perf_counter()
    progress = Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TextColumn("{task.completed:,} read"),
        TextColumn("{task.fields[rates]}"),
        TimeElapsedColumn(),
        console=console,
        disable=args.quiet,
        transient=False,
    )
    try:
        with progress:
            task = progress.add_task(Path(args.config).name, total=total, rates="")
            last = 0.0
            if args.max_batches == 0:
                status = "stopped"
                checkpoint = _save(pipe, args)
            else:
                for item in pipe:
                    n, t, ids, lane = item_stats(item)
                    items += 1
                    samples += n
                    tokens += t
                    if record is not None:
                        record.write(json.dumps({"lane": lane, "ids": ids, "tokens": t}) + "\n")
                    now = time.perf_counter()
                    if now - last > 0.2:
                        last = now
                        _update(progress, task, pipe, items, tokens, now - start)
                    if args.checkpoint_every and items % args.checkpoint_every == 0:
                        if record is not None:
                            record.flush()
                        checkpoint = _save(pipe, args)
                    if args.max_batches is not None and items >= args.max_batches:
                        status = "stopped"
                        checkpoint = _save(pipe, args)
                        break
                else:
                    checkpoint = _save(pipe, args)
            _update(progress, task, pipe, items, tokens, time.perf_counter() - start)
    except KeyboardInterrupt:
        status = "interrupted"
        try:
            checkpoint = _save(pipe, args)
        except Exception:  # the engine may be half torn down; keep the last good checkpoint
            checkpoint = None
    except Exception as exc:  # zephon errors and errors raised by user code in an operator
        status, error = "failed", exc
    finally:
        if record is not None:
            record.close()
        if metrics is not None:
            metrics.close()
    elapsed = time.perf_counter() - start
    if args.prometheus_file is not None and status != "failed":
        _write_prometheus(pipe, args.prometheus_file)
    stats = pipe.stats()
    summary = {
        "status": status,
        "config": args.config,
        "items": items,
        "samples": samples,
        "tokens": tokens,
        "elapsed_s": round(elapsed, 3),
        "items_per_s": round(items / elapsed, 2) if elapsed > 0 else 0.0,
        "tokens_per_s": round(tokens / elapsed, 1) if elapsed > 0 else 0.0,
        "checkpoint": str(checkpoint) if checkpoint else None,
        "resumed_from": str(resumed_from) if resumed_from else None,
        "error": f"{type(error).__name__}: {error}" if error else None,
        "stats": stats.to_dict() if stats is not None else None,
    }
    if args.json:
        print(json.dumps(summary))
    else:
        _print_summary(summary, stats if args.stats else None)
    if error is not None:
        return fail("run", f"{type(error).__name__}: {error}", EXIT_FAILURE)
    return EXIT_INTERRUPTED if status == "interrupted" else EXIT_OK


def _prometheus_text(pipe: Any) -> str:
    stats = pipe.stats()
    return stats.to_prometheus() if stats is not None else ""


def _update(progress: Any, task: Any, pipe: Any, items: int, tokens: int, elapsed: float) -> None:
    stats = pipe.stats()
    read = stats.samples_read if stats is not None else 0
    rate = elapsed if elapsed > 0 else 1e-9
    progress.update(
        task,
        completed=read,
        rates=f"{items:,} items · {items / rate:,.1f} items/s · {tokens / rate:,.0f} tokens/s",
    )


def _print_summary(summary: dict[str, Any], stats: Any) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    line = (
        f"{summary['status']}: {summary['items']:,} items, {summary['samples']:,} samples, "
        f"{summary['tokens']:,} tokens in {summary['elapsed_s']:.2f} s "
        f"({summary['items_per_s']:,.1f} items/s, {summary['tokens_per_s']:,.0f} tokens/s)"
    )
    console.print(line, highlight=False)
    if summary["resumed_from"]:
        console.print(f"resumed from {summary['resumed_from']}", highlight=False)
    if summary["checkpoint"]:
        console.print(f"checkpoint: {summary['checkpoint']}", highlight=False)
    if stats is None:
        return
    table = Table(title="operators")
    for col in ("operator", "runner", "workers", "in", "out", "worker s", "acc s", "stalls"):
        table.add_column(col, justify="left" if col in ("operator", "runner") else "right")
    for op in stats.operators:
        table.add_row(
            op.name,
            op.runner,
            str(op.parallelism),
            f"{op.elements_in:,}",
            f"{op.elements_out:,}",
            f"{op.worker_ns / 1e9:.2f}",
            f"{op.accumulator_ns / 1e9:.2f}",
            str(op.stalls),
        )
    console.print(table)
    lanes = Table(title="lanes")
    for col in ("lane", "delivered", "next chunk", "in flight", "finished"):
        lanes.add_column(col, justify="right")
    for lane, p in sorted(stats.lanes.items()):
        lanes.add_row(
            str(lane), f"{p.delivered:,}", str(p.next_chunk_id), str(p.inflight_chunks),
            str(p.finished),
        )  # fmt: skip
    console.print(lanes)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="zephon run")
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
