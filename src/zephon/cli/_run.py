"""``zephon run CONFIG.yaml``: run a YAML pipeline with progress, checkpoints and resume.

Checkpoints are the pipeline's own (``pipeline.checkpoint()``), written atomically as
``DIR/ckpt-<items delivered>.json`` with a checksum; ``--resume`` restores the newest valid
one, so a run that stopped for any reason (``--max-batches``, Ctrl-C, SIGTERM, a failure, a
crash after the last checkpoint) continues exactly where its checkpoint says, with the items
it would have delivered uninterrupted. A ``--record`` file is cut back to the checkpoint's
position on resume, so it holds every item exactly once.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from zephon.checkpoints import CheckpointWriteError, latest_checkpoint, save_checkpoint
from zephon.cli._common import (
    EXIT_FAILURE,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_TERMINATED,
    EXIT_USAGE,
    MetricsServer,
    checkpoint_files,
    checkpoint_path,
    fail,
    one_line,
)
from zephon.cli._leave import leave_if_stuck
from zephon.cli._lock import RunLock, RunLockedError
from zephon.cli._record import cut_record, record_position
from zephon.cli._report import ConsoleHandler, console, done_before, print_summary, show
from zephon.cli._signals import RunSignals, Startup
from zephon.errors import (
    OUT_OF_MEMORY_FIX,
    CheckpointError,
    ConfigError,
    WaitInterrupted,
    ZephonError,
)
from zephon.options import RUNNERS

if TYPE_CHECKING:
    from zephon._progress import WorkCount

TOKEN_FIELDS = ("input_ids", "tokens", "token_ids", "ids")


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "run",
        description="Run the pipeline of CONFIG (see docs/yaml.md). Exit codes: 0 done or "
        "stopped at --max-batches, 1 the run failed (its checkpoint is written), 2 bad command "
        "line or config, 130 interrupted (Ctrl-C), 143 terminated (SIGTERM); both write a "
        "final checkpoint once an item was delivered (before that, they stop at once: there "
        "is nothing new to save). SIGUSR1 writes a checkpoint and goes on.",
    )
    add_arguments(parser)
    parser.set_defaults(func=run)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", metavar="CONFIG.yaml", help="pipeline description")
    parser.add_argument(
        "--max-batches", type=int, default=None, metavar="N",
        help="stop after N items (batches when the pipeline ends with batch); checkpointed",
    )  # fmt: skip
    parser.add_argument(
        "--checkpoint-dir", type=Path, default=None, metavar="DIR",
        help="write DIR/ckpt-<items>.json when the run stops (and every --checkpoint-every N)",
    )  # fmt: skip
    parser.add_argument(
        "--checkpoint-every", type=int, default=0, metavar="N",
        help="also checkpoint every N items (default: only when the run stops)",
    )  # fmt: skip
    parser.add_argument(
        "--no-held-records", dest="held_records", action="store_false",
        help="write checkpoints without the payloads of the records shuffle, packing and "
        "mixture buffers hold (smaller files; a restore then reads and re-runs their sources)",
    )  # fmt: skip
    parser.add_argument("--keep", type=int, default=3, help="checkpoints to keep (3)")
    parser.add_argument(
        "--resume", action="store_true",
        help="restore the newest checkpoint of --checkpoint-dir (start fresh if there is none)",
    )  # fmt: skip
    parser.add_argument(
        "--epoch", type=int, default=None, metavar="N",
        help="run pass N over the data, in its own order (overrides the file's 'epoch'); with "
        "--resume it continues epoch N, or starts it after a checkpoint that finished an "
        "earlier one",
    )  # fmt: skip
    parser.add_argument("--runner", default=None, choices=RUNNERS, help="override options.runner")
    parser.add_argument(
        "--record", type=Path, default=None, metavar="FILE",
        help="append one JSON line per item: its lane and sample ids (for audits and tests)",
    )  # fmt: skip
    parser.add_argument(
        "--provenance", type=Path, default=None, metavar="LOG",
        help="log every delivered batch's segments to the Parquet folder LOG (zephon trace "
        "--find, zephon diff); flushed with every checkpoint, cut back on resume",
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
        "--statsd", default=None, metavar="HOST:PORT",
        help="push the statistics to a statsd server over UDP while running (zephon[statsd]; "
        "the YAML's metrics section sets the prefix and interval)",
    )  # fmt: skip
    parser.add_argument(
        "--prometheus-file", type=Path, default=None, metavar="PATH",
        help="write the Prometheus text to PATH at every checkpoint and at the end",
    )  # fmt: skip
    parser.add_argument(
        "--quarantine", type=Path, default=None, metavar="FILE",
        help="append records skipped by on_error: skip to FILE as JSON lines "
        "(default: DIR/quarantine.jsonl with --checkpoint-dir)",
    )  # fmt: skip
    parser.add_argument(
        "--strict", action="store_true",
        help="exit 1 when the run delivers nothing (it always says which operator dropped all)",
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


def _log_lines(err: Any) -> logging.Handler:
    """``--log-every``: the ``zephon`` logger's INFO lines on stderr, printed through the
    bar's console so each is a line of its own above the bar, never glued to it."""
    handler = ConsoleHandler(err)
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
    log = logging.getLogger("zephon")
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    return handler


