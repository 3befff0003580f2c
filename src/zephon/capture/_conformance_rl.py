"""Conformance checks of the RL data plane: the prompt ledger and rollout scores.

Why black-box checks: a user's store must keep "every prompt trained exactly once" as ours
does, so each clause of :mod:`zephon.capture.ledger` (no skipped state, no second training,
idempotent retries, all-or-none batches, positions without gaps) and of scores (finite values,
one score per verifier, fenced after retirement) is exercised across fresh clients. A store
without the methods is skipped with a warning. Registered by :mod:`._conformance_checks`.
"""

from __future__ import annotations

import math
from typing import Any

import msgspec

from zephon.capture._conformance_kit import _check, _Ctx, _entry
from zephon.capture.ledger import LedgerTransitionError, PromptState, StreamLedger
from zephon.capture.protocols import RolloutRetiredError, TokenCaptureRetiredError
from zephon.capture.scores import RolloutScore

__all__: list[str] = []

_NO_LEDGER = "the store keeps no prompt ledger: an RL trainer cannot resume exactly once"
_NO_SCORES = "the store keeps no scores: rewards are lost with the trainer"


async def _ledger(ctx: _Ctx) -> Any:
    return await ctx.optional("source", "issue_prompt", _NO_LEDGER)


async def _read(ctx: _Ctx, stream: str) -> StreamLedger:
    ledger: StreamLedger = await (await _ledger(ctx)).stream_ledger(stream)
    return ledger


async def _state(ctx: _Ctx, stream: str, position: int, member: int) -> PromptState:
    return (await _read(ctx, stream)).member((position, member)).state


@_check
async def _check_prompt_ledger_issue(ctx: _Ctx) -> None:
    stream = ctx.rid()
    a = await _ledger(ctx)
    row = await a.issue_prompt(
        stream, 0, prompt_key="k0", payload={"q": "2+2"}, n=2, cursor={"c": 1}
    )
    again = await (await _ledger(ctx)).issue_prompt(
        stream, 0, prompt_key="k0", payload={"q": "2+2"}, n=2
    )
    ctx.require(again == row, f"an identical re-issue answered {again}, not {row}")
    b = await _ledger(ctx)
    await ctx.raises(
        b.issue_prompt(stream, 0, prompt_key="other", payload={}, n=2),
        LedgerTransitionError,
        "issue of another prompt at a taken position",
    )
    await ctx.raises(
        b.issue_prompt(stream, 2, prompt_key="k2", payload={}, n=1),
        LedgerTransitionError,
        "issue that leaves a gap",
    )
    ledger = await _read(ctx, stream)
    ctx.require(
        ledger.next_position == 1 and ledger.cursor == {"c": 1},
        f"a fresh client reads next_position {ledger.next_position}, cursor {ledger.cursor}",
    )
    ids = [m.rollout_id for m in ledger.prompts[0].members]
    ctx.require(len(set(ids)) == 2, f"the two members share rollout ids {ids}")


@_check
async def _check_prompt_ledger_transitions(ctx: _Ctx) -> None:
    stream = ctx.rid()
    led = await _ledger(ctx)
    await led.issue_prompt(stream, 0, prompt_key="k0", payload=1, n=2)
    await led.issue_prompt(stream, 1, prompt_key="k1", payload=2, n=1)
    fresh = await _ledger(ctx)
    ctx.require(await fresh.advance(stream, [(0, 0)], "captured"), "the first move said False")
    ctx.require(
        not await (await _ledger(ctx)).advance(stream, [(0, 0)], "captured"),
        "repeating a move did not answer False",
    )
    await ctx.raises(
        (await _ledger(ctx)).advance(stream, [(0, 1)], "scored"),
        LedgerTransitionError,
        "issued -> scored (a skipped state)",
    )
    await ctx.raises(
        (await _ledger(ctx)).advance(stream, [(0, 0), (0, 1)], "scored"),
        LedgerTransitionError,
        "a batch where one member would skip a state",
    )
    got = await _state(ctx, stream, 0, 0)
    ctx.require(got is PromptState.CAPTURED, f"a refused batch still moved a member to {got}")
    await (await _ledger(ctx)).advance(stream, [(0, 0)], "scored")
    await (await _ledger(ctx)).advance(stream, [(0, 0)], "trained", step=5)
    await (await _ledger(ctx)).advance(stream, [(0, 0)], "trained", step=5)
    await ctx.raises(
        (await _ledger(ctx)).advance(stream, [(0, 0)], "trained", step=6),
        LedgerTransitionError,
        "a second training of one member",
    )
    await ctx.raises(
        (await _ledger(ctx)).advance(stream, [(0, 0)], "filtered", reason="late"),
        LedgerTransitionError,
        "filtering a trained member",
    )
    ledger = await _read(ctx, stream)
    m = ledger.member((0, 0))
    ctx.require(
        (m.state, m.step) == (PromptState.TRAINED, 5), f"a fresh client reads {m.state} {m.step}"
    )
    ctx.require(ledger.trained_after(4) == {5: [(0, 0)]}, f"trained_after(4) is wrong: {ledger}")


