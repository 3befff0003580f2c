"""One torch.distributed rank training a tiny model from zephon batches (used by tests).

Launched like torchrun launches a script: ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and
``MASTER_PORT`` in the environment. Usage::

    python -m tests._train_rank OUT STEPS CHECKPOINT_AT {fresh,resume,fresh-then-wait}

Every step appends one JSON line to ``OUT/seen-<mode>-w<world>-r<rank>.jsonl``: the batch's lane,
its rows, the loss and a digest of the parameters after the step. At step ``CHECKPOINT_AT``
the ranks gather their data states and rank 0 saves model, optimizer and data together in
``OUT/ckpt``. With ``fresh-then-wait`` the rank prints ``trained`` and blocks on stdin: the
test kills it there, as a scheduler kills a job.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from tests.engine.test_checkpoint_stateful import REFERENCE_CFG, build, key
from tests.integrations._launch import rank_exit
from zephon.checkpoints import load_checkpoint, save_checkpoint
from zephon.distributed import gather_checkpoints

VOCAB = 260  # byte tokens and a few specials


def tiny_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Embedding(VOCAB, 16), torch.nn.Linear(16, VOCAB))


def param_digest(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().numpy().tobytes())
    return h.hexdigest()[:16]


def average_gradients(model: torch.nn.Module, world: int) -> None:
    """What DDP does, minus its bucket rebuilds: those reorder the sums after a restart."""
    for p in model.parameters():
        assert p.grad is not None
        dist.all_reduce(p.grad)
        p.grad /= world


def save_all(ckpt: Path, step: int, model: Any, opt: Any, data: dict[str, Any]) -> None:
    """Model first, data last: the data file's presence says the pair is complete."""
    ckpt.mkdir(parents=True, exist_ok=True)
    tmp = ckpt / f".model-{step}.pt.tmp"
    torch.save({"step": step, "model": model.state_dict(), "opt": opt.state_dict()}, tmp)
    os.replace(tmp, ckpt / "model.pt")
    save_checkpoint(ckpt / "data.json", data)


def main() -> None:
    with rank_exit():
        out, steps, checkpoint_at, mode = Path(sys.argv[1]), *map(int, sys.argv[2:4]), sys.argv[4]
        dist.init_process_group("gloo")  # env:// rendezvous, as under torchrun
        rank, world = dist.get_rank(), dist.get_world_size()
        model = tiny_model()
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        pipe = build(REFERENCE_CFG, runner="inline", dp_rank=rank, dp_world_size=world)
        start = 0
        if mode == "resume":
            saved = torch.load(out / "ckpt" / "model.pt")
            model.load_state_dict(saved["model"])
            opt.load_state_dict(saved["opt"])
            start = saved["step"]
            pipe.restore(load_checkpoint(out / "ckpt" / "data.json"))
        log = open(out / f"seen-{mode}-w{world}-r{rank}.jsonl", "w", encoding="utf-8")  # noqa: SIM115
        log.write(json.dumps({"start": start, "params": param_digest(model)}) + "\n")
        it = iter(pipe)
        for step in range(start, start + steps):
            batch = next(it)
            inputs = batch.to_training(return_tensors="pt")
            logits = model(inputs["input_ids"].long())
            loss = torch.nn.functional.cross_entropy(
                logits.reshape(-1, VOCAB), inputs["labels"].long().reshape(-1), ignore_index=-100
            )
            opt.zero_grad()
            loss.backward()
            average_gradients(model, world)
            opt.step()
            lane, rows = key(batch)
            line = {"step": step, "lane": lane, "rows": repr(rows), "loss": loss.item()}
            log.write(json.dumps({**line, "params": param_digest(model)}) + "\n")
            log.flush()
            if step + 1 == checkpoint_at:
                data = gather_checkpoints(pipe.checkpoint())  # every rank gets the merge
                if rank == 0:
                    save_all(out / "ckpt", step + 1, model, opt, data)
                dist.barrier()  # nobody trains past a checkpoint that is not on disk yet
        log.close()
        if mode == "fresh-then-wait":
            print("trained", flush=True)
            sys.stdin.read()  # blocks until the test kills this process
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
