"""What Megatron-Bridge's training loop does with an external data loader, for the tests.

Megatron-Bridge cannot be imported without Transformer Engine (a CUDA build), so its two steps
that touch the provider are written out here: with ``dataloader_type="external"`` the dataset the
provider returns is passed through and wrapped in ``RerunDataIterator``, and
``maybe_save_dataloader_state`` calls ``iterator.iterable.save_state()`` on pipeline rank 0 and
tensor rank 0 only (the ranks of a ``ProcessGroupCollection``) and stores the result as
``{"dataloader_state_dict": state}`` in ``<dir>/iter_<NNNNNNN>/train_dataloader_dprank<NNN>.pt``:
no ``mp_rank_*`` folder, unlike Megatron-LM.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

with warnings.catch_warnings():  # at import it warns of missing Transformer Engine / Apex
    warnings.simplefilter("ignore")
    from megatron.core.process_groups_config import ProcessGroupCollection
    from megatron.core.rerun_state_machine import RerunDataIterator


def training_iterator(train_ds: Any) -> RerunDataIterator | list[RerunDataIterator]:
    """The iterator ``dataloader_type="external"`` trains from (a list: one per virtual stage)."""
    if isinstance(train_ds, list):
        return [RerunDataIterator(d) for d in train_ds]
    return RerunDataIterator(train_ds)


def process_groups() -> ProcessGroupCollection:
    """The groups Bridge hands the save: megatron-core's parallel state."""
    return ProcessGroupCollection.use_mpu_process_groups(["tp", "pp", "dp"])


def rank_file(save_dir: Path, iteration: int, dp_rank: int) -> Path:
    return save_dir / f"iter_{iteration:07d}" / f"train_dataloader_dprank{dp_rank:03d}.pt"


def maybe_save_dataloader_state(
    train_iterator: Any,
    iteration: int,
    dataloader_save_path: Path | None,
    *,
    pg_collection: ProcessGroupCollection,
) -> None:
    """Every rank of the job calls it at the same iteration, as Bridge's checkpoint save."""
    if train_iterator is None or not dataloader_save_path:
        return
    if not hasattr(train_iterator.iterable, "save_state"):
        raise RuntimeError(f"no save_state on {type(train_iterator)}")
    if not (pg_collection.pp.rank() == 0 and pg_collection.tp.rank() == 0):
        return
    state = train_iterator.iterable.save_state()
    path = rank_file(dataloader_save_path, iteration, pg_collection.dp.rank())
    dist.barrier(group=pg_collection.dp)
    if pg_collection.dp.rank() == 0:
        path.parent.mkdir(parents=True, exist_ok=True)
    dist.barrier(group=pg_collection.dp)
    torch.save({"dataloader_state_dict": state}, path)
