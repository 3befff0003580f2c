"""Bounded recovery: checkpoint size and restore-to-first-batch time.

Table 0 (per step): ``pipeline.checkpoint()`` after every batch of the reference pipeline
(tokenize, shuffle 256, pack_flat 256, batch 4; 4 lanes or ``--step-lanes``, chunks of 64,
inline), as a training loop that checkpoints every step calls it: per-call cost (median, mean,
p90, max in ms) and JSON size (``json.dumps``, median and max in KB) over the steps after a
warm-up, and the time to the first batch of a restore from one of them.

Table 1 (a monotone pipeline): after 10, 100, 1000 steps; both must stay flat, since a
checkpoint holds per-lane cursors and source states, never the history.

Table 2 (pack + shuffle + ensure_mixture + batch at production chunk sizes): restore to first
batch at 10 stop points, from the newest snapshot (default) against a replay from the last
flush (``snapshot_every_chunks=0``, the previous behaviour), as a ratio to the cold first batch
of the same run (medians of 5, cold and snapshot starts taking turns; the replay, seconds
long, runs once); plus checkpoint bytes per
buffered record. Garbage is collected before each timed start (cold and restored alike), so a
collection owed by building the 240k-row corpus in memory is not charged to whichever run
happens to trigger it. Prints the tables and a final JSON line.

Table 3 (``--user-only`` runs only this one): the same restore measurement at 5 stop points
for a plan of operators written only against the public API (``tests/ops/_user_ops.py``: a
window sorter and a packer) on a 20,000-document corpus: such a plan takes snapshots too.
Its restores take 10-25 ms, so besides the wall-time ratio it gives the ratio of CPU time
(every thread of the process), medians of ``--repeats`` starts per stop point.
``--snapshot-every-records`` overrides the option (default: the option's default).
Usage: ``python benchmarks/checkpoint.py [--docs 240000] [--skip-monotone] [--per-step-only]
[--step-lanes 4] [--user-only] [--repeats 5] [--snapshot-every-records N]``.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from _reference import reference_pipeline
from zephon import Dataset, MixtureSpec, Pipeline, StaticMixtureWorkSource
from zephon._snapshot_codec import unpack_state
from zephon.checkpoints import refetch_counts


def per_step(steps: int, warmup: int, lanes: int = 4) -> dict[str, Any]:
    """``checkpoint()`` after every batch: cost and size at steady state."""
    pipe = reference_pipeline().options(canonical_replicas=lanes)
    costs: list[float] = []
    sizes: list[int] = []
    it = iter(pipe)
    saved: dict[str, Any] = {}
    for step in range(1, steps + 1):
        next(it)
        start = time.perf_counter()
        state = pipe.checkpoint()
        elapsed = time.perf_counter() - start
        if step > warmup:
            costs.append(elapsed)
            sizes.append(len(json.dumps(state)))
            saved = state
    expected = next(it).ids
    it.close()  # type: ignore[attr-defined]
    restored = reference_pipeline().options(canonical_replicas=lanes)
    restore_s, first = first_batch_s(restored.restore(json.loads(json.dumps(saved))))
    assert first.ids == expected, "restore did not continue where the checkpoint was taken"
    costs.sort()
    return {
        "lanes": lanes,
        "steps": len(costs),
        "ms_median": round(statistics.median(costs) * 1e3, 3),
        "ms_mean": round(statistics.fmean(costs) * 1e3, 3),
        "ms_p90": round(costs[int(0.9 * (len(costs) - 1))] * 1e3, 3),
        "ms_max": round(costs[-1] * 1e3, 3),
        "kb_median": round(statistics.median(sizes) / 1024, 1),
        "kb_max": round(max(sizes) / 1024, 1),
        "restore_first_batch_s": round(restore_s, 4),
    }


def build(docs: int, lanes: int) -> Pipeline:
    rows = [{"id": i, "text": f"document {i} " + "token " * (i % 50)} for i in range(docs)]
    datasets = [
        Dataset.from_records("a", rows[: docs // 2], shard_size=2000),
        Dataset.from_records("b", rows[docs // 2 :], shard_size=2000),
    ]
    source = StaticMixtureWorkSource(
        datasets=datasets,
        mixture=MixtureSpec({"a": 0.7, "b": 0.3}),
        chunk_size=256,
        seed=1,
    )
    return (
        Pipeline(source)
        .decode_text()
        .tokenize("bytes", max_length=256)
        .batch(8)
        .options(runner="threads", canonical_replicas=lanes)
    )


def measure(steps: int, docs: int, lanes: int) -> dict[str, Any]:
    pipe = build(docs, lanes)
    it = iter(pipe)
    for _ in range(steps):
        next(it)
    start = time.perf_counter()
    state = pipe.checkpoint()
    checkpoint_ms = (time.perf_counter() - start) * 1e3
    expected = next(it)
    it.close()  # type: ignore[attr-defined]
    blob = json.dumps(state)

    restore_s, first = first_batch_s(build(docs, lanes).restore(json.loads(blob)))
    assert first.ids == expected.ids, "restore did not continue where the checkpoint was taken"
    return {
        "steps": steps,
        "checkpoint_bytes": len(blob),
        "checkpoint_ms": round(checkpoint_ms, 3),
        "restore_to_first_batch_s": round(restore_s, 4),
    }


WORDS = ["token", "alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta"]


def build_packed(docs: int, lanes: int, *, every: int, records: int | None) -> Pipeline:
    rows = [
        {"id": i, "text": f"document {i} " + " ".join(WORDS[(i + j) % 8] for j in range(i % 97))}
        for i in range(docs)
    ]
    source = StaticMixtureWorkSource(
        datasets=[
            Dataset.from_records("a", rows[: docs * 2 // 3], shard_size=4096),
            Dataset.from_records("b", rows[docs * 2 // 3 :], shard_size=4096),
        ],
        mixture=MixtureSpec({"a": 0.6, "b": 0.4}),
        chunk_size=16_384,
        seed=1,
    )
    return (
        Pipeline(source)
        .decode_text()
        .tokenize("bytes", max_length=2048)
        .pack_flat(2048, 0)
        .shuffle(256, seed=3)
        .ensure_mixture(max_buffer_size=256)
        .batch(8)
        .options(
            runner="threads",
            canonical_replicas=lanes,
            flush_every_k_chunks=8,
            snapshot_every_chunks=every,
            **record_cuts(records),
        )
    )


def record_cuts(records: int | None) -> dict[str, int]:
    """``snapshot_every_records`` when given, else nothing: the pipeline's default applies."""
    return {} if records is None else {"snapshot_every_records": records}


