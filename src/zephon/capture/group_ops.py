"""Group operators: deterministic pipeline operators over the groups a streaming source serves.

Why operators: a group's fate (dropped for lack of signal, trimmed to ``k`` members) must be
the same on every replay, so it is decided from the record alone (its members and rewards,
in member order), never from the clock. Each member left out is recorded ``filtered`` in the
prompt ledger with its reason, in one transaction per group; a replay repeats the same move,
which the ledger answers as a no-op. Add them with the builder methods
(``pipe.drop_equal_rewards(store)``, ``keep_per_prompt``, ``difficulty_pool``; also YAML
operator names) or ``pipe.add_op(DropEqualRewards(store))``.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from zephon.capture.dataset import run_sync
from zephon.capture.ledger import MemberRef
from zephon.capture.protocols import PromptLedger
from zephon.capture.store_handle import StoreHandle
from zephon.errors import ConfigError, DataError
from zephon.ops import Accumulator, BaseOp, CountingAccumulator, OpContext, OpTraits
from zephon.types import SampleRecord, StreamItem, record_tokens, tombstone_meta

__all__ = ["DifficultyPool", "DropEqualRewards", "KeepPerPrompt", "store_at"]

_MICRO_BATCH = 16
EQUAL_REASON = "all rewards equal"


def store_at(location: Any) -> Any:
    """A capture store, its URL, or a folder path (what a YAML file names, resolved against
    its folder): the URL of a file store there. The group operators and a YAML
    ``capture_stream`` source take any of these."""
    if isinstance(location, str) and "://" not in location:
        return Path(location).resolve().as_uri()
    return location


def _shape(payload: object) -> str:
    if isinstance(payload, Mapping):
        return "a record with fields " + ", ".join(sorted(map(str, payload))[:6])
    return f"a {type(payload).__name__}"


def _refs(group: Mapping[str, Any], members: Sequence[Mapping[str, Any]]) -> list[MemberRef]:
    """Each member's ``(position, index, attempt)`` once (a member may have several samples)."""
    refs = {(group["position"], m["index"], m["attempt"]): None for m in members}
    return list(refs)


class _GroupOp(BaseOp):
    """An element-wise operator on group records that files its drops in the ledger."""

    config_exclude = ("store",)  # where drops are filed, not what is kept

    def __init__(self, store: Any, *, name: str | None = None) -> None:
        super().__init__(name=name)
        store = store_at(store)
        if isinstance(store, str):
            self._handle = StoreHandle(url=store)
            store = self._handle.get()
        else:
            self._handle = StoreHandle(store=store)
        self._handle.close()  # checked; the copies that run reopen it (and close it)
        if not isinstance(store, PromptLedger):
            raise ConfigError(
                f"{self.name}: store is a {type(store).__name__}, not a capture store keeping "
                "prompt ledgers; pass open_store(url) or the URL"
            )

    @property
    def store(self) -> Any:
        """The store the drops are filed in (a worker process opens its own from the URL)."""
        return self._handle.get()

    def teardown(self) -> None:
        """Close the client opened from the URL (the next run reopens it)."""
        self._handle.close()

    def __deepcopy__(self, memo: dict[int, Any]) -> _GroupOp:
        """Worker copies share the store (its connection and locks); the op keeps no state."""
        return copy.copy(self)

    def accumulator(self, *, deterministic: bool, ctx: OpContext) -> Accumulator:
        return CountingAccumulator(_MICRO_BATCH, None)

    def traits(self) -> OpTraits:
        return OpTraits(preserves_cursor_order=True, parallelism=1, elementwise=True)

    def decide(self, group: Mapping[str, Any]) -> tuple[dict[str, Any] | None, str, list[Any]]:
        """``(kept record or None, reason, members left out)`` for one group."""
        raise NotImplementedError

    def process_many(self, elems: list[StreamItem]) -> list[StreamItem]:
        out: list[StreamItem] = []
        for elem in elems:
            group = elem.payload
            if not isinstance(group, Mapping) or not {"stream", "position", "members"} <= set(
                group
            ):
                raise DataError(
                    f"{self.name} reads the group records of a StreamingCaptureSource (stream, "
                    f"position, members), got {_shape(group)}; put it right after the source"
                )
            kept, reason, dropped = self.decide(group)
            if dropped:
                refs = _refs(group, dropped)
                run_sync(self.store.advance(group["stream"], refs, "filtered", reason=reason))
            if kept is None:
                meta = tombstone_meta(elem.meta, reason=reason, tokens=record_tokens(elem))
                out.append(SampleRecord(meta, None))
            else:
                out.append(SampleRecord(elem.meta, kept))
        return out


