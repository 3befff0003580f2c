"""A GRPO-shaped trainer and rollout loop in one process, for the SIGKILL tests of the ledger.

``python -m tests.capture._rl_loop URL WORKDIR KILL`` runs the loop over the prompts of
:func:`prompt_pipeline`: each group member's rollout is "generated" (one entry put under its
rollout id), scored, and every two scored groups are one trainer step, marked ``trained`` in
one transaction BEFORE the model file (``WORKDIR/model.json``: step and trained members) is
replaced durably; the groups of a step are what the ledger admits (``StreamLedger.admit``,
oldest first, staleness bound ``MAX_STALENESS``). Groups whose rewards are all equal are
filtered. The process sends itself a
real SIGKILL just before its ``KILL``-th durable operation (``N``), or before the ``N``-th
operation of one kind (``save:N``: between marking a step trained and saving the model), so
every gap between two operations is a crash point. It prints ``op KIND`` as each operation
starts (a parent may kill it after any of them, landing inside a store write) and ``done``
after the last prompt.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from tests.capture._workload import make_entry
from zephon import Dataset, MixtureSpec, Pipeline, StaticMixtureWorkSource
from zephon.capture.ledger import PromptState
from zephon.capture.rl import PromptGroup, PromptSource
from zephon.capture.scores import RolloutScore
from zephon.capture.stores import open_store

__all__ = ["GROUP", "MAX_STALENESS", "PROMPTS", "STREAM", "equal_rewards", "prompt_pipeline"]

PROMPTS = 24
GROUP = 2
STREAM = "grpo"
MAX_STALENESS = 2
_KILL: list[tuple[str, int]] = [("", 0)]  # (kind or "" for any, N)
_COUNTS: Counter[str] = Counter()


def prompt_pipeline() -> Pipeline:
    rows = [{"i": i, "prompt": f"what is {i} + {i}?"} for i in range(PROMPTS)]
    source = StaticMixtureWorkSource(
        datasets=[Dataset.from_records("prompts", rows)],
        mixture=MixtureSpec({"prompts": 1.0}),
        chunk_size=4,
        seed=0,
    )
    return Pipeline(source).shuffle(8, seed=1)


def equal_rewards(i: int) -> bool:
    """Every fourth prompt's group is all-equal (filtered: no learning signal)."""
    return i % 4 == 0


def _tick(kind: str) -> None:
    """Count one operation of ``kind`` (and one of any kind); SIGKILL this process on the
    planned one."""
    label, at = _KILL[0]
    _COUNTS.update(("", kind))
    if _COUNTS[label] == at:
        os.kill(os.getpid(), signal.SIGKILL)
    print("op", kind, flush=True)  # the parent may SIGKILL us after any of these lines


def _save(path: Path, model: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as f:
        json.dump(model, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


async def _roll(store: Any, source: PromptSource, group: PromptGroup) -> None:
    """Generate and score the members that need it."""
    for m in group.members:
        if m.state is PromptState.ISSUED:
            _tick("put")
            await store.put(make_entry(m.rollout_id, "call-0", prompt=8, gen=4))
            _tick("captured")
            await source.advance([(group.position, m.index, m.attempt)], "captured")
        if m.state in (PromptState.ISSUED, PromptState.CAPTURED):
            i = group.payload["i"]
            reward = 1.0 if equal_rewards(i) else float(m.index)
            _tick("score")
            await store.put_score(
                RolloutScore(rollout_id=m.rollout_id, verifier="sum", reward=reward)
            )
            _tick("scored")
            await source.advance([(group.position, m.index, m.attempt)], "scored")


async def _train(source: PromptSource, path: Path, model: dict[str, Any], batch: list[Any]) -> None:
    step = model["step"] + 1
    _tick("trained")
    await source.advance(batch, "trained", step=step)
    model["step"] = step
    model["trained"].extend([list(ref[:2]) for ref in batch])
    _tick("save")
    _save(path, model)


async def _train_admitted(
    store: Any, source: PromptSource, path: Path, model: dict[str, Any], *, full_only: bool
) -> None:
    """Train what the durable ledger admits, oldest first, two groups a step (a batch is
    derived from the ledger, never from memory, so a restart admits the same groups)."""
    while True:
        ledger = await store.stream_ledger(STREAM)
        admitted = ledger.admit(model["step"], max_staleness=MAX_STALENESS, limit=2)
        if admitted.wait_for is not None:
            raise AssertionError(f"a sequential loop never waits: {admitted.wait_for}")
        if not admitted.groups or (full_only and len(admitted.groups) < 2):
            return
        await _train(source, path, model, admitted.refs())


async def run(url: str, workdir: Path) -> None:
    path = workdir / "model.json"
    model = json.loads(path.read_text()) if path.exists() else {"step": 0, "trained": []}
    store = open_store(url)
    try:
        source = await PromptSource.open(store, STREAM, prompt_pipeline(), n=GROUP)
        for step, refs in source.ledger.trained_after(model["step"]).items():
            model["step"] = step  # the ledger says this step was taken: redo it exactly
            model["trained"].extend([list(ref) for ref in refs])
            _tick("replay")
            _save(path, model)
        while (group := await source.next_group(weight_version=model["step"])) is not None:
            await _roll(store, source, group)
            if equal_rewards(group.payload["i"]):
                _tick("filter")
                await source.advance(group.refs(), "filtered", reason="all rewards equal")
                continue
            await _train_admitted(store, source, path, model, full_only=True)
        await _train_admitted(store, source, path, model, full_only=False)
    finally:
        await store.close()
    print("done", flush=True)


if __name__ == "__main__":
    label, _, at = sys.argv[3].rpartition(":")
    _KILL[0] = (label, int(at))
    asyncio.run(run(sys.argv[1], Path(sys.argv[2])))
