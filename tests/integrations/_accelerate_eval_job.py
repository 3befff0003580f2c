"""One process of an ``accelerate launch`` job that evaluates pipelines between training steps.

Usage: ``accelerate launch [--multi_gpu --num_processes 2] _accelerate_eval_job.py OUT WORKERS``

Evaluates both eval sets of ``_eval_corpus`` through ``prepare_eval_pipeline`` and
``evaluate_loss`` before training and after each of 3 training steps with learning rate 0 (the
weights stay the starting ones, so 1 and 2 processes must agree), then trains 3 more steps.
Writes ``OUT/losses-r<RANK>.json`` (per evaluation and set: the loss as float hex), one line per
trained step to ``OUT/steps-r<RANK>.jsonl`` and the rows of every eval batch (``RecordEval``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from accelerate import Accelerator

from tests.integrations._corpus import build_pipeline, row_digest, tiny_llama
from tests.integrations._eval_corpus import EVAL_DOCS, RecordEval, eval_pipeline
from tests.integrations._launch import rank_exit, record_pid
from zephon.integrations.accelerate import evaluate_loss, prepare_eval_pipeline, prepare_pipeline

STEPS = 6


def main() -> None:
    with rank_exit():
        out, workers = Path(sys.argv[1]), int(sys.argv[2])
        record_pid(out)
        accelerator = Accelerator(cpu=True)
        model = tiny_llama()
        opt = torch.optim.AdamW(model.parameters(), lr=0.0)
        loader = prepare_pipeline(accelerator, build_pipeline(), num_workers=workers)
        record = RecordEval(out)
        evals = {
            name: prepare_eval_pipeline(
                accelerator, eval_pipeline(name), record, num_workers=workers
            )
            for name in EVAL_DOCS
        }
        model, opt = accelerator.prepare(model, opt)
        losses: dict[str, str] = {}

        def evaluate(step: int) -> None:
            for name, eval_loader in evals.items():
                record.label = f"{step}-{name}"
                losses[record.label] = evaluate_loss(accelerator, model, eval_loader).hex()

        evaluate(0)
        lines = []
        for step, inputs in enumerate(loader, 1):
            accelerator.backward(model(**inputs).loss)
            opt.step()
            opt.zero_grad()
            lines.append({"step": step, "rows": [row_digest(r) for r in inputs["input_ids"].cpu()]})
            if step <= STEPS // 2:
                evaluate(step)
            if step == STEPS:
                break
        rank = accelerator.process_index
        (out / f"losses-r{rank}.json").write_text(json.dumps(losses))
        with open(out / f"steps-r{rank}.jsonl", "w", encoding="utf-8") as fh:
            fh.writelines(json.dumps(line) + "\n" for line in lines)
        accelerator.end_training()


if __name__ == "__main__":
    main()
