"""Terminal attribution: which captured call produced the response that was scored?

Independent witnesses, each abstaining when it cannot name exactly one call (calls with
identical full token sequences count as one, the smallest id): the caller's explicit call id,
a harness-declared response id (a declared id that matches no single entry stops attribution),
the scored response's ``id``, and its content (the assistant fingerprint of its output,
compared with each entry's continuation fingerprint, with the fingerprint of each entry's own
output, and for a merged transcript with its trailing block of model-authored items). All
witnesses that speak must agree; a disagreement attributes nothing and is reported.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from zephon.capture._dialects import is_model_authored
from zephon.capture.lineage import assistant_fingerprint
from zephon.capture.records import FINGERPRINT_VERSION, TokenEntry

__all__ = ["TerminalAttribution", "attribute_terminal"]


@dataclass(frozen=True, slots=True)
class TerminalAttribution:
    """The attributed call (or None), the method that named it, and the witnesses' trail."""

    call_id: str | None
    method: str = ""
    reason: str = ""

    @property
    def attributed(self) -> bool:
        return self.call_id is not None


def _identity(entry: TokenEntry) -> tuple[Any, ...]:
    if entry.digest and entry.cum_len is not None:
        return (entry.digest, entry.cum_len)
    return (tuple(entry.prompt_token_ids), tuple(entry.generation_token_ids))


def _one(candidates: Sequence[TokenEntry]) -> TokenEntry | None:
    if not candidates:
        return None
    if len({_identity(e) for e in candidates}) == 1:
        return min(candidates, key=lambda e: e.model_call_id)
    return None


def _fingerprint(items: list[dict[str, Any]]) -> str:
    try:
        return assistant_fingerprint(items)
    except (TypeError, ValueError):
        return ""


def _trailing_fingerprint(items: list[dict[str, Any]]) -> str:
    """The fingerprint of the model-authored items at the end of the output, when the output
    also holds other items before them (else empty)."""
    trailing: list[dict[str, Any]] = []
    for item in reversed(items):
        if not is_model_authored(item):
            break
        trailing.append(item)
    return _fingerprint(trailing[::-1]) if trailing and len(trailing) != len(items) else ""


def _content_matches(
    entries: Sequence[TokenEntry], target: str, tail: str
) -> tuple[dict[str, TokenEntry], bool]:
    """Entries whose content matches the output, and whether a cumulative fingerprint did."""
    matches: dict[str, TokenEntry] = {}
    cumulative = False
    for entry in entries:
        version_ok = entry.fingerprint_version in (None, FINGERPRINT_VERSION)
        if entry.continuation_fingerprint == target and version_ok:
            matches[entry.model_call_id] = entry
            cumulative = True
        own = _fingerprint(list(entry.output_items)) if entry.output_items else ""
        if own and (own == target or (tail and own == tail)):
            matches[entry.model_call_id] = entry
    return matches, cumulative


def _content_witness(
    entries: Sequence[TokenEntry], response: dict[str, Any], trail: list[str]
) -> tuple[str, TokenEntry] | None:
    output = response.get("output")
    if not isinstance(output, list) or not output:
        trail.append("response_has_no_output")
        return None
    items = [item for item in output if isinstance(item, dict)]
    target = _fingerprint(items)
    if not target:
        trail.append("no_model_authored_output")
        return None
    matches, cumulative = _content_matches(entries, target, _trailing_fingerprint(items))
    winner = _one(list(matches.values()))
    if winner is None:
        trail.append("content_ambiguous" if matches else "no_content_match")
        return None
    return ("content_cumulative" if cumulative else "content_output", winner)


def _response_witnesses(
    entries: Sequence[TokenEntry], response: dict[str, Any], trail: list[str]
) -> list[tuple[str, TokenEntry]]:
    """What the scored response object itself names: its id, then its content."""
    witnesses: list[tuple[str, TokenEntry]] = []
    rid = str(response.get("id") or "")
    if rid:
        hits = [e for e in entries if e.response_id and e.response_id == rid]
        winner = _one(hits)
        if winner is not None:
            witnesses.append(("response_id", winner))
        else:
            trail.append("response_id_ambiguous" if hits else "response_id_no_match")
    else:
        trail.append("response_has_no_id")
    content = _content_witness(entries, response, trail)
    if content is not None:
        witnesses.append(content)
    return witnesses


def _verdict(witnesses: list[tuple[str, TokenEntry]], trail: list[str]) -> TerminalAttribution:
    """One call when every witness names the same one; otherwise none, saying why."""
    if not witnesses:
        return TerminalAttribution(None, reason=",".join(trail))
    if _one([e for _, e in witnesses]) is None:
        detail = ";".join(f"{m}={e.model_call_id}" for m, e in witnesses)
        trail.append(f"witness_disagreement[{detail}]")
        return TerminalAttribution(None, reason=",".join(trail))
    method, named = witnesses[0]
    if len(witnesses) > 1:
        trail.append("corroborated_by=" + "+".join(m for m, _ in witnesses[1:]))
    return TerminalAttribution(named.model_call_id, method=method, reason=",".join(trail))


def attribute_terminal(
    entries: Sequence[TokenEntry],
    *,
    call_id: str | None = None,
    response_id: str | None = None,
    response: dict[str, Any] | None = None,
) -> TerminalAttribution:
    """Join the scored response to one captured call; never raises on malformed content."""
    trail: list[str] = []
    witnesses: list[tuple[str, TokenEntry]] = []
    if call_id:
        named = {e.model_call_id: e for e in entries}.get(call_id)
        if named is None:
            trail.append("explicit_terminal_not_captured")
        else:
            witnesses.append(("explicit", named))
    if response_id:
        declared = [e for e in entries if e.response_id == response_id]
        winner = _one(declared)
        if winner is None:
            trail.append("declared_ambiguous" if declared else "declared_terminal_not_captured")
            return TerminalAttribution(None, reason=",".join(trail))
        witnesses.append(("declared", winner))
    if isinstance(response, dict):
        witnesses += _response_witnesses(entries, response, trail)
    elif response is None and not (call_id or response_id):
        trail.append("no_response_object")
    return _verdict(witnesses, trail)