@_check
async def _check_prompt_ledger_filtered(ctx: _Ctx) -> None:
    stream = ctx.rid()
    led = await _ledger(ctx)
    await led.issue_prompt(stream, 0, prompt_key="k0", payload=None, n=2)
    await (await _ledger(ctx)).advance(stream, [(0, 0), (0, 1)], "filtered", reason="equal")
    ctx.require(
        not await (await _ledger(ctx)).advance(stream, [(0, 0)], "filtered", reason="equal"),
        "repeating a filter did not answer False",
    )
    for to, kw in (("filtered", {"reason": "other"}), ("captured", {}), ("trained", {"step": 1})):
        await ctx.raises(
            (await _ledger(ctx)).advance(stream, [(0, 1)], to, **kw),
            LedgerTransitionError,
            f"a filtered member moved to {to} {kw}",
        )
    ledger = await _read(ctx, stream)
    ctx.require(not ledger.pending(), f"a fully filtered prompt is still pending: {ledger}")
    ctx.require(ledger.member((0, 1)).reason == "equal", "the filter reason was not kept")


@_check
async def _check_prompt_ledger_reissue(ctx: _Ctx) -> None:
    stream = ctx.rid()
    led = await _ledger(ctx)
    row = await led.issue_prompt(stream, 0, prompt_key="k0", payload=None, n=1)
    first = await (await _ledger(ctx)).reissue(stream, (0, 0), 1)
    again = await (await _ledger(ctx)).reissue(stream, (0, 0), 1)
    ctx.require(first == again, "repeating a re-issue changed the member")
    ctx.require(
        first.rollout_id != row.members[0].rollout_id and first.attempt == 1,
        f"a re-issue kept rollout id {first.rollout_id} (attempt {first.attempt})",
    )
    await ctx.raises(
        (await _ledger(ctx)).reissue(stream, (0, 0), 3),
        LedgerTransitionError,
        "a re-issue that skips an attempt",
    )
    await ctx.raises(
        (await _ledger(ctx)).advance(stream, [(0, 0, 0)], "captured"),
        LedgerTransitionError,
        "a move by the worker of the re-issued attempt 0",
    )
    await (await _ledger(ctx)).advance(stream, [(0, 0, 1)], "captured")
    await ctx.raises(
        (await _ledger(ctx)).reissue(stream, (0, 0), 2),
        LedgerTransitionError,
        "a re-issue of a captured member",
    )


@_check
async def _check_rollout_scores(ctx: _Ctx) -> None:
    rid = ctx.rid()
    store = await ctx.optional("sink", "put_score", _NO_SCORES)
    score = RolloutScore(rollout_id=rid, verifier="math", reward=1.0, details={"len": 3})
    await ctx.raises(store.put_score(score), ValueError, "a score of a rollout without entries")
    await store.put(_entry(rid, "c1"))
    await store.put_score(score)
    await (await ctx.sink()).put_score(score)  # identical: a no-op
    other = RolloutScore(rollout_id=rid, verifier="math", reward=0.0)
    await ctx.raises(
        (await ctx.sink()).put_score(other), ValueError, "a different score by one verifier"
    )
    for bad in (math.nan, math.inf):
        poisoned = RolloutScore(rollout_id=rid, verifier="nan", reward=0.0)
        msgspec.structs.force_setattr(poisoned, "reward", bad)
        await ctx.raises((await ctx.sink()).put_score(poisoned), ValueError, f"reward {bad}")
    second = RolloutScore(rollout_id=rid, verifier="format", reward=-0.5)
    await (await ctx.sink()).put_score(second)
    got = await (await ctx.source()).scores(rid)
    ctx.require(got == [second, score], f"a fresh client reads {got}")
    await (await ctx.source()).retire([rid])
    await ctx.raises(
        (await ctx.source()).scores(rid), RolloutRetiredError, "reading a retired rollout's scores"
    )
    await ctx.raises(
        (await ctx.sink()).put_score(score), TokenCaptureRetiredError, "a score after retire"
    )
