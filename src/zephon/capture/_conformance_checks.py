"""The conformance checks, registered in run order into ``CHECKS``.

Each check gets a fresh :class:`~zephon.capture._conformance_kit._Ctx`; every client it asks for
is new, over the shared backend, and rollout ids are unique to the check.
"""

from __future__ import annotations

import asyncio
import contextlib
import math

from zephon.capture._conformance_kit import (
    CHECKS,
    ConformanceError,
    _by_call,
    _check,
    _Ctx,
    _entry,
    _freeze,
    _require_fenced,
    _Skip,
    _wire,
    sample_commit,
)
from zephon.capture._conformance_put_rules import PUT_RULES
from zephon.capture.protocols import (
    CaptureAdmissionRefused,
    RolloutRetiredError,
    TokenCaptureFrozenError,
    TokenCaptureRetiredError,
)
from zephon.capture.records import (
    CaptureLedgerCommit,
    ParentResolutionStatus,
    TokenEntry,
    canonical_json,
    compute_digest,
)

__all__ = ["CHECKS", "NEEDS"]


@_check
async def _check_put_then_freeze_visibility(ctx: _Ctx) -> None:
    rid = ctx.rid()
    entry = _entry(rid, "c1")
    await (await ctx.sink()).put(entry)
    snap = await _freeze(ctx, rid)
    ctx.require(
        _by_call(snap) == {"c1": _wire(entry)}, f"snapshot entries differ: {_by_call(snap)}"
    )
    ctx.require(not snap.incomplete, "a clean rollout was reported incomplete")
    ctx.require(bool(snap.snapshot_id), "empty snapshot_id")
    ctx.require(isinstance(snap.version, int), f"version {snap.version!r} is not an int")
    ctx.require(not tuple(getattr(snap, "engine_refusals", ())), "unexpected engine_refusals")


@_check
async def _check_non_finite_log_probs_refused(ctx: _Ctx) -> None:
    rid = ctx.rid()
    bad = _entry(rid, "c1").with_changes(generation_log_probs=[-0.1, math.nan])
    exc = await ctx.raises((await ctx.sink()).put(bad), ValueError, "put of a NaN log-prob")
    ctx.require("generation_log_probs" in str(exc), f"the error does not name the field: {exc}")
    good = _entry(rid, "c2")
    await (await ctx.sink()).put(good)
    snap = await _freeze(ctx, rid)
    ctx.require(_by_call(snap) == {"c2": _wire(good)}, "unreadable after the refused put")


for _rule in PUT_RULES:  # integer ids, id range, lengths, holdable call ids
    _check(_rule)


@_check
async def _check_idempotent_reput(ctx: _Ctx) -> None:
    once, twice = ctx.rid("-once"), ctx.rid("-twice")
    await (await ctx.sink()).put(_entry(once, "c1"))
    entry = _entry(twice, "c1")
    await (await ctx.sink()).put(entry)
    await (await ctx.sink()).put(TokenEntry.from_json(entry.canonical_bytes()))
    s1, s2 = await _freeze(ctx, once), await _freeze(ctx, twice)
    ctx.require(len(s2.entries) == 1, f"identical retry stored {len(s2.entries)} entries")
    ctx.require(not s2.incomplete, "identical retry marked the rollout incomplete")
    ctx.require(
        s1.version == s2.version,
        f"identical retry moved the version ({s1.version} -> {s2.version})",
    )


async def _conflict(ctx: _Ctx, changed: TokenEntry, first: TokenEntry) -> None:
    await (await ctx.sink()).put(first)
    with contextlib.suppress(Exception):  # raising is allowed; the poison is what counts
        await (await ctx.sink()).put(changed)
    snap = await _freeze(ctx, first.rollout_id)
    ctx.require(snap.incomplete, "a conflicting re-put did not poison the rollout (incomplete)")
    ctx.require(
        _by_call(snap).get("c1") in (None, _wire(first)),
        "a conflicting re-put replaced the first payload",
    )


@_check
async def _check_conflicting_reput(ctx: _Ctx) -> None:
    rid = ctx.rid()
    await _conflict(ctx, _entry(rid, "c1", gen=(13, 99)), _entry(rid, "c1"))


