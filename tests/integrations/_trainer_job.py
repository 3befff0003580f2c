"""One rank of a ``ZephonTrainer`` job, started by ``torchrun`` in the tests.

Usage: ``torchrun --nproc-per-node 2 tests/integrations/_trainer_job.py OUT MODE GA WORKERS
[uneven | elastic STEPS]``

MODE is ``fresh`` (train 40 steps), ``park`` (the same, but rank 1 sends itself SIGUSR1 at step
15 and both ranks stop at step 22 and wait to be killed) or ``resume`` (from the newest complete
checkpoint). ``uneven`` trains on the first :data:`UNEVEN_DOCS` documents instead, whose passes
hold 14 batches on rank 0 and 10 on rank 1: :func:`uneven_plan` gives the steps (through several
passes), a checkpoint every step, and the step to park at (no SIGUSR1). ``elastic STEPS`` is
``uneven`` with ``max_steps=STEPS`` and the park at :data:`ELASTIC_PARK`, for a resume on another
number of ranks.

Each rank appends one JSON line per micro-batch to ``OUT/<MODE>-r<RANK>.jsonl``
(step, row digests, loss as float hex) and the rows every pipeline batch it *delivered* to
``OUT/delivered-<MODE>-r<RANK>-<PID>.jsonl`` (DataLoader workers write their own files).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from transformers import TrainerCallback, TrainingArguments

from tests.integrations._corpus import BATCH, build_pipeline, row_digest, tiny_llama
from tests.integrations._launch import rank_exit, record_pid
from zephon.integrations.transformers import ZephonTrainer
from zephon.torch_data import hf_tensors

STEPS, SAVE_EVERY, PARK_AT, USR1_AT = 40, 10, 22, 15
UNEVEN_DOCS = 56
ELASTIC_PARK = 12  # on 2 ranks: checkpoint-11 is taken after rank 1 started its second pass


def uneven_plan(accumulation: int) -> tuple[int, int]:
    """(steps, park at) of an ``uneven`` run: the checkpoint before the park (the newest one
    complete then) is taken while rank 0 is in its first pass and rank 1 in its second."""
    return (8, 4) if accumulation == 4 else (16, 13)


class RecordDeliveries:
    """The transform: HF tensors, and a line per batch the pipeline delivered."""

    def __init__(self, out: Path, mode: str) -> None:
        self.prefix = out / f"delivered-{mode}-r{os.environ['RANK']}"

    def __call__(self, batch: Any) -> dict[str, Any]:
        inputs = hf_tensors(batch)
        with open(f"{self.prefix}-{os.getpid()}.jsonl", "a", encoding="utf-8") as fh:
            fh.write(json.dumps([row_digest(r) for r in inputs["input_ids"]]) + "\n")
        return inputs


class RecordingTrainer(ZephonTrainer):
    """Logs what each micro-batch trained and its loss, bit for bit."""

    log_path: Path

    def training_step(self, model: Any, inputs: Any, num_items_in_batch: Any = None) -> Any:
        rows = [row_digest(r) for r in inputs["input_ids"]]
        loss = super().training_step(model, inputs, num_items_in_batch)
        line = {"step": self.state.global_step + 1, "rows": rows, "loss": float(loss).hex()}
        with open(self.log_path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(line) + "\n")
        return loss


class Choreography(TrainerCallback):  # type: ignore[misc]
    """``park``: SIGUSR1 on rank 1 at step 15, then every rank waits at step 22 to be killed."""

    def __init__(self, park_at: int = PARK_AT, usr1_at: int | None = USR1_AT) -> None:
        self.park_at, self.usr1_at = park_at, usr1_at

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if state.global_step == self.usr1_at and args.process_index == 1:
            os.kill(os.getpid(), signal.SIGUSR1)
        if state.global_step == self.park_at:
            print(f"parked {args.process_index} {os.getpid()}", flush=True)
            threading.Event().wait()  # until the test kills this process
        return control


def main() -> None:
    with rank_exit():
        out, mode, accumulation, workers = Path(sys.argv[1]), sys.argv[2], *map(int, sys.argv[3:5])
        variant = sys.argv[5:6]
        uneven = variant in (["uneven"], ["elastic"])
        record_pid(out)
        steps, save_every, choreography = STEPS, SAVE_EVERY, Choreography()
        if uneven:
            steps, park_at = uneven_plan(accumulation)
            if variant == ["elastic"]:
                steps, park_at = int(sys.argv[6]), ELASTIC_PARK
            save_every, choreography = 1, Choreography(park_at, usr1_at=None)
        args = TrainingArguments(
            output_dir=str(out / "run"),
            max_steps=steps,
            per_device_train_batch_size=BATCH,
            gradient_accumulation_steps=accumulation,
            dataloader_num_workers=workers,
            save_steps=save_every,
            learning_rate=1e-3,
            logging_steps=1,
            report_to=[],
            use_cpu=True,
            disable_tqdm=True,
            seed=0,
        )
        trainer = RecordingTrainer(
            model=tiny_llama(),
            args=args,
            train_pipeline=build_pipeline(docs=UNEVEN_DOCS) if uneven else build_pipeline(),
            transform=RecordDeliveries(out, mode),
        )
        trainer.log_path = out / f"{mode}-r{args.process_index}.jsonl"
        if mode == "park":
            trainer.add_callback(choreography)
        trainer.train(resume_from_checkpoint=True if mode == "resume" else None)


if __name__ == "__main__":
    main()
