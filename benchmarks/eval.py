"""What evaluating a pipeline with ZephonTrainer costs per eval batch, against the same forwards
without it.

Rows (one process, a tiny random Llama on the CPU, eval batches of 4 x 256 packed byte tokens,
``.batch(4, drop_last=False)`` over the reference documents):

1. ``plain loop``: a hand-written no-grad loop over the pipeline's batches, ``to_training("hf")``
   and forward: the floor.
2. ``ZephonTrainer.evaluate``: the eval loader over the rank's lanes, token counts, exact sums
   and the closing gather (a no-op in one process).
3. ``Trainer.evaluate``, batches prebuilt in memory: the Trainer's own eval loop (per-batch
   gathers and loss containers), with no data pipeline at all.

Besides: ``TokenLoss.update`` plus ``loss_tokens`` per batch (the bookkeeping alone). Times are
medians over interleaved rounds, after a warm-up run. Prints a table and a final JSON line.
Usage: ``python benchmarks/eval.py [--docs 2000] [--rounds 3]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from typing import Any

import torch
from transformers import Trainer, TrainingArguments

from _reference import REFERENCE_ROWS
from trainer import _Prebuilt, _unwrap, model
from zephon import Dataset, MixtureSpec, Pipeline, StaticMixtureWorkSource
from zephon.integrations._eval import TokenLoss, loss_tokens
from zephon.integrations.transformers import ZephonTrainer
from zephon.torch_data import hf_tensors


def eval_pipeline(docs: int) -> Pipeline:
    source = StaticMixtureWorkSource(
        datasets=[Dataset.from_records("docs", REFERENCE_ROWS[:docs], shard_size=2000)],
        mixture=MixtureSpec({"docs": 1.0}),
        chunk_size=64,
        seed=1,
    )
    return (
        Pipeline(source)
        .decode_text()
        .tokenize("bytes", max_length=256)
        .pack_flat(256, pad_token_id=0)
        .batch(4, drop_last=False)
        .options(runner="inline", canonical_replicas=4)
    )


def plain(docs: int) -> float:
    net = model().eval()
    start = time.perf_counter()
    with torch.no_grad():
        for batch in eval_pipeline(docs):
            net(**hf_tensors(batch)).loss.item()
    return time.perf_counter() - start


def _args(out: str) -> TrainingArguments:
    return TrainingArguments(
        output_dir=out, per_device_train_batch_size=4, per_device_eval_batch_size=4,
        report_to=[], use_cpu=True, disable_tqdm=True,
    )  # fmt: skip


def zephon(docs: int, out: str) -> float:
    pipe = eval_pipeline(docs)
    trainer = ZephonTrainer(
        model=model(), args=_args(out), train_pipeline=pipe, eval_dataset=eval_pipeline(docs)
    )
    start = time.perf_counter()
    trainer.evaluate()
    return time.perf_counter() - start


class _PrebuiltEval(Trainer):  # type: ignore[misc]
    def get_eval_dataloader(self, eval_dataset: Any = None) -> Any:
        return torch.utils.data.DataLoader(self.eval_dataset, batch_size=1, collate_fn=_unwrap)


def prebuilt(batches: list[dict[str, Any]], out: str) -> float:
    trainer = _PrebuiltEval(model=model(), args=_args(out), eval_dataset=_Prebuilt(batches))
    start = time.perf_counter()
    trainer.evaluate()
    return time.perf_counter() - start


def bookkeeping(batches: list[dict[str, Any]], repeats: int = 20) -> float:
    metric, loss = TokenLoss(), torch.tensor(5.25)
    start = time.perf_counter()
    for _ in range(repeats):
        for inputs in batches:
            metric.update(loss, loss_tokens(inputs))
    return (time.perf_counter() - start) / (repeats * len(batches))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--docs", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    cli = parser.parse_args()
    torch.set_num_threads(1)
    batches = [hf_tensors(b) for b in eval_pipeline(cli.docs)]
    configs: dict[str, Any] = {
        "plain loop": lambda out: plain(cli.docs),
        "ZephonTrainer.evaluate": lambda out: zephon(cli.docs, out),
        "Trainer.evaluate, prebuilt": lambda out: prebuilt(batches, out),
    }
    samples: dict[str, list[float]] = {name: [] for name in configs}
    with tempfile.TemporaryDirectory() as out:
        configs["plain loop"](out)  # warm-up
        for _ in range(cli.rounds):  # interleaved rounds: the machine's load hits all alike
            for name, run in configs.items():
                samples[name].append(run(out) / len(batches))
    rows = {name: statistics.median(values) for name, values in samples.items()}
    book = bookkeeping(batches)
    floor = rows["plain loop"]
    print(f"{len(batches)} eval batches of 4 x 256 tokens")
    print(f"{'configuration':32} {'ms/batch':>9} {'vs plain loop':>14}")
    for name, seconds in rows.items():
        print(f"{name:32} {seconds * 1e3:9.2f} {seconds / floor:14.3f}")
    print(f"TokenLoss.update + loss_tokens: {book * 1e6:.1f} us per batch")
    summary = {name: round(s * 1e3, 3) for name, s in rows.items()}
    summary |= {"bookkeeping_us": round(book * 1e6, 1), "batches": len(batches)}
    print(json.dumps({"benchmark": "eval", "ms_per_batch": summary, "rounds": cli.rounds}))


if __name__ == "__main__":
    main()
