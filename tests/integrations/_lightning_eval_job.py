"""A ``lightning.Trainer`` on the CPU that validates pipelines through ``ZephonDataModule``.

Usage: ``python tests/integrations/_lightning_eval_job.py OUT DEVICES SETS`` (2 devices: DDP,
one process each; SETS: comma-separated names of ``_eval_corpus.EVAL_DOCS``). Trains 4 steps
with learning rate 0, so the weights stay those every run starts from, and validates after
steps 2 and 4 (through the DDP wrapper under DDP). Appends one JSON
line per validation and eval set to ``OUT/val-r<RANK>.jsonl`` (step, set, loss as float hex,
loss tokens) and one per eval batch to ``OUT/eval-r<RANK>-<PID>.jsonl`` (its rows, labelled
``<step>-<set>``, as ``_eval_corpus.evaluated_rows`` reads them).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch

from tests.integrations._corpus import build_pipeline, row_digest, tiny_llama
from tests.integrations._eval_corpus import eval_pipeline
from tests.integrations._launch import rank_exit, record_pid
from zephon.integrations.lightning import TokenLoss, ZephonDataModule, loss_tokens

NAMES = sys.argv[3].split(",")


class EvaluatedLlama(pl.LightningModule):  # type: ignore[misc]
    def __init__(self, out: Path) -> None:
        super().__init__()
        self.model = tiny_llama()
        self.out = out
        self.eval_losses = [TokenLoss() for _ in NAMES]

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> Any:
        return self.model(**batch).loss

    def validation_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        self.eval_losses[dataloader_idx].update(self.model(**batch).loss, loss_tokens(batch))
        rows = [row_digest(r) for r in batch["input_ids"]]
        line = {"eval": f"{self.global_step}-{NAMES[dataloader_idx]}", "rows": rows}
        with open(self.out / f"eval-r{self.global_rank}-{os.getpid()}.jsonl", "a") as fh:
            fh.write(json.dumps(line) + "\n")

    def on_validation_epoch_end(self) -> None:
        for name, metric in zip(NAMES, self.eval_losses, strict=True):
            tokens = metric.totals()[1]  # a collective, as compute() is: every rank calls both
            loss = metric.compute()
            self.log(f"val_{name}_loss", loss)
            line = {"step": self.global_step, "set": name, "loss": loss.hex(), "tokens": tokens}
            with open(self.out / f"val-r{self.global_rank}.jsonl", "a", encoding="utf-8") as fh:
                fh.write(json.dumps(line) + "\n")

    def configure_optimizers(self) -> Any:
        return torch.optim.AdamW(self.parameters(), lr=0.0)


def main() -> None:
    with rank_exit():
        out, devices = Path(sys.argv[1]), int(sys.argv[2])
        record_pid(out)
        trainer = pl.Trainer(
            accelerator="cpu", devices=devices, strategy="ddp" if devices > 1 else "auto",
            max_steps=4, val_check_interval=2, num_sanity_val_steps=0, logger=False,
            enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        )  # fmt: skip
        data = ZephonDataModule(build_pipeline(), eval_pipeline=[eval_pipeline(n) for n in NAMES])
        trainer.fit(EvaluatedLlama(out), datamodule=data)


if __name__ == "__main__":
    main()