@_check
async def _check_rebuilt_entry_conflict(ctx: _Ctx) -> None:
    rid = ctx.rid()
    await _conflict(ctx, _entry(rid, "c1", created_at=1_700_000_001.0), _entry(rid, "c1"))


@_check
async def _check_mark_incomplete_before_freeze(ctx: _Ctx) -> None:
    rid = ctx.rid()
    await (await ctx.sink()).put(_entry(rid, "c1"))
    await (await ctx.sink()).mark_incomplete(rid, "c2")
    snap = await _freeze(ctx, rid)
    ctx.require(snap.incomplete, "mark_incomplete before freeze is not visible to a fresh source")
    ctx.require(set(_by_call(snap)) == {"c1"}, "mark_incomplete changed the entries")


@_check
async def _check_mark_incomplete_durability(ctx: _Ctx) -> None:
    rid = ctx.rid()
    await (await ctx.sink()).put(_entry(rid, "c1"))
    s1 = await _freeze(ctx, rid)
    await (await ctx.sink()).mark_incomplete(rid, "c2")
    s2 = await _freeze(ctx, rid)
    ctx.require(s2.incomplete, "mark_incomplete after freeze is not visible to a fresh source")
    ctx.require(s2.version != s1.version, "mark_incomplete after freeze did not move the version")
    ok = await (await ctx.source()).drop(rid, snapshot_id=s1.snapshot_id, version=s1.version)
    ctx.require(ok is False, "the stale snapshot was still retirable after mark_incomplete")
    s3 = await _freeze(ctx, rid)
    ctx.require("c1" in _by_call(s3), "a failed drop destroyed the evidence")


@_check
async def _check_freeze_idempotency(ctx: _Ctx) -> None:
    rid = ctx.rid()
    await (await ctx.sink()).put(_entry(rid, "c1"))
    s1, s2 = await _freeze(ctx, rid), await _freeze(ctx, rid)
    ctx.require(s1.snapshot_id == s2.snapshot_id, "snapshot_id changed on re-freeze")
    ctx.require(
        s1.version == s2.version, f"version changed on re-freeze ({s1.version}->{s2.version})"
    )
    ctx.require(_by_call(s1) == _by_call(s2), "entries changed on re-freeze")
    ctx.require(s1.incomplete == s2.incomplete, "incomplete changed on re-freeze")


@_check
async def _check_post_freeze_write_safety(ctx: _Ctx) -> None:
    rid = ctx.rid()
    entry = _entry(rid, "c1")
    await (await ctx.sink()).put(entry)
    s1 = await _freeze(ctx, rid)
    sink = await ctx.sink()
    await ctx.raises(
        sink.put(_entry(rid, "c2")), TokenCaptureFrozenError, "put of a new call after freeze"
    )
    await ctx.raises(sink.put(entry), TokenCaptureFrozenError, "identical re-put after freeze")
    s2 = await _freeze(ctx, rid)
    ctx.require(
        (s2.snapshot_id, s2.version) == (s1.snapshot_id, s1.version),
        "a refused write changed the snapshot",
    )
    ctx.require(set(_by_call(s2)) == {"c1"}, "a refused late write became visible")
    ok = await (await ctx.source()).drop(rid, snapshot_id=s1.snapshot_id, version=s1.version)
    ctx.require(ok is True, "the consumed snapshot could not be retired after a refused late write")


@_check
async def _check_conditional_retirement(ctx: _Ctx) -> None:
    rid = ctx.rid()
    await (await ctx.sink()).put(_entry(rid, "c1"))
    s1 = await _freeze(ctx, rid)
    src = await ctx.source()
    ctx.require(
        await src.drop(rid, snapshot_id=s1.snapshot_id, version=s1.version + 1) is False,
        "drop with a stale version succeeded",
    )
    ctx.require(
        await src.drop(rid, snapshot_id=s1.snapshot_id + "x", version=s1.version) is False,
        "drop with another snapshot_id succeeded",
    )
    ctx.require("c1" in _by_call(await _freeze(ctx, rid)), "a failed drop destroyed the evidence")
    src = await ctx.source()
    ctx.require(
        await src.drop(rid, snapshot_id=s1.snapshot_id, version=s1.version) is True,
        "drop of the exact consumed snapshot failed",
    )
    ctx.require(
        await (await ctx.source()).drop(rid, snapshot_id=s1.snapshot_id, version=s1.version)
        is True,
        "a repeated identical drop did not return True",
    )
    await _require_fenced(ctx, rid, "drop")


