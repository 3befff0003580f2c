"""Mutation harness: break one contract clause of ANY store, expect one check to fail.

Why: a conformance suite is only as good as the clauses it notices breaking. Each mutation wraps
a store client (black box, so it works for memory, file, sqlite, postgres and yours alike) and
breaks exactly one clause; :func:`assert_mutation_caught` runs the suite on the mutant and
asserts the expected check failed. Parametrise a test over :data:`MUTATIONS`::

    @pytest.mark.parametrize("name", sorted(MUTATIONS))
    def test_my_store_mutations(name, tmp_path):
        assert_mutation_caught(lambda: MyStore.from_url(f"my://{tmp_path}"), MUTATIONS[name])
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec

from zephon.capture.conformance import ConformanceReport, run_conformance
from zephon.capture.ledger import LedgerTransitionError
from zephon.capture.protocols import (
    RolloutRetiredError,
    TokenCaptureFrozenError,
    TokenCaptureRetiredError,
)
from zephon.capture.records import (
    MAX_TOKEN_ID,
    RolloutManifest,
    RolloutRemoval,
    TokenEntry,
    validate_call_id,
    validate_capture_keys,
)


class Wrapper:
    """Forwards everything to the wrapped client; subclasses override one method."""

    def __init__(self, inner: Any, shared: dict[str, Any]) -> None:
        self._inner = inner
        self._shared = shared

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class ReputConflictAccepted(Wrapper):
    """A different payload for a known call id is silently accepted (never reaches the store)."""

    async def put(self, entry: TokenEntry) -> None:
        key = (entry.rollout_id, entry.model_call_id)
        seen = self._shared.setdefault("seen", {})
        if key in seen and seen[key] != entry.canonical_bytes():
            return
        seen[key] = entry.canonical_bytes()
        await self._inner.put(entry)


class WriteAfterFreezeAccepted(Wrapper):
    async def put(self, entry: TokenEntry) -> None:
        try:
            await self._inner.put(entry)
        except TokenCaptureRetiredError:
            raise
        except TokenCaptureFrozenError:
            return


class RetireNotFencing(Wrapper):
    async def retire(self, rollout_ids: Any) -> RolloutRemoval:
        keys = tuple(validate_capture_keys(rollout_ids))
        return RolloutRemoval(action="retire", capture_keys=keys, changed=keys)


class DeleteKeepsFence(Wrapper):
    async def delete(self, rollout_ids: Any) -> RolloutRemoval:
        keys = tuple(validate_capture_keys(rollout_ids))
        return RolloutRemoval(action="delete", capture_keys=keys, changed=keys)


class DanglingIntentIgnored(Wrapper):
    async def begin_call(self, rollout_id: str, model_call_id: str) -> None:
        return None


class VersionPinned(Wrapper):
    """mark_incomplete (or anything) after the first freeze does not move the reported version."""

    async def freeze(self, rollout_id: str) -> Any:
        snap = await self._inner.freeze(rollout_id)
        first = self._shared.setdefault("versions", {}).setdefault(rollout_id, snap.version)
        return msgspec.structs.replace(snap, version=first)


class DropIgnoresVersion(Wrapper):
    async def drop(self, rollout_id: str, *, snapshot_id: str, version: int) -> bool:
        await self._inner.retire([rollout_id])
        return True


class RefusalAfterFreezeMovesSnapshot(Wrapper):
    async def record_engine_refusal(self, rollout_id: str, **kw: Any) -> None:
        try:
            await self._inner.record_engine_refusal(rollout_id, **kw)
        except TokenCaptureRetiredError:
            raise
        except TokenCaptureFrozenError:
            await self._inner.mark_incomplete(rollout_id, kw["model_call_id"])


class PutInvisible(Wrapper):
    """put 'succeeds' without reaching the shared backend (a client-local buffer)."""

    async def put(self, entry: TokenEntry) -> None:
        self._shared.setdefault("buffer", []).append(entry)


class RetiredErrorUntyped(Wrapper):
    async def put(self, entry: TokenEntry) -> None:
        try:
            await self._inner.put(entry)
        except TokenCaptureRetiredError as exc:
            raise RuntimeError(str(exc)) from None


class RefusalNotSettling(Wrapper):
    async def record_engine_refusal(self, rollout_id: str, **kw: Any) -> None:
        return None


class AdmissionsNeverClose(Wrapper):
    async def close_admissions(self, rollout_id: str) -> dict[str, Any]:
        result: dict[str, Any] = await self._inner.manifest(rollout_id)
        return result


class RefuseCallIgnored(Wrapper):
    async def refuse_call(self, rollout_id: str, model_call_id: str) -> None:
        return None


class RetiredManifestEmpty(Wrapper):
    async def manifest(self, rollout_id: str) -> dict[str, Any]:
        try:
            result: dict[str, Any] = await self._inner.manifest(rollout_id)
        except RolloutRetiredError:
            return RolloutManifest(rollout_id=rollout_id).to_wire()
        return result


class UnstableSnapshotId(Wrapper):
    async def freeze(self, rollout_id: str) -> Any:
        snap = await self._inner.freeze(rollout_id)
        n = self._shared["n"] = self._shared.get("n", 0) + 1
        return msgspec.structs.replace(snap, snapshot_id=f"{snap.snapshot_id}-{n}")


class DuplicatedEntries(Wrapper):
    async def freeze(self, rollout_id: str) -> Any:
        snap = await self._inner.freeze(rollout_id)
        return msgspec.structs.replace(snap, entries=snap.entries + snap.entries)


class NonFiniteAccepted(Wrapper):
    """A put with a NaN or infinite log-prob reports success (the entry is silently lost)."""

    async def put(self, entry: TokenEntry) -> None:
        if not all(math.isfinite(x) for x in entry.generation_log_probs):
            return
        await self._inner.put(entry)


class _PoisonAcknowledged(Wrapper):
    """A put that breaks one put rule reports success (what a store without the rule does)."""

    @staticmethod
    def breaks_rule(entry: TokenEntry) -> bool:
        raise NotImplementedError

    async def put(self, entry: TokenEntry) -> None:
        if self.breaks_rule(entry):
            return
        await self._inner.put(entry)


def _token_ids(entry: TokenEntry) -> list[Any]:
    return [*entry.prompt_token_ids, *entry.generation_token_ids]


class NonIntegerTokenIdsAccepted(_PoisonAcknowledged):
    @staticmethod
    def breaks_rule(entry: TokenEntry) -> bool:
        return any(type(x) is not int for x in _token_ids(entry))


class OutOfRangeTokenIdsAccepted(_PoisonAcknowledged):
    @staticmethod
    def breaks_rule(entry: TokenEntry) -> bool:
        return any(type(x) is int and not 0 <= x <= MAX_TOKEN_ID for x in _token_ids(entry))


class InconsistentLengthsAccepted(_PoisonAcknowledged):
    @staticmethod
    def breaks_rule(entry: TokenEntry) -> bool:
        own = len(entry.prompt_token_ids) + len(entry.generation_token_ids)
        index = entry.token_item_index
        return (
            len(entry.generation_log_probs) != len(entry.generation_token_ids)
            or (entry.cum_len is not None and entry.cum_len != own)
            or (index is not None and not 0 <= index < len(entry.output_items))
        )


class OutOfDomainValuesAccepted(_PoisonAcknowledged):
    @staticmethod
    def breaks_rule(entry: TokenEntry) -> bool:
        experts = entry.routed_experts
        return any(x > 0 for x in entry.generation_log_probs) or not (
            experts is None or isinstance(experts, list)
        )


class UnholdableCallIdsAccepted(_PoisonAcknowledged):
    @staticmethod
    def breaks_rule(entry: TokenEntry) -> bool:
        try:
            validate_call_id(entry.model_call_id)
        except ValueError:
            return True
        return False


class LedgerConflictAccepted(Wrapper):
    async def record(self, commit: Any) -> None:
        key = (commit.rollout_id, commit.record.model_call_id)
        seen = self._shared.setdefault("ledger", {})
        if key in seen and seen[key] != commit:
            return
        seen[key] = commit
        await self._inner.record(commit)


class StaleDropDestroysEvidence(Wrapper):
    async def drop(self, rollout_id: str, *, snapshot_id: str, version: int) -> bool:
        ok: bool = await self._inner.drop(rollout_id, snapshot_id=snapshot_id, version=version)
        if not ok:
            await self._inner.retire([rollout_id])
        return ok


class ChainHintIgnored(Wrapper):
    """Resolution drops the chain a text request names (identical calls collapse to one)."""

    async def resolve(self, rollout_id: str, request_items: list[dict[str, Any]]) -> Any:
        if request_items and request_items[-1].get("type") == "zephon_chain_of":
            request_items = request_items[:-1]
        return await self._inner.resolve(rollout_id, request_items)


class TrainedTwiceAccepted(Wrapper):
    """A member already trained at another step is reported trained again (a lost update)."""

    async def advance(self, stream: str, refs: Any, to: Any, **kw: Any) -> bool:
        try:
            changed: bool = await self._inner.advance(stream, refs, to, **kw)
        except LedgerTransitionError:
            if str(to) != "trained":
                raise
            return True
        return changed


class SkippedStateAccepted(Wrapper):
    """A move that skips states walks through them instead of being refused."""

    async def advance(self, stream: str, refs: Any, to: Any, **kw: Any) -> bool:
        order = ["captured", "scored", "trained"]
        if str(to) in order:
            for earlier in order[: order.index(str(to))]:
                for ref in refs:
                    with contextlib.suppress(LedgerTransitionError):
                        await self._inner.advance(stream, [ref], earlier)
        changed: bool = await self._inner.advance(stream, refs, to, **kw)
        return changed


class BatchNotAtomic(Wrapper):
    """A batch is moved member by member, so a refused member leaves the others moved."""

    async def advance(self, stream: str, refs: Any, to: Any, **kw: Any) -> bool:
        changed = False
        for ref in refs:
            changed = await self._inner.advance(stream, [ref], to, **kw) or changed
        return changed


class AttemptIgnored(Wrapper):
    """Moves drop the attempt of their refs, so an abandoned attempt's worker moves the new one."""

    async def advance(self, stream: str, refs: Any, to: Any, **kw: Any) -> bool:
        changed: bool = await self._inner.advance(stream, [r[:2] for r in refs], to, **kw)
        return changed


