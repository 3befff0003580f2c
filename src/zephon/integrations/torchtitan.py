"""A zephon pipeline as torchtitan's data loader, checkpointed with the model and resumable on any
data-parallel size.

torchtitan builds its data loader from the trainer config's ``dataloader`` entry
(``config.dataloader.build(dp_world_size=..., dp_rank=..., tokenizer=..., seq_len=...,
local_batch_size=...)``) and iterates it for ``({"input": ..., "positions": ...}, labels)``.
:class:`ZephonDataLoader` is such a loader: its :class:`ZephonDataLoader.Config` names the
pipeline (a YAML file or a Python factory), so a config registry function, or
``--dataloader.pipeline`` on torchtitan's command line, selects it.

torchtitan's checkpointer stores ``state_dict()`` through DCP next to the model and optimizer,
and DCP writes plain values from the coordinator rank only. Here ``state_dict()`` is every DP
rank's position merged (a gather over the DP group), the same on every rank, so the saved value
is the whole job's position and a restart on any DP size continues exactly.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from torchtitan.components.dataloader import BaseDataLoader

from zephon.checkpoints.format import verify_checksum
from zephon.errors import CheckpointError, ConfigError
from zephon.integrations._ranks import accumulation_steps, global_state, max_over_ranks, rank_view
from zephon.integrations._torchtitan_batch import IGNORE_INDEX, titan_batch
from zephon.torch_loader import PipelineDataLoader

if TYPE_CHECKING:
    from zephon.pipeline import Pipeline

__all__ = ["IGNORE_INDEX", "STATE_FORMAT", "ZephonDataLoader", "load_pipeline", "titan_batch"]

STATE_FORMAT = "zephon-torchtitan-dataloader"


def load_pipeline(spec: str) -> Pipeline:
    """The pipeline ``spec`` names: a YAML pipeline file (``.yaml``/``.yml``), or
    ``"module:name"`` of a :class:`~zephon.pipeline.Pipeline` or a function returning one."""
    from zephon._config_values import import_object
    from zephon.config import load_config
    from zephon.pipeline import Pipeline

    if not spec:
        raise ConfigError(
            "dataloader.pipeline is empty; set it to a pipeline YAML file or 'module:function' "
            "(--dataloader.pipeline pipeline.yaml)"
        )
    if spec.endswith((".yaml", ".yml")):
        built: Any = load_config(spec).build()
    else:
        built = import_object(spec, "dataloader.pipeline")
        built = built() if callable(built) and not isinstance(built, Pipeline) else built
    if not isinstance(built, Pipeline):
        raise ConfigError(
            f"dataloader.pipeline={spec!r} gave a {type(built).__name__}, not a zephon Pipeline; "
            "name a Pipeline or a function returning one"
        )
    return built


class ZephonDataLoader(BaseDataLoader):  # type: ignore[misc]
    """torchtitan's data loader over a zephon pipeline: one batch of this DP rank's lanes per item.

    The pipeline ends in ``.pack_flat(seq_len)`` and ``.batch(local_batch_size)`` and is
    narrowed to this rank's lanes, so build it without ``dp_rank``. Each pass is handed out in
    whole optimizer steps (``global_batch_size``, as in ``training.global_batch_size``: -1 is
    ``local_batch_size x DP``). With ``endless=False`` one pass is trained and every rank stops
    at the same batch (the ranks agree before each one), so none waits on a rank that ran out.
    """

    @dataclass(kw_only=True, slots=True)
    class Config(BaseDataLoader.Config):  # type: ignore[misc]
        pipeline: str = ""
        """A pipeline YAML file, or 'module:function' returning a zephon Pipeline."""

        global_batch_size: int = -1
        """training.global_batch_size: whole optimizer steps per pass (-1: no accumulation)."""

        endless: bool = True
        """Pass after pass until the trainer's step limit; False: one pass, then stop."""

        num_workers: int = 0
        """DataLoader worker processes running shares of the rank's lanes (speed only)."""

        pad_token_id: int = 0
        """Fills a flat row up to num_tokens_per_batch."""

    def __init__(
        self,
        config: Config,
        *,
        dp_world_size: int = 1,
        dp_rank: int = 0,
        seq_len: int | None = None,
        local_batch_size: int | None = None,
        num_tokens_per_batch: int | None = None,
        max_context_length: int | None = None,
        dp_group: Any = None,
        built_pipeline: Pipeline | None = None,
        **_framework: Any,  # tokenizer, snapshot_every_n_steps: the pipeline tokenizes itself
    ) -> None:
        pipeline = built_pipeline if built_pipeline is not None else load_pipeline(config.pipeline)
        rows = local_batch_size or 1
        wanted = config.global_batch_size
        self.accumulation_steps = accumulation_steps(
            global_batch_size=wanted if wanted > 0 else rows * dp_world_size,
            micro_batch_size=rows,
            data_parallel_size=dp_world_size,
            option="--training.global_batch_size",
        )
        self.config = config
        self.dp_rank, self.dp_world_size, self.dp_group = dp_rank, dp_world_size, dp_group
        self.seq_len = seq_len if seq_len is not None else max_context_length
        self.local_batch_size, self.num_tokens_per_batch = local_batch_size, num_tokens_per_batch
        self.loader = PipelineDataLoader(
            rank_view(pipeline, dp_rank, dp_world_size),
            endless=config.endless,
            accumulation_steps=self.accumulation_steps,
            num_workers=config.num_workers,
        )
        self.batches = 0  # handed out by this loader (the rows are local_batch_size each)
        self._started = False

    def __iter__(self) -> Iterator[tuple[dict[str, Any], Any]]:
        self._started = True
        items = iter(self.loader)
        while True:
            item = next(items, None)
            if not self._every_rank_has(item is not None) or item is None:
                return
            self.batches += 1
            yield titan_batch(
                item,
                seq_len=self.seq_len,
                local_batch_size=self.local_batch_size,
                num_tokens_per_batch=self.num_tokens_per_batch,
                pad_token_id=self.config.pad_token_id,
            )

    def _every_rank_has(self, has: bool) -> bool:
        """Whether every DP rank has its next batch (a collective only for finite data)."""
        if self.config.endless:
            return has
        return max_over_ranks(0 if has else 1, group=self.dp_group) == 0

    def state_dict(self) -> dict[str, Any]:
        """The whole job's position, the same on every rank (a collective over ``dp_group``, by
        default the whole job: torchtitan's checkpointer calls it on every rank at the same
        step; tensor, pipeline and context parallel peers of a DP rank count once). The merged
        checkpoint travels as one JSON string, which DCP stores whole."""
        state = global_state(self.loader, group=self.dp_group, dp_rank=self.dp_rank)
        return {
            "format": STATE_FORMAT,
            "dp_world_size": self.dp_world_size,
            "state": json.dumps(state, sort_keys=True),
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Continue from a saved position (any DP size); before the first batch only."""
        if not state_dict:
            return
        if self._started:
            raise CheckpointError(
                "load_state_dict after the data loader handed out batches; load the checkpoint "
                "before training starts"
            )
        if state_dict.get("format") != STATE_FORMAT or not isinstance(state_dict.get("state"), str):
            raise CheckpointError(
                f"the checkpoint's dataloader state is not a zephon torchtitan state (keys "
                f"{sorted(state_dict)}); resume with the data loader that wrote it, or exclude it "
                "with --checkpoint.exclude_from_loading dataloader"
            )
        state = json.loads(state_dict["state"])
        verify_checksum(state)
        self.loader.load_state_dict(state)