@_check
async def _check_unconditional_retirement(ctx: _Ctx) -> None:
    rid, frozen = ctx.rid(), ctx.rid("-frozen")
    await (await ctx.sink()).put(_entry(rid, "c1"))
    src = await ctx.source()
    await ctx.raises(
        src.retire([rid, "not/a valid id"]), ValueError, "retire of a batch with an invalid key"
    )
    await (await ctx.sink()).put(_entry(rid, "c2"))  # the valid key was not retired
    removal = await (await ctx.source()).retire([rid, rid])
    ctx.require(list(removal.capture_keys) == [rid], f"retire did not dedupe its keys: {removal}")
    ctx.require(list(removal.changed) == [rid], f"retire did not report the change: {removal}")
    await _require_fenced(ctx, rid, "retire")
    await ctx.raises(_freeze(ctx, rid), RolloutRetiredError, "freeze of a retired rollout")
    again = await (await ctx.source()).retire(rid)
    ctx.require(not again.changed, f"a second retire changed state: {again}")
    await (await ctx.sink()).put(_entry(frozen, "c1"))
    await _freeze(ctx, frozen)
    await (await ctx.source()).retire([frozen])
    await _require_fenced(ctx, frozen, "retire of a frozen rollout")


@_check
async def _check_delete_clears_retirement(ctx: _Ctx) -> None:
    rid = ctx.rid()
    await (await ctx.sink()).put(_entry(rid, "c1"))
    await (await ctx.sink()).mark_incomplete(rid, "c1")
    await (await ctx.source()).retire([rid])
    removal = await (await ctx.source()).delete([rid])
    ctx.require(list(removal.changed) == [rid], f"delete did not report the change: {removal}")
    await (await ctx.sink()).put(_entry(rid, "c2"))
    snap = await _freeze(ctx, rid)
    ctx.require(
        set(_by_call(snap)) == {"c2"}, f"after delete the rollout holds {set(_by_call(snap))}"
    )
    ctx.require(not snap.incomplete, "delete kept the old incomplete flag")
    await (await ctx.source()).delete(rid)
    again = await (await ctx.source()).delete(rid)
    ctx.require(not again.changed, f"deleting again changed state: {again}")
    snap = await _freeze(ctx, rid)
    ctx.require(not snap.entries, "delete did not remove the records")


@_check
async def _check_begin_call_custody(ctx: _Ctx) -> None:
    rid, ok_rid = ctx.rid(), ctx.rid("-settled")
    sink = await ctx.optional("sink", "begin_call", "a lost final call would go unnoticed")
    await sink.begin_call(rid, "c1")
    ctx.require((await _freeze(ctx, rid)).incomplete, "a dangling intent did not mask the rollout")
    await (await ctx.sink()).begin_call(ok_rid, "c1")
    await (await ctx.sink()).put(_entry(ok_rid, "c1"))
    ctx.require(not (await _freeze(ctx, ok_rid)).incomplete, "a settled intent masked the rollout")


@_check
async def _check_begin_call_fenced(ctx: _Ctx) -> None:
    rid = ctx.rid()
    sink = await ctx.optional(
        "sink", "begin_call", "late calls could not be refused before dispatch"
    )
    await _freeze(ctx, rid)
    await ctx.raises(sink.begin_call(rid, "c1"), TokenCaptureFrozenError, "begin_call after freeze")
    await (await ctx.source()).retire(rid)
    await ctx.raises(
        (await ctx.sink()).begin_call(rid, "c2"),
        TokenCaptureRetiredError,
        "begin_call after retire",
    )


