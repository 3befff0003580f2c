"""Side by side with the released zephon (PyPI ``zephon==0.2.0``) on the reference text pipeline.

JSONL -> decode_text -> tokenize(max_length=2048, truncation) -> pack_flat(2048, best_fit,
16 bins, fullest) -> batch(8, drop_last=True), 20k generated documents, a local BPE tokenizer;
``StaticMixtureWorkSource(chunk_size=1000, seed=42)`` on both sides (1000 divides the corpus, so
the release's pass-tail drop loses nothing). The release gets its tokenizer as a
``PreTrainedTokenizerFast`` instance (its ``tokenizer_id`` needs a transformers directory with
special tokens named) and its own JSONL index (built once, outside the timing).

The release lives in its own virtual environment (``bench-data/released-venv``, created on first
use with ``python -m venv`` + pip; gitignored). Every run is a fresh subprocess; ours and the
release's alternate within each round so both see the same machine noise. Prints per-side
tokens/s, CPU seconds per million tokens and peak RSS, our/released ratios, and one final JSON
line.

Usage: ``python benchmarks/compare_zephon.py [--docs 20000] [--repeats 3] [--workers 2 1]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from pipeline import prepare, spawn  # type: ignore[import-not-found]  # noqa: E402

RELEASED_VERSION = "0.2.0"
RELEASED_PACKAGES = [f"zephon=={RELEASED_VERSION}", "tokenizers", "transformers", "psutil"]

RELEASED_CHILD = r"""
import json, resource, sys, time
cfg = json.loads(sys.argv[1])
start = time.perf_counter()
from transformers import PreTrainedTokenizerFast
from zephon import Dataset, MixtureSpec, Pipeline, StaticMixtureWorkSource

tok = PreTrainedTokenizerFast(
    tokenizer_file=cfg["tok_file"], bos_token="<s>", eos_token="</s>", pad_token="</s>"
)
w = cfg["workers"]
ds = Dataset.from_path("bench", cfg["corpus"])
src = StaticMixtureWorkSource(
    datasets=[ds], mixture=MixtureSpec({"bench": 1.0}), chunk_size=1000, seed=42
)
pipe = (
    Pipeline(src)
    .fetch(parallelism=w)
    .decode_text(parallelism=w)
    .tokenize(tokenizer=tok, field="text", max_length=2048, truncation=True, parallelism=w)
    .pack_flat(2048, pad_token_id=0, algorithm="best_fit", num_bins=16,
               flush_strategy="fullest", tokens_field="input_ids", parallelism=w)
    .batch(8, drop_last=True)
    .options(runner="threads", deterministic=True)
)
first = None
real = rows = 0
for batch in pipe:
    if first is None:
        first = time.perf_counter() - start
    for r in batch.records:
        pad = r.meta.tags["_packing_metadata"]["padding_length"] or 0
        real += len(r.payload["input_ids"]) - pad
        rows += 1
