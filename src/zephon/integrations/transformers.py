"""``ZephonTrainer``: a Hugging Face ``Trainer`` fed by a zephon pipeline, exact on every rank.

What a plain ``Trainer`` gets wrong with an iterable dataset, and what this class does instead:

- accelerate dispatches rank 0's stream or keeps every n-th batch of each rank's; here each rank
  reads its own lanes (narrowed from the job's rank and world size), and accelerate never wraps
  the loader, so every lane is trained exactly once across ranks.
- the data position is not saved, and a resume re-reads and drops every trained batch; here
  every Trainer checkpoint holds ``zephon-data-state.json`` (all ranks' lanes merged) for the
  last batch the optimizer consumed, whatever the DataLoader or gradient accumulation read
  ahead, and ``resume_from_checkpoint`` continues from it without replaying anything.
- a second pass over an iterable dataset repeats the first (the Trainer numbers epochs from 0
  again after a resume, so it cannot key them); here each rank's stream goes on from pass to
  pass by itself (each the pipeline's next epoch, ``Pipeline.set_epoch``), so ranks whose
  passes differ in length never end a Trainer epoch at different steps, and only ``max_steps``
  ends training; a resume continues each lane in its saved pass.
- a partial gradient-accumulation group at the end of a pass is carried into the next one (an
  optimizer step over two passes); here a rank's pass is handed out in whole groups of
  ``gradient_accumulation_steps`` batches, the fewer left at its end are left out of it.
- SIGTERM kills the job without a checkpoint; here SIGTERM checkpoints at the next step end and
  exits 143, and SIGUSR1 checkpoints and goes on, as ``zephon run`` does.
- evaluation over an iterable dataset gathers every batch's loss across ranks (a hang when
  ranks hold different batch counts) and averages batch means; here ``eval_dataset=`` a pipeline
  (or a dict of them) is read by each rank from its own lanes, from the start at every
  evaluation, and ``eval_loss`` is token-weighted over the whole eval set, the same on any
  number of ranks (:mod:`zephon.integrations._eval`).
"""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from transformers import Trainer, TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from zephon.checkpoints import load_checkpoint, save_checkpoint
from zephon.errors import CheckpointError, ConfigError
from zephon.integrations._eval import EvalLoader, TokenLoss, check_eval_pipeline, loss_tokens
from zephon.integrations._ranks import global_state, max_over_ranks, rank_view, settle_collectives
from zephon.pipeline import Pipeline
from zephon.torch_data import hf_tensors
from zephon.torch_loader import PipelineDataLoader

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

__all__ = ["DATA_STATE_NAME", "PreemptionCallback", "ZephonTrainer", "latest_complete_checkpoint"]

DATA_STATE_NAME = "zephon-data-state.json"
_TRAINER_STATE_NAME = "trainer_state.json"
EXIT_SIGTERM = 143


def latest_complete_checkpoint(output_dir: str | os.PathLike[str]) -> str | None:
    """The newest ``checkpoint-N`` folder holding both the Trainer's and zephon's state.

    A job killed while saving leaves a newer folder without them; ``get_last_checkpoint``
    would pick it and the resume would fail.
    """
    folder = Path(output_dir)
    if not folder.is_dir():
        return None
    steps = []
    for child in folder.iterdir():
        name, _, step = child.name.partition("-")
        if name == PREFIX_CHECKPOINT_DIR and step.isdigit() and child.is_dir():
            steps.append((int(step), child))
    for _, child in sorted(steps, reverse=True):
        if (child / _TRAINER_STATE_NAME).is_file() and (child / DATA_STATE_NAME).is_file():
            return str(child)
    return None