@_check
async def _check_engine_refusal_resolution(ctx: _Ctx) -> None:
    rid = ctx.rid()
    sink = await ctx.optional(
        "sink",
        "record_engine_refusal",
        "a refused call leaves its intent dangling and masks the rollout",
    )
    await sink.put(_entry(rid, "c0"))
    has_intents = callable(getattr(sink, "begin_call", None))
    if has_intents:
        await sink.begin_call(rid, "c1")
    await sink.record_engine_refusal(
        rid, model_call_id="c1", code="context_length", parent_resolution="root"
    )
    if has_intents:
        await (await ctx.sink()).begin_call(rid, "c2")
    await (await ctx.sink()).record_engine_refusal(
        rid, model_call_id="c2", code="refused", parent_call_id="c0", parent_resolution="resolved"
    )
    snap = await _freeze(ctx, rid)
    ctx.require(not snap.incomplete, "an engine refusal did not settle its intent")
    got = [
        (r.model_call_id, r.code, r.parent_call_id, str(r.parent_resolution))
        for r in snap.engine_refusals
    ]
    want = [("c1", "context_length", None, "root"), ("c2", "refused", "c0", "resolved")]
    ctx.require(got == want, f"engine_refusals {got} != {want} (recorded order)")
    ctx.require(set(_by_call(snap)) == {"c0"}, "an engine refusal created an entry")


@_check
async def _check_engine_refusal_after_freeze(ctx: _Ctx) -> None:
    rid = ctx.rid()
    sink = await ctx.optional("sink", "record_engine_refusal", "late refusals cannot be checked")
    await sink.put(_entry(rid, "c0"))
    s1 = await _freeze(ctx, rid)
    try:
        await (await ctx.sink()).record_engine_refusal(rid, model_call_id="c1", code="late")
    except TokenCaptureFrozenError:
        pass
    except Exception as exc:
        ctx.require(False, f"late refusal raised {type(exc).__name__}, not TokenCaptureFrozenError")
    s2 = await _freeze(ctx, rid)
    ctx.require(
        (s2.version, tuple(s2.engine_refusals)) == (s1.version, tuple(s1.engine_refusals)),
        "a late engine refusal changed the frozen snapshot",
    )
    ctx.require(
        await (await ctx.source()).drop(rid, snapshot_id=s1.snapshot_id, version=s1.version)
        is True,
        "a late engine refusal staled the consumed snapshot",
    )
    await ctx.raises(
        (await ctx.sink()).record_engine_refusal(rid, model_call_id="c2", code="late"),
        TokenCaptureRetiredError,
        "engine refusal after retire",
    )


@_check
async def _check_freeze_unknown_rollout(ctx: _Ctx) -> None:
    snap = await _freeze(ctx, ctx.rid())
    ctx.require(not snap.entries, "a never-written rollout froze with entries")
    ctx.require(bool(snap.snapshot_id), "empty snapshot_id for a never-written rollout")


@_check
async def _check_close_idempotency(ctx: _Ctx) -> None:
    for client in (await ctx.sink(), await ctx.source()):
        await client.close()
        await client.close()


@_check
async def _check_concurrent_clients(ctx: _Ctx) -> None:
    rid, race, clash = ctx.rid(), ctx.rid("-race"), ctx.rid("-clash")
    a, b = await ctx.sink(), await ctx.sink()
    shared = _entry(rid, "shared")
    await asyncio.gather(
        *(a.put(_entry(rid, f"a{i}")) for i in range(8)),
        *(b.put(_entry(rid, f"b{i}")) for i in range(8)),
        a.put(shared),
        b.put(TokenEntry.from_json(shared.canonical_bytes())),
    )
    snap = await _freeze(ctx, rid)
    ctx.require(
        len(snap.entries) == 17, f"two clients' puts gave {len(snap.entries)} entries, not 17"
    )
    ctx.require(not snap.incomplete, "concurrent identical puts poisoned the rollout")
    await a.put(_entry(race, "first"))
    src = await ctx.source()
    results = await asyncio.gather(
        *(b.put(_entry(race, f"r{i}")) for i in range(8)), src.freeze(race), return_exceptions=True
    )
    frozen = results[-1]
    if isinstance(frozen, BaseException):
        raise ConformanceError(ctx.check, f"freeze racing puts raised {frozen!r}")
    stored = set(_by_call(frozen))
    for i, res in enumerate(results[:-1]):
        if isinstance(res, BaseException):
            ctx.require(isinstance(res, TokenCaptureFrozenError), f"racing put raised {res!r}")
            ctx.require(f"r{i}" not in stored, f"refused put r{i} is in the snapshot")
        else:
            ctx.require(f"r{i}" in stored, f"put r{i} returned but is missing from the snapshot")
    again = await _freeze(ctx, race)
    ctx.require(again.version == frozen.version, "the snapshot moved after a freeze racing puts")
    await asyncio.gather(
        a.put(_entry(clash, "c1")), b.put(_entry(clash, "c1", gen=(1, 2))), return_exceptions=True
    )
    ctx.require(
        (await _freeze(ctx, clash)).incomplete, "concurrent conflicting puts were not detected"
    )