def first_batch_s(pipe: Pipeline) -> tuple[float, Any]:
    start = time.perf_counter()
    it = iter(pipe)
    first = next(it)
    elapsed = time.perf_counter() - start
    it.close()  # type: ignore[attr-defined]
    return elapsed, first


def timed_first_batch(pipe: Pipeline) -> tuple[float, float, Any]:
    """Wall and CPU seconds (every thread of this process) to the first batch, after a
    collection."""
    gc.collect()
    cpu = time.process_time()
    elapsed, first = first_batch_s(pipe)
    return elapsed, time.process_time() - cpu, first


def median_first_batch(make: Any, repeats: int) -> tuple[float, Any]:
    runs = [timed_first_batch(make()) for _ in range(repeats)]
    return statistics.median(r[0] for r in runs), runs[0][2]


def interleaved(
    makers: list[Callable[[], Pipeline]], repeats: int
) -> list[tuple[float, float, Any]]:
    """Median wall and CPU time to the first batch of each maker's pipeline, the makers
    taking turns."""
    runs: list[list[tuple[float, float, Any]]] = [[] for _ in makers]
    for _ in range(repeats):
        for i, make in enumerate(makers):
            runs[i].append(timed_first_batch(make()))
    return [
        (statistics.median(r[0] for r in rs), statistics.median(r[1] for r in rs), rs[0][2])
        for rs in runs
    ]


def state_bytes(state: dict[str, Any]) -> dict[str, float]:
    """Checkpoint bytes per open pack bin, per buffered shuffle record, per queued record."""
    sizes = {"per_open_bin": [0, 0], "per_shuffled": [0, 0], "per_mixture_queued": [0, 0]}
    for lane in state["lanes"].values():
        ops = {k: unpack_state(v) for k, v in (lane.get("operator_state") or {}).items()}
        pack, shuffle, mixture = ops.get("3") or {}, ops.get("4") or {}, ops.get("5") or {}
        if pack:
            sizes["per_open_bin"][0] += len(json.dumps(pack))
            packers = pack.get("packers") or [[None, pack["packer"]]]  # older: one packer
            sizes["per_open_bin"][1] += sum(len(p["bins"]) for _, p in packers)
        if shuffle:
            sizes["per_shuffled"][0] += len(json.dumps(shuffle))
            sizes["per_shuffled"][1] += len(shuffle["items"])
        if mixture:
            queued = json.dumps(mixture).count("$zrec")
            sizes["per_mixture_queued"][0] += len(json.dumps(mixture))
            sizes["per_mixture_queued"][1] += queued
    return {k: round(b / n) if n else 0 for k, (b, n) in sizes.items()}


