"""``CapturedRollouts``: TRL's ``GRPOTrainer`` trained from a streaming capture source.

Why this shape: TRL 1.16's ``GRPOTrainer`` draws prompts from its ``train_dataset`` and asks
``rollout_func(prompts, trainer)`` for their completions (``num_generations`` consecutive
copies of each prompt, one completion per copy). In a zephon RL loop the rollouts are already
generated, captured and scored, and the order they are trained in is the streaming source's
(oldest first, under the staleness bound), not the dataset sampler's. So the dataset holds
placeholder slots, and ``rollout_func`` answers each block of ``num_generations`` slots with
the next group record of the pipeline: its members' captured prompt and completion ids, the
engine's log-probs, a mask of the tokens the engine generated (``env_mask``: the prompts
between calls of a multi-call rollout are not trained) and the captured reward, which
:meth:`CapturedRollouts.reward` hands back to TRL as the reward function. The callback marks
the served groups ``trained`` in the prompt ledger after the optimizer step that used them,
and saves the pipeline's position with each TRL checkpoint (``zephon_rollouts.json``), so a
run resumed from that checkpoint (:meth:`CapturedRollouts.resume`) serves the next group.

Under several data-parallel processes (``accelerate launch``, ``torchrun``) each rank trains a
disjoint, deterministic share of the groups: admission ``g`` goes to rank ``g % world_size``
(the pipeline's lanes, :class:`~zephon.options.RuntimeOptions` ``dp_rank``/``dp_world_size``,
set from ``torch.distributed`` once its process group is up), and each rank saves its own
position (``zephon_rollouts-rank<R>.json``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
from transformers import TrainerCallback

from zephon.capture.dataset import run_sync
from zephon.capture.group_ops import store_at
from zephon.capture.ledger import MemberRef
from zephon.capture.store_handle import StoreHandle
from zephon.errors import CheckpointError

__all__ = ["CapturedRollouts"]

SLOT_PROMPT = "zephon group slot {i}"
STATE_FILE = "zephon_rollouts.json"
RANK_STATE_FILE = "zephon_rollouts-rank{rank}.json"


def data_parallel() -> tuple[int, int]:
    """This process's rank and the world size: ``torch.distributed``'s when its process group
    is initialised (accelerate and TRL initialise it), else the launcher's ``RANK`` and
    ``WORLD_SIZE``, else one process."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def state_file(rank: int, world: int) -> str:
    """The name of a rank's position file in a TRL checkpoint folder."""
    return STATE_FILE if world == 1 else RANK_STATE_FILE.format(rank=rank)


def _split(member: Mapping[str, Any]) -> tuple[list[int], list[int], list[float], list[int]]:
    """A built trajectory as TRL's prompt ids, completion ids, log-probs and env mask: the
    completion starts at the first generated token."""
    ids = np.asarray(member["input_ids"]).tolist()
    mask = np.asarray(member["loss_mask"]).tolist()
    logprobs = np.asarray(member["logprobs"], dtype=np.float64).tolist()
    start = next((i for i, m in enumerate(mask) if m), len(ids))
    return ids[:start], ids[start:], logprobs[start:], [int(m) for m in mask[start:]]