class PreemptionCallback(TrainerCallback):  # type: ignore[misc]
    """Turns SIGTERM into "save at the next step end, then stop" and SIGUSR1 into "save at the
    next step end". Ranks agree on the request at every step end, so they all save together."""

    def __init__(self) -> None:
        self.stop_requested = False
        self.checkpoint_requested = False
        self.stopped = False
        self._previous: dict[int, Any] = {}

    def _on_stop(self, signum: int, frame: FrameType | None) -> None:
        if self.stop_requested:
            raise SystemExit(EXIT_SIGTERM)  # the second one: do not wait for the step end
        self.stop_requested = True

    def _on_checkpoint(self, signum: int, frame: FrameType | None) -> None:
        self.checkpoint_requested = True

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # handlers can only be set from the main thread
        self._previous[signal.SIGTERM] = signal.signal(signal.SIGTERM, self._on_stop)
        if hasattr(signal, "SIGUSR1"):
            self._previous[signal.SIGUSR1] = signal.signal(signal.SIGUSR1, self._on_checkpoint)

    def uninstall(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        # One reduction per step: 2 = stop (and save), 1 = save, 0 = nothing.
        wanted = 2 if self.stop_requested else 1 if self.checkpoint_requested else 0
        level = max_over_ranks(wanted)
        self.checkpoint_requested = False
        if level >= 1:
            control.should_save = True
        if level == 2:
            control.should_training_stop = True
            self.stopped = True
        return control


class ZephonTrainer(Trainer):  # type: ignore[misc]
    """A ``transformers.Trainer`` that takes ``train_pipeline=`` instead of ``train_dataset``.

    The pipeline ends in ``.batch(n)`` with ``n == per_device_train_batch_size``: each of its
    batches is one micro-batch. ``transform`` turns a batch into model inputs (default:
    ``to_training(convention="hf")`` as torch tensors). ``dataloader_num_workers`` runs shares
    of the rank's lanes in worker processes. Build the pipeline once for the whole job (without
    ``dp_rank``) or with this process's rank; under ``torchrun`` or ``accelerate launch`` each
    rank reads its own lanes.
    """

    def __init__(
        self,
        *args: Any,
        train_pipeline: Pipeline,
        transform: Callable[[Any], Any] | None = None,
        eval_transform: Callable[[Any], Any] | None = None,
        **kwargs: Any,
    ) -> None:
        if kwargs.get("train_dataset") is not None:
            raise ConfigError(
                "ZephonTrainer reads train_pipeline=; do not pass train_dataset as well"
            )
        super().__init__(*args, **kwargs)
        self.args.ignore_data_skip = True  # the pipeline resumes itself: skipping would drop data
        self.train_pipeline = rank_view(
            train_pipeline, self.args.process_index, self.args.world_size
        )
        _check_batch_size(self.train_pipeline, self.args.per_device_train_batch_size)
        self.transform = transform or hf_tensors
        self.zephon_loader: PipelineDataLoader | None = None
        self._data_resume: dict[str, Any] | None = None
        self.preemption = PreemptionCallback()
        self.add_callback(self.preemption)
        self.eval_transform = eval_transform or self.transform
        for pipeline in _eval_pipelines(self.eval_dataset):
            check_eval_pipeline(pipeline, self.args.per_device_eval_batch_size)

    def get_train_dataloader(self) -> _Passes:  # type: ignore[override]
        if self.zephon_loader is None:
            args = self.args
            extra: dict[str, Any] = {"pin_memory": args.dataloader_pin_memory}
            if args.dataloader_num_workers:
                extra["persistent_workers"] = args.dataloader_persistent_workers
                extra["prefetch_factor"] = args.dataloader_prefetch_factor
                extra["multiprocessing_context"] = args.dataloader_multiprocessing_context
            self.zephon_loader = PipelineDataLoader(
                self.train_pipeline,
                self.transform,
                num_workers=args.dataloader_num_workers,
                endless=True,
                accumulation_steps=args.gradient_accumulation_steps,
                **extra,
            )
        if self._data_resume is not None:
            self.zephon_loader.load_state_dict(self._data_resume)
            self._data_resume = None
        return _Passes(self.zephon_loader)

    def train(  # type: ignore[override]
        self, resume_from_checkpoint: str | bool | None = None, **kwargs: Any
    ) -> Any:
        """``Trainer.train``; ``resume_from_checkpoint=True`` takes the newest *complete*
        checkpoint, and the data continues from the state saved in it."""
        if resume_from_checkpoint is True:
            resume_from_checkpoint = latest_complete_checkpoint(str(self.args.output_dir))
            if resume_from_checkpoint is None:
                raise CheckpointError(
                    f"no checkpoint with both {_TRAINER_STATE_NAME} and {DATA_STATE_NAME} in "
                    f"{self.args.output_dir}"
                )
        if resume_from_checkpoint:
            data_file = Path(resume_from_checkpoint) / DATA_STATE_NAME
            if not data_file.is_file():
                raise CheckpointError(
                    f"{resume_from_checkpoint} holds no {DATA_STATE_NAME}: it was not saved by "
                    "ZephonTrainer, so the data position is unknown"
                )
            self._data_resume = load_checkpoint(data_file)
        self.preemption.install()
        try:
            result = super().train(resume_from_checkpoint=resume_from_checkpoint, **kwargs)
        finally:
            self.preemption.uninstall()
        settle_collectives()
        if self.preemption.stopped:
            raise SystemExit(EXIT_SIGTERM)
        return result

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        # Every rank takes part in the gather; the data file goes first, so a folder that has
        # the Trainer's state also has the data position that belongs to it.
        data = global_state(self.zephon_loader) if self.zephon_loader is not None else None
        if data is not None and self.args.should_save:
            folder = Path(self._get_output_dir(trial=trial))
            target = folder / f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
            target.mkdir(parents=True, exist_ok=True)
            save_checkpoint(target / DATA_STATE_NAME, data)
        super()._save_checkpoint(model, trial)

    # -- evaluation over pipelines ---------------------------------------------------------

    def get_eval_dataloader(self, eval_dataset: Any = None) -> Any:
        """A pipeline eval set (or the named one of a dict): this rank's lanes, from the start."""
        dataset = eval_dataset if eval_dataset is not None else self.eval_dataset
        if isinstance(eval_dataset, str):
            named: Any = self.eval_dataset
            dataset = named[eval_dataset]
        if not isinstance(dataset, Pipeline):
            return super().get_eval_dataloader(eval_dataset)
        check_eval_pipeline(dataset, self.args.per_device_eval_batch_size)
        args = self.args
        return EvalLoader(
            dataset,
            self.eval_transform,
            rank=args.process_index,
            world_size=args.world_size,
            num_workers=args.dataloader_num_workers,
            **_dataloader_extra(args),
        )

    def evaluation_loop(
        self,
        dataloader: Any,
        description: str,
        prediction_loss_only: bool | None = None,
        ignore_keys: list[str] | None = None,
        metric_key_prefix: str = "eval",
    ) -> Any:
        """For a pipeline eval set: every rank runs its own batches without a collective per
        batch, then one gather gives the token-weighted loss of the whole set."""
        if not isinstance(dataloader, EvalLoader):
            return super().evaluation_loop(
                dataloader, description, prediction_loss_only, ignore_keys, metric_key_prefix
            )
        if self.compute_metrics is not None:
            raise ConfigError(
                "compute_metrics needs every prediction gathered; a pipeline eval set reports "
                "eval_loss (token-weighted over all ranks) only: drop compute_metrics, or "
                "compute the metric in compute_loss"
            )
        import torch
        from transformers.trainer_utils import EvalLoopOutput

        unwrapped: Any = self.model
        model = self._wrap_model(unwrapped, training=False)
        model.eval()
        optimizer: Any = self.optimizer
        if callable(getattr(optimizer, "eval", None)):
            optimizer.eval()
        self.callback_handler.eval_dataloader = dataloader
        shifts = bool(getattr(self, "_loss_shifts_labels", True))
        totals = TokenLoss()
        with torch.no_grad():
            for inputs in dataloader:
                tokens = loss_tokens(inputs, shifts_labels=shifts)
                with self.compute_loss_context_manager():
                    loss = self.compute_loss(model, self._prepare_inputs(inputs))
                totals.update(loss, tokens, rows=len(inputs["input_ids"]))
                self.control = self.callback_handler.on_prediction_step(
                    self.args, self.state, self.control
                )
        loss_sum, tokens, rows, _ = totals.totals()  # the one collective, on every rank
        metrics = {
            f"{metric_key_prefix}_loss": float(loss_sum / tokens) if tokens else float("nan"),
            f"{metric_key_prefix}_loss_tokens": tokens,
        }
        nothing: Any = None  # no predictions: the loss is reduced on each rank as it goes
        return EvalLoopOutput(
            predictions=nothing, label_ids=None, metrics=metrics, num_samples=rows
        )


def _eval_pipelines(eval_dataset: Any) -> list[Pipeline]:
    values = eval_dataset.values() if isinstance(eval_dataset, dict) else [eval_dataset]
    return [value for value in values if isinstance(value, Pipeline)]


def _dataloader_extra(args: Any) -> dict[str, Any]:
    """The DataLoader settings of ``TrainingArguments`` an eval loader honours."""
    extra: dict[str, Any] = {"pin_memory": args.dataloader_pin_memory}
    if args.dataloader_num_workers:
        extra["prefetch_factor"] = args.dataloader_prefetch_factor
        extra["multiprocessing_context"] = args.dataloader_multiprocessing_context
    return extra


class _Passes:
    """The loader as the Trainer sees it: without ``set_epoch``, whose epoch index restarts at
    0 after a resume of an iterable dataset; the loader counts its passes itself, and one
    iteration is the rank's whole stream."""

    def __init__(self, loader: PipelineDataLoader) -> None:
        self.loader = loader

    def __iter__(self) -> Iterator[Any]:
        return iter(self.loader)


def _check_batch_size(pipeline: Pipeline, per_device: int) -> None:
    ops = pipeline.operators()
    last = ops[-1] if ops else None
    if last is None or last.name != "batch":
        raise ConfigError(
            "ZephonTrainer needs a pipeline that ends in .batch(n): each batch is one "
            f"micro-batch; add .batch({per_device}) (per_device_train_batch_size)"
        )
    size = int(last.config()["microbatch_size"])
    if size != per_device:
        raise ConfigError(
            f"the pipeline's batches hold {size} rows but per_device_train_batch_size is "
            f"{per_device}; set per_device_train_batch_size={size}, or .batch({per_device})"
        )
