"""``ZephonDataModule``: a zephon pipeline as a Lightning ``LightningDataModule``, resumed exactly.

Lightning fetches one batch ahead of the one it trains, and saves a stateful loader's state when
it checkpoints, which is then a batch the model never trained. The data module instead hands
out its batches tagged with their position, notes the position of each batch as it reaches the
model (``on_before_batch_transfer``, right before ``training_step``), and its ``state_dict``,
which Lightning stores in every checkpoint, is the position after the last batch trained: all
ranks' lanes merged, so ``ckpt_path=`` resumes on any world size. The loader itself exposes no
``state_dict``, so Lightning keeps none of its own.

With ``eval_pipeline=``, ``val_dataloader`` reads this rank's lanes of the eval set from its
start at every validation, apart from the training position; the ranks may hold different
numbers of eval batches (or none). :class:`TokenLoss` and :func:`loss_tokens` give a
``validation_step`` the token-weighted loss of the whole set, the same on any number of ranks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import lightning.pytorch as pl
from torch.nn.parallel import DistributedDataParallel

from zephon.errors import ConfigError
from zephon.integrations._eval import EvalLoader
from zephon.integrations._eval import TokenLoss as TokenLoss
from zephon.integrations._eval import loss_tokens as loss_tokens
from zephon.integrations._ranks import global_state, rank_view
from zephon.pipeline import Pipeline
from zephon.torch_data import hf_tensors
from zephon.torch_loader import PipelineDataLoader

__all__ = ["ZephonDataModule"]


@dataclass(frozen=True)
class _Positioned:
    """A batch and its index among the items the loader handed out."""

    index: int
    batch: Any


class _PositionedLoader:
    """Iterates the loader's items as :class:`_Positioned` (no ``state_dict``: see module doc)."""

    def __init__(self, loader: PipelineDataLoader) -> None:
        self.loader = loader

    def __iter__(self) -> Iterator[_Positioned]:
        for batch in self.loader:
            yield _Positioned(self.loader.items_yielded - 1, batch)


class _Validation:
    """An eval loader that keeps DDP from syncing buffers at the first forward of a validation.

    After a training step, DDP broadcasts the module's buffers at the next forward (a
    collective); a rank whose eval lanes hold no batch never makes that forward, and the job
    would hang. The buffers were synced before the last training forward, so validation skips
    the broadcast; the next training forward syncs them as usual.
    """

    def __init__(self, loader: EvalLoader, trainer: Any) -> None:
        self.loader = loader
        self.trainer = trainer

    def __iter__(self) -> Iterator[Any]:
        model = getattr(getattr(self.trainer, "strategy", None), "model", None)
        if isinstance(model, DistributedDataParallel):
            model.require_forward_param_sync = False
        return iter(self.loader)


class ZephonDataModule(pl.LightningDataModule):  # type: ignore[misc]
    """Training batches from ``pipeline`` (one rank's lanes under DDP) for ``lightning.Trainer``.

    ``transform`` turns a zephon batch into what ``training_step`` receives (default:
    ``to_training(convention="hf")`` tensors). ``num_workers`` runs shares of the rank's lanes in
    DataLoader workers; ``read_ahead`` bounds how many batches Lightning may fetch beyond the
    one it trains (1 by default in Lightning). The rank's stream goes on from pass to pass by
    itself (each the pipeline's next epoch, ``Pipeline.set_epoch``), in whole groups of
    ``accumulate_grad_batches`` per pass, so ranks whose passes differ in length never end a
    Lightning epoch at different steps: ``max_steps`` ends training (it is required), and a
    resume continues each lane in its saved pass.

    ``eval_pipeline`` (ending in ``.batch(n, drop_last=False)``), or a list of them (one
    ``dataloader_idx`` each), is what ``val_dataloader`` reads, each validation from its start,
    through ``eval_transform`` (default: ``transform``).
    """

    def __init__(
        self,
        pipeline: Pipeline,
        transform: Callable[[Any], Any] | None = None,
        *,
        num_workers: int = 0,
        read_ahead: int = 4,
        eval_pipeline: Pipeline | Sequence[Pipeline] | None = None,
        eval_transform: Callable[[Any], Any] | None = None,
    ) -> None:
        super().__init__()
        self.pipeline = pipeline
        self.transform = transform or hf_tensors
        self.num_workers = num_workers
        self.read_ahead = read_ahead
        self.loader: PipelineDataLoader | None = None
        self._trained: int | None = None  # index of the last batch that reached the model
        self._pending: Mapping[str, Any] | None = None
        self.eval_pipeline = eval_pipeline
        self.eval_transform = eval_transform or self.transform
        if eval_pipeline is not None:  # Lightning validates when val_dataloader is overridden
            vars(self)["val_dataloader"] = self._val_dataloader

    def _build_loader(self) -> PipelineDataLoader:
        if self.loader is None:
            trainer = self.trainer
            rank, world = (0, 1) if trainer is None else (trainer.global_rank, trainer.world_size)
            if trainer is not None and trainer.max_steps in (None, -1):
                raise ConfigError(
                    "ZephonDataModule: the data is one endless stream per rank (their passes "
                    "differ in length), so set lightning.Trainer(max_steps=N); "
                    "pipeline.pass_length() tells a rank how many batches a pass holds"
                )
            group = 1 if trainer is None else int(trainer.accumulate_grad_batches)
            self.loader = PipelineDataLoader(
                rank_view(self.pipeline, rank, world),
                self.transform,
                num_workers=self.num_workers,
                history=self.read_ahead + 1,
                endless=True,
                accumulation_steps=group,
            )
        if self._pending is not None:
            self.loader.load_state_dict(self._pending)
            self._pending = None
        return self.loader

    def train_dataloader(self) -> _PositionedLoader:
        return _PositionedLoader(self._build_loader())

    def _val_dataloader(self) -> _Validation | list[_Validation]:
        """``val_dataloader`` with an eval pipeline: this rank's lanes of ``eval_pipeline`` (or
        of each), from the start at every validation."""
        trainer = self.trainer
        rank, world = (0, 1) if trainer is None else (trainer.global_rank, trainer.world_size)
        pipelines = self.eval_pipeline
        assert pipelines is not None
        single = isinstance(pipelines, Pipeline)
        loaders = [
            _Validation(
                EvalLoader(
                    pipeline, self.eval_transform, rank=rank, world_size=world,
                    num_workers=self.num_workers,
                ),
                trainer,
            )
            for pipeline in ([pipelines] if isinstance(pipelines, Pipeline) else pipelines)
        ]  # fmt: skip
        return loaders[0] if single else loaders

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        if isinstance(batch, _Positioned):
            self._trained = batch.index
            return batch.batch
        return batch

    def state_dict(self) -> dict[str, Any]:
        """The position after the last batch trained, every rank merged (a collective)."""
        if self.loader is None:
            raise ConfigError("ZephonDataModule.state_dict() before training started")
        if self._trained is None:  # nothing trained yet in this run
            return global_state(self.loader)
        return global_state(self.loader, upto=self._trained)

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        self._trained = None
        self._pending = state_dict
        if self.loader is not None:
            self._build_loader()
