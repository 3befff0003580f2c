"""One rank of a ``torchrun`` job that trains from zephon's torchtitan data loader and saves with
torchtitan's own ``CheckpointManager`` (DCP: model, optimizer, LR schedule, data loader, step).

Usage: ``torchrun ... _torchtitan_job.py OUT MODE STEPS``. The loader comes from its config entry
as torchtitan's trainer builds it (``config.dataloader.build(dp_world_size=..., ...)``; local
batch 2 rows of 64 tokens, global batch 8: the accumulation follows the DP size) and the step is
torchtitan's: every micro-batch of the step fetched first, then forward and backward on each,
gradients averaged over the DP ranks, one optimizer step, a checkpoint into ``OUT/checkpoint``.
One JSON line per micro-batch goes to ``OUT/<MODE>-r<RANK>.jsonl``: the step, the row digests
and the loss (``float.hex``); one per step to ``OUT/<MODE>-states-r<RANK>.jsonl``: a digest of
the loader's ``state_dict()`` after the checkpoint. MODE ``full`` trains STEPS steps, ``park``
waits to be killed after the checkpoint of step ``PARK_AT``, ``resume`` continues from the
newest checkpoint.
MODE ``peers`` makes both ranks one DP rank and saves the loader state after STEPS batches
(:func:`peers`). MODE ``finite`` trains one pass of a small corpus whose ranks hold different
numbers of batches (``endless=False``) until the loader ends, long before STEPS.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import threading
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torchtitan.components.checkpoint import CheckpointManager
from torchtitan.components.optimizer import LRSchedulersContainer, default_adamw

from tests.integrations._corpus import BATCH, ROW_LENGTH, row_digest, tiny_llama
from tests.integrations._launch import rank_exit, record_pid
from zephon.integrations.torchtitan import IGNORE_INDEX, ZephonDataLoader

PARK_AT = 3
GLOBAL = 8
FINITE_DOCS = 40  # 14 batches on rank 0 of 2, 4 on rank 1: rank 1 ends first


class TrainState:
    """The step, saved with the checkpoint (torchtitan's ``train_state``)."""

    def __init__(self) -> None:
        self.step = 0

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step = int(state["step"])


def micro_step(model: Any, inputs: dict[str, Any], labels: Any, scale: float) -> float:
    logits = model(input_ids=inputs["input"], position_ids=inputs["positions"]).logits
    loss = torch.nn.functional.cross_entropy(
        logits.flatten(0, 1).float(), labels.flatten(), ignore_index=IGNORE_INDEX
    )
    (loss * scale).backward()
    return float(loss.detach())


def average_gradients(model: Any) -> None:
    world = dist.get_world_size()
    for param in model.parameters():
        if param.grad is not None:
            dist.all_reduce(param.grad)
            param.grad /= world


def build_loader(mode: str) -> ZephonDataLoader:
    finite = mode == "finite"
    pipeline = "tests.integrations._torchtitan_job:finite_pipeline" if finite else None
    config = ZephonDataLoader.Config(
        pipeline=pipeline or "tests.integrations._corpus:build_pipeline",
        global_batch_size=-1 if finite else GLOBAL,
        endless=not finite,
    )
    return config.build(
        dp_world_size=dist.get_world_size(),
        dp_rank=dist.get_rank(),
        tokenizer=None,
        seq_len=ROW_LENGTH,
        local_batch_size=BATCH,
        snapshot_every_n_steps=1,
    )


def finite_pipeline() -> Any:
    from tests.integrations._corpus import build_pipeline

    return build_pipeline(docs=FINITE_DOCS)


def train(out: Path, mode: str, steps: int) -> None:
    model = tiny_llama()
    optimizers = default_adamw(lr=1e-3).build(model_parts=[model])
    schedulers = LRSchedulersContainer.Config(warmup_steps=2).build(
        optimizers=optimizers, training_steps=steps
    )
    loader = build_loader(mode)
    state = TrainState()
    checkpointer = CheckpointManager.Config(
        enable=mode != "finite", interval=1, keep_latest_k=0, last_save_model_only=False
    ).build(
        dataloader=loader,
        model_parts=[model],
        optimizers=optimizers,
        lr_schedulers=schedulers,
        states={"train_state": state},
        sd_adapter=None,
        base_folder=str(out),
    )
    checkpointer.load()
    rank = dist.get_rank()
    batches = iter(loader)
    with (
        open(out / f"{mode}-r{rank}.jsonl", "w", encoding="utf-8") as log,
        open(out / f"{mode}-states-r{rank}.jsonl", "w", encoding="utf-8") as states,
    ):
        while state.step < steps:
            group = [next(batches, None) for _ in range(loader.accumulation_steps)]
            if None in group:  # the data ended (on every rank at the same batch)
                break
            state.step += 1
            optimizers.zero_grad()
            for inputs, labels in group:  # type: ignore[misc]
                loss = micro_step(model, inputs, labels, 1 / len(group))
                rows = [row_digest(r) for r in inputs["input"]]
                line = {"iteration": state.step, "rows": rows, "loss": loss.hex()}
                log.write(json.dumps(line) + "\n")
            log.flush()
            average_gradients(model)
            optimizers.step()
            schedulers.step()
            checkpointer.save(state.step, last_step=state.step == steps)
            saved = hashlib.sha256(loader.state_dict()["state"].encode()).hexdigest()[:16]
            states.write(json.dumps({"iteration": state.step, "state": saved}) + "\n")
            states.flush()
            if mode == "park" and state.step == PARK_AT:
                print(f"parked {rank} {os.getpid()}", flush=True)
                threading.Event().wait()  # until the test kills this process
    print(f"rank {rank} trained {loader.batches * BATCH} rows", flush=True)
    dist.barrier()
    checkpointer.close()


def peers(out: Path, batches: int) -> None:
    """Both ranks are one DP rank (as tensor-parallel peers are): each reads ``batches`` batches
    and writes the loader's ``state_dict()`` to ``OUT/peers-r<RANK>.json``."""
    loader = ZephonDataLoader.Config(pipeline="tests.integrations._corpus:build_pipeline").build(
        dp_world_size=1, dp_rank=0, seq_len=ROW_LENGTH, local_batch_size=BATCH
    )
    items = iter(loader)
    for _ in range(batches):
        next(items)
    state = loader.state_dict()
    (out / f"peers-r{dist.get_rank()}.json").write_text(json.dumps(state))
    dist.barrier()


def main() -> None:
    out, mode, steps = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    record_pid(out)
    with rank_exit():
        dist.init_process_group("gloo")
        torch.use_deterministic_algorithms(True)
        if mode == "peers":
            peers(out, steps)
        else:
            train(out, mode, steps)


if __name__ == "__main__":
    main()
