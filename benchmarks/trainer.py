"""What the Trainer integration costs per step, against the same training without it.

Rows (one process, a tiny random Llama on the CPU, batches of 4 x 256 packed byte tokens):

1. ``plain loop``: a hand-written loop over the pipeline's batches, ``to_training("hf")``,
   forward, backward, AdamW step: the floor.
2. ``PipelineDataLoader`` workers=0: the same loop fed by the loader ZephonTrainer uses.
3. ``ZephonTrainer`` workers=0 and workers=2: ``Trainer.train`` with the zephon loader
   (workers: every item is stamped with its worker pipeline's checkpoint, off the main thread).
4. ``Trainer`` over the same batches pre-built in memory: the Trainer's own per-step cost,
   with no data pipeline at all.

Besides the step times: ``checkpoint()`` per call (what a worker pays per item, and what a save
pays once per rank), the merged data state's size, and the per-step agreement on signals
(``max_over_ranks``, one all-reduce over 2 gloo processes).
Step times are medians over interleaved rounds, after a warm-up run.
Prints a table and a final JSON line. Usage: ``python benchmarks/trainer.py [--steps 60]
[--rounds 3]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

from _reference import reference_pipeline as pipeline
from zephon.integrations._ranks import global_state, max_over_ranks
from zephon.integrations.transformers import ZephonTrainer
from zephon.torch_data import hf_tensors
from zephon.torch_loader import PipelineDataLoader


def model() -> Any:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=260, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
    )  # fmt: skip
    return LlamaForCausalLM(config)


def loop(batches: Any, steps: int) -> float:
    net = model()
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    start = time.perf_counter()
    for step, inputs in enumerate(batches, 1):
        net(**inputs).loss.backward()
        opt.step()
        opt.zero_grad()
        if step == steps:
            break
    return (time.perf_counter() - start) / steps


def trainer_step(cls: type, steps: int, out: str, **kwargs: Any) -> float:
    args = TrainingArguments(
        output_dir=out, max_steps=steps, per_device_train_batch_size=4, report_to=[],
        use_cpu=True, disable_tqdm=True, save_strategy="no", learning_rate=1e-3,
        dataloader_num_workers=kwargs.pop("workers", 0),
    )  # fmt: skip
    trainer = cls(model=model(), args=args, **kwargs)
    start = time.perf_counter()
    trainer.train()
    return (time.perf_counter() - start) / steps


class _Prebuilt(torch.utils.data.Dataset):  # type: ignore[type-arg]
    def __init__(self, batches: list[dict[str, Any]]) -> None:
        self.batches = batches

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return self.batches[i]


def _unwrap(items: list[dict[str, Any]]) -> dict[str, Any]:
    return items[0]


class _PrebuiltTrainer(Trainer):  # type: ignore[misc]
    def get_train_dataloader(self) -> Any:
        return torch.utils.data.DataLoader(self.train_dataset, batch_size=1, collate_fn=_unwrap)


def _agreement_worker(rank: int, port: int, calls: int, out: Any) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    max_over_ranks(0)
    start = time.perf_counter()
    for _ in range(calls):
        max_over_ranks(0)
    if rank == 0:
        out.put((time.perf_counter() - start) / calls)
    dist.destroy_process_group()


def agreement_cost(calls: int = 500) -> float:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_agreement_worker, args=(r, port, calls, queue)) for r in (0, 1)]
    for p in procs:
        p.start()
    value = float(queue.get(timeout=120))
    for p in procs:
        p.join()
    return value


def checkpoint_cost(steps: int) -> tuple[float, int]:
    pipe = pipeline()
    costs = []
    for step, _ in enumerate(pipe, 1):
        start = time.perf_counter()
        pipe.checkpoint()
        costs.append(time.perf_counter() - start)
        if step == steps:
            break
    loader = PipelineDataLoader(pipeline(), hf_tensors, num_workers=2)
    for step, _ in enumerate(loader, 1):
        if step == steps:
            break
    return statistics.median(costs), len(json.dumps(global_state(loader)))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=3)
    cli = parser.parse_args()
    steps, rounds = cli.steps, cli.rounds
    torch.set_num_threads(1)
    prebuilt = [hf_tensors(b) for _, b in zip(range(steps), pipeline())]
    configs: dict[str, Any] = {
        "plain loop": lambda out: loop((hf_tensors(b) for b in pipeline()), steps),
        "PipelineDataLoader workers=0": lambda out: loop(
            PipelineDataLoader(pipeline(), hf_tensors), steps
        ),
        "ZephonTrainer workers=0": lambda out: trainer_step(
            ZephonTrainer, steps, out, train_pipeline=pipeline()
        ),
        "ZephonTrainer workers=2": lambda out: trainer_step(
            ZephonTrainer, steps, out, train_pipeline=pipeline(), workers=2
        ),
        "Trainer, batches prebuilt": lambda out: trainer_step(
            _PrebuiltTrainer, steps, out, train_dataset=_Prebuilt(prebuilt)
        ),
    }
    samples: dict[str, list[float]] = {name: [] for name in configs}
    with tempfile.TemporaryDirectory() as out:
        configs["plain loop"](out)  # warm-up: first-use costs of torch and the tokenizer
        for _ in range(rounds):  # interleaved rounds: the machine's load hits all alike
            for name, run in configs.items():
                samples[name].append(run(out))
    rows = {name: statistics.median(values) for name, values in samples.items()}
    ckpt_s, state_bytes = checkpoint_cost(steps)
    agree_s = agreement_cost()
    floor = rows["plain loop"]
    print(f"{'configuration':32} {'ms/step':>8} {'vs plain loop':>14}")
    for name, seconds in rows.items():
        print(f"{name:32} {seconds * 1e3:8.2f} {seconds / floor:14.3f}")
    print(f"checkpoint() per call: {ckpt_s * 1e3:.2f} ms; merged data state: {state_bytes} B")
    print(f"signal agreement (all-reduce, 2 gloo ranks): {agree_s * 1e6:.0f} us per step")
    summary = {name: round(s * 1e3, 3) for name, s in rows.items()}
    summary |= {"checkpoint_ms": round(ckpt_s * 1e3, 3), "data_state_bytes": state_bytes}
    summary |= {"agreement_us": round(agree_s * 1e6, 1), "steps": steps, "rounds": rounds}
    print(json.dumps({"benchmark": "trainer", "ms_per_step": summary}))


if __name__ == "__main__":
    main()
