"""Evaluation over a zephon pipeline, shared by the integrations: one rank's share of the eval
set, read from its start at every evaluation, and a loss that does not depend on the ranks.

Each rank reads its own lanes of the eval pipeline, so the ranks together see every eval row
exactly once, but they may hold different numbers of batches (none at all on a rank whose lanes
are empty). Nothing here runs a collective per batch; :meth:`TokenLoss.compute` runs one
``all_gather_object`` after the last batch, which every rank reaches whatever its batch count.

The loss is token-weighted: the sum of every loss token's loss over the whole eval set divided
by the number of loss tokens. Each batch adds its mean loss times its loss-token count, an
exact product in float64 (a float32 mean times fewer than 2**29 tokens); the products are summed
as exact fractions, so the result is the same bit for bit in any order and on any number of
ranks, as long as each batch's mean is.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from fractions import Fraction
from typing import TYPE_CHECKING, Any

from zephon.errors import ConfigError
from zephon.integrations._ranks import rank_view
from zephon.torch_loader import PipelineDataLoader

if TYPE_CHECKING:
    from zephon.pipeline import Pipeline

IGNORE_INDEX = -100  # the label Hugging Face losses skip


class EvalLoader:
    """One rank's lanes of an eval pipeline; each iteration is that whole share from its start.

    Iterating again restarts the eval set (the pipeline's epoch at construction, ``set_epoch``
    repeated on purpose), so an evaluation never continues where the last one stopped, and it
    shares nothing with the training loader. It has no ``state_dict``: frameworks that save a
    stateful loader's position keep none for it.
    """

    def __init__(
        self,
        pipeline: Pipeline,
        transform: Callable[[Any], Any],
        *,
        rank: int,
        world_size: int,
        num_workers: int = 0,
        device: Any = None,
        **dataloader_kwargs: Any,
    ) -> None:
        check_eval_pipeline(pipeline)
        view = rank_view(pipeline, rank, world_size)
        self.epoch = view.epoch
        self.loader = PipelineDataLoader(
            view, transform, num_workers=num_workers, device=device, **dataloader_kwargs
        )

    def __iter__(self) -> Iterator[Any]:
        self.loader.set_epoch(self.epoch)  # from the start again, on purpose
        return iter(self.loader)


def check_eval_pipeline(pipeline: Pipeline, per_device: int | None = None) -> None:
    """Refuse an eval pipeline whose batches would drop rows or disagree with the batch size."""
    ops = pipeline.operators()
    last = ops[-1] if ops else None
    size = f"{per_device}" if per_device is not None else "n"
    if last is None or last.name != "batch":
        raise ConfigError(
            "an eval pipeline needs to end in .batch(n, drop_last=False): each batch is one "
            f"evaluation step; add .batch({size}, drop_last=False)"
        )
    config = last.config()
    if config.get("drop_last", True):
        raise ConfigError(
            "the eval pipeline's .batch() drops each lane's partial last batch, so those rows "
            f"would never be evaluated; use .batch({config['microbatch_size']}, drop_last=False)"
        )
    if per_device is not None and int(config["microbatch_size"]) != per_device:
        raise ConfigError(
            f"the eval pipeline's batches hold {config['microbatch_size']} rows but "
            f"per_device_eval_batch_size is {per_device}; set per_device_eval_batch_size="
            f"{config['microbatch_size']}, or .batch({per_device}, drop_last=False)"
        )


def loss_tokens(inputs: Mapping[str, Any], *, shifts_labels: bool = True) -> int:
    """How many tokens a batch's loss averages over: labels other than -100, without each row's
    first label when the model shifts them (Hugging Face causal LMs); a ``shift_labels`` entry
    is taken as it is."""
    if "shift_labels" in inputs:
        labels = inputs["shift_labels"]
    elif "labels" in inputs:
        labels = inputs["labels"][..., 1:] if shifts_labels else inputs["labels"]
    else:
        raise ConfigError(
            f"an eval batch needs `labels` to count its loss tokens; it holds {sorted(inputs)}"
        )
    return int((labels != IGNORE_INDEX).sum())


class TokenLoss:
    """The token-weighted eval loss over every rank: ``update`` per batch, ``compute`` once.

    ``update(mean_loss, tokens)`` adds a batch whose loss is the mean over ``tokens`` loss
    tokens (what Hugging Face models return). ``compute()`` is a collective when a process
    group runs: every rank calls it once per evaluation, also one that had no batch. It returns
    sum of per-token losses / loss tokens of all ranks (NaN when there were none) and starts
    the next evaluation from zero.
    """

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.loss_sum = Fraction(0)
        self.tokens = 0
        self.rows = 0
        self.batches = 0

    def update(self, mean_loss: Any, tokens: int, rows: int = 0) -> None:
        value = float(mean_loss.detach()) if hasattr(mean_loss, "detach") else float(mean_loss)
        if tokens:  # a batch without loss tokens has a NaN mean and adds nothing
            self.loss_sum += Fraction(value) * tokens
        self.tokens += int(tokens)
        self.rows += int(rows)
        self.batches += 1

    def totals(self) -> tuple[Fraction, int, int, int]:
        """(loss sum, loss tokens, rows, batches) of every rank (a collective, see above)."""
        local = (self.loss_sum, self.tokens, self.rows, self.batches)
        gathered = _gather(local)
        return (
            sum((g[0] for g in gathered), Fraction(0)),
            sum(g[1] for g in gathered),
            sum(g[2] for g in gathered),
            sum(g[3] for g in gathered),
        )

    def compute(self) -> float:
        loss_sum, tokens, _, _ = self.totals()
        self.reset()
        return float(loss_sum / tokens) if tokens else float("nan")


def _gather(local: tuple[Fraction, int, int, int]) -> list[tuple[Fraction, int, int, int]]:
    try:
        import torch.distributed as dist
    except ImportError:  # pragma: no cover - torch is a dependency of every integration
        return [local]
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return [local]
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, local)
    return gathered
