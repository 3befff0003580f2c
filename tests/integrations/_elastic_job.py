"""A ``torchrun`` training loop that checkpoints every 3 steps (started by the tests).

Usage: ``torchrun ... tests/integrations/_elastic_job.py OUT MODE GRAD_ACCUM STEPS``. Each rank
reads ``GRAD_ACCUM`` zephon batches per optimizer step from the default pipeline narrowed to
its rank and appends one JSON line per step to ``OUT/<MODE>-r<RANK>.jsonl``: the step and the
digests of the rows it trained on. Every 3 steps the ranks gather their data states and rank 0
saves them in ``OUT/ckpt/data.json`` (with the step). MODE ``park`` stops after step 7 and
waits to be killed; ``resume`` continues from ``OUT/ckpt/data.json``.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from pathlib import Path

import torch.distributed as dist

from tests.integrations._corpus import build_pipeline, row_digest
from tests.integrations._launch import record_pid
from zephon.checkpoints import load_checkpoint, save_checkpoint, seal
from zephon.distributed import gather_checkpoints

EVERY, PARK_AT = 3, 7


def main() -> None:
    out, mode = Path(sys.argv[1]), sys.argv[2]
    grad_accum, steps = int(sys.argv[3]), int(sys.argv[4])
    record_pid(out)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    pipe = build_pipeline(dp_rank=rank, dp_world_size=world)  # default options otherwise
    start = 0
    if mode == "resume":
        saved = load_checkpoint(out / "ckpt" / "data.json")
        start = int(saved["step"])
        pipe.restore(saved)
    batches = iter(pipe)
    with open(out / f"{mode}-r{rank}.jsonl", "w", encoding="utf-8") as log:
        for step in range(start + 1, steps + 1):
            micro = [next(batches) for _ in range(grad_accum)]
            rows = [row_digest(r.payload["input_ids"]) for b in micro for r in b.records]
            log.write(json.dumps({"step": step, "rows": rows}) + "\n")
            log.flush()
            if step % EVERY == 0:
                data = gather_checkpoints(pipe.checkpoint())  # a collective: every rank
                if rank == 0:
                    save_checkpoint(out / "ckpt" / "data.json", seal({**data, "step": step}))
                dist.barrier()  # nobody trains past a checkpoint that is not on disk yet
            if mode == "park" and step == PARK_AT:
                print(f"parked {rank} {os.getpid()}", flush=True)
                threading.Event().wait()  # until the test kills this process
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
