"""One process of an ``accelerate launch`` job feeding a tiny Llama through ``prepare_pipeline``.

Usage: ``accelerate launch --multi_gpu --num_processes 2 _accelerate_job.py OUT WORKERS``
(``--multi_gpu`` starts torchrun; ``Accelerator(cpu=True)`` keeps every process on the CPU).

Trains 20 steps, with ``accelerator.save_state`` after step 10; then ``load_state`` (model,
optimizer and data position) and trains again from there. Each process writes one JSON line
per step to ``OUT/steps-r<RANK>.jsonl``: the pass (1, or 2 after load_state), the step, the
row digests and the loss as float hex.

``... _accelerate_job.py OUT WORKERS uneven GA MODE`` trains instead on ranks whose passes differ
in length (the documents of the ``uneven`` trainer job) with ``gradient_accumulation_steps=GA``
and ``save_state`` after every step into ``OUT/state-<STEP>``; MODE ``fresh`` trains the steps
of ``uneven_plan(GA)``, ``park`` waits after its park step to be killed, ``resume`` loads the
state of the step before and trains to the end. One JSON line per micro-batch (step, rows,
loss) goes to ``OUT/<MODE>-r<RANK>.jsonl``.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator

from tests.integrations._corpus import build_pipeline, row_digest, tiny_llama
from tests.integrations._launch import rank_exit, record_pid
from tests.integrations._trainer_job import UNEVEN_DOCS, uneven_plan
from zephon.integrations.accelerate import prepare_pipeline

STEPS, SAVE_AT = 20, 10


def train(accelerator: Accelerator, model: Any, opt: Any, loader: Any, steps: int) -> list[Any]:
    lines = []
    for step, inputs in enumerate(loader, 1):
        loss = model(**inputs).loss
        accelerator.backward(loss)
        opt.step()
        opt.zero_grad()
        lines.append({"step": step, "rows": [row_digest(r) for r in inputs["input_ids"].cpu()],
                      "loss": float(loss.detach()).hex()})  # fmt: skip
        if step == SAVE_AT and steps == STEPS:
            accelerator.save_state(str(OUT / "state"))
        if step == steps:
            break
    return lines


def train_uneven(accumulation: int, mode: str) -> None:
    """One process of the ``uneven`` job (see the module's docstring)."""
    with rank_exit():
        steps, park_at = uneven_plan(accumulation)
        accelerator = Accelerator(cpu=True, gradient_accumulation_steps=accumulation)
        model = tiny_llama()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        loader = prepare_pipeline(accelerator, build_pipeline(docs=UNEVEN_DOCS))
        model, opt = accelerator.prepare(model, opt)
        step = 0
        if mode == "resume":
            step = park_at - 1
            accelerator.load_state(str(OUT / f"state-{step}"))
        log = OUT / f"{mode}-r{accelerator.process_index}.jsonl"
        for inputs in loader:
            with accelerator.accumulate(model):
                loss = model(**inputs).loss
                accelerator.backward(loss)
                opt.step()
                opt.zero_grad()
            line = {"step": step + 1, "rows": [row_digest(r) for r in inputs["input_ids"].cpu()]}
            with open(log, "a", encoding="utf-8") as fh:
                fh.write(json.dumps({**line, "loss": float(loss.detach()).hex()}) + "\n")
            if not accelerator.sync_gradients:
                continue
            step += 1
            accelerator.save_state(str(OUT / f"state-{step}"))
            if mode == "park" and step == park_at:
                print(f"parked {accelerator.process_index} {os.getpid()}", flush=True)
                threading.Event().wait()  # until the test kills this process
            if step == steps:
                break
        accelerator.end_training()


def main() -> None:
    with rank_exit():
        workers = int(sys.argv[2])
        record_pid(OUT)
        if sys.argv[3:4] == ["uneven"]:
            train_uneven(int(sys.argv[4]), sys.argv[5])
            return
        accelerator = Accelerator(cpu=True)
        model = tiny_llama()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        loader = prepare_pipeline(accelerator, build_pipeline(), num_workers=workers)
        model, opt = accelerator.prepare(model, opt)
        first = train(accelerator, model, opt, loader, STEPS)
        accelerator.load_state(str(OUT / "state"))  # model, optimizer and the data position
        second = train(accelerator, model, opt, loader, STEPS - SAVE_AT)
        with open(OUT / f"steps-r{accelerator.process_index}.jsonl", "w", encoding="utf-8") as fh:
            for pass_number, lines in ((1, first), (2, second)):
                for line in lines:
                    fh.write(json.dumps({"pass": pass_number, **line}) + "\n")
        accelerator.end_training()


OUT = Path(sys.argv[1])
if __name__ == "__main__":
    main()
