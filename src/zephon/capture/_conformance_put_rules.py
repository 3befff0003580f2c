"""Conformance checks of the put rules: a store acknowledges only entries it can read back.

Why here: each rule is a clause a user's store must honour like ours (a poisoned rollout is
unreadable, and a store that acknowledged it lost the call silently). Every check puts entries
that break one rule, expects ``ValueError`` for each, then freezes and requires that only the
valid entry is there. Registered by :mod:`._conformance_checks`.
"""

from __future__ import annotations

from collections.abc import Callable

from zephon.capture._conformance_kit import CheckFn, _by_call, _Ctx, _entry, _freeze, _wire
from zephon.capture.records import MAX_CALL_ID_CHARS, MAX_TOKEN_ID, TokenEntry

__all__ = ["POISONS", "PUT_RULES"]

Poison = Callable[[TokenEntry], TokenEntry]


def _set(**changes: object) -> Poison:
    """Change fields after construction (no ``__post_init__``), as a library user can."""

    def change(entry: TokenEntry) -> TokenEntry:
        for name, value in changes.items():
            setattr(entry, name, value)
        return entry

    return change


POISONS: dict[str, dict[str, Poison]] = {
    "token_ids_integers": {
        "float prompt id": _set(prompt_token_ids=[11.0, 12]),
        "bool prompt id": _set(prompt_token_ids=[True, 12]),
        "float generation id": _set(generation_token_ids=[13, 14.0]),
        "bool generation id": _set(generation_token_ids=[False, 14]),
    },
    "token_ids_in_range": {
        "negative id": _set(prompt_token_ids=[-1, 12]),
        "id beyond int64": _set(generation_token_ids=[13, MAX_TOKEN_ID + 1]),
    },
    "lengths_consistent": {
        "fewer log-probs than tokens": _set(generation_log_probs=[-0.1]),
        "cum_len not prompt + generation": _set(cum_len=3),
        "token_item_index beyond output_items": _set(token_item_index=9),
    },
    "values_in_domain": {
        "positive log-prob": _set(generation_log_probs=[5.0, -0.1]),
        "routed_experts not a list": _set(routed_experts={"layer0": [1, 2]}),
    },
    "call_ids_holdable": {
        "NUL in model_call_id": _set(model_call_id="c\x00"),
        "model_call_id too long": _set(model_call_id="c" * (MAX_CALL_ID_CHARS + 1)),
        "lone surrogate in model_call_id": _set(model_call_id="c\udc80"),
    },
}
"""Rule -> {case: how to break a valid entry}; the cases each rule's check puts."""


def _rule_check(rule: str) -> CheckFn:
    async def check(ctx: _Ctx) -> None:
        rid = ctx.rid()
        for i, (case, poison) in enumerate(POISONS[rule].items()):
            bad = poison(_entry(rid, f"bad{i}"))
            sink = await ctx.sink()
            await ctx.raises(sink.put(bad), ValueError, f"put of an entry with {case}")
        good = _entry(rid, "good")
        await (await ctx.sink()).put(good)
        snap = await _freeze(ctx, rid)
        ctx.require(
            _by_call(snap) == {"good": _wire(good)},
            f"after the refused puts the rollout holds {sorted(_by_call(snap))}, not ['good']",
        )

    check.__name__ = f"_check_{rule}_at_put"
    return check


PUT_RULES: list[CheckFn] = [_rule_check(rule) for rule in POISONS]
