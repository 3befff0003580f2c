"""``zephon convert`` against the raw tokenizer ceiling, on the same cores in the same run.

A JSON Lines corpus (``--docs`` documents of 20-400 words over ``--files`` files) and a byte-level
BPE tokenizer trained on it (``--vocab`` ids) are written to a temporary folder. Then:

- ``tokenizer ceiling``: ``Tokenizer.encode_batch`` over every text already in memory, in one
  process on every core (the Rust thread pool): no reading, decoding or writing.
- ``zephon convert``: ``convert`` of a pipeline ``decode_text -> tokenize`` into Megatron shards
  with ``--workers`` processes (default: the cores), from the files, start-up included.
- ``zephon convert, 1 worker``: the same in the calling process (one core).

Tokens/s count the tokens written (equal to the ceiling's). Each runs ``--repeats`` times in
interleaved rounds; the table shows medians and the ratio to the ceiling. Beside the wall
clock, tokens per CPU second (this process's threads and its finished children, the pool's
workers): on a shared machine the wall clock also counts waiting for a core.

Then megatron-core's ``IndexedDataset`` (when installed) reads the ``--workers`` output back and
every document is compared, token for token, with what zephon's reader gives.

Usage: ``python benchmarks/convert.py [--docs 40000] [--files 16] [--repeats 3]``. Prints a
table and one final JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from zephon.convert import convert
from zephon.io import Dataset

WORDS = [
    "".join(random.Random(i).choice("abcdefghijklmnopqrstuvwxyz") for _ in range(2 + i % 9))
    for i in range(3000)
]


def write_corpus(folder: Path, docs: int, files: int) -> list[str]:
    rng = random.Random(0)
    texts = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(20, 400))) for _ in range(docs)]
    (folder / "data").mkdir()
    per = -(-docs // files)
    for f in range(files):
        with open(folder / "data" / f"part-{f:04d}.jsonl", "w") as fh:
            fh.writelines(json.dumps({"text": t}) + "\n" for t in texts[f * per : (f + 1) * per])
    return texts


def train_tokenizer(folder: Path, texts: list[str], vocab: int) -> Path:
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=["<s>", "</s>"],
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(texts[:5000], trainer)
    out = folder / "tok"
    out.mkdir()
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text('{"bos_token": "<s>", "eos_token": "</s>"}')
    return out


def cpu_seconds() -> float:
    """CPU time of this process (every thread) and of its children that have ended."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def ceiling(tok_dir: Path, texts: list[str]) -> tuple[float, float, int]:
    tok = Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
    t0, c0 = time.perf_counter(), cpu_seconds()
    encoded = tok.encode_batch(texts, add_special_tokens=False)
    elapsed, cpu = time.perf_counter() - t0, cpu_seconds() - c0
    return elapsed, cpu, sum(len(e.ids) for e in encoded) + 2 * len(texts)  # BOS/EOS as convert


def run_convert(folder: Path, workers: int, name: str) -> tuple[float, float, int]:
    out = folder / name
    shutil.rmtree(out, ignore_errors=True)
    t0, c0 = time.perf_counter(), cpu_seconds()
    result = convert(folder / "p.yaml", out, workers=workers, documents_per_shard=2000)
    return time.perf_counter() - t0, cpu_seconds() - c0, result.tokens


def megatron_read_back(out: Path) -> int | None:
    """Documents of ``out`` megatron-core reads back, each equal to zephon's read of it;
    None when megatron-core is not installed."""
    here = Path(__file__).resolve().parent  # its megatron.py would shadow megatron-core
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != here]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            from megatron.core.datasets.indexed_dataset import IndexedDataset
    except ImportError:
        return None
    ours = Dataset.from_path("converted", out)
    documents = 0
    for k, shard in enumerate(ours.shards):
        theirs = IndexedDataset(str(out / Path(shard.location).stem))
        mine = ours.read(k, range(len(shard)))
        assert len(theirs) == len(mine), f"{shard.location}: document counts differ"
        for i, row in enumerate(mine):
            assert np.array_equal(theirs[i], row["input_ids"]), f"{shard.location} doc {i}"
        documents += len(mine)
    return documents


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--docs", type=int, default=40_000)
    parser.add_argument("--files", type=int, default=16)
    parser.add_argument("--vocab", type=int, default=8000)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        texts = write_corpus(folder, args.docs, args.files)
        tok_dir = train_tokenizer(folder, texts, args.vocab)
        (folder / "p.yaml").write_text(
            "datasets:\n  - {name: web, path: data}\noperators:\n  - decode_text\n"
            f"  - {{op: tokenize, tokenizer: {json.dumps(str(tok_dir))}}}\n"
        )
        runs: dict[str, list[tuple[float, float, int]]] = {"ceiling": [], "convert": [], "one": []}
        for _ in range(args.repeats):
            runs["ceiling"].append(ceiling(tok_dir, texts))
            runs["convert"].append(run_convert(folder, args.workers, "out"))
            runs["one"].append(run_convert(folder, 1, "out1"))
        read_back = megatron_read_back(folder / "out")
    rates = {k: statistics.median(n / s for s, _, n in v) for k, v in runs.items()}
    cpu = {k: statistics.median(n / c for _, c, n in v) for k, v in runs.items()}
    tokens = runs["ceiling"][0][2]
    assert all(n == tokens for v in runs.values() for _, _, n in v), "token counts differ"
    labels = {
        "ceiling": f"tokenizer ceiling (encode_batch, {os.cpu_count()} cores)",
        "convert": f"zephon convert ({args.workers} workers)",
        "one": "zephon convert (1 worker)",
    }
    print(f"{args.docs} documents, {tokens} tokens, {args.files} files, vocab {args.vocab}")
    print(f"load average at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    if read_back is None:
        print("megatron-core not installed: the read-back check was skipped")
    else:
        print(f"megatron-core read back all {read_back} documents, equal to zephon's")
    print(f"{'configuration':<46} {'tokens/s':>12} {'vs ceiling':>11} {'tokens/CPU s':>13} "
          f"{'vs ceiling':>11}")  # fmt: skip
    for key, label in labels.items():
        print(f"{label:<46} {rates[key]:>12,.0f} {rates[key] / rates['ceiling']:>10.2f}x "
              f"{cpu[key]:>13,.0f} {cpu[key] / cpu['ceiling']:>10.2f}x")  # fmt: skip
    print(json.dumps({
        "benchmark": "convert", "docs": args.docs, "tokens": tokens, "cores": os.cpu_count(),
        "workers": args.workers, "tokens_per_s": {k: round(v) for k, v in rates.items()},
        "ceiling_over_convert": round(rates["ceiling"] / rates["convert"], 3),
        "tokens_per_cpu_s": {k: round(v) for k, v in cpu.items()},
        "cpu_ceiling_over_convert": round(cpu["ceiling"] / cpu["convert"], 3),
        "load_average": round(os.getloadavg()[0], 1),
        "megatron_read_back_documents": read_back,
    }))  # fmt: skip


if __name__ == "__main__":
    main()
