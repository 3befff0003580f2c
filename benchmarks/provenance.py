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

Then a run with a checkpoint every ``--every`` steps is traced at step ``N``: the trace time
is compared with the cold first batch plus ``N - K`` batches at the measured steady rate
(K: the checkpoint restored), with a trace from the start, and with a trace of step K alone
(the restore and its first batch, which re-reads the records the snapshot holds open).

Prints a table and one final JSON line. Usage:
``python benchmarks/provenance.py [--docs 8000] [--rounds 3] [--every 50]
[--snapshot-every-records N]`` (the last sets ``options.snapshot_every_records``, which bounds
what a restore replays from its snapshot to the checkpoint).
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
    """One run writing both checkpoint forms every ``every`` steps, then a plain run (no
    checkpoints, since the pipeline works ahead while one is written) timing each step."""
    from zephon.checkpoints import checkpoint_path, save_checkpoint
    from zephon.config import load_config

    pipe = load_config(yaml).build()
    encode_s = []
    for k, _ in enumerate(pipe, start=1):
        if k % every == 0:
            save_checkpoint(checkpoint_path(dirs["lean"], k), pipe.checkpoint())
            t0 = time.perf_counter()
            held = pipe.checkpoint(held_records=True)
            encode_s.append(time.perf_counter() - t0)
            save_checkpoint(checkpoint_path(dirs["held"], k), held)
    start, cpu_start = time.perf_counter(), time.process_time()
    times, cpus = [], []
    for _ in load_config(yaml).build():
        times.append(time.perf_counter() - start)
        cpus.append(time.process_time() - cpu_start)
    return {
        "times": times,
        "cpus": cpus,
        "steps": len(times),
        "per_batch_s": (times[-1] - times[0]) / max(1, len(times) - 1),
        "per_batch_cpu_s": (cpus[-1] - cpus[0]) / max(1, len(cpus) - 1),
        "held_checkpoint_s": statistics.median(encode_s),
    }


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


def trace_cost(yaml: Path, work: Path, every: int, repeats: int) -> dict[str, Any]:
    """Trace a step mid-way past a checkpoint and the checkpoint's own step, restoring
    checkpoints without (``lean``) and with (``held``) held payloads, interleaved."""
    from zephon.config import load_config
    from zephon.provenance import trace

    dirs = {m: work / f"ckpt-{m}" for m in ("lean", "held")}
    for d in dirs.values():
        d.mkdir(exist_ok=True)
    run = _write_checkpoints(yaml, dirs, every)
    steps, per_batch, per_cpu = run["steps"], run["per_batch_s"], run["per_batch_cpu_s"]
    target = min(steps - 1, (steps // every - 1) * every + every // 2)  # mid-way past one
    base = (target + 1) // every * every  # items the restored checkpoint had delivered
    got: dict[str, dict[str, list[float]]] = {
        m: {"wall": [], "cpu": [], "at_wall": [], "at_cpu": []} for m in dirs
    }
    colds, cold_cpus = [], []
    for i in range(repeats):
        for m in list(dirs)[i % 2 :] + list(dirs)[: i % 2]:  # alternate which goes first
            wall, cpu = restore_to(yaml, dirs[m], base, target)
            got[m]["wall"].append(wall)
            got[m]["cpu"].append(cpu)
            wall, cpu = restore_to(yaml, dirs[m], base, base)  # the restore and its 1st batch
            got[m]["at_wall"].append(wall)
            got[m]["at_cpu"].append(cpu)
        c0, t0 = time.process_time(), time.perf_counter()  # cold: build, take the 1st batch
        it = iter(load_config(yaml).build())
        next(it)
        colds.append(time.perf_counter() - t0)
        cold_cpus.append(time.process_time() - c0)
        it.close()
    start = trace(yaml, target)
    traced = {m: trace(yaml, target, checkpoint_dir=d) for m, d in dirs.items()}
    assert all(t.replayed == target - base + 1 for t in traced.values())
    first, first_cpu = statistics.median(colds), statistics.median(cold_cpus)
    out: dict[str, Any] = {
        "step": target,
        "restored_at": base,
        "bound_s": first + (target - base) * per_batch,
        "bound_cpu_s": first_cpu + (target - base) * per_cpu,
        # the same with the uninterrupted run's own time for the batches after ``base``
        "bound_window_s": first + run["times"][target] - run["times"][base],
        "bound_window_cpu_s": first_cpu + run["cpus"][target] - run["cpus"][base],
        "cold_first_batch_s": first,
        "cold_first_batch_cpu_s": first_cpu,
        "per_batch_s": per_batch,
        "per_batch_cpu_s": per_cpu,
        "trace_from_start_s": start.elapsed_s,
        "same_batch": {t.fingerprint for t in traced.values()} == {start.fingerprint},
        "held_checkpoint_s": run["held_checkpoint_s"],
    }
    for m, d in dirs.items():
        out[m] = {k: statistics.median(v) for k, v in got[m].items()}
        out[m]["trace_s"] = traced[m].elapsed_s  # zephon.provenance.trace itself, once
        out[m]["bytes"] = checkpoint_path_size(d, base)
    return out


def checkpoint_path_size(directory: Path, items: int) -> int:
    from zephon.checkpoints import checkpoint_path

    return checkpoint_path(directory, items).stat().st_size


def print_trace(traced: dict[str, Any]) -> None:
    step, base = traced["step"], traced["restored_at"]
    print(
        f"trace bound at step {step}: cold first batch + {step - base} batches = "
        f"{traced['cold_first_batch_s']:.2f} + {step - base} x "
        f"{traced['per_batch_s'] * 1e3:.1f} ms = {traced['bound_s']:.2f} s wall, "
        f"{traced['cold_first_batch_cpu_s']:.2f} + {step - base} x "
        f"{traced['per_batch_cpu_s'] * 1e3:.1f} ms = {traced['bound_cpu_s']:.2f} s cpu; at step "
        f"{base}: the cold first batch; from the start {traced['trace_from_start_s']:.2f} s; "
        f"same batch: {traced['same_batch']}"
    )
    print(
        f"with the uninterrupted run's own steps {base + 1}-{step} instead: "
        f"{traced['bound_window_s']:.2f} s wall, {traced['bound_window_cpu_s']:.2f} s cpu "
        f"(held: {traced['held']['wall'] / traced['bound_window_s']:.2f}x wall, "
        f"{traced['held']['cpu'] / traced['bound_window_cpu_s']:.2f}x cpu; lean: "
        f"{traced['lean']['wall'] / traced['bound_window_s']:.2f}x, "
        f"{traced['lean']['cpu'] / traced['bound_window_cpu_s']:.2f}x)"
    )
    print(
        f"{'checkpoint':<10} {'bytes':>10} {f'@{step} s':>7} {'/bound':>6} {'cpu s':>6} "
        f"{'/bound':>6} {f'@{base} s':>7} {'/cold':>6} {'cpu s':>6} {'/cold':>6}"
    )
    for m in ("lean", "held"):
        r = traced[m]
        print(
            f"{m:<10} {r['bytes']:>10,} {r['wall']:>7.2f} {r['wall'] / traced['bound_s']:>6.2f} "
            f"{r['cpu']:>6.2f} {r['cpu'] / traced['bound_cpu_s']:>6.2f} {r['at_wall']:>7.2f} "
            f"{r['at_wall'] / traced['cold_first_batch_s']:>6.2f} {r['at_cpu']:>6.2f} "
            f"{r['at_cpu'] / traced['cold_first_batch_cpu_s']:>6.2f}"
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