def _prune(directory: Path, keep: int) -> None:
    files = checkpoint_files(directory)
    for old in files[: max(0, len(files) - keep)]:
        old.unlink(missing_ok=True)


def _delivered(state: Mapping[str, Any]) -> int:
    return sum(int(lane.get("delivered", 0)) for lane in state.get("lanes", {}).values())


def _write_prometheus(pipe: Any, path: Path) -> None:
    stats = pipe.stats()
    if stats is None:
        return
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(stats.to_prometheus(), encoding="utf-8")
    tmp.replace(path)


def _who_dropped_everything(stats: Any) -> str:
    """Name the operator after which no record flowed on (for a run that delivered nothing)."""
    ops = list(stats.operators) if stats is not None else []
    if not ops:
        return "no statistics were tracked (options.track_stats is off)"
    if ops[0].elements_in == 0:
        return "the source produced no samples (are the datasets empty?)"
    for op, after in zip(ops, [*ops[1:], None], strict=True):
        passed_on = after.elements_in if after is not None else op.elements_out
        if op.elements_in > 0 and passed_on == 0:
            return (
                f"operator {op.name!r} received {op.elements_in:,} records and passed none on "
                "(a filter that rejects everything, a map that returns None, a packing or batch "
                "size larger than the data?)"
            )
    return f"{stats.tombstones:,} records became tombstones"


class UsageError(Exception):
    """A command-line or configuration problem found while starting the run (exit 2)."""


def _refused(args: argparse.Namespace, exc: BaseException) -> int:
    """Exit 2 before the run starts; with ``--json`` stdout still gets one JSON object."""
    if args.json:
        print(json.dumps({
            "status": "failed", "config": str(args.config), "items": 0, "samples": 0,
            "tokens": 0, "checkpoint": None, "resumed_from": None, "error": one_line(exc),
        }))  # fmt: skip
    return fail("run", exc, EXIT_USAGE)


class RecordWriteError(Exception):
    """The ``--record`` file cannot be written (a full disk): the run stops without a new
    checkpoint, since one now would be ahead of the record; the last one still matches it."""

    def __init__(self, path: Path, error: OSError) -> None:
        super().__init__(
            f"cannot write the record {path}: {error.strerror or error}; stopped without a new "
            "checkpoint (the newest one matches the record): free space, then resume"
        )


class ProvenanceWriteError(Exception):
    """The ``--provenance`` log cannot be written (a full disk): the run stops as for
    :class:`RecordWriteError`; the parts already written stay, and cover the newest checkpoint."""

    def __init__(self, path: Path, error: OSError) -> None:
        super().__init__(
            f"cannot write the provenance log {path}: {error.strerror or error}; stopped "
            "without a new checkpoint (the newest one matches the log): free space, then resume"
        )


OUTPUT_ERRORS = (RecordWriteError, ProvenanceWriteError, CheckpointWriteError)
"""Errors writing what the run writes: it stops without trying a final checkpoint."""


def _check_arguments(args: argparse.Namespace) -> None:
    if args.max_batches is not None and args.max_batches < 0:
        raise UsageError("--max-batches must be >= 0")
    if args.resume and args.checkpoint_dir is None:
        raise UsageError("--resume needs --checkpoint-dir DIR")
    if args.checkpoint_every and args.checkpoint_dir is None:
        raise UsageError("--checkpoint-every needs --checkpoint-dir DIR (where to write them)")
    if args.checkpoint_every < 0:
        raise UsageError("--checkpoint-every must be >= 0")
    if args.keep < 1:
        raise UsageError("--keep must be >= 1")
    if args.epoch is not None and args.epoch < 0:
        raise UsageError("--epoch must be >= 0")


