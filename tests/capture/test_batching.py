"""Trainer steps by samples or tokens, and backfill from the prompt source: every step has its
budget and a stopped and restored run yields the uninterrupted run's steps."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest

from tests.capture._pg import pg_dsn, pg_url  # noqa: F401
from tests.capture._procs import store_url
from tests.capture._rl_loop import GROUP, PROMPTS, prompt_pipeline
from tests.capture._stream_fill import reward_of
from tests.capture._workload import make_entry
from zephon import Dataset, Pipeline, StaticMixtureWorkSource
from zephon.capture.batching import StepBatcher, StepBudget, TrainStep
from zephon.capture.group_ops import DropEqualRewards
from zephon.capture.ledger import PromptState
from zephon.capture.rl import PromptGroup, PromptSource
from zephon.capture.scores import RolloutScore
from zephon.capture.stores import open_store
from zephon.capture.streaming import StreamingCaptureSource
from zephon.errors import CheckpointError, ConfigError

JOIN_TIMEOUT_S = 240  # a loop takes a few seconds; generous for a loaded machine


def _groups() -> Pipeline:
    """Group records of 1-3 members whose members have 3-9 tokens each."""
    rows = [
        {
            "position": p,
            "members": [
                {"index": i, "attempt": 0, "input_ids": list(range(3 + (p * 5 + i) % 7))}
                for i in range(1 + p % 3)
            ],
        }
        for p in range(20)
    ]
    return Pipeline(StaticMixtureWorkSource([Dataset.from_records("groups", rows)], chunk_size=1))


def _key(step: TrainStep) -> tuple[int, list[int], int, int, bool]:
    return step.step, [g["position"] for g in step.groups], step.samples, step.tokens, step.full


@pytest.mark.parametrize("budget", [StepBudget(samples=4), StepBudget(tokens=25)])
def test_steps_hold_whole_groups_and_close_with_the_group_that_reaches_the_budget(
    budget: StepBudget,
) -> None:
    steps = list(StepBatcher(_groups(), budget, first_step=1))
    assert [s.step for s in steps] == list(range(1, len(steps) + 1))
    assert sorted(p for s in steps for g in s.groups for p in [g["position"]]) == list(range(20))
    for s in steps[:-1]:
        used = s.samples if budget.samples else s.tokens
        last = budget.measure(s.groups[-1])
        assert s.full and budget.limit <= used < budget.limit + last
    last = steps[-1]
    assert last.full == ((last.samples if budget.samples else last.tokens) >= budget.limit)
    refs = [(p, i, 0) for g in steps[0].groups for p in [g["position"]] for i in range(1 + p % 3)]
    assert steps[0].refs() == refs  # each member once, in group order


@pytest.mark.parametrize("budget", [StepBudget(samples=5), StepBudget(tokens=30)])
def test_stop_and_restore_after_any_step_equals_the_uninterrupted_steps(
    budget: StepBudget,
) -> None:
    whole = [_key(s) for s in StepBatcher(_groups(), budget)]
    for stop in range(1, len(whole)):
        batcher = StepBatcher(_groups(), budget)
        it = iter(batcher)
        head = [_key(next(it)) for _ in range(stop)]
        state = batcher.state_dict()
        restored = StepBatcher(_groups(), budget)
        restored.load_state_dict(state)
        assert head + [_key(s) for s in restored] == whole, stop


def test_bad_budgets_and_states_are_refused() -> None:
    for kwargs in ({}, {"samples": 4, "tokens": 9}, {"samples": 0}, {"tokens": True}):
        with pytest.raises(ConfigError, match="StepBudget"):
            StepBudget(**kwargs)
    with pytest.raises(ConfigError, match="use StepBudget"):
        StepBatcher(_groups(), 4)  # type: ignore[arg-type]
    with pytest.raises(CheckpointError, match="pass what state_dict"):
        StepBatcher(_groups(), StepBudget(samples=2)).load_state_dict({"step": 1})
    rows = Pipeline(StaticMixtureWorkSource([Dataset.from_records("rows", [{"x": 1}])]))
    with pytest.raises(ConfigError, match="StepBatcher reads group records"):
        list(StepBatcher(rows, StepBudget(samples=2)))


@pytest.mark.parametrize("kind", ["file", "sqlite", "postgres"])
def test_backfill_keeps_prompts_in_flight_and_replaces_filtered_and_trained_ones(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = store_url(kind, tmp_path, request)

    async def go() -> None:
        store = open_store(url)
        source = await PromptSource.open(store, "s", prompt_pipeline(), n=2)
        assert [g.position for g in await source.backfill(3)] == [0, 1, 2]
        assert await source.backfill(3) == []  # three in flight already
        await source.advance([(0, 0), (0, 1)], "filtered", reason="all rewards equal")
        assert [g.position for g in await source.backfill(3)] == [3]
        for to in ("captured", "scored"):
            await source.advance([(1, 0), (1, 1)], to)
        await source.advance([(1, 0), (1, 1)], "trained", step=0)
        assert [g.position for g in await source.backfill(4)] == [4, 5]
        reopened = await PromptSource.open(store, "s", prompt_pipeline(), n=2)
        again = await reopened.backfill(4)  # owed prompts first, re-issued; none new
        assert [(g.position, g.resumed) for g in again] == [(p, True) for p in (2, 3, 4, 5)]
        assert all(m.attempt == 1 for g in again for m in g.members)
        with pytest.raises(ConfigError, match="backfill in_flight is 0"):
            await reopened.backfill(0)
        await store.close()

    asyncio.run(go())


async def _roll(store: Any, stream: str, group: PromptGroup) -> None:
    """Generate (prompt lengths vary by prompt), capture and score every member."""
    i = group.payload["i"]
    for m in group.members:
        ref = [(group.position, m.index, m.attempt)]
        await store.put(make_entry(m.rollout_id, "call-0", prompt=4, gen=2 + i % 5))
        await store.advance(stream, ref, "captured")
        reward = reward_of(i, m.index)
        await store.put_score(RolloutScore(rollout_id=m.rollout_id, verifier="v", reward=reward))
        await store.advance(stream, ref, "scored")


def _generate(url: str, stream: str, in_flight: int, failures: list[BaseException]) -> None:
    """Keep ``in_flight`` prompts generating until the pipeline is exhausted."""

    async def go() -> None:
        store = open_store(url)
        source = await PromptSource.open(store, stream, prompt_pipeline(), n=GROUP)
        issued = 0
        while issued < PROMPTS:
            groups = await source.backfill(in_flight, weight_version=0)
            for group in groups:  # in issue order: groups complete in position order
                await _roll(store, stream, group)
            issued += len(groups)
            if not groups:
                await asyncio.sleep(0.01)  # poll: the trainer has not freed room yet
        await store.close()

    try:
        asyncio.run(go())
    except BaseException as exc:
        failures.append(exc)
        raise


def _train(
    url: str, stream: str, budget: StepBudget, stop: int | None, state: Any
) -> tuple[list[Any], Any]:
    """Train steps (marking each trained at its number) until the end or after ``stop``."""
    store = open_store(url)
    source = StreamingCaptureSource(
        store, stream, groups_per_step=2, max_staleness=1000, prompts=PROMPTS
    )
    batcher = StepBatcher(source.pipeline().add_op(DropEqualRewards(store)), budget)
    if state is not None:
        batcher.load_state_dict(state)
    seen = []
    for step in batcher:
        reason = "" if step.full else "end of pass"
        to = "trained" if step.full else "filtered"
        asyncio.run(store.advance(stream, step.refs(), to, step=step.step, reason=reason))
        seen.append(_key(step))
        if step.step == stop:
            break
    asyncio.run(store.close())
    return seen, batcher.state_dict()


def _run(url: str, stream: str, budget: StepBudget, stop: int | None) -> list[Any]:
    failures: list[BaseException] = []
    thread = threading.Thread(target=_generate, args=(url, stream, 3, failures))
    thread.start()
    steps, state = _train(url, stream, budget, stop, None)
    if stop is not None:
        steps += _train(url, stream, budget, None, state)[0]
    thread.join(JOIN_TIMEOUT_S)
    assert not thread.is_alive() and not failures
    return steps


@pytest.mark.parametrize("kind", ["file", "sqlite", "postgres"])
@pytest.mark.parametrize("budget", [StepBudget(samples=4), StepBudget(tokens=40)])
def test_a_loop_with_filters_and_backfill_fills_every_step_and_replays_after_a_stop(
    kind: str, budget: StepBudget, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = store_url(kind, tmp_path, request)
    whole = _run(url, "a", budget, None)
    assert all(full for *_, full in whole[:-1])
    if budget.samples:  # 16 groups of 2 have a signal: 8 steps of exactly 4 samples
        assert [samples for _, _, samples, _, _ in whole] == [4] * 8
    else:
        assert all(40 <= tokens < 40 + 2 * 10 for _, _, _, tokens, _ in whole[:-1])
    assert _run(url, "b", budget, stop=2) == whole  # stopped after step 2, restored, finished

    async def ledger_counts() -> dict[str, int]:
        store = open_store(url)
        ledger = await store.stream_ledger("b")
        await store.close()
        assert all(
            m.state is PromptState.TRAINED or m.reason in ("all rewards equal", "end of pass")
            for row in ledger.prompts
            for m in row.members
        )
        return ledger.counts()

    counts = asyncio.run(ledger_counts())
    assert counts["trained"] + counts["filtered"] == PROMPTS * GROUP
    assert counts["filtered"] >= 8 * GROUP  # every third prompt is all-equal