class CapturedRollouts:
    """Feeds ``GRPOTrainer`` the groups of a streaming capture pipeline.

    Args:
        records: the pipeline over a :class:`~zephon.capture.streaming.StreamingCaptureSource`
            (group operators included), or any iterable of its records.
        store: the capture store (or its URL) holding the stream's prompt ledger.
        num_generations: TRL's ``num_generations``: every group must have that many members
            (``keep_per_prompt(store, k)`` trims larger groups).

    The callback marks each served group ``trained`` at its ``trained_version``: the version
    the source checked its staleness at (it counts admitted groups, those a group operator
    dropped included), so a replay marks it again at the same step, a no-op.
    """

    def __init__(self, records: Iterable[Any], store: Any, *, num_generations: int) -> None:
        if isinstance(num_generations, bool) or not isinstance(num_generations, int):
            raise TypeError(f"num_generations is {num_generations!r}: use an int >= 2")
        if num_generations < 2:
            raise ValueError(f"num_generations is {num_generations}: GRPO needs groups of >= 2")
        location = store_at(store)
        self._handle = (
            StoreHandle(url=location) if isinstance(location, str) else StoreHandle(store=location)
        )
        self._source = records
        self._records: Iterator[Any] | None = None  # iterated from the first group on
        self.num_generations = num_generations
        self.served: list[dict[str, Any]] = []  # every group handed to TRL, in order
        self._unmarked: list[dict[str, Any]] = []
        self._closed = False
        self.rank, self.world_size = 0, 1
        self._placed = False  # the rank's share chosen (on first use, once ranks are up)

    def _place(self) -> None:
        """Give this rank its share of the groups: the pipeline's lanes ``rank::world``."""
        if self._placed:
            return
        self._placed = True
        self.rank, self.world_size = rank, world = data_parallel()
        if world == 1:
            return
        options = getattr(self._source, "runtime_options", None)
        if options is None:
            raise TypeError(
                f"CapturedRollouts runs on {world} processes: pass the Pipeline over the "
                "streaming source (not an iterable of its records) so each rank gets its share"
            )
        if options.dp_world_size not in (1, world) or options.dp_rank not in (0, rank):
            raise ValueError(
                f"the pipeline is set for rank {options.dp_rank} of {options.dp_world_size}, "
                f"this process is rank {rank} of {world}: leave dp_rank/dp_world_size unset "
                "(CapturedRollouts sets them)"
            )
        replicas = options.canonical_replicas if options.canonical_replicas > 1 else world
        self._source.options(canonical_replicas=replicas, dp_rank=rank, dp_world_size=world)  # type: ignore[attr-defined]

    def train_dataset(self, groups: int) -> Any:
        """A ``datasets.Dataset`` of ``groups`` placeholder prompts (TRL samples from it;
        which slot it samples does not matter: the stream decides the group)."""
        from datasets import Dataset

        return Dataset.from_list([{"prompt": SLOT_PROMPT.format(i=i)} for i in range(groups)])

    def rollout_func(self, prompts: Sequence[Any], trainer: Any) -> dict[str, list[Any]]:
        """TRL's ``rollout_func``: one group record per ``num_generations`` prompts."""
        n = self.num_generations
        if len(prompts) % n:
            raise ValueError(
                f"rollout_func got {len(prompts)} prompts, not a multiple of num_generations {n}"
            )
        out: dict[str, list[Any]] = {
            "prompt_ids": [],
            "completion_ids": [],
            "logprobs": [],
            "env_mask": [],
            "zephon_reward": [],
        }
        for _ in range(len(prompts) // n):
            group = self._next_group()
            for member in group["members"]:
                prompt, completion, logprobs, mask = _split(member)
                out["prompt_ids"].append(prompt)
                out["completion_ids"].append(completion)
                out["logprobs"].append(logprobs)
                out["env_mask"].append(mask)
                out["zephon_reward"].append(float(member["reward"]))
        return out

    def _next_group(self) -> dict[str, Any]:
        if self._closed:
            raise RuntimeError(
                "CapturedRollouts was closed: make a new one over the pipeline and resume() it "
                "from the last TRL checkpoint"
            )
        if self._records is None:
            self._place()
            self._records = iter(self._source)
        record = next(self._records, None)
        if record is None:
            raise RuntimeError(
                "the capture stream ended before TRL's max_steps: train fewer steps or issue "
                "more prompts"
            )
        group = dict(record.payload if hasattr(record, "payload") else record)
        members = group["members"]
        if len(members) != self.num_generations:
            raise ValueError(
                f"group at position {group['position']} has {len(members)} members, TRL's "
                f"num_generations is {self.num_generations}: add keep_per_prompt(store, "
                f"{self.num_generations}) to the pipeline or issue n={self.num_generations}"
            )
        if any(m.get("reward") is None for m in members):
            raise ValueError(f"group at position {group['position']} has an unscored member")
        self.served.append(group)
        self._unmarked.append(group)
        return group

    def close(self) -> None:
        """End the pipeline's iteration (its workers and store clients) and close the store
        client opened from a URL; a store object passed in stays open (it is the caller's).
        Groups served but not marked stay unmarked: a resume serves them again."""
        records, self._records = self._records, None
        self._closed = True
        close = getattr(records, "close", None)
        if close is not None:
            close()
        self._handle.close()

    def __enter__(self) -> CapturedRollouts:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def reward(
        self, prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any
    ) -> list[float]:
        """TRL's reward function: the captured reward of each completion."""
        rewards: list[float] = kwargs["zephon_reward"]
        return rewards

    def mark_trained(self) -> None:
        """Mark every served group not yet marked ``trained`` at its ``trained_version``."""
        for group in self._unmarked:
            refs: list[MemberRef] = [
                (group["position"], m["index"], m["attempt"]) for m in group["members"]
            ]
            store = self._handle.get()
            run_sync(store.advance(group["stream"], refs, "trained", step=group["trained_version"]))
        self._unmarked = []

    def save(self, checkpoint_dir: str | os.PathLike[str]) -> None:
        """Write the pipeline's position (every group served so far) into a TRL checkpoint
        folder; the callback does it after each checkpoint save."""
        checkpoint = getattr(self._source, "checkpoint", None)
        if checkpoint is None:
            raise TypeError("CapturedRollouts can save its position only over a Pipeline")
        self._place()
        state = {"served": len(self.served), "pipeline": checkpoint()}
        os.makedirs(checkpoint_dir, exist_ok=True)  # another rank may not have made it yet
        path = os.path.join(checkpoint_dir, state_file(self.rank, self.world_size))
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            json.dump(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(path + ".tmp", path)

    def resume(self, checkpoint_dir: str | os.PathLike[str]) -> None:
        """Continue after the groups served before TRL's checkpoint ``checkpoint_dir`` (call it
        before ``trainer.train(resume_from_checkpoint=checkpoint_dir)``)."""
        self._place()
        path = os.path.join(checkpoint_dir, state_file(self.rank, self.world_size))
        try:
            with open(path, encoding="utf-8") as f:
                state = json.load(f)
        except FileNotFoundError:
            raise CheckpointError(
                f"{path} is missing: that checkpoint was saved without CapturedRollouts' "
                "callback, so where the stream stood is unknown"
            ) from None
        if self._records is not None:
            raise CheckpointError("resume before the first group is served")
        self._source.restore(state["pipeline"])  # type: ignore[attr-defined]

    def callback(self) -> Any:
        """A ``TrainerCallback`` that marks the served groups trained after each optimizer
        step (the groups of a generation batch are all used by then)."""
        return _MarkTrained(self)


class _MarkTrained(TrainerCallback):  # type: ignore[misc]  # transformers is untyped here
    def __init__(self, rollouts: CapturedRollouts) -> None:
        self._rollouts = rollouts

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        steps_per_generation = getattr(args, "steps_per_generation", 1) or 1
        if state.global_step % steps_per_generation == 0:
            self._rollouts.mark_trained()
        return control

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        self._rollouts.mark_trained()  # a saved model has trained every group served
        folder = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
        self._rollouts.save(folder)
        return control