def _build(args: argparse.Namespace) -> tuple[Any, Any]:
    from zephon.config import load_config

    try:
        config = load_config(args.config)
        pipe = config.build()
        if args.epoch is not None:
            pipe.set_epoch(args.epoch)
        if args.runner is not None:
            pipe.options(runner=args.runner)
        if args.log_every is not None:
            pipe.options(log_every_s=args.log_every)
        quarantine = args.quarantine
        if quarantine is None and args.checkpoint_dir is not None:
            quarantine = args.checkpoint_dir / "quarantine.jsonl"
        if quarantine is not None:
            pipe.options(quarantine=str(quarantine))
        if args.statsd is not None:
            from zephon.metrics import parse_address

            parse_address(args.statsd)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    except ZephonError as exc:
        raise UsageError(f"{args.config}: {exc}") from None
    return config, pipe


def _resume(
    args: argparse.Namespace, config: Any, pipe: Any
) -> tuple[Path | None, Mapping[str, Any] | None]:
    """Restore the newest valid checkpoint; (its path, its state) or (None, None)."""
    try:
        latest = latest_checkpoint(args.checkpoint_dir, set_aside=True)
    except CheckpointError as exc:
        raise UsageError(f"cannot resume: {exc}") from None
    if latest is None:
        if not args.quiet:
            print(
                f"zephon run: no checkpoint in {args.checkpoint_dir}; starting from the beginning",
                file=sys.stderr,
            )
        return None, None
    for path, reason in latest.rejected:
        print(
            f"zephon run: warning: {reason}; set it aside as {path.name} and resuming from "
            f"the newest valid checkpoint, {latest.path}",
            file=sys.stderr,
        )
    requested = args.epoch if args.epoch is not None else config.epoch
    try:
        pipe.restore(latest.state)
        if requested is not None:  # the run's epoch: continue it, or start it after a done one
            pipe.set_epoch(requested)
    except (CheckpointError, ValueError) as exc:
        raise UsageError(f"cannot resume from {latest.path}: {exc}") from None
    return latest.path, latest.state


def run(args: argparse.Namespace) -> int:
    # an operator stuck for good keeps a thread the interpreter would join at exit forever
    return leave_if_stuck(_run(args))


def _run(args: argparse.Namespace) -> int:
    # Signals are handled from the command's start (zephon.cli.main): until the first item a
    # stop ends the run at once with its summary, afterwards after the item being delivered.
    Startup.config, Startup.json = str(args.config), bool(args.json)
    with RunSignals() as signals:
        try:
            _check_arguments(args)
            from zephon.io import io_totals

            before = io_totals()
            config, pipe = _build(args)
            Startup.opened_io = (io_totals() - before).to_dict()
        except UsageError as exc:
            return _refused(args, exc)
        if args.checkpoint_dir is None:
            return RunLoop(args, config, pipe, signals).execute()
        lock = RunLock(args.checkpoint_dir)
        try:
            args.checkpoint_dir.mkdir(parents=True, exist_ok=True)
            lock.acquire()
        except (OSError, RunLockedError) as exc:
            return _refused(args, exc)
        try:
            return _run_locked(args, config, pipe, signals)
        finally:
            lock.release()


def _run_locked(args: argparse.Namespace, config: Any, pipe: Any, signals: RunSignals) -> int:
    """The run once it holds its checkpoint directory: resume, cut the record, iterate."""
    loop = RunLoop(args, config, pipe, signals)
    if args.resume:
        try:
            loop.resumed_from, state = _resume(args, config, pipe)
        except UsageError as exc:
            return _refused(args, exc)
        Startup.checkpoint = str(loop.resumed_from) if loop.resumed_from is not None else None
        if state is not None:
            loop.before = done_before(state)
            loop.start_step = _delivered(state)
        if args.record is not None:
            run_meta = state.get("run", {}) if state is not None else None
            cut_record(args.record, args.checkpoint_dir, run_meta)
    return loop.execute()