class CursorNotKept(Wrapper):
    """The pipeline cursor issued with a prompt is not stored (a restart re-draws prompts)."""

    async def issue_prompt(self, stream: str, position: int, **kw: Any) -> Any:
        kw["cursor"] = None
        return await self._inner.issue_prompt(stream, position, **kw)


class NonFiniteScoreAccepted(Wrapper):
    """A NaN or infinite reward is stored as 0.0 instead of being refused."""

    async def put_score(self, score: Any) -> None:
        if not math.isfinite(score.reward):
            score = msgspec.structs.replace(score, reward=0.0)
        await self._inner.put_score(score)


@dataclass(frozen=True)
class Mutation:
    name: str
    clause: str
    expected_check: str
    wrapper: type[Wrapper]


MUTATIONS: dict[str, Mutation] = {
    m.name: m
    for m in [
        Mutation(
            "reput_conflict_accepted",
            "different payload for a call id fails and poisons",
            "conflicting_reput",
            ReputConflictAccepted,
        ),
        Mutation(
            "write_after_freeze_accepted",
            "write after freeze raises TokenCaptureFrozenError",
            "post_freeze_write_safety",
            WriteAfterFreezeAccepted,
        ),
        Mutation(
            "retire_not_fencing",
            "retire keeps a fence",
            "unconditional_retirement",
            RetireNotFencing,
        ),
        Mutation(
            "delete_keeps_fence",
            "delete removes records and fence",
            "delete_clears_retirement",
            DeleteKeepsFence,
        ),
        Mutation(
            "dangling_intent_ignored",
            "a dangling intent masks the rollout",
            "begin_call_custody",
            DanglingIntentIgnored,
        ),
        Mutation(
            "mark_incomplete_version_pinned",
            "mark_incomplete moves the version",
            "mark_incomplete_durability",
            VersionPinned,
        ),
        Mutation(
            "drop_ignores_version",
            "drop is conditional on (snapshot_id, version)",
            "conditional_retirement",
            DropIgnoresVersion,
        ),
        Mutation(
            "refusal_after_freeze_moves_snapshot",
            "a late refusal raises or changes nothing",
            "engine_refusal_after_freeze",
            RefusalAfterFreezeMovesSnapshot,
        ),
        Mutation(
            "put_invisible_to_fresh_client",
            "put is visible to every client on return",
            "put_then_freeze_visibility",
            PutInvisible,
        ),
        Mutation(
            "retired_error_untyped",
            "write after retire raises TokenCaptureRetiredError",
            "conditional_retirement",
            RetiredErrorUntyped,
        ),
        Mutation(
            "refusal_not_settling_intent",
            "an engine refusal settles its intent and is reported",
            "engine_refusal_resolution",
            RefusalNotSettling,
        ),
        Mutation(
            "admissions_never_close",
            "close_admissions refuses later begin_call",
            "ledger_admission_cut",
            AdmissionsNeverClose,
        ),
        Mutation(
            "refuse_call_ignored",
            "refuse_call settles the intent",
            "refuse_call_resolution",
            RefuseCallIgnored,
        ),
        Mutation(
            "retired_manifest_empty",
            "manifest of a retired rollout raises RolloutRetiredError",
            "ledger_retirement",
            RetiredManifestEmpty,
        ),
        Mutation(
            "unstable_snapshot_id", "freeze is idempotent", "freeze_idempotency", UnstableSnapshotId
        ),
        Mutation(
            "non_finite_accepted",
            "non-finite log-probs are refused at put, naming the field",
            "non_finite_log_probs_refused",
            NonFiniteAccepted,
        ),
        Mutation(
            "non_integer_token_ids_accepted",
            "float or bool token ids are refused at put",
            "token_ids_integers_at_put",
            NonIntegerTokenIdsAccepted,
        ),
        Mutation(
            "out_of_range_token_ids_accepted",
            "token ids outside [0, MAX_TOKEN_ID] are refused at put",
            "token_ids_in_range_at_put",
            OutOfRangeTokenIdsAccepted,
        ),
        Mutation(
            "inconsistent_lengths_accepted",
            "log-probs, cum_len and token_item_index agree with the token lists",
            "lengths_consistent_at_put",
            InconsistentLengthsAccepted,
        ),
        Mutation(
            "out_of_domain_values_accepted",
            "positive log-probs and a routed_experts that is not a list are refused at put",
            "values_in_domain_at_put",
            OutOfDomainValuesAccepted,
        ),
        Mutation(
            "unholdable_call_ids_accepted",
            "call ids some store cannot hold are refused at put",
            "call_ids_holdable_at_put",
            UnholdableCallIdsAccepted,
        ),
        Mutation(
            "duplicated_entries",
            "entries are unique per call id",
            "idempotent_reput",
            DuplicatedEntries,
        ),
        Mutation(
            "ledger_conflict_accepted",
            "a conflicting ledger record fails",
            "ledger_record_visibility",
            LedgerConflictAccepted,
        ),
        Mutation(
            "stale_drop_destroys_evidence",
            "a failed drop keeps the evidence",
            "conditional_retirement",
            StaleDropDestroysEvidence,
        ),
        Mutation(
            "trained_twice_accepted",
            "a member is trained at one step only",
            "prompt_ledger_transitions",
            TrainedTwiceAccepted,
        ),
        Mutation(
            "skipped_state_accepted",
            "ledger states are not skipped",
            "prompt_ledger_transitions",
            SkippedStateAccepted,
        ),
        Mutation(
            "batch_not_atomic",
            "a batch of ledger moves is all or none",
            "prompt_ledger_transitions",
            BatchNotAtomic,
        ),
        Mutation(
            "attempt_ignored",
            "a move of a re-issued attempt is refused",
            "prompt_ledger_reissue",
            AttemptIgnored,
        ),
        Mutation(
            "cursor_not_kept",
            "the pipeline cursor is stored with its prompt",
            "prompt_ledger_issue",
            CursorNotKept,
        ),
        Mutation(
            "non_finite_score_accepted",
            "scores are finite numbers",
            "rollout_scores",
            NonFiniteScoreAccepted,
        ),
        Mutation(
            "chain_hint_ignored",
            "a request naming a chain resolves only on that chain",
            "lineage_named_chain_text",
            ChainHintIgnored,
        ),
    ]
}


def mutated_factory(factory: Callable[[], Any], mutation: Mutation) -> Callable[[], Any]:
    """A factory of wrapped clients sharing one mutation state (like clients share a backend)."""
    shared: dict[str, Any] = {}

    async def make() -> Any:
        client = factory()
        if inspect.isawaitable(client):
            client = await client
        return mutation.wrapper(client, shared)

    return make


async def run_mutation(
    factory: Callable[[], Any], mutation: Mutation, *, all_checks: bool = False
) -> ConformanceReport:
    f = mutated_factory(factory, mutation)
    checks = None if all_checks else [mutation.expected_check]
    return await run_conformance(f, f, f, f, checks=checks, raise_on_failure=False)


def assert_mutation_caught(
    factory: Callable[[], Any], mutation: Mutation, *, all_checks: bool = False
) -> ConformanceReport:
    """Run the suite on the mutated store; the expected check must fail."""
    report = asyncio.run(run_mutation(factory, mutation, all_checks=all_checks))
    failed = [r.name for r in report.failed]
    assert mutation.expected_check in failed, (
        f"mutation {mutation.name!r} ({mutation.clause}) was not caught by "
        f"{mutation.expected_check!r}; failed checks: {failed}"
    )
    return report
