"""What Megatron-LM's training loop does with an external data loader, for the tests.

``megatron.training`` is not part of the ``megatron-core`` wheel, so its two steps that touch the
provider are written out here from its documented behaviour: the iterator it trains from is the
provider wrapped in ``RerunDataIterator``, and ``save_dataloader_state`` calls
``iterator.iterable.save_state()`` on tensor-parallel rank 0 of the first pipeline stage of
every data-parallel rank and stores the result as ``{"dataloader_state_dict": state}`` in
``<dir>/iter_<NNNNNNN>/mp_rank_00/train_dataloader_dprank<NNN>.pt``.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

with warnings.catch_warnings():  # at import it warns of missing Transformer Engine / Apex
    warnings.simplefilter("ignore")
    from megatron.core import parallel_state as mpu
    from megatron.core.rerun_state_machine import (
        RerunDataIterator,
        RerunMode,
        get_rerun_state_machine,
    )

__all__ = [
    "RerunMode",
    "get_rerun_state_machine",
    "mpu",
    "rank_file",
    "save_dataloader_state",
    "training_iterator",
]


def training_iterator(train_ds: Any) -> RerunDataIterator:
    """The iterator ``--dataloader-type external`` trains from."""
    return RerunDataIterator(train_ds)


def rank_file(save_dir: Path, iteration: int, dp_rank: int) -> Path:
    return (
        save_dir
        / f"iter_{iteration:07d}"
        / "mp_rank_00"
        / f"train_dataloader_dprank{dp_rank:03d}.pt"
    )


def save_dataloader_state(iterator: RerunDataIterator, iteration: int, save_dir: Path) -> None:
    """Every rank of the job calls it at the same iteration, as Megatron's checkpoint save."""
    if not hasattr(iterator.iterable, "save_state"):
        raise RuntimeError(f"no save_state on {type(iterator.iterable)}")
    if not (mpu.is_pipeline_first_stage() and mpu.get_tensor_model_parallel_rank() == 0):
        return
    state = iterator.iterable.save_state()
    path = rank_file(save_dir, iteration, mpu.get_data_parallel_rank())
    group = mpu.get_data_parallel_group()
    dist.barrier(group=group)
    path.parent.mkdir(parents=True, exist_ok=True)
    dist.barrier(group=group)
    torch.save({"dataloader_state_dict": state}, path)