# -- ledger


@_check
async def _check_ledger_record_visibility(ctx: _Ctx) -> None:
    rid = ctx.rid()
    ledger = await ctx.ledger()
    commit = sample_commit(rid, "c1")
    ctx.require(await ledger.has_rows(rid) is False, "an unused rollout has ledger rows")
    await ledger.record(commit)
    await (await ctx.ledger()).record(commit)
    manifest = await (await ctx.ledger()).manifest(rid)
    rows = manifest.get("records", [])
    ctx.require([r["model_call_id"] for r in rows] == ["c1"], f"manifest records {rows}")
    ctx.require(
        canonical_json(rows[0]) == canonical_json(commit.record), "record did not round-trip"
    )
    ctx.require(
        "cumulative_token_ids" not in canonical_json(manifest).decode(), "token ids in manifest"
    )
    ctx.require(await (await ctx.ledger()).has_rows(rid) is True, "has_rows False after record")
    changed = sample_commit(rid, "c1").record
    other = CaptureLedgerCommit(
        rollout_id=rid,
        record=changed,
        request_items=[{"role": "user", "content": "changed"}],
        response_items=[],
    )
    with contextlib.suppress(Exception):
        await (await ctx.ledger()).record(other)
    manifest = await (await ctx.ledger()).manifest(rid)
    ctx.require(bool(manifest.get("failures")), "a conflicting ledger record left no failure row")


@_check
async def _check_ledger_failure_rows(ctx: _Ctx) -> None:
    rid = ctx.rid()
    ledger = await ctx.ledger()
    await ledger.record_failure(rid, "c1", "worker_capture_failed")
    await (await ctx.ledger()).record_failure(rid, "c1", "worker_capture_failed")
    manifest = await (await ctx.ledger()).manifest(rid)
    ctx.require(
        [(f["model_call_id"], f["reason"]) for f in manifest.get("failures", [])]
        == [("c1", "worker_capture_failed")],
        f"failure rows {manifest.get('failures')}",
    )
    ctx.require(not manifest.get("records"), "a failure row appeared as a record")
    ctx.require(await (await ctx.ledger()).has_rows(rid) is True, "has_rows ignores failure rows")


@_check
async def _check_ledger_retirement(ctx: _Ctx) -> None:
    rid = ctx.rid()
    await (await ctx.ledger()).record(sample_commit(rid, "c1"))
    removal = await (await ctx.ledger()).retire([rid])
    ctx.require(
        list(removal.changed) == [rid], f"ledger retire did not report the change: {removal}"
    )
    ledger = await ctx.ledger()
    await ledger.record(sample_commit(rid, "c2"))  # discarded, not raised
    await ledger.record_failure(rid, "c3", "late")
    await ctx.raises(ledger.manifest(rid), RolloutRetiredError, "manifest of a retired rollout")
    await ctx.raises(ledger.has_rows(rid), RolloutRetiredError, "has_rows of a retired rollout")
    ctx.require(not (await ledger.retire(rid)).changed, "a second ledger retire changed state")
    await (await ctx.ledger()).delete([rid])
    ledger = await ctx.ledger()
    ctx.require(await ledger.has_rows(rid) is False, "delete left ledger rows behind")
    ctx.require(not (await ledger.delete(rid)).changed, "deleting again changed state")


