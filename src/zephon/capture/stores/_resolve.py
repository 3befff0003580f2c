"""Request-time parent resolution over a rollout's committed entries (pure, no I/O).

Every durable store reads its entries (under its read lock or in one transaction) and hands
them here, so all stores answer alike. Rules: ROOT when the request has no model-authored
item; otherwise exactly one candidate whose continuation fingerprint (current version) and
recorded request context both match, else UNRESOLVED. Candidates with identical token
sequences count as one (the smallest call id is reported). The hashes come from
:mod:`zephon.capture.lineage` when it is available; without it the answer is UNRESOLVED
``resolver_unavailable`` (never a guess).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from zephon.capture.protocols import LineageMatch, LineageResolution
from zephon.capture.records import (
    FINGERPRINT_VERSION,
    ParentResolutionStatus,
    TokenEntry,
    compute_digest,
    cumulative_tokens,
)

__all__ = ["has_model_authored_item", "resolve_among"]


def has_model_authored_item(request_items: list[dict[str, Any]]) -> bool:
    return any(
        isinstance(item, dict)
        and (item.get("role") == "assistant" or item.get("type") == "function_call")
        for item in request_items
    )


def resolve_among(
    request_items: list[dict[str, Any]], entries: Iterable[TokenEntry]
) -> LineageResolution:
    """Decide the parent of a request among ``entries`` (one rollout's committed entries)."""
    if not has_model_authored_item(request_items):
        return LineageResolution(ParentResolutionStatus.ROOT)
    try:
        from zephon.capture import lineage  # type: ignore[attr-defined]

        fingerprint = lineage.assistant_fingerprint
        context_digest = lineage.conversation_digest
    except (ImportError, AttributeError):
        return LineageResolution(ParentResolutionStatus.UNRESOLVED, reason="resolver_unavailable")
    fp = fingerprint(request_items)
    if not fp:
        return LineageResolution(ParentResolutionStatus.ROOT)
    candidates: list[TokenEntry] = []
    digests: dict[int, str] = {}
    for entry in entries:
        n = entry.continuation_context_len
        if (
            entry.continuation_fingerprint == fp
            and entry.fingerprint_version == FINGERPRINT_VERSION
            and entry.continuation_context_digest
            and len(request_items) >= n
            and not entry.prompt_is_delta
        ):
            if n not in digests:
                digests[n] = context_digest(request_items[:n])
            if digests[n] == entry.continuation_context_digest:
                candidates.append(entry)
    if len({(e.digest, e.cum_len) for e in candidates}) == 1:
        candidates = [min(candidates, key=lambda e: e.model_call_id)]
    if len(candidates) != 1:
        reason = "no_match" if not candidates else "ambiguous"
        return LineageResolution(ParentResolutionStatus.UNRESOLVED, reason=reason)
    parent = candidates[0]
    tokens = cumulative_tokens(parent)
    return LineageResolution(
        ParentResolutionStatus.RESOLVED,
        match=LineageMatch(
            model_call_id=parent.model_call_id,
            cumulative_token_ids=tuple(tokens),
            digest=parent.digest or compute_digest(tokens),
        ),
    )
