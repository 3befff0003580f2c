"""Trainer steps cut from a stream of group records by a budget of samples or of tokens.

Why here and not in the trainer: a step's contents must be the same on every replay, so the
cut is decided from the records alone, in their order (the admissions of a
:class:`~zephon.capture.streaming.StreamingCaptureSource`, after its group operators), and the
cut points travel with the pipeline checkpoint. Groups are never split (GRPO's advantages are
per group): a step closes with the group that brings it to its budget, so every step holds at
least its budget and overshoots by less than one group. A group a filter drops never reaches
the batcher; the next admitted groups fill its place, and
:meth:`zephon.capture.rl.PromptSource.backfill` draws new prompts so there are always more.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from zephon.capture.ledger import MemberRef
from zephon.errors import CheckpointError, ConfigError
from zephon.pipeline import Pipeline

__all__ = ["StepBatcher", "StepBudget", "TrainStep"]

STATE_VERSION = 1


@dataclass(frozen=True, slots=True)
class StepBudget:
    """What one trainer step holds at least: ``samples`` trajectories or ``tokens`` tokens
    (the members' ``input_ids``); give exactly one."""

    samples: int | None = None
    tokens: int | None = None

    def __post_init__(self) -> None:
        if (self.samples is None) == (self.tokens is None):
            raise ConfigError(
                f"StepBudget(samples={self.samples!r}, tokens={self.tokens!r}): give exactly "
                "one of samples= or tokens="
            )
        name, value = ("samples", self.samples) if self.tokens is None else ("tokens", self.tokens)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"StepBudget {name} is {value!r}: use an int >= 1")

    def measure(self, group: Mapping[str, Any]) -> int:
        """What ``group`` costs of this budget."""
        members: Sequence[Mapping[str, Any]] = group["members"]
        if self.samples is not None:
            return len(members)
        return sum(len(m["input_ids"]) for m in members)

    @property
    def limit(self) -> int:
        value = self.tokens if self.samples is None else self.samples
        assert value is not None  # __post_init__ checked that one is given
        return value


@dataclass(frozen=True, slots=True)
class TrainStep:
    """One trainer step: its number, its groups (records, in order), and their samples and
    tokens; ``full`` is False only for the last step of a finite stream, short of its budget
    (train it, or filter its members with a reason such as ``end of pass``)."""

    step: int
    groups: tuple[Mapping[str, Any], ...]
    samples: int
    tokens: int
    full: bool = True

    def refs(self) -> list[MemberRef]:
        """``(position, index, attempt)`` of every member trained in this step, once each:
        mark them ``trained`` at :attr:`step` in one transaction."""
        out = {
            (g["position"], m["index"], m["attempt"]): None
            for g in self.groups
            for m in g["members"]
        }
        return list(out)


class StepBatcher:
    """Iterate ``pipeline`` (group records) as :class:`TrainStep` s of ``budget``.

    Checkpoint with :meth:`state_dict` after a step was trained (the pipeline's checkpoint at
    that step's last group and the next step number); a batcher built over a fresh pipeline
    and given that state yields exactly the steps the uninterrupted one would have.
    """

    def __init__(self, pipeline: Pipeline, budget: StepBudget, *, first_step: int = 0) -> None:
        if not isinstance(budget, StepBudget):
            raise ConfigError(f"StepBatcher budget is {budget!r}: use StepBudget(samples=...)")
        self.budget = budget
        self._pipeline = pipeline
        self._step = first_step
        self._state: dict[str, Any] = {
            "version": STATE_VERSION,
            "pipeline": None,
            "step": first_step,
        }

    def __iter__(self) -> Iterator[TrainStep]:
        groups: list[Mapping[str, Any]] = []
        filled = 0
        for item in self._pipeline:
            group = item.payload
            if not isinstance(group, Mapping) or "members" not in group:
                raise ConfigError(
                    f"StepBatcher reads group records (a StreamingCaptureSource pipeline), got "
                    f"{type(group).__name__}; remove .batch() and map() ops that reshape them"
                )
            groups.append(group)
            filled += self.budget.measure(group)
            if filled >= self.budget.limit:
                yield self._cut(groups, full=True)
                groups, filled = [], 0
        if groups:
            yield self._cut(groups, full=False)

    def _cut(self, groups: list[Mapping[str, Any]], *, full: bool) -> TrainStep:
        samples = sum(len(g["members"]) for g in groups)
        tokens = sum(len(m["input_ids"]) for g in groups for m in g["members"])
        step = TrainStep(self._step, tuple(groups), samples, tokens, full)
        self._step += 1
        self._state = {
            "version": STATE_VERSION,
            "pipeline": self._pipeline.checkpoint(),
            "step": self._step,
        }
        return step

    def state_dict(self) -> dict[str, Any]:
        """Where the last yielded step ended (resume after it)."""
        return dict(self._state)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume after the step ``state`` was taken at (before iterating)."""
        if state.get("version") != STATE_VERSION or not isinstance(state.get("step"), int):
            raise CheckpointError(
                f"StepBatcher cannot load state {dict(state)!r}: pass what state_dict() returned"
            )
        if state["pipeline"] is not None:
            self._pipeline.restore(state["pipeline"])
        self._step = int(state["step"])
        self._state = dict(state)
