"""What provenance costs: ``batch.provenance()`` and the ``--provenance`` log per step, the
log's size, and ``trace`` from a checkpoint against the bound "cold first batch + the batches
from the checkpoint to N".

The pipeline is the reference one (``benchmarks/pipeline.py``'s corpus and byte-level BPE)
as a two-dataset mixture: half the shards as JSON Lines, half converted to Parquet; tokenize,
shuffle, pack_flat(2048), batch(8), threads runner. Configurations alternate within each round
(same process, same machine load) and the table gives medians of tokens/s and their ratio to the
plain run of the same round:

* ``plain``: iterate only;
* ``provenance``: call ``batch.provenance()`` on every batch;
* ``log``: write every batch to a :class:`zephon.provenance.ProvenanceLog` (flushed at the end);
* ``fingerprint``: ``batch.fingerprint()`` on every batch (what ``--record`` adds per line).

Besides the tokens/s ratio (noisy on a shared machine), each run times the consumer's own calls
(``us/step`` and ``share`` of the run's wall time): the cost provenance adds to a training step,
an upper bound on the throughput it can take whatever else runs on the machine.

Then a run writes a checkpoint every ``--every`` steps in both forms: without the payloads
of held records (``lean``, ``pipeline.checkpoint()``) and with them (``held``,
``checkpoint(held_records=True)``, what ``zephon run`` writes). Each round restores both to a
step ``N`` mid-way past checkpoint ``K`` (what ``zephon trace --step N --checkpoint-dir``
does up to the item, without stopping and previews) and to step ``K`` alone (the restore and
its first batch), and runs the pipeline uninterrupted to ``N``: the bound is its cold first
batch plus its own steps ``K+1..N``. The three take turns; wall and CPU seconds (every thread
of the process), ratios per round, medians; checkpoint bytes; a ``zephon.provenance.trace``
of each form once (the same batch as a trace from the start).

Prints a table and one final JSON line. Usage:
``python benchmarks/provenance.py [--docs 8000] [--rounds 3] [--every 50]
[--snapshot-every-records N] [--trace-only]`` (``--snapshot-every-records`` sets
``options.snapshot_every_records``, which bounds what a restore replays from its snapshot to
the checkpoint; ``--trace-only`` skips the per-step provenance table).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent

YAML = """\
datasets:
  - name: web
    path: {web}
  - name: books
    path: {books}
source:
  chunk_size: 500
  seed: 1
  stop_after_passes: 1
operators:
  - op: tokenize
    tokenizer: {tok}
    max_length: 2048
  - op: shuffle
    buffer_size: 512
    seed: 3
  - pack_flat: {{max_length: 2048, pad_token_id: 0}}
  - op: batch
    microbatch_size: 8
