"""One rank of a ``ZephonTrainer`` job that evaluates pipelines, started by ``torchrun``.

Usage: ``torchrun --nproc-per-node N tests/integrations/_trainer_eval_job.py OUT WORKERS``

Evaluates both eval sets of ``_eval_corpus`` on the untrained model (the same weights on any
number of ranks), then trains 4 steps evaluating after steps 2 and 4. Writes the metrics of the
first evaluation to ``OUT/metrics-r<RANK>.json``, one line per trained micro-batch to
``OUT/train-r<RANK>.jsonl`` and the rows of every eval batch (see ``RecordEval``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from transformers import TrainingArguments

from tests.integrations._corpus import BATCH, build_pipeline, tiny_llama
from tests.integrations._eval_corpus import RecordEval, eval_sets
from tests.integrations._launch import rank_exit, record_pid
from tests.integrations._trainer_job import RecordingTrainer

STEPS, EVAL_EVERY = 4, 2


class EvalRecordingTrainer(RecordingTrainer):
    """Labels the rows of each evaluation ``<global step>-<eval set name>``."""

    def get_eval_dataloader(self, eval_dataset: Any = None) -> Any:
        self.eval_transform.label = f"{self.state.global_step}-{eval_dataset}"
        return super().get_eval_dataloader(eval_dataset)


def main() -> None:
    with rank_exit():
        out, workers = Path(sys.argv[1]), int(sys.argv[2])
        record_pid(out)
        args = TrainingArguments(
            output_dir=str(out / "run"),
            max_steps=STEPS,
            per_device_train_batch_size=BATCH,
            per_device_eval_batch_size=BATCH,
            dataloader_num_workers=workers,
            eval_strategy="steps",
            eval_steps=EVAL_EVERY,
            save_steps=STEPS,
            learning_rate=1e-3,
            report_to=[],
            use_cpu=True,
            disable_tqdm=True,
            seed=0,
        )
        trainer = EvalRecordingTrainer(
            model=tiny_llama(),
            args=args,
            train_pipeline=build_pipeline(),
            eval_dataset=eval_sets(),
            eval_transform=RecordEval(out),
        )
        trainer.log_path = out / f"train-r{args.process_index}.jsonl"
        metrics = trainer.evaluate()
        (out / f"metrics-r{args.process_index}.json").write_text(json.dumps(metrics))
        trainer.train()


if __name__ == "__main__":
    main()
