"""A zephon pipeline as Megatron-LM's ``--dataloader-type external`` data, resumable on any DP size.

With ``--dataloader-type external`` Megatron wraps whatever the datasets provider returns for
training in a ``RerunDataIterator`` and calls ``next()`` on it (tensor-parallel rank 0 of the
first and last pipeline stages, once per micro-batch). :class:`MegatronDataProvider` is that
iterator: each ``next()`` is one micro-batch of this data-parallel rank's lanes as Megatron's batch
keys (:func:`bshd_batch`, or packed THD sequences with :func:`thd_batch`).

Megatron's ``save_dataloader_state`` (and Megatron-Bridge's ``maybe_save_dataloader_state``, which
uses the same hook) writes ``iterable.save_state()`` of every DP rank to its own
``train_dataloader_dprank<NNN>.pt`` and leaves restoring to the provider. Here ``save_state`` is
every rank's position merged (a gather over the DP group), so each rank file holds the whole
job's position; :meth:`MegatronDataProvider.load_state` takes the newest complete generation of
rank files (or the model's iteration), checks the count and checksums, and continues on any DP
size. What cannot be resumed is refused with the file at fault: never skipped.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from zephon.errors import CheckpointError, ConfigError
from zephon.integrations._megatron_batch import bshd_batch, thd_batch, thd_pad_multiple
from zephon.integrations._megatron_files import STATE_FORMAT, load_generation, rank_file_name
from zephon.integrations._ranks import accumulation_steps, global_state, rank_view
from zephon.torch_loader import PipelineDataLoader

if TYPE_CHECKING:
    from zephon.pipeline import Pipeline

__all__ = [
    "MegatronDataProvider",
    "accumulation_steps",
    "bshd_batch",
    "datasets_provider",
    "load_generation",
    "rank_file_name",
    "reads_data",
    "thd_batch",
    "thd_pad_multiple",
]


def reads_data(*, tensor_rank: int, pipeline_rank: int, pipeline_size: int) -> bool:
    """Whether Megatron calls ``next()`` on this rank's iterator: tensor-parallel rank 0 of the
    first and the last pipeline stage (the others get the batch broadcast, or need none)."""
    return tensor_rank == 0 and pipeline_rank in (0, pipeline_size - 1)


class MegatronDataProvider:
    """The iterator Megatron trains from: one micro-batch of this DP rank's lanes per ``next()``.

    ``pipeline`` ends in ``.batch(micro_batch_size)`` (with ``thd=True``, each batch's rows are
    packed into one sequence and Megatron's micro-batch size is 1). It is narrowed to this rank's
    lanes, so build it without ``dp_rank``. The stream runs pass after pass; each pass is handed
    out in whole optimizer steps (the accumulation steps the batch sizes imply).
    """

    def __init__(
        self,
        pipeline: Pipeline,
        *,
        micro_batch_size: int,
        global_batch_size: int,
        dp_rank: int = 0,
        dp_world_size: int = 1,
        dp_group: Any = None,
        thd: bool = False,
        pad_multiple: int = 1,
        pad_token_id: int = 0,
    ) -> None:
        if thd and micro_batch_size != 1:
            raise ConfigError(
                f"thd=True packs each pipeline batch into one sequence, so Megatron's "
                f"micro_batch_size must be 1, got {micro_batch_size}; use --micro-batch-size 1"
            )
        self.accumulation_steps = accumulation_steps(
            global_batch_size=global_batch_size,
            micro_batch_size=micro_batch_size,
            data_parallel_size=dp_world_size,
        )
        self.micro_batch_size = micro_batch_size
        self.dp_rank, self.dp_world_size, self.dp_group = dp_rank, dp_world_size, dp_group
        self.thd, self.pad_multiple, self.pad_token_id = thd, pad_multiple, pad_token_id
        self.loader = PipelineDataLoader(
            rank_view(pipeline, dp_rank, dp_world_size),
            endless=True,
            accumulation_steps=self.accumulation_steps,
        )
        self._items: Iterator[Any] | None = None
        self.resumed_from: int | None = None  # the iteration load_state continued from

    def __iter__(self) -> MegatronDataProvider:
        return self

    def __next__(self) -> dict[str, Any]:
        if self._items is None:
            self._items = iter(self.loader)
        return self._convert(next(self._items))

    def _convert(self, item: Any) -> dict[str, Any]:
        if self.thd:
            return thd_batch(item, pad_multiple=self.pad_multiple, pad_token_id=self.pad_token_id)
        rows = len(item.records)
        if rows != self.micro_batch_size:
            raise ConfigError(
                f"the pipeline's batch holds {rows} rows but micro_batch_size is "
                f"{self.micro_batch_size}; end the pipeline in .batch({self.micro_batch_size})"
            )
        return bshd_batch(item)

    def save_state(self) -> dict[str, Any]:
        """What Megatron writes to this rank's file: the whole job's merged position (a
        collective over the DP group: Megatron calls it on every DP rank at the same step)."""
        return {
            "format": STATE_FORMAT,
            "dp_rank": self.dp_rank,
            "dp_world_size": self.dp_world_size,
            "state": global_state(self.loader, group=self.dp_group),
        }

    def load_state(self, save_dir: str | Path, iteration: int | None = None) -> int:
        """Continue from the rank files under ``save_dir`` (Megatron's ``--dataloader-save``):
        exactly ``iteration``'s when given (the model's), else the newest complete generation.
        Call it before the first ``next()``; returns the iteration it continues from."""
        if self._items is not None:
            raise CheckpointError(
                "load_state after the provider has handed out batches; load before training starts"
            )
        found, state = load_generation(save_dir, iteration)
        self.loader.load_state_dict(state)
        self.resumed_from = found
        return found


def datasets_provider(
    pipeline: Pipeline,
    *,
    micro_batch_size: int,
    global_batch_size: int,
    thd: bool = False,
    sequence_parallel: bool = False,
    resume_dir: str | Path | None = None,
    resume_iteration: int | None = None,
    pad_token_id: int = 0,
) -> Callable[..., tuple[MegatronDataProvider | None, None, None]]:
    """A ``train_valid_test_datasets_provider`` for ``pretrain(...)`` with
    ``--dataloader-type external``: on the ranks that read data (:func:`reads_data`) it returns
    this rank's :class:`MegatronDataProvider` (restored from ``resume_dir`` when given), elsewhere
    None. Ranks, groups and the THD padding multiple come from ``megatron.core.parallel_state``."""

    def provide(*_args: Any, **_kwargs: Any) -> tuple[MegatronDataProvider | None, None, None]:
        from megatron.core import parallel_state as mpu

        if not reads_data(
            tensor_rank=mpu.get_tensor_model_parallel_rank(),
            pipeline_rank=mpu.get_pipeline_model_parallel_rank(),
            pipeline_size=mpu.get_pipeline_model_parallel_world_size(),
        ):
            return None, None, None
        provider = MegatronDataProvider(
            pipeline,
            micro_batch_size=micro_batch_size,
            global_batch_size=global_batch_size,
            dp_rank=mpu.get_data_parallel_rank(),
            dp_world_size=mpu.get_data_parallel_world_size(),
            dp_group=mpu.get_data_parallel_group(),
            thd=thd,
            pad_multiple=thd_pad_multiple(
                tensor_parallel=mpu.get_tensor_model_parallel_world_size(),
                context_parallel=mpu.get_context_parallel_world_size(),
                sequence_parallel=sequence_parallel,
            ),
            pad_token_id=pad_token_id,
        )
        if resume_dir is not None:
            provider.load_state(resume_dir, resume_iteration)
        return provider, None, None

    return provide