wall = time.perf_counter() - start
me = resource.getrusage(resource.RUSAGE_SELF)
kids = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({
    "tokens": real, "rows": rows, "wall_s": wall, "first_batch_s": first or 0.0,
    "efficiency": real / max(1, rows * 2048),
    "cpu_s": me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime,
    "rss_mb": me.ru_maxrss / 1024,
}))
"""


def released_python(data: Path) -> Path:
    """The release's interpreter, creating its virtual environment on first use."""
    venv = data / "released-venv"
    python = venv / "bin" / "python"
    check = [str(python), "-c", f"import zephon; assert zephon.__version__ == '{RELEASED_VERSION}'"]
    if python.exists() and subprocess.run(check, capture_output=True, cwd="/").returncode == 0:
        return python
    print(f"creating {venv} with {' '.join(RELEASED_PACKAGES)} ...", flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run(
        [str(venv / "bin" / "pip"), "install", "-q", *RELEASED_PACKAGES], check=True, cwd="/"
    )
    return python


def released_corpus(corpus: Path, python: Path) -> Path:
    """The corpus's JSONL files, linked into a folder the release indexes with its own tool."""
    folder = corpus.parent / f"released-{corpus.name}"
    if not (folder / "index.json").exists():
        folder.mkdir(parents=True, exist_ok=True)
        for src in sorted(corpus.glob("part-*.jsonl")):
            link = folder / src.name
            if not link.exists():
                link.symlink_to(src.resolve())
        subprocess.run(
            [str(python), "-m", "zephon.build_index", "jsonl", str(folder)],
            check=True,
            cwd="/",
            capture_output=True,
        )
    return folder


def run_released(python: Path, script: Path, cfg: dict[str, Any]) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    proc = subprocess.run(
        [str(python), str(script), json.dumps(cfg)],
        capture_output=True,
        text=True,
        cwd="/",  # never import our zephon from the repository
        env=env,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"released run failed:\n{proc.stderr[-4000:]}")
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def med(runs: list[dict[str, Any]], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--docs", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", type=int, nargs="+", default=[2, 1])
    parser.add_argument("--data", type=Path, default=Path("bench-data"))
    args = parser.parse_args()

    data = args.data.resolve()
    corpus, tok_dir = prepare(data / "pipeline", args.docs)
    python = released_python(data)
    released_dir = released_corpus(corpus, python)
    script = data / "released_child.py"
    script.write_text(RELEASED_CHILD)

    table: list[dict[str, Any]] = []
    for workers in args.workers:
        ours_cfg = {
            "corpus": str(corpus),
            "tok_dir": str(tok_dir),
            "fraction": 1.0,
            "runner": "threads",
            "workers": workers,
            "algorithm": "best_fit",
            "drop_last": True,
        }
        released_cfg = {
            "corpus": str(released_dir),
            "tok_file": str(tok_dir / "tokenizer.json"),
            "workers": workers,
        }
        ours: list[dict[str, Any]] = []
        released: list[dict[str, Any]] = []
        for _ in range(args.repeats):
            ours.append(spawn("pipeline", ours_cfg))
            released.append(run_released(python, script, released_cfg))
        for r in (*ours, *released):
            r["tokens_per_s"] = r["tokens"] / r["wall_s"]
            r["cpu_per_mtok"] = r["cpu_s"] / r["tokens"] * 1e6
        pairs = zip(ours, released, strict=True)
        ratios = [o["tokens_per_s"] / p["tokens_per_s"] for o, p in pairs]
        row = {
            "workers": workers,
            "ours_tokens_per_s": round(med(ours, "tokens_per_s")),
            "released_tokens_per_s": round(med(released, "tokens_per_s")),
            "speedup": round(statistics.median(ratios), 3),
            "speedup_range": (round(min(ratios), 2), round(max(ratios), 2)),
            "ours_cpu_s_per_Mtok": round(med(ours, "cpu_per_mtok"), 2),
            "released_cpu_s_per_Mtok": round(med(released, "cpu_per_mtok"), 2),
            "ours_rss_mb": round(med(ours, "rss_mb")),
            "released_rss_mb": round(med(released, "rss_mb")),
            "ours_efficiency": round(ours[0]["efficiency"], 4),
            "released_efficiency": round(released[0]["efficiency"], 4),
            "ours_tokens": ours[0]["tokens"],
            "released_tokens": released[0]["tokens"],
            "ours_first_batch_s": round(med(ours, "first_batch_s"), 2),
            "released_first_batch_s": round(med(released, "first_batch_s"), 2),
        }
        table.append(row)

    print(f"cores: {os.cpu_count()}  docs: {args.docs}  released: zephon {RELEASED_VERSION}")
    keys = [k for k in table[0] if k != "workers"]
    print(f"{'':24}" + "".join(f"{'workers=' + str(r['workers']):>24}" for r in table))
    for k in keys:
        print(f"{k:24}" + "".join(f"{r[k]!s:>24}" for r in table))
    print(json.dumps({"benchmark": "compare_zephon", "docs": args.docs, "rows": table}))


if __name__ == "__main__":
    main()