runner: threads
"""


def build_mixture(work: Path, docs: int, snapshot_every: int | None = None) -> Path:
    sys.path.insert(0, str(HERE))
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pipeline import prepare  # type: ignore[import-not-found]

    corpus, tok_dir = prepare(work / "data", docs)
    files = sorted(corpus.glob("part-*.jsonl"))
    books = work / "books"
    books.mkdir(exist_ok=True)
    for f in files[len(files) // 2 :]:
        rows = [json.loads(line) for line in f.read_text().splitlines()]
        pq.write_table(pa.Table.from_pylist(rows), books / (f.stem + ".parquet"))
    web = [str(f) for f in files[: len(files) // 2]]
    path = work / "mixture.yaml"
    text = YAML.format(web=json.dumps(web), books=str(books), tok=str(tok_dir))
    if snapshot_every is not None:  # a restore replays at most this many records per lane
        text += f"options: {{snapshot_every_records: {snapshot_every}}}\n"
    path.write_text(text)
    return path


def tokens_of(batch: Any) -> int:
    from zephon.types import TAG_PACKING

    return sum(int(r.meta.tags[TAG_PACKING]["total_length"]) for r in batch.records)


def one_run(yaml: Path, mode: str, log_dir: Path) -> dict[str, Any]:
    from zephon.config import load_config
    from zephon.provenance import ProvenanceLog

    pipe = load_config(yaml).build()
    log = ProvenanceLog.for_pipeline(log_dir / mode, pipe) if mode == "log" else None
    tokens = steps = segments = 0
    start = time.perf_counter()
    first = extra = 0.0
    for batch in pipe:
        if not steps:
            first = time.perf_counter() - start
        t0 = time.perf_counter()
        if mode == "provenance":
            segments += sum(len(row) for row in batch.provenance())
        elif mode == "fingerprint":
            batch.fingerprint()
        elif log is not None:
            log.write(batch)
        extra += time.perf_counter() - t0
        tokens += tokens_of(batch)
        steps += 1
    if log is not None:
        t0 = time.perf_counter()
        log.close()
        extra += time.perf_counter() - t0
    wall = time.perf_counter() - start
    out = {
        "tokens_per_s": tokens / wall,
        "steps": steps,
        "wall_s": wall,
        "first_s": first,
        "extra_s": extra,  # time the consumer spent in the mode's call
    }
    if log is not None:
        from zephon.provenance import read_log

        table = read_log(log_dir / mode)
        size = sum(p.stat().st_size for p in (log_dir / mode).iterdir())
        out.update(log_bytes=size, segments=table.num_rows)
    return out


def _write_checkpoints(yaml: Path, dirs: dict[str, Path], every: int) -> dict[str, Any]:
    """One run writing both checkpoint forms every ``every`` steps."""
    from zephon.checkpoints import checkpoint_path, save_checkpoint
    from zephon.config import load_config

    pipe = load_config(yaml).build()
    encode_s = []
    steps = 0
    for steps, _ in enumerate(pipe, start=1):
        if steps % every == 0:
            save_checkpoint(checkpoint_path(dirs["lean"], steps), pipe.checkpoint())
            t0 = time.perf_counter()
            held = pipe.checkpoint(held_records=True)
            encode_s.append(time.perf_counter() - t0)
            save_checkpoint(checkpoint_path(dirs["held"], steps), held)
    return {"steps": steps, "held_checkpoint_s": statistics.median(encode_s)}


def restore_to(yaml: Path, directory: Path, items: int, step: int) -> tuple[float, float]:
    """What ``trace(yaml, step, checkpoint_dir=directory)`` does up to the item of ``step``
    (build, read and restore the checkpoint of ``items``, iterate), as wall and CPU seconds of
    this process (every thread) when that item arrives; stopping and previews are left out."""
    from zephon.checkpoints import checkpoint_path, load_checkpoint
    from zephon.config import load_config

    t0, c0 = time.perf_counter(), time.process_time()
    pipe = load_config(yaml).build()
    pipe.restore(load_checkpoint(checkpoint_path(directory, items)))
    it = iter(pipe)
    for _ in range(step - items + 1):
        next(it)
    out = time.perf_counter() - t0, time.process_time() - c0
    it.close()
    return out


def plain_to(yaml: Path, base: int, step: int) -> dict[str, float]:
    """An uninterrupted run to ``step``: its cold first batch, and the batches after ``base``
    up to ``step`` (wall and CPU seconds of this process, every thread)."""
    from zephon.config import load_config

    t0, c0 = time.perf_counter(), time.process_time()
    marks = {}
    it = iter(load_config(yaml).build())
    for k in range(step + 1):
        next(it)
        if k in (0, base, step):
            marks[k] = (time.perf_counter() - t0, time.process_time() - c0)
    it.close()
    return {
        "cold": marks[0][0],
        "cold_cpu": marks[0][1],
        "window": marks[step][0] - marks[base][0],
        "window_cpu": marks[step][1] - marks[base][1],
    }


def trace_cost(yaml: Path, work: Path, every: int, repeats: int) -> dict[str, Any]:
    """Restore to a step mid-way past a checkpoint and to the checkpoint's own step, from
    checkpoints without (``lean``) and with (``held``) held payloads, and an uninterrupted run
    giving the bound of the same round (cold first batch + the batches in between); the three
    take turns in each round, ratios are per round, then medians."""
    from zephon.provenance import trace

    dirs = {m: work / f"ckpt-{m}" for m in ("lean", "held")}
    for d in dirs.values():
        d.mkdir(exist_ok=True)
    run = _write_checkpoints(yaml, dirs, every)
    steps = run["steps"]
    target = min(steps - 1, (steps // every - 1) * every + every // 2)  # mid-way past one
    base = (target + 1) // every * every  # items the restored checkpoint had delivered
    rounds: list[dict[str, Any]] = []
    order = ["plain", *dirs]
    for i in range(repeats):
        got: dict[str, Any] = {}
        for m in order[i % 3 :] + order[: i % 3]:  # no configuration always first
            if m == "plain":
                got[m] = plain_to(yaml, base, target)
                continue
            wall, cpu = restore_to(yaml, dirs[m], base, target)
            at_wall, at_cpu = restore_to(yaml, dirs[m], base, base)  # restore + 1st batch
            got[m] = {"wall": wall, "cpu": cpu, "at_wall": at_wall, "at_cpu": at_cpu}
        plain = got["plain"]
        plain["bound"] = plain["cold"] + plain["window"]
        plain["bound_cpu"] = plain["cold_cpu"] + plain["window_cpu"]
        for m in dirs:
            r = got[m]
            r["x_bound"] = r["wall"] / plain["bound"]
            r["x_bound_cpu"] = r["cpu"] / plain["bound_cpu"]
            r["x_cold"] = r["at_wall"] / plain["cold"]
            r["x_cold_cpu"] = r["at_cpu"] / plain["cold_cpu"]
        rounds.append(got)
    start = trace(yaml, target)
    traced = {m: trace(yaml, target, checkpoint_dir=d) for m, d in dirs.items()}
    assert all(t.replayed == target - base + 1 for t in traced.values())
    out: dict[str, Any] = {
        "step": target,
        "restored_at": base,
        "rounds": repeats,
        "trace_from_start_s": start.elapsed_s,
        "same_batch": {t.fingerprint for t in traced.values()} == {start.fingerprint},
        "held_checkpoint_s": run["held_checkpoint_s"],
    }
    for m in order:
        out[m] = {k: statistics.median(r[m][k] for r in rounds) for k in rounds[0][m]}
    for m, d in dirs.items():
        out[m]["trace_s"] = traced[m].elapsed_s  # zephon.provenance.trace itself, once
        out[m]["bytes"] = checkpoint_path_size(d, base)
    return out


def checkpoint_path_size(directory: Path, items: int) -> int:
    from zephon.checkpoints import checkpoint_path

    return checkpoint_path(directory, items).stat().st_size


def print_trace(traced: dict[str, Any]) -> None:
    step, base, plain = traced["step"], traced["restored_at"], traced["plain"]
    print(
        f"restore to step {step} from the checkpoint at {base}; bound = cold first batch + "
        f"steps {base + 1}-{step} of an uninterrupted run = {plain['cold']:.2f} + "
        f"{plain['window']:.2f} = {plain['bound']:.2f} s wall, {plain['cold_cpu']:.2f} + "
        f"{plain['window_cpu']:.2f} = {plain['bound_cpu']:.2f} s cpu (medians of "
        f"{traced['rounds']} rounds; ratios are per round, then medians); trace from the start "
        f"{traced['trace_from_start_s']:.2f} s; same batch: {traced['same_batch']}"
    )
    print(
        f"{'checkpoint':<10} {'bytes':>10} {f'@{step} s':>7} {'/bound':>6} {'cpu s':>6} "
        f"{'/bound':>6} {f'@{base} s':>7} {'/cold':>6} {'cpu s':>6} {'/cold':>6} {'trace s':>7}"
    )
    for m in ("lean", "held"):
        r = traced[m]
        print(
            f"{m:<10} {r['bytes']:>10,} {r['wall']:>7.2f} {r['x_bound']:>6.2f} {r['cpu']:>6.2f} "
            f"{r['x_bound_cpu']:>6.2f} {r['at_wall']:>7.2f} {r['x_cold']:>6.2f} "
            f"{r['at_cpu']:>6.2f} {r['x_cold_cpu']:>6.2f} {r['trace_s']:>7.2f}"
        )
    print(f"held checkpoint: {traced['held_checkpoint_s'] * 1e3:.0f} ms to take (median)")


def _rounded(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    return round(value, 4) if isinstance(value, float) else value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--docs", type=int, default=8000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--every", type=int, default=50)
    parser.add_argument("--snapshot-every-records", type=int, default=None)
    parser.add_argument("--trace-only", action="store_true", help="only the trace part")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="zephon-prov-bench-"))
    yaml = build_mixture(work, args.docs, args.snapshot_every_records)
    if args.trace_only:
        traced = trace_cost(yaml, work, args.every, args.rounds)
        print_trace(traced)
        print(json.dumps({"docs": args.docs, "trace": _rounded(traced)}))
        return
    modes = ("plain", "provenance", "log", "fingerprint")
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
    ratios: dict[str, list[float]] = {m: [] for m in modes}
    for i in range(args.rounds):
        order = modes[i % len(modes) :] + modes[: i % len(modes)]  # rotate: no mode always first
        got = {m: one_run(yaml, m, work) for m in order}
        for m in modes:
            runs[m].append(got[m])
            ratios[m].append(got[m]["tokens_per_s"] / got["plain"]["tokens_per_s"])
    log = runs["log"][-1]
    steps = runs["plain"][-1]["steps"]
    per_million = log["log_bytes"] / log["segments"] * 1e6 / 2**20
    traced = trace_cost(yaml, work, args.every, args.rounds)
    print(f"{'mode':<12} {'tokens/s':>12} {'vs plain':>9} {'us/step':>9} {'share':>7}")
    summary: dict[str, Any] = {"docs": args.docs, "steps": steps, "rounds": args.rounds}
    for m in modes:
        rate = statistics.median(r["tokens_per_s"] for r in runs[m])
        ratio = statistics.median(ratios[m])
        per_step = statistics.median(r["extra_s"] / r["steps"] for r in runs[m]) * 1e6
        share = statistics.median(r["extra_s"] / r["wall_s"] for r in runs[m])
        summary[m] = {
            "tokens_per_s": round(rate),
            "ratio": round(ratio, 4),
            "us_per_step": round(per_step, 1),
            "share_of_wall": round(share, 5),
        }
        print(f"{m:<12} {rate:>12,.0f} {ratio:>9.3f} {per_step:>9.1f} {share:>7.2%}")
    print(
        f"log: {log['log_bytes']:,} bytes for {log['segments']:,} segments "
        f"({steps} steps): {per_million:.2f} MiB per million samples"
    )
    print_trace(traced)
    summary["log"] = {
        "bytes": log["log_bytes"],
        "segments": log["segments"],
        "mib_per_million_samples": round(per_million, 3),
    }
    summary["trace"] = _rounded(traced)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
