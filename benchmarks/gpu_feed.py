"""Training step time with zephon feeding a Llama live, over the step time on one batch kept on
the device.

Model: transformers' ``LlamaForCausalLM`` from a config (no download), vocabulary 8,192,
``--model-size`` tiny, 5m, 90m or 690m (the parameter count is printed), bf16 on CUDA and
float32 on CPU (``--device`` picks; CUDA when present). One training step: forward with the
labels, backward, AdamW step. Data: ``benchmarks/engine.py``'s corpus through fetch ->
decode_text -> tokenize (byte-level BPE, max_length = the row length) -> pack_flat -> batch,
every batch turned into ``to_training(convention="hf", return_tensors="pt")`` (``input_ids``,
``labels`` and ``position_ids`` go to the model; pinned and copied with ``non_blocking`` on
CUDA). Modes, each a fresh pipeline:

* ``ceiling``: the first batch, kept on the device, trained on at every step;
* ``in-process``: the process runner with W workers, the engine in the training process;
* ``engine_process``: the same with ``engine_process=True``;
* ``PipelineDataLoader``: ``PipelineDataLoader`` with 4 workers (inline runner in each);
* ``lane_workers``: ``lane_workers=min(W, 4)`` over the 4 lanes and ``iter_training``: the
  inputs are built in the lane workers, the training process maps them (and pins them on CUDA).

Each mode runs ``--warmup`` steps (start-up), then ``--steps`` timed steps; ``vs_ceiling`` is
its mean step time over the ceiling's. On CPU the pipeline and the model share the cores, so
the ratio there is the cost of the cores the data takes, not of the hand-off.

Prints a table and a final JSON line. Usage: ``python benchmarks/gpu_feed.py [--model-size
90m] [--steps 20] [--seq-len 2048] [--batch-size 8]``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from engine import make_corpus, train_tokenizer
from zephon import Dataset, MixtureSpec, Pipeline, StaticMixtureWorkSource
from zephon.torch_loader import PipelineDataLoader

VOCAB = 8192
#: hidden size, intermediate size, layers, attention heads
SIZES = {
    "tiny": (64, 172, 2, 2),
    "5m": (192, 512, 4, 4),
    "90m": (768, 2048, 11, 12),
    "690m": (1536, 4096, 24, 12),
}
MODEL_KEYS = ("input_ids", "labels", "position_ids")


def build_model(size: str, seq_len: int, device: torch.device) -> LlamaForCausalLM:
    hidden, intermediate, layers, heads = SIZES[size]
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        max_position_embeddings=seq_len,
    )
    torch.manual_seed(0)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    return LlamaForCausalLM(config).to(device=device, dtype=dtype)


def pipeline(corpus: Path, tok: Path, args: argparse.Namespace, **options: Any) -> Pipeline:
    source = StaticMixtureWorkSource(
        datasets=[Dataset.from_path("bench", corpus)],
        mixture=MixtureSpec({"bench": 1.0}),
        chunk_size=256,
        seed=42,
    )
    workers = options.pop("workers", args.workers)
    pipe = Pipeline(source).fetch(parallelism=workers).decode_text(parallelism=workers)
    pipe = pipe.tokenize(tok, max_length=args.seq_len, parallelism=workers)
    pipe = pipe.pack_flat(args.seq_len, 0, parallelism=workers).batch(args.batch_size)
    return pipe.options(canonical_replicas=4, **options)


def to_model(batch: Any) -> dict[str, Any]:
    out = batch.to_training(convention="hf", return_tensors="pt")
    return {k: out[k] for k in MODEL_KEYS}


def on_device(inputs: dict[str, Any], device: torch.device) -> dict[str, Any]:
    if device.type != "cuda":
        return inputs
    return {k: v.pin_memory().to(device, non_blocking=True) for k, v in inputs.items()}


def feeds(corpus: Path, tok: Path, args: argparse.Namespace, device: torch.device) -> Any:
    """Mode -> a function that starts a fresh stream of model inputs on ``device``."""

    def live(**options: Any) -> Callable[[], Iterator[dict[str, Any]]]:
        def stream() -> Iterator[dict[str, Any]]:
            for batch in pipeline(corpus, tok, args, **options):
                yield on_device(to_model(batch), device)

        return stream

    def loader() -> Iterator[dict[str, Any]]:
        pipe = pipeline(corpus, tok, args, runner="inline", workers=1)
        cuda = device.type == "cuda"
        items = PipelineDataLoader(pipe, to_model, num_workers=4, pin_memory=cuda)
        for inputs in items:
            yield {k: v.to(device, non_blocking=True) for k, v in inputs.items()}

    def lanes() -> Iterator[dict[str, Any]]:
        pipe = pipeline(corpus, tok, args, lane_workers=max(1, min(args.workers, 4)))
        cuda = device.type == "cuda"
        for inputs in pipe.iter_training(to_model, pin_memory=cuda):
            yield {k: v.to(device, non_blocking=True) for k, v in inputs.items()}

    def ceiling() -> Iterator[dict[str, Any]]:
        stream = live(runner="inline")()
        first = next(stream)
        stream.close()
        while True:
            yield first

    return {
        "ceiling": ceiling,
        "in-process": live(runner="process"),
        "engine_process": live(runner="process", engine_process=True),
        "PipelineDataLoader": loader,
        "lane_workers": lanes,
    }


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_steps(model: Any, stream: Iterator[dict[str, Any]], args: argparse.Namespace) -> float:
    """Mean seconds per training step after ``args.warmup`` steps."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    device = next(model.parameters()).device
    start = 0.0
    for step in range(args.warmup + args.steps):
        if step == args.warmup:
            sync(device)
            start = time.perf_counter()
        try:
            inputs = next(stream)
        except StopIteration:
            raise SystemExit(
                f"gpu_feed: the corpus ran out after {step} steps; raise --docs"
            ) from None
        loss = model(**inputs, use_cache=False).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    sync(device)
    return (time.perf_counter() - start) / args.steps


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model-size", choices=list(SIZES), default=None)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--workers", type=int, default=min(12, os.cpu_count() or 1))
    parser.add_argument("--docs", type=int, default=None, help="corpus size (default: enough)")
    parser.add_argument("--data", type=Path, default=Path("bench-data/gpu_feed"))
    args = parser.parse_args()
    if args.model_size is None:
        args.model_size = "90m" if args.device.startswith("cuda") else "tiny"
    if args.docs is None:  # about 500 tokens a document, fewer when truncated; some to spare
        per_doc = min(350, args.seq_len // 2)
        args.docs = (args.warmup + args.steps + 2) * args.batch_size * args.seq_len // per_doc
    return args


def main() -> None:
    args = parse()
    device = torch.device(args.device)
    corpus, tok = args.data / "corpus", args.data / "tokenizer.json"
    for stale in corpus.glob("part-*.jsonl"):
        stale.unlink()
    train_tokenizer(make_corpus(corpus, args.docs, shards=8), tok)
    model = build_model(args.model_size, args.seq_len, device)
    params = sum(p.numel() for p in model.parameters())
    rows = []
    for mode, start in feeds(corpus, tok, args, device).items():
        step_s = timed_steps(model, start(), args)
        rows.append({"mode": mode, "step_ms": round(step_s * 1e3, 2)})
    for r in rows:
        r["vs_ceiling"] = round(r["step_ms"] / rows[0]["step_ms"], 3)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    head = f"device: {name}  cores: {os.cpu_count()}  model: {args.model_size} ({params:,} params)"
    print(f"{head}  batch: {args.batch_size}x{args.seq_len}  workers: {args.workers}")
    for r in rows:
        print(f"{r['mode']:>20} | {r['step_ms']:>10} ms | {r['vs_ceiling']:>6}x")
    summary = {"benchmark": "gpu_feed", "device": name, "cores": os.cpu_count()}
    summary |= {"model_size": args.model_size, "parameters": params, "workers": args.workers}
    summary |= {"batch": [args.batch_size, args.seq_len], "steps": args.steps}
    print(json.dumps({**summary, "rows": rows}))


if __name__ == "__main__":
    main()