class RunLoop:
    """One ``zephon run``: iterate, record, checkpoint, and end with a summary."""

    def __init__(
        self,
        args: argparse.Namespace,
        config: Any,
        pipe: Any,
        signals: RunSignals,
    ) -> None:
        self.args, self.config, self.pipe = args, config, pipe
        self.resumed_from: Path | None = None
        # samples done before the checkpoint resumed from (None: unknown, so no total)
        self.before: int | None = 0
        self.count: WorkCount | None = None  # the bar's measure of the work, once it runs
        self.signals = signals
        self.items = self.samples = self.tokens = 0
        self.status = "completed"
        self.checkpoint: Path | None = None
        self.error: BaseException | None = None
        self.record: TextIO | None = None
        self.start_step = 0  # items delivered before this run (a resumed checkpoint's)
        self.provenance: Any = None
        # a stop signal also ends a wait for the next item (a stalled store, a stuck worker)
        pipe.interrupt_when(lambda: signals.stop_requested)
        # held while an item is recorded or a checkpoint written: the stop watch's take-over
        # (the main thread stuck in an operator) never cuts one in half
        self.lock = threading.Lock()
        self._started = time.perf_counter()
        if signals.watch is not None:
            signals.watch.take_over = self._take_over

    def _take_over(self, operator: str, signum: int) -> int:
        """End the run from the stop watch's thread: the main thread has been inside
        ``operator`` since before the stop signal (see ``StopWatch``), whose handler may never
        have run (a call blocked in C)."""
        if self.signals.stop_signal is None:
            self.signals.stop_signal = signum
        print(
            f"zephon run: warning: operator {operator!r} has not returned since the stop signal "
            "(a call it makes never returns; py-spy dump shows where); checkpointing the last "
            "delivered item and leaving without it",
            file=sys.stderr,
        )
        self.status = self._stop_status()
        if not self.lock.acquire(timeout=5.0):
            return EXIT_TERMINATED if self.status == "terminated" else EXIT_INTERRUPTED
        self._save_after_stop()
        return self._finish(time.perf_counter() - self._started)

    def save(self) -> Path | None:
        """Write the checkpoint of what was delivered (with the record file's position)."""
        args = self.args
        if args.checkpoint_dir is None:
            return None
        state = self.pipe.checkpoint(held_records=args.held_records)
        if self.count is not None and self.count.before is not None:
            # what the bar of a resume starts at (the work before the checkpoint)
            state.setdefault("run", {})["samples_done"] = self.count.done()
        if self.provenance is not None:
            try:
                self.provenance.flush()  # the log covers every step the checkpoint does
            except OSError as exc:
                raise ProvenanceWriteError(args.provenance, exc) from None
        if self.record is not None:
            try:
                self.record.flush()
                os.fsync(self.record.fileno())
            except OSError as exc:
                raise RecordWriteError(args.record, exc) from None
            where = record_position(args.record, args.checkpoint_dir, self.record.tell())
            state.setdefault("run", {})["record"] = where
        target = checkpoint_path(args.checkpoint_dir, _delivered(state), self.pipe.epoch)
        path = save_checkpoint(target, state)
        _prune(args.checkpoint_dir, args.keep)
        if args.prometheus_file is not None:
            _write_prometheus(self.pipe, args.prometheus_file)
        self.checkpoint = path
        return path

    def _save_after_stop(self) -> None:
        """Checkpoint after a stop or a failure; a broken engine keeps the last good one."""
        try:
            self.save()
        except Exception as exc:
            print(f"zephon run: warning: no final checkpoint ({exc})", file=sys.stderr)

    def _stop_status(self) -> str:
        return "terminated" if self.signals.stop_signal == signal.SIGTERM else "interrupted"

    def _deliver(self, item: Any) -> None:
        self.signals.started()  # before the record line: a stop now saves a checkpoint
        n, t, ids, lane = item_stats(item)
        self.items += 1
        self.samples += n
        self.tokens += t
        if self.provenance is not None:
            try:
                self.provenance.write(item)  # a full buffer writes a part
            except OSError as exc:
                raise ProvenanceWriteError(self.args.provenance, exc) from None
        if self.record is not None:
            from zephon.provenance import content_fingerprint

            entry = {
                "lane": lane,
                "ids": ids,
                "tokens": t,
                "fingerprint": content_fingerprint(item),
            }
            line = json.dumps(entry) + "\n"
            try:
                self.record.write(line)
            except OSError as exc:
                raise RecordWriteError(self.args.record, exc) from None

    def _iterate(self, progress: Any, task: Any) -> None:
        args, signals = self.args, self.signals
        start = time.perf_counter()
        last = 0.0
        if signals.stop_requested or args.max_batches == 0:
            self.status = self._stop_status() if signals.stop_requested else "stopped"
            self.save()
            return
        for item in self.pipe:
            with self.lock:
                self._deliver(item)
                now = time.perf_counter()
                if now - last > 0.2:
                    last = now
                    self._update(progress, task, now - start)
                if signals.stop_requested:
                    self.status = self._stop_status()
                    self.save()
                    return
                due = args.checkpoint_every and self.items % args.checkpoint_every == 0
                if due or signals.take_checkpoint_request():
                    self.save()
                if args.max_batches is not None and self.items >= args.max_batches:
                    self.status = "stopped"
                    self.save()
                    return
        self.save()

    def _update(self, progress: Any, task: Any, elapsed: float) -> None:
        assert self.count is not None
        done = self.items if self.args.max_batches is not None else self.count.done()
        show(progress, task, done, (self.items, self.tokens), elapsed)

    def _bar(self, err: Any) -> tuple[Any, Any]:
        """The progress bar and its task: items against ``--max-batches`` when it is given
        (the run's end is known in items), else the samples done against the pass's plan."""
        from rich.progress import TextColumn

        from zephon._progress import WorkCount, of_total, progress_bar

        count = self.count = WorkCount(self.pipe, self.before)
        if self.args.max_batches is not None:
            unit, total, done = "items", self.args.max_batches, 0
        else:
            unit, total, done = "samples", count.total, count.before or 0
        bar = progress_bar(err, unit, TextColumn("{task.fields[rates]}"), disable=self.args.quiet)
        name = Path(self.args.config).name
        task = bar.add_task(name, total=total, completed=done, rates="", of=of_total(total))
        return bar, task

    def execute(self) -> int:
        args = self.args
        err = console(stderr=True)
        metrics = None
        if args.metrics_port is not None:
            metrics = MetricsServer(lambda: _prometheus_text(self.pipe), port=args.metrics_port)
            err.print(f"metrics: {metrics.url}")
        try:
            self._open_outputs()
        except UsageError as exc:
            return _refused(args, exc)
        reporter = _metrics_reporter(self.pipe, self.config.metrics, args.statsd)
        progress, task = self._bar(err)
        log = _log_lines(err) if args.log_every is not None else None
        start = time.perf_counter()
        try:
            with progress:
                self._iterate(progress, task)
                self._update(progress, task, time.perf_counter() - start)
                total = progress.tasks[0].total
                if self.status == "completed" and total is not None and args.max_batches is None:
                    progress.update(task, completed=total)  # the pass is read, all of it
        except (KeyboardInterrupt, WaitInterrupted) as exc:  # a stop signal while the run
            # waited, a second stop signal, or Ctrl-C inside the engine
            self.status = self._stop_status()
            for note in getattr(exc, "__notes__", ()):  # an operator that never returned
                print(f"zephon run: warning: {note}", file=sys.stderr)
            self._save_after_stop()
        except OUTPUT_ERRORS as exc:
            self.status, self.error = "failed", exc
        except Exception as exc:  # zephon errors and errors raised by user code in an operator
            self.status, self.error = "failed", exc
            self._save_after_stop()
        finally:
            if self.record is not None:
                with contextlib.suppress(OSError):  # a full disk: said above, cut on resume
                    self.record.close()
            if self.provenance is not None and self.status != "failed":
                self._close_provenance()
            if metrics is not None:
                metrics.close()
            if reporter is not None:
                reporter.close()
            if log is not None:
                logging.getLogger("zephon").removeHandler(log)
        return self._finish(time.perf_counter() - start)

    def _open_outputs(self) -> None:
        """Open the ``--record`` file and the ``--provenance`` log; a path that cannot be one
        is a usage error (exit 2) before anything runs."""
        args = self.args
        if args.record is not None:
            try:  # line-buffered: a kill loses no line of an item already delivered
                self.record = open(args.record, "a", encoding="utf-8", buffering=1)  # noqa: SIM115
            except OSError as exc:
                raise UsageError(f"cannot open the record {args.record}: {exc.strerror}") from None
        if args.provenance is not None:
            from zephon.provenance import ProvenanceLog

            try:
                self.provenance = ProvenanceLog.for_pipeline(
                    args.provenance, self.pipe, start_step=self.start_step
                )
            except (OSError, ValueError) as exc:
                if self.record is not None:
                    self.record.close()
                if isinstance(exc, ValueError):
                    raise UsageError(str(exc)) from None
                raise UsageError(
                    f"cannot open the provenance log {args.provenance}: {exc.strerror or exc}"
                ) from None

    def _close_provenance(self) -> None:
        """Write the log's last part; a failure fails the run (its steps are not all logged)."""
        try:
            self.provenance.close()
        except OSError as exc:
            self.status, self.error = "failed", ProvenanceWriteError(self.args.provenance, exc)

    def _finish(self, elapsed: float) -> int:
        args, pipe = self.args, self.pipe
        if args.prometheus_file is not None and self.status != "failed":
            _write_prometheus(pipe, args.prometheus_file)
        stats = pipe.stats()
        summary = self._summary(elapsed, stats)
        if args.json:
            print(json.dumps(summary))
        else:
            print_summary(summary, stats if args.stats else None)
        if self.error is not None:
            code = EXIT_USAGE if isinstance(self.error, ConfigError) else EXIT_FAILURE
            return fail("run", _describe_error(self.error, pipe), code)
        if self.status == "terminated":
            return EXIT_TERMINATED
        if self.status == "interrupted":
            return EXIT_INTERRUPTED
        if self.items == 0 and self.resumed_from is None and self.status == "completed":
            why = _who_dropped_everything(stats)
            print(f"zephon run: warning: the run delivered nothing: {why}", file=sys.stderr)
            if args.strict:
                return EXIT_FAILURE
        return EXIT_OK

    def _summary(self, elapsed: float, stats: Any) -> dict[str, Any]:
        error = self.error
        return {
            "status": self.status,
            "config": self.args.config,
            "items": self.items,
            "samples": self.samples,
            "tokens": self.tokens,
            "elapsed_s": round(elapsed, 3),
            "items_per_s": round(self.items / elapsed, 2) if elapsed > 0 else 0.0,
            "tokens_per_s": round(self.tokens / elapsed, 1) if elapsed > 0 else 0.0,
            "checkpoint": str(self.checkpoint) if self.checkpoint else None,
            "resumed_from": str(self.resumed_from) if self.resumed_from else None,
            "error": f"{type(error).__name__}: {error}" if error else None,
            "dropped": stats.to_dict()["dropped"] if stats is not None else None,
            # the whole pass's so far: a resumed run's counts go on from its checkpoint's
            "mixture": stats.mixture.to_dict() if stats and stats.mixture else None,
            "io": stats.io.to_dict() if stats is not None else None,
            "opened_io": Startup.opened_io,
            "stats": stats.to_dict() if stats is not None else None,
        }


