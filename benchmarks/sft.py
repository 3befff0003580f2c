"""Chat SFT throughput: expand_chat -> tokenize_chat -> pack_flat against the raw transformers path.

The raw path is what a training script does by hand on the same data: for every conversation
and every assistant turn, ``apply_chat_template(prefix, tokenize=True, return_dict=True,
return_assistant_tokens_mask=True)`` (same template with ``{% generation %}`` tags, same
tokenizer, same ids and masks). The pipeline runs with the threads and process runners on 2
workers, and once with the untagged template (prefix diffing). Each configuration runs
``--repeats`` times in interleaved rounds; the table shows medians.

Conversations (system prompt, 1-4 user/assistant rounds, tool calls, Zipfian pseudo-words) and
a byte-level BPE with the chat special tokens are generated locally; nothing is downloaded.
Prints a table and one final JSON line.

Usage: ``python benchmarks/sft.py [--conversations 2000] [--repeats 3]``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.ops._chat import CHATML, CHATML_TAGGED, TOOLS, make_tokenizer_dir


def words(rng: random.Random, vocab: list[str], n: int) -> str:
    return " ".join(vocab[min(int(rng.paretovariate(1.1)) - 1, len(vocab) - 1)] for _ in range(n))


def make_conversations(n: int, seed: int = 0) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    vocab = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9)))
             for _ in range(5000)]  # fmt: skip
    rows = []
    for _ in range(n):
        messages: list[dict[str, Any]] = [{"role": "system", "content": words(rng, vocab, 20)}]
        for _ in range(rng.randint(1, 4)):
            messages.append({"role": "user", "content": words(rng, vocab, rng.randint(10, 80))})
            if rng.random() < 0.2:
                call = {"name": "weather", "arguments": {"city": words(rng, vocab, 1)}}
                messages.append({"role": "assistant", "tool_calls": [{"function": call}]})
                messages.append({"role": "tool", "content": words(rng, vocab, 10)})
            reply = words(rng, vocab, rng.randint(20, 200))
            messages.append({"role": "assistant", "content": reply})
        row: dict[str, Any] = {"messages": messages}
        if rng.random() < 0.3:
            row["tools"] = TOOLS
        rows.append(row)
    return rows


def make_tokenizer(root: Path, rows: list[dict[str, Any]]) -> Path:
    texts = (m["content"] for r in rows[:500] for m in r["messages"] if m.get("content"))
    return make_tokenizer_dir(root, CHATML_TAGGED, corpus=texts, vocab_size=4096)


def raw_path(tok_dir: Path, rows: list[dict[str, Any]]) -> tuple[float, int]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tok_dir))
    start = time.perf_counter()
    tokens = 0
    for row in rows:
        messages = row["messages"]
        for i, m in enumerate(messages):
            if m["role"] != "assistant":
                continue
            out = tok.apply_chat_template(
                messages[: i + 1],
                tools=row.get("tools"),
                tokenize=True,
                return_dict=True,
                return_assistant_tokens_mask=True,
            )
            tokens += len(out["input_ids"])
    return time.perf_counter() - start, tokens


def pipeline_path(
    tok_dir: Path, rows: list[dict[str, Any]], runner: str, workers: int, template: str
) -> tuple[float, int]:
    from zephon import Dataset, Pipeline, StaticMixtureWorkSource

    source = StaticMixtureWorkSource(
        [Dataset.from_records("chats", rows, shard_size=500)], chunk_size=256
    )
    pipe = (
        Pipeline(source)
        .expand_chat()
        .tokenize_chat(tok_dir, chat_template=template, parallelism=workers)
        .pack_flat(8192, 0, parallelism=workers)
        .options(runner=runner)
    )
    start = time.perf_counter()
    tokens = 0
    for record in pipe:
        packing = record.meta.tags["_packing_metadata"]
        tokens += int(packing["total_length"])
    return time.perf_counter() - start, tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--conversations", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    rows = make_conversations(args.conversations)
    with tempfile.TemporaryDirectory() as tmp:
        tok_dir = make_tokenizer(Path(tmp) / "tok", rows)
        configs: dict[str, Any] = {
            "raw apply_chat_template": lambda: raw_path(tok_dir, rows),
            "pipeline threads x2 (tags)": lambda: pipeline_path(
                tok_dir, rows, "threads", 2, CHATML_TAGGED
            ),
            "pipeline process x2 (tags)": lambda: pipeline_path(
                tok_dir, rows, "process", 2, CHATML_TAGGED
            ),
            "pipeline inline x1 (tags)": lambda: pipeline_path(
                tok_dir, rows, "inline", 1, CHATML_TAGGED
            ),
            "pipeline threads x2 (prefix diff)": lambda: pipeline_path(
                tok_dir, rows, "threads", 2, CHATML
            ),
        }
        times: dict[str, list[float]] = {k: [] for k in configs}
        tokens: dict[str, int] = {}
        for _ in range(args.repeats):
            for name, fn in configs.items():
                seconds, n = fn()
                times[name].append(seconds)
                tokens[name] = n
    raw = statistics.median(times["raw apply_chat_template"])
    print(f"{'configuration':<36} {'conv/s':>9} {'tokens/s':>11} {'vs raw':>7}")
    results = {}
    for name, ts in times.items():
        t = statistics.median(ts)
        results[name] = {
            "conversations_per_s": args.conversations / t,
            "tokens_per_s": tokens[name] / t,
            "tokens": tokens[name],
            "speedup_vs_raw": raw / t,
        }
        r = results[name]
        print(f"{name:<36} {r['conversations_per_s']:>9.0f} {r['tokens_per_s']:>11.0f} "
              f"{r['speedup_vs_raw']:>6.2f}x")  # fmt: skip
    assert len(set(tokens.values())) == 1, f"paths disagree on the token count: {tokens}"
    print(json.dumps({"benchmark": "sft", "conversations": args.conversations,
                      "cpus": os.cpu_count(), "results": results}))  # fmt: skip


if __name__ == "__main__":
    main()