class DropEqualRewards(_GroupOp):
    """Drops a group whose rewards are all equal (no learning signal); its members are
    filtered with the reason ``all rewards equal``."""

    name = "drop_equal_rewards"

    def config(self) -> Mapping[str, Any]:
        return {}

    def decide(self, group: Mapping[str, Any]) -> tuple[dict[str, Any] | None, str, list[Any]]:
        members = list(group["members"])
        if len({m["reward"] for m in members}) > 1:
            return dict(group), "", []
        return None, EQUAL_REASON, members


class KeepPerPrompt(_GroupOp):
    """Keeps the first ``k`` members of each group (by member index); the others are filtered
    with the reason ``keep K per prompt``."""

    name = "keep_per_prompt"

    def __init__(self, store: Any, k: int, *, name: str | None = None) -> None:
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ConfigError(f"KeepPerPrompt k is {k!r}: keep at least 1 member per prompt")
        super().__init__(store, name=name)
        self.k = k

    def config(self) -> Mapping[str, Any]:
        return {"k": self.k}

    def decide(self, group: Mapping[str, Any]) -> tuple[dict[str, Any] | None, str, list[Any]]:
        members = list(group["members"])
        keep = sorted({m["index"] for m in members})[: self.k]
        dropped = [m for m in members if m["index"] not in keep]
        kept = [m for m in members if m["index"] in keep]
        return {**group, "members": kept}, f"keep {self.k} per prompt", dropped


def _bound(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ConfigError(f"DifficultyPool {name} is {value!r}: use a finite number (a reward)")
    return float(value)


class DifficultyPool(_GroupOp):
    """Keeps a group whose mean reward lies in ``[low, high]`` (bounds included): with 0/1
    rewards, its pass rate, so ``DifficultyPool(store, 0.2, 0.8)`` keeps the prompts neither
    solved nor failed by (nearly) every member. The members of a group outside the band are
    filtered with the reason ``mean reward M outside [LOW, HIGH]``."""

    name = "difficulty_pool"

    def __init__(self, store: Any, low: float, high: float, *, name: str | None = None) -> None:
        self.low, self.high = _bound("low", low), _bound("high", high)
        if self.low > self.high:
            raise ConfigError(f"DifficultyPool low {low!r} is above high {high!r}: swap them")
        super().__init__(store, name=name)

    def config(self) -> Mapping[str, Any]:
        return {"low": self.low, "high": self.high}

    def decide(self, group: Mapping[str, Any]) -> tuple[dict[str, Any] | None, str, list[Any]]:
        members = list(group["members"])
        rewards = []
        for m in members:
            if m["reward"] is None:
                raise DataError(
                    f"DifficultyPool: stream {group['stream']!r} position {group['position']} "
                    f"member {m['index']} has no reward; score it (put_score) or pick the "
                    "verifier with StreamingCaptureSource(verifier=...)"
                )
            rewards.append(float(m["reward"]))
        mean = math.fsum(rewards) / len(rewards) if rewards else math.nan
        if self.low <= mean <= self.high:
            return dict(group), "", []
        reason = f"mean reward {mean:.6g} outside [{self.low:g}, {self.high:g}]"
        return None, reason, members