def _describe_error(error: BaseException, pipe: Any = None) -> str:
    """``Type: message``, naming the operator it was raised in when the engine knows it, and
    the file and line of the record when the error names one."""
    text = f"{type(error).__name__}: {error}"
    if isinstance(error, MemoryError):
        text = f"{text.rstrip(': ')}: {OUT_OF_MEMORY_FIX}"
    op_name = getattr(error, "zephon_op_name", None)
    if op_name and repr(op_name) not in text:
        text = f"operator {op_name!r}: {text}"
    where = _record_location(error, pipe)
    return f"{where}: {text}" if where else text


def _record_location(error: BaseException | None, pipe: Any) -> str | None:
    """``FILE, line N`` of the record a :class:`MissingFieldError` (or its cause) names."""
    seen = 0
    while error is not None and seen < 5:
        sample_id = getattr(error, "sample_id", None)
        if isinstance(sample_id, tuple) and len(sample_id) == 3 and pipe is not None:
            try:
                dataset = pipe.work_source.datasets[int(sample_id[0])]
                return str(dataset.locate(int(sample_id[1]), int(sample_id[2])))
            except (AttributeError, IndexError, ZephonError, OSError):
                return None
        error, seen = error.__cause__ or error.__context__, seen + 1
    return None


def _metrics_reporter(pipe: Any, section: dict[str, Any], statsd: str | None) -> Any:
    """The statsd reporter the YAML's ``metrics`` section or ``--statsd`` asks for, else None."""
    from zephon.metrics import MetricsReporter, StatsdSink, parse_address

    address = statsd or section.get("statsd")
    if address is None:
        return None
    host, port = parse_address(address)
    sink = StatsdSink(
        host,
        port,
        prefix=section.get("prefix", "zephon"),
        max_packet_bytes=section.get("max_packet_bytes", 512),
    )
    return MetricsReporter(pipe.stats, [sink], interval_s=section.get("interval_s", 10.0))


def _prometheus_text(pipe: Any) -> str:
    stats = pipe.stats()
    return stats.to_prometheus() if stats is not None else ""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="zephon run")
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
