"""One rank of a ``torchrun`` job that trains from zephon's Megatron external data provider.

Usage: ``torchrun ... _megatron_job.py OUT MODE STEPS [RESUME_ITERATION [PP]]``. Each rank sets
up megatron-core's parallel state (gloo, TP = 1, PP stages (1), DP = the rest), takes its
training data from ``datasets_provider`` (micro-batch 2, global batch 8: the accumulation
follows the DP size), wraps it as Megatron does and reads ``accumulation`` micro-batches per
iteration, saving the data-loader rank files after every iteration into ``OUT/ckpt``. One JSON
line per micro-batch goes to ``OUT/<MODE>-r<RANK>.jsonl``: the iteration, the row digests and a
digest of the whole batch. MODE ``park`` waits to be killed after iteration ``PARK_AT``;
``resume`` continues from the rank files of ``RESUME_ITERATION``.

``... _megatron_job.py OUT layout TP PP`` sets up TP x PP model parallelism instead and writes
``OUT/layout-r<RANK>.json``: the rank's TP and PP rank, whether the provider gave it data and
the first micro-batch it reads.

MODE ``bridge-park`` / ``bridge-resume`` do the same through Megatron-Bridge's wrapping and save
(``_bridge_save``: the pipeline-0 / tensor-0 ranks write ``iter_*/train_dataloader_dprank*.pt``;
``park`` takes a RESUME_ITERATION of 0 to be given PP).
"""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch.distributed as dist

from tests.integrations import _bridge_save as bridge
from tests.integrations._corpus import build_pipeline
from tests.integrations._launch import rank_exit, record_pid
from tests.integrations._megatron_corpus import GLOBAL, MICRO, batch_line
from tests.integrations._megatron_save import mpu, save_dataloader_state, training_iterator
from zephon.integrations.megatron import datasets_provider

PARK_AT = 5


def layout(out: Path, tensor: int, pipeline: int) -> None:
    """Which ranks of a TP x PP job the provider gives data, and their first micro-batch."""
    mpu.initialize_model_parallel(tensor, pipeline)
    provide = datasets_provider(build_pipeline(), micro_batch_size=MICRO, global_batch_size=GLOBAL)
    train_ds, _, _ = provide([0, 0, 0])
    seen = {
        "tp": mpu.get_tensor_model_parallel_rank(),
        "pp": mpu.get_pipeline_model_parallel_rank(),
        "first": None if train_ds is None else batch_line(next(training_iterator(train_ds))),
    }
    (out / f"layout-r{dist.get_rank()}.json").write_text(json.dumps(seen))
    dist.barrier()
    mpu.destroy_model_parallel()


def trainer(mode: str) -> tuple[Callable[[Any], Any], Callable[[Any, int, Path], None]]:
    """How the framework of ``mode`` wraps the provider and saves the data-loader state."""
    if not mode.startswith("bridge-"):
        return training_iterator, save_dataloader_state
    groups = bridge.process_groups()

    def save(iterator: Any, iteration: int, save_dir: Path) -> None:
        bridge.maybe_save_dataloader_state(iterator, iteration, save_dir, pg_collection=groups)

    return bridge.training_iterator, save


def main() -> None:
    out, mode, steps = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    record_pid(out)
    with rank_exit():
        dist.init_process_group("gloo")
        if mode == "layout":
            layout(out, steps, int(sys.argv[4]))
            return
        mpu.initialize_model_parallel(1, int(sys.argv[5]) if len(sys.argv) > 5 else 1)
        resume = mode.endswith("resume")
        start = int(sys.argv[4]) if resume else 0
        provide = datasets_provider(
            build_pipeline(),
            micro_batch_size=MICRO,
            global_batch_size=GLOBAL,
            resume_dir=out / "ckpt" if resume else None,
            resume_iteration=start if resume else None,
        )
        train_ds, _, _ = provide([0, 0, 0])
        assert train_ds is not None
        wrap, save = trainer(mode)
        iterator = wrap(train_ds)
        rank = dist.get_rank()
        with open(out / f"{mode}-r{rank}.jsonl", "w", encoding="utf-8") as log:
            for iteration in range(start + 1, steps + 1):
                for _ in range(train_ds.accumulation_steps):
                    log.write(
                        json.dumps({"iteration": iteration, **batch_line(next(iterator))}) + "\n"
                    )
                log.flush()
                save(iterator, iteration, out / "ckpt")
                if mode.endswith("park") and iteration == PARK_AT:
                    print(f"parked {rank} {os.getpid()}", flush=True)
                    threading.Event().wait()  # until the test kills this process
        dist.barrier()
        mpu.destroy_model_parallel()


if __name__ == "__main__":
    main()