@_check
async def _check_ledger_admission_cut(ctx: _Ctx) -> None:
    rid = ctx.rid()
    ledger = await ctx.optional(
        "ledger", "close_admissions", "late calls of a finished rollout are admitted"
    )
    if not callable(getattr(ledger, "begin_call", None)):
        raise _Skip("ledger has close_admissions() but no begin_call()")
    await ledger.begin_call(rid, "c1")
    await (await ctx.ledger()).record(sample_commit(rid, "c0"))
    manifest = await (await ctx.ledger()).close_admissions(rid)
    ctx.require(
        [r["model_call_id"] for r in manifest["records"]] == ["c0"], f"cut manifest {manifest}"
    )
    await ctx.raises(
        (await ctx.ledger()).begin_call(rid, "c2"),
        CaptureAdmissionRefused,
        "begin_call after close_admissions",
    )
    await ctx.raises(
        (await ctx.ledger()).record(sample_commit(rid, "stray")),
        CaptureAdmissionRefused,
        "record of a call without an intent after close_admissions",
    )
    # Admitted before the cut: may still commit.
    await (await ctx.ledger()).record(sample_commit(rid, "c1"))
    manifest = await (await ctx.ledger()).manifest(rid)
    ctx.require(
        {r["model_call_id"] for r in manifest["records"]} == {"c0", "c1"}, "admitted call lost"
    )


@_check
async def _check_refuse_call_resolution(ctx: _Ctx) -> None:
    rid = ctx.rid()
    ledger = await ctx.optional(
        "ledger", "refuse_call", "refused calls stay dangling and mask rollouts"
    )
    if not callable(getattr(ledger, "begin_call", None)):
        raise _Skip("ledger has refuse_call() but no begin_call()")
    await ledger.begin_call(rid, "c1")
    await (await ctx.ledger()).record(sample_commit(rid, "c0"))
    await (await ctx.ledger()).refuse_call(rid, "c1")
    manifest = await (await ctx.ledger()).manifest(rid)
    ctx.require([r["model_call_id"] for r in manifest["records"]] == ["c0"], f"manifest {manifest}")
    ctx.require(not manifest["failures"], "a refused call became a failure row")
    if ctx.factories["source"] is not None:
        ctx.require(
            not (await _freeze(ctx, rid)).incomplete, "a refused call left its intent dangling"
        )


# -- lineage


@_check
async def _check_lineage_root(ctx: _Ctx) -> None:
    rid = ctx.rid()
    await (await ctx.sink()).put(_entry(rid, "c1"))
    res = await (await ctx.lineage()).resolve(rid, [{"role": "user", "content": "fresh question"}])
    ctx.require(
        res.status == ParentResolutionStatus.ROOT,
        f"a request without history resolved {res.status}",
    )


@_check
async def _check_lineage_never_guesses(ctx: _Ctx) -> None:
    rid = ctx.rid()
    await (await ctx.sink()).put(_entry(rid, "c1"))
    items = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "an answer nobody recorded"},
        {"role": "user", "content": "and?"},
    ]
    res = await (await ctx.lineage()).resolve(rid, items)
    ctx.require(
        res.status == ParentResolutionStatus.UNRESOLVED, f"an unknown history resolved {res.status}"
    )


async def _lineage_visibility(ctx: _Ctx, resolver_first: bool) -> None:
    try:
        from zephon.capture import lineage  # type: ignore[attr-defined]

        stamp = lineage.stamp_continuation
    except (ImportError, AttributeError):
        raise _Skip("zephon.capture.lineage.stamp_continuation is not available") from None
    rid = ctx.rid()
    request = [{"role": "user", "content": "what is 2+2?"}]
    entry = _entry(rid, "c1")
    stamped = stamp(entry, request)
    entry = stamped if isinstance(stamped, TokenEntry) else entry
    resolver = await ctx.lineage() if resolver_first else None
    await (await ctx.sink()).put(entry)
    resolver = resolver or await ctx.lineage()
    follow = [*request, *entry.output_items, {"role": "user", "content": "and 3+3?"}]
    res = await resolver.resolve(rid, follow)
    ctx.require(
        res.status == ParentResolutionStatus.RESOLVED,
        f"faithful continuation: {res.status} {res.reason}",
    )
    ctx.require(res.match.model_call_id == "c1", f"wrong parent {res.match.model_call_id}")
    ctx.require(list(res.match.cumulative_token_ids) == [11, 12, 13, 14], "wrong cumulative tokens")
    rewritten = [{"role": "user", "content": "what is 2+3?"}, *follow[1:]]
    res = await resolver.resolve(rid, rewritten)
    ctx.require(res.status == ParentResolutionStatus.UNRESOLVED, "a rewritten context resolved")


