"""A ``lightning.Trainer`` run on the CPU fed by ``ZephonDataModule`` (started by the tests).

Usage: ``python tests/integrations/_lightning_job.py OUT MODE WORKERS``. MODE is ``fresh``
(train 20 steps, checkpoint every 5), ``park`` (the same, but wait at step 12 to be killed) or
``resume`` (``ckpt_path`` = the step-10 checkpoint). One JSON line per step goes to
``OUT/<MODE>.jsonl``: the step, the row digests and the loss as float hex.

``torchrun --nproc-per-node 2 tests/integrations/_lightning_job.py OUT MODE WORKERS uneven GA``
runs DDP over 2 ranks whose passes differ in length (the documents of the ``uneven`` trainer
job), with ``accumulate_grad_batches=GA``, a checkpoint every step, parking after the steps
of ``uneven_plan(GA)`` and resuming from the checkpoint before; each rank writes
``OUT/<MODE>-r<RANK>.jsonl``.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch

from tests.integrations._corpus import build_pipeline, row_digest, tiny_llama
from tests.integrations._launch import rank_exit, record_pid
from tests.integrations._trainer_job import UNEVEN_DOCS, uneven_plan
from zephon.integrations.lightning import ZephonDataModule

STEPS, EVERY, PARK_AT = 20, 5, 12


class TinyLlama(pl.LightningModule):  # type: ignore[misc]
    def __init__(self, log: Path, park: bool, park_at: int = PARK_AT) -> None:
        super().__init__()
        self.model = tiny_llama()
        self.log_path, self.park, self.park_at = log, park, park_at

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> Any:
        loss = self.model(**batch).loss
        line = {"step": self.global_step + 1, "rows": [row_digest(r) for r in batch["input_ids"]]}
        with open(self.log_path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps({**line, "loss": float(loss.detach()).hex()}) + "\n")
        return loss

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.park and self.global_step == self.park_at:
            print(f"parked {self.global_rank} {os.getpid()}", flush=True)
            threading.Event().wait()  # until the test kills this process

    def configure_optimizers(self) -> Any:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def fit(
    out: Path,
    mode: str,
    workers: int,
    *,
    steps: int = STEPS,
    docs: int | None = None,
    ckpt: str | None = None,
) -> None:
    """Train ``steps`` steps (checkpoints every 5 in ``OUT/ckpt``), from ``ckpt`` if given."""
    with rank_exit():
        torch.manual_seed(0)
        checkpoints = pl.callbacks.ModelCheckpoint(
            dirpath=out / "ckpt", every_n_train_steps=EVERY, save_top_k=-1, filename="{step}"
        )
        trainer = pl.Trainer(
            accelerator="cpu", devices=1, max_steps=steps, callbacks=[checkpoints],
            logger=False, enable_progress_bar=False, enable_model_summary=False,
        )  # fmt: skip
        pipeline = build_pipeline() if docs is None else build_pipeline(docs=docs)
        data = ZephonDataModule(pipeline, num_workers=workers)
        model = TinyLlama(out / f"{mode}.jsonl", park=mode == "park")
        trainer.fit(model, datamodule=data, ckpt_path=ckpt)


def fit_uneven(out: Path, mode: str, workers: int, accumulation: int) -> None:
    """One rank of a DDP job over ranks of uneven passes (see the module's docstring)."""
    with rank_exit():
        torch.manual_seed(0)
        steps, park_at = uneven_plan(accumulation)
        checkpoints = pl.callbacks.ModelCheckpoint(
            dirpath=out / "ckpt", every_n_train_steps=1, save_top_k=-1, filename="{step}"
        )
        trainer = pl.Trainer(
            accelerator="cpu", devices=2, strategy="ddp", max_steps=steps,
            accumulate_grad_batches=accumulation, callbacks=[checkpoints], logger=False,
            enable_progress_bar=False, enable_model_summary=False,
        )  # fmt: skip
        data = ZephonDataModule(build_pipeline(docs=UNEVEN_DOCS), num_workers=workers)
        log = out / f"{mode}-r{os.environ['RANK']}.jsonl"
        model = TinyLlama(log, park=mode == "park", park_at=park_at)
        ckpt = str(out / "ckpt" / f"step={park_at - 1}.ckpt") if mode == "resume" else None
        trainer.fit(model, datamodule=data, ckpt_path=ckpt)


def main() -> None:
    out, mode, workers = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    record_pid(out)
    if sys.argv[4:5] == ["uneven"]:
        fit_uneven(out, mode, workers, int(sys.argv[5]))
        return
    ckpt = str(out / "ckpt" / "step=10.ckpt") if mode == "resume" else None
    fit(out, mode, workers, ckpt=ckpt)


if __name__ == "__main__":
    main()