def restore_points(docs: int, lanes: int, points: int, records: int | None) -> dict[str, Any]:
    """Table 2: the built-in pack, shuffle and mixture plan."""
    return restore_table(
        lambda every: build_packed(docs, lanes, every=every, records=records), points, state_bytes
    )


def _user_ops() -> ModuleType:
    """``tests/ops/_user_ops.py``: operators that use only the public API."""
    path = Path(__file__).resolve().parent.parent / "tests" / "ops" / "_user_ops.py"
    spec = importlib.util.spec_from_file_location("_user_ops", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build_user(docs: int, lanes: int, *, every: int, records: int | None) -> Pipeline:
    """Table 3: tokenize, a user window sorter (64), a user packer (2048), batch 8."""
    ops = _user_ops()
    rows = [
        {"id": i, "text": f"document {i} " + " ".join(WORDS[(i + j) % 8] for j in range(i % 97))}
        for i in range(docs)
    ]
    source = StaticMixtureWorkSource(
        datasets=[Dataset.from_records("a", rows, shard_size=1024)], chunk_size=1024, seed=1
    )
    return (
        Pipeline(source)
        .decode_text()
        .tokenize("bytes", max_length=2048)
        .add_op(ops.WindowSortOp(64))
        .add_op(ops.GreedyPackOp(2048))
        .batch(8)
        .options(
            runner="threads",
            canonical_replicas=lanes,
            flush_every_k_chunks=8,
            snapshot_every_chunks=every,
            **record_cuts(records),
        )
    )


def restore_table(
    build_for: Callable[[int], Pipeline],
    points: int,
    sizes_of: Callable[[dict[str, Any]], dict[str, float]] | None = None,
    repeats: int = 5,
) -> dict[str, Any]:
    """Restore to first batch at ``points`` stop points: snapshots against epoch replay."""

    def make(every: int, state: dict[str, Any] | None = None) -> Pipeline:
        pipe = build_for(every)
        return pipe if state is None else pipe.restore(state)

    total = sum(1 for _ in make(1))
    stops = sorted({max(1, total * i // (points + 1)) for i in range(1, points)} | {total - 2})
    rows = []
    sizes: dict[str, float] = {}
    for stop in stops:
        state = checkpoint_at(make(1), stop)
        expected_ids = state.pop("expected")
        held = checkpoint_at(make(1), stop, held_records=True)
        held.pop("expected")
        replay = checkpoint_at(make(0), stop)
        replay.pop("expected")
        # cold and snapshot starts alternate, so a change in machine load hits them alike
        starts = [lambda: make(1), lambda s=state: make(1, s), lambda s=held: make(1, s)]
        cold, snapshot, with_held = interleaved(starts, repeats)
        cold_s, cold_cpu, _ = cold
        replay_s, replayed = median_first_batch(lambda s=replay: make(0, s), 1)
        row: dict[str, Any] = {"stop": stop, "cold_s": round(cold_s, 3)}
        row["cold_cpu_s"] = round(cold_cpu, 3)
        row["snapshot_cpu_x_cold"] = round(snapshot[1] / cold_cpu, 2)
        row["held_cpu_x_cold"] = round(with_held[1] / cold_cpu, 2)
        row["checkpoint_bytes"] = len(json.dumps(state))
        row["held_bytes"] = len(json.dumps(held))
        row["refetch"] = sum(refetch_counts(state).values())
        for name, seconds, first in (
            ("snapshot", snapshot[0], snapshot[2]),
            ("held", with_held[0], with_held[2]),
            ("replay", replay_s, replayed),
        ):
            assert first.ids == expected_ids, f"{name} restore at {stop} did not continue exactly"
            row[f"{name}_s"] = round(seconds, 3)
            row[f"{name}_x_cold"] = round(seconds / cold_s, 2)
        rows.append(row)
        sizes = sizes or (sizes_of(state) if sizes_of is not None else {})
    return {"batches": total, "rows": rows, "state_bytes": sizes}


def checkpoint_at(pipe: Pipeline, stop: int, held_records: bool = False) -> dict[str, Any]:
    """The checkpoint after ``stop`` batches (JSON round trip), with the next batch's ids."""
    it = iter(pipe)
    for _ in range(stop):
        next(it)
    state = json.loads(json.dumps(pipe.checkpoint(held_records=held_records)))
    state["expected"] = next(it).ids
    it.close()  # type: ignore[attr-defined]
    return state


def print_table(rows: list[dict[str, Any]]) -> None:
    cols = list(rows[0])
    print(" | ".join(f"{c:>16}" for c in cols))
    for row in rows:
        print(" | ".join(f"{row[c]:>16}" for c in cols))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--docs", type=int, default=60_000, help="documents of table 1")
    parser.add_argument("--lanes", type=int, default=4)
    parser.add_argument("--packed-docs", type=int, default=240_000, help="documents of table 2")
    parser.add_argument("--packed-lanes", type=int, default=2)
    parser.add_argument("--points", type=int, default=10)
    parser.add_argument(
        "--snapshot-every-records", type=int, default=None, help="default: the option's default"
    )
    parser.add_argument(
        "--repeats", type=int, default=5, help="table 3: cold and restored starts per stop point"
    )
    parser.add_argument("--skip-monotone", action="store_true")
    parser.add_argument("--per-step-only", action="store_true", help="only table 0")
    parser.add_argument("--steps", type=int, default=400, help="table 0: batches")
    parser.add_argument("--step-lanes", type=int, default=4, help="table 0: lanes")
    parser.add_argument("--user-only", action="store_true", help="only table 3")
    parser.add_argument("--user-docs", type=int, default=20_000, help="documents of table 3")
    args = parser.parse_args()
    out: dict[str, Any] = {"benchmark": "checkpoint"}
    if args.user_only:
        out["user"] = user_table(
            args.user_docs, args.packed_lanes, args.snapshot_every_records, args.repeats
        )
        print(json.dumps(out))
        return
    step = per_step(args.steps, warmup=50, lanes=args.step_lanes)
    print(f"checkpoint() per step, reference pipeline ({args.step_lanes} lanes):")
    print_table([step])
    out["per_step"] = step
    if args.per_step_only:
        print(json.dumps(out))
        return
    if not args.skip_monotone:
        rows = [measure(steps, args.docs, args.lanes) for steps in (10, 100, 1000)]
        print_table(rows)
        out.update(lanes=args.lanes, rows=rows)
    packed = restore_points(
        args.packed_docs, args.packed_lanes, args.points, args.snapshot_every_records
    )
    print(f"{packed['batches']} batches; checkpoint bytes: {packed['state_bytes']}")
    print_table(packed["rows"])
    worst = max(r["snapshot_x_cold"] for r in packed["rows"])
    print(f"worst snapshot restore: {worst}x the cold first batch")
    out["packed"] = {**packed, "docs": args.packed_docs, "lanes": args.packed_lanes}
    out["user"] = user_table(
        args.user_docs, args.packed_lanes, args.snapshot_every_records, args.repeats
    )
    print(json.dumps(out))


def user_table(docs: int, lanes: int, records: int | None, repeats: int = 5) -> dict[str, Any]:
    """Table 3, printed; its rows for the JSON line."""
    table = restore_table(
        lambda every: build_user(docs, lanes, every=every, records=records),
        5,
        repeats=repeats,
    )
    print(f"user operators, {docs} documents: {table['batches']} batches")
    print_table(table["rows"])
    worst = max(r["snapshot_x_cold"] for r in table["rows"])
    worst_cpu = max(r["snapshot_cpu_x_cold"] for r in table["rows"])
    print(f"worst snapshot restore: {worst}x the cold first batch ({worst_cpu}x its CPU time)")
    worst = max(r["held_x_cold"] for r in table["rows"])
    worst_cpu = max(r["held_cpu_x_cold"] for r in table["rows"])
    print(f"with held records: {worst}x the cold first batch ({worst_cpu}x its CPU time)")
    return {**table, "docs": docs, "lanes": lanes}


if __name__ == "__main__":
    main()
