"""One rank of a plain DDP loop over ``to_torch_dataset``, started by ``torchrun`` in the tests.

Usage: ``torchrun --nproc-per-node 2 tests/integrations/_dataset_job.py OUT GA STEPS``

Each rank trains the tiny Llama for STEPS optimizer steps of GA micro-batches from
``to_torch_dataset(endless=True, accumulation_steps=GA)`` over its lanes of the first
:data:`UNEVEN_DOCS` documents (passes of 14 batches on rank 0 and 10 on rank 1), through a plain
``DataLoader``; the gradients are all-reduced at the last micro-batch of every step. It appends
one JSON line per micro-batch to ``OUT/fresh-r<RANK>.jsonl`` (step, row digests).
"""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader

from tests.integrations._corpus import build_pipeline, row_digest, tiny_llama
from tests.integrations._launch import rank_exit, record_pid
from tests.integrations._trainer_job import UNEVEN_DOCS
from zephon.torch_data import hf_tensors


def main() -> None:
    with rank_exit():
        out, accumulation, steps = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
        record_pid(out)
        dist.init_process_group("gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
        pipeline = build_pipeline(docs=UNEVEN_DOCS, dp_rank=rank, dp_world_size=world)
        dataset = pipeline.to_torch_dataset(
            hf_tensors, endless=True, accumulation_steps=accumulation
        )
        batches = iter(DataLoader(dataset, batch_size=None))
        model = DistributedDataParallel(tiny_llama())
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        with open(out / f"fresh-r{rank}.jsonl", "w", encoding="utf-8") as log:
            for step in range(1, steps + 1):
                for micro in range(accumulation):
                    inputs = next(batches)
                    last = micro == accumulation - 1  # the all-reduce: every rank takes part
                    with contextlib.nullcontext() if last else model.no_sync():
                        (model(**inputs).loss / accumulation).backward()
                    rows = [row_digest(r) for r in inputs["input_ids"]]
                    log.write(json.dumps({"step": step, "rows": rows}) + "\n")
                optimizer.step()
                optimizer.zero_grad()
        dist.barrier()  # every rank's log is written


if __name__ == "__main__":
    main()
