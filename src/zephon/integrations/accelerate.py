"""``prepare_pipeline``: a zephon pipeline in an ``accelerate`` training loop, exact on every rank.

``Accelerator.prepare`` of a DataLoader over an iterable dataset either reads it on rank 0 and
dispatches slices, or reads it on every rank and keeps every n-th batch; with a zephon pipeline
narrowed to one rank's lanes, both drop or repeat lanes. ``prepare_pipeline`` gives each rank a
loader over its own lanes that accelerate does not wrap, and registers the data position with
``accelerator.save_state`` / ``load_state``: the saved state is every rank's lanes merged, taken
for the last batch each rank handed to the loop, so a resume on any world size continues exactly.

``prepare_eval_pipeline`` gives each rank its lanes of an eval set, read from the start at every
evaluation; ``evaluate_loss`` runs the model over them and returns the token-weighted loss of
the whole set, the same on any number of processes (the ranks may hold different numbers of
eval batches, or none).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from zephon.integrations._eval import EvalLoader, TokenLoss, loss_tokens
from zephon.integrations._ranks import global_state, rank_view
from zephon.torch_data import hf_tensors
from zephon.torch_loader import PipelineDataLoader

if TYPE_CHECKING:
    from accelerate import Accelerator

    from zephon.pipeline import Pipeline

__all__ = [
    "DataState",
    "TokenLoss",
    "evaluate_loss",
    "loss_tokens",
    "prepare_eval_pipeline",
    "prepare_pipeline",
]


class DataState:
    """The object ``accelerator.register_for_checkpointing`` saves: every rank calls
    ``state_dict`` inside ``save_state`` (a gather), and the main process writes the merge."""

    def __init__(self, loader: PipelineDataLoader) -> None:
        self.loader = loader

    def state_dict(self) -> dict[str, Any]:
        return global_state(self.loader)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.loader.load_state_dict(state)


def prepare_pipeline(
    accelerator: Accelerator,
    pipeline: Pipeline,
    transform: Callable[[Any], Any] | None = None,
    *,
    num_workers: int = 0,
    register: bool = True,
    endless: bool = True,
    **dataloader_kwargs: Any,
) -> PipelineDataLoader:
    """This process's loader: its rank's lanes, items moved to ``accelerator.device``.

    Use it instead of ``accelerator.prepare(dataloader)``. ``transform`` turns a batch into
    model inputs (default: ``to_training(convention="hf")`` tensors). With ``register`` the data
    position is part of ``accelerator.save_state()`` and ``load_state()``.

    Ranks' passes differ in length, so by default (``endless``) one iteration is the rank's
    whole stream, pass after pass, and the loop ends at a step count of its own: no rank
    leaves the loop while the others wait in a collective. Each pass is handed out in whole
    groups of ``accelerator.gradient_accumulation_steps`` batches (the fewer left at its end
    are left out of it), so no accumulated step spans two passes.
    """
    view = rank_view(pipeline, accelerator.process_index, accelerator.num_processes)
    loader = PipelineDataLoader(
        view,
        transform or hf_tensors,
        num_workers=num_workers,
        device=accelerator.device,
        auto_epoch=True,
        endless=endless,
        accumulation_steps=accelerator.gradient_accumulation_steps,
        **dataloader_kwargs,
    )
    if register:
        accelerator.register_for_checkpointing(DataState(loader))
    return loader


def prepare_eval_pipeline(
    accelerator: Accelerator,
    pipeline: Pipeline,
    transform: Callable[[Any], Any] | None = None,
    *,
    num_workers: int = 0,
    **dataloader_kwargs: Any,
) -> EvalLoader:
    """This process's lanes of an eval set ending in ``.batch(n, drop_last=False)``, items on
    ``accelerator.device``; every iteration reads them from the start. Nothing is registered:
    the training position is all ``save_state`` keeps."""
    return EvalLoader(
        pipeline,
        transform or hf_tensors,
        rank=accelerator.process_index,
        world_size=accelerator.num_processes,
        num_workers=num_workers,
        device=accelerator.device,
        **dataloader_kwargs,
    )


def evaluate_loss(accelerator: Accelerator, model: Any, loader: EvalLoader) -> float:
    """The token-weighted loss of ``model`` over the whole eval set: every process calls it.

    The forward passes run on the unwrapped model, without a collective: DDP's forward would
    broadcast buffers at the first one after a training step, which a process without eval
    batches never joins. One gather at the end sums every process's share (see
    :class:`TokenLoss`). The model is back in training mode afterwards if it was before.
    """
    import torch

    module = accelerator.unwrap_model(model)
    training = module.training
    module.eval()
    metric = TokenLoss()
    try:
        with torch.no_grad():
            for inputs in loader:
                metric.update(module(**inputs).loss, loss_tokens(inputs))
    finally:
        module.train(training)
    return metric.compute()