@_check
async def _check_lineage_visibility(ctx: _Ctx) -> None:
    await _lineage_visibility(ctx, resolver_first=True)


@_check
async def _check_fresh_client_lineage_visibility(ctx: _Ctx) -> None:
    await _lineage_visibility(ctx, resolver_first=False)


@_check
async def _check_lineage_named_chain(ctx: _Ctx) -> None:
    """Token-in calls with identical ids (samples of a peaked policy) keep their identities:
    a request naming a call's chain resolves to that call, never to its identical sibling."""
    try:
        from zephon.capture import lineage  # type: ignore[attr-defined]

        stamp, item = lineage.stamp_continuation, lineage.token_prompt_item
    except (ImportError, AttributeError):
        raise _Skip("zephon.capture.lineage.token_prompt_item is not available") from None
    rid = ctx.rid()
    sink = await ctx.sink()
    for cid in ("s0", "s1"):
        tokens = [11, 12, 13, 14]
        entry = _entry(rid, cid, cum_len=4, digest=compute_digest(tokens))
        await sink.put(stamp(entry, [item([11, 12])]))
    resolver = await ctx.lineage()
    for named in ("s1", "s0"):
        res = await resolver.resolve(rid, [item([11, 12, 13, 14, 15], chain_of=named)])
        got = res.match.model_call_id if res.match is not None else None
        ctx.require(got == named, f"chain of {named} resolved to {got} ({res.status})")
    res = await resolver.resolve(rid, [item([11, 12, 13, 14, 15], chain_of="elsewhere")])
    ctx.require(
        res.status == ParentResolutionStatus.UNRESOLVED,
        f"a chain the ids do not extend resolved {res.status}",
    )


@_check
async def _check_lineage_named_chain_text(ctx: _Ctx) -> None:
    """Text calls with identical history and ids (samples of a peaked policy, continued by
    echoing) keep their identities: a request naming a call's chain resolves to that call."""
    try:
        from zephon.capture import lineage  # type: ignore[attr-defined]

        stamp, hint = lineage.stamp_continuation, lineage.chain_hint_item
    except (ImportError, AttributeError):
        raise _Skip("zephon.capture.lineage.chain_hint_item is not available") from None
    rid = ctx.rid()
    sink = await ctx.sink()
    request = [{"role": "user", "content": "name a river"}]
    for cid in ("s0", "s1"):
        entry = _entry(rid, cid, cum_len=4, digest=compute_digest([11, 12, 13, 14]))
        await sink.put(stamp(entry, request))
    follow = [*request, *entry.output_items, {"role": "user", "content": "another"}]
    resolver = await ctx.lineage()
    for named in ("s1", "s0"):
        res = await resolver.resolve(rid, [*follow, hint(named)])
        got = res.match.model_call_id if res.match is not None else None
        ctx.require(got == named, f"chain of {named} resolved to {got} ({res.status})")
    res = await resolver.resolve(rid, [*follow, hint("elsewhere")])
    ctx.require(
        res.status == ParentResolutionStatus.UNRESOLVED,
        f"a chain the history does not extend resolved {res.status}",
    )


from zephon.capture import _conformance_rl  # noqa: E402, F401 - registers the RL checks last

NEEDS: dict[str, tuple[str, ...]] = {
    name: ("lineage",) for name in CHECKS if "lineage" in name and not name.startswith("ledger")
}
NEEDS.update(
    {
        name: ("ledger",)
        for name in CHECKS
        if name.startswith("ledger") or name == "refuse_call_resolution"
    }
)
