"""Request-time lineage: which recorded call does a request continue?

Two hashes, bit-compatible with NeMo Gym's fingerprint version 2 (byte layout in
``docs/lineage.md``):

* :func:`assistant_fingerprint` hashes only the model-authored items (assistant turns and
  Responses function calls; reasoning is ignored) and is the lookup key;
* :func:`conversation_digest` hashes every item, tool results included, and verifies that the
  request really extends the context the candidate was generated from.

:func:`stamp_continuation` writes both onto an entry before ``put``. :class:`RolloutLineage` is
the per-rollout matcher: a candidate must carry the request's fingerprint AND the digest of
the request's first ``context_len`` items; it never chooses between candidates (candidates
with identical token sequences are one: the smallest call id, unless the request names the
chain it extends, see :func:`token_prompt_item` and :func:`chain_hint_item`).
:class:`IncrementalResolver` keeps one matcher per rollout over any store and, on each look,
reads only the entries committed since its previous look, so every entry whose ``put``
returned is seen, from any client, at the cost of the new entries alone.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from zephon.capture._dialects import (
    canonicalize_tool_arguments as canonicalize_tool_arguments,
)
from zephon.capture._dialects import (
    content_parts,
    is_model_authored,
    role_or_type,
    tool_calls,
    tool_results,
)
from zephon.capture.protocols import (
    CaptureHistoryUnrepresentable,
    LineageMatch,
    LineageResolution,
)
from zephon.capture.records import (
    FINGERPRINT_VERSION as FINGERPRINT_VERSION,
)
from zephon.capture.records import (
    CaptureLedgerCommit,
    ParentResolutionStatus,
    TokenEntry,
    compute_digest,
)

__all__ = [
    "EntryFetch",
    "LineageNode",
    "chain_hint_item",
    "has_model_authored_item",
    "resolve_among",
    "resolve_from_ledger",
    "split_chain_hint",
    "token_prompt_chain_of",
    "token_prompt_item",
    "token_prompt_of",
]

FINGERPRINT_DOMAIN = b"nemo-gym-lineage"
CONTEXT_DOMAIN = b"nemo-gym-lineage-context"

TOKEN_PREFIX_DOMAIN = b"zephon-lineage-token-prefix"
TOKEN_PROMPT_TYPE = "token_prompt"
CHAIN_HINT_TYPE = "zephon_chain_of"
CHAIN_OF_KEY = "chain_of"

# Reason codes of UNRESOLVED answers (the first two are the reference's).
NO_MATCH = "no_match"
AMBIGUOUS = "ambiguous"
PARENT_UNAVAILABLE = "parent_tokens_unavailable"
NOT_ON_CHAIN = "not_on_named_chain"
TEXTLESS_TURN = "textless_turn"

_ROOT = LineageResolution(ParentResolutionStatus.ROOT)


# --------------------------------------------------------------------------- hashes


def _field(h: Any, tag: bytes, value: str) -> None:
    data = value.encode("utf-8")
    h.update(tag + len(data).to_bytes(8, "big"))
    h.update(data)


def _items(items: Iterable[Any]) -> Iterable[dict[str, Any]]:
    for i, item in enumerate(items or ()):
        if not isinstance(item, dict):
            raise CaptureHistoryUnrepresentable(
                f"request item #{i} is a {type(item).__name__}; lineage needs JSON objects"
            )
        yield item


def assistant_fingerprint(items: Iterable[dict[str, Any]]) -> str:
    """Hex SHA-256 of the model-authored items, or ``""`` when there are none (a root).

    Per kept item: every content part as (0x00 type, 0x01 payload), then every tool call as
    (0x02 call id, 0x03 name, 0x04 canonical arguments). Roles and item boundaries are not
    hashed, so a Chat assistant message with ``tool_calls`` equals the Responses message plus
    function-call items and the Anthropic message with ``tool_use`` blocks.
    """
    h = hashlib.sha256(FINGERPRINT_DOMAIN)
    kept = 0
    for item in _items(items):
        if not is_model_authored(item):
            continue
        kept += 1
        for kind, payload in content_parts(item.get("content")):
            _field(h, b"\x00", kind)
            _field(h, b"\x01", payload)
        for call_id, name, arguments in tool_calls(item):
            _field(h, b"\x02", call_id)
            _field(h, b"\x03", name)
            _field(h, b"\x04", arguments)
    return h.hexdigest() if kept else ""


def conversation_digest(items: Iterable[dict[str, Any]]) -> str:
    """Hex SHA-256 of every item: any edit, summary or truncation of the context changes it.

    Per item: 0x00 role (or type), content parts (0x01 type, 0x02 payload), tool calls (0x03
    id, 0x04 name, 0x05 arguments) and tool results (0x06 call id, 0x07 output).
    """
    h = hashlib.sha256(CONTEXT_DOMAIN)
    for item in _items(items):
        _field(h, b"\x00", role_or_type(item))
        for kind, payload in content_parts(item.get("content")):
            _field(h, b"\x01", kind)
            _field(h, b"\x02", payload)
        for call_id, name, arguments in tool_calls(item):
            _field(h, b"\x03", call_id)
            _field(h, b"\x04", name)
            _field(h, b"\x05", arguments)
        for call_id, output in tool_results(item):
            _field(h, b"\x06", call_id)
            _field(h, b"\x07", output)
    return h.hexdigest()


def token_prompt_item(token_ids: Sequence[int], chain_of: str | None = None) -> dict[str, Any]:
    """The one request item of a token-in call: the prompt as the exact ids the engine gets.

    Such a request continues the recorded call whose prompt + generation ids are the longest
    prefix of these ids (see :meth:`RolloutLineage.resolve_prefix`), whatever text they render.
    ``chain_of`` names a call of the chain the request extends (its parent or any ancestor):
    among calls with identical ids, such as the samples of a group from a peaked policy, only
    the one on that chain is the parent. It is not hashed (digests stay as they are).
    """
    item: dict[str, Any] = {"type": TOKEN_PROMPT_TYPE, "token_ids": list(token_ids)}
    if chain_of is not None:
        item[CHAIN_OF_KEY] = chain_of
    return item


def token_prompt_of(items: Sequence[Any]) -> list[int] | None:
    """The prompt ids of a token-in request (its one :func:`token_prompt_item`), else None."""
    if len(items) != 1 or not isinstance(items[0], dict):
        return None
    item = items[0]
    if item.get("type") != TOKEN_PROMPT_TYPE:
        return None
    ids = item.get("token_ids")
    if not isinstance(ids, list) or not all(type(t) is int and t >= 0 for t in ids):
        raise CaptureHistoryUnrepresentable("a token prompt needs a list of non-negative ids")
    return ids


def token_prompt_chain_of(items: Sequence[Any]) -> str | None:
    """The call a token-in request says it extends (see :func:`token_prompt_item`), else None."""
    if len(items) != 1 or not isinstance(items[0], dict):
        return None
    hint = items[0].get(CHAIN_OF_KEY)
    if hint is None or items[0].get("type") != TOKEN_PROMPT_TYPE:
        return None
    if not isinstance(hint, str) or not hint:
        raise CaptureHistoryUnrepresentable("a token prompt's chain_of must be a call id string")
    return hint


def chain_hint_item(chain_of: str) -> dict[str, Any]:
    """The item a text request (Chat, Responses) appends, for resolution only, to name the
    chain it extends: ``chain_of`` is its parent or any ancestor. Among calls whose echoed
    history and ids are identical (the samples of a group from a peaked policy) only the one on
    that chain is the parent. Never stamped or hashed: strip it with :func:`split_chain_hint`.
    """
    return {"type": CHAIN_HINT_TYPE, CHAIN_OF_KEY: chain_of}


def split_chain_hint(items: Sequence[Any]) -> tuple[Sequence[Any], str | None]:
    """The request items without a trailing :func:`chain_hint_item`, and the chain it names."""
    if not items or not isinstance(items[-1], dict) or items[-1].get("type") != CHAIN_HINT_TYPE:
        return items, None
    hint = items[-1].get(CHAIN_OF_KEY)
    if not isinstance(hint, str) or not hint:
        raise CaptureHistoryUnrepresentable("a chain hint's chain_of must be a call id string")
    return items[:-1], hint


def has_model_authored_item(items: Iterable[Any]) -> bool:
    """Whether a request may continue a recorded call (a token-in prompt always may)."""
    items = list(split_chain_hint(list(items))[0])
    if token_prompt_of(items) is not None:
        return True
    return any(isinstance(item, dict) and is_model_authored(item) for item in items)


def _token_fingerprint(entry: TokenEntry) -> str:
    """The lookup key of a token-in call: its own ids, in a domain no chat request hashes to."""
    h = hashlib.sha256(TOKEN_PREFIX_DOMAIN)
    h.update((entry.digest or "").encode())
    return h.hexdigest()


def stamp_continuation(entry: TokenEntry, request_items: Sequence[dict[str, Any]]) -> TokenEntry:
    """A copy of ``entry`` carrying its continuation lookup metadata (call before ``put``).

    The fingerprint covers the request's model-authored items plus this call's own output, so a
    faithful next request (this request + echoed output + new user/tool items) looks it up. A
    token-in call is looked up by its ids instead; its fingerprint only makes it visible.
    """
    items = list(request_items)
    if token_prompt_of(items) is not None:
        return entry.with_changes(
            continuation_fingerprint=_token_fingerprint(entry),
            continuation_context_len=len(items),
            continuation_context_digest=conversation_digest(items),
            fingerprint_version=FINGERPRINT_VERSION,
        )
    return entry.with_changes(
        continuation_fingerprint=assistant_fingerprint([*items, *entry.output_items]),
        continuation_context_len=len(items),
        continuation_context_digest=conversation_digest(items),
        fingerprint_version=FINGERPRINT_VERSION,
    )


# --------------------------------------------------------------------------- matcher


@dataclass(frozen=True, slots=True)
class LineageNode:
    """What matching needs of one committed call (no token arrays)."""

    call_id: str
    fingerprint: str
    cum_len: int
    digest: str
    context_len: int
    context_digest: str
    parent_call_id: str | None = None
    prompt_is_delta: bool = False

    @classmethod
    def of(cls, entry: TokenEntry) -> LineageNode | None:
        """The node of a stamped entry; ``None`` (invisible) when unstamped, stamped with
        another fingerprint version, or a delta record without its cumulative length."""
        if not entry.continuation_fingerprint or entry.fingerprint_version != FINGERPRINT_VERSION:
            return None
        cum_len = entry.cum_len
        if cum_len is None:
            if entry.prompt_is_delta:
                return None
            cum_len = len(entry.prompt_token_ids) + len(entry.generation_token_ids)
        return cls(
            call_id=entry.model_call_id,
            fingerprint=entry.continuation_fingerprint,
            cum_len=cum_len,
            digest=entry.digest or "",
            context_len=entry.continuation_context_len,
            context_digest=entry.continuation_context_digest,
            parent_call_id=entry.parent_call_id,
            prompt_is_delta=entry.prompt_is_delta,
        )


@dataclass
class RolloutLineage:
    """Append-only matcher over one rollout's committed calls."""

    by_fingerprint: dict[str, list[str]] = field(default_factory=dict)
    nodes: dict[str, LineageNode] = field(default_factory=dict)
    conflicted: set[str] = field(default_factory=set)
    by_len: dict[int, list[str]] = field(default_factory=dict)  # cum_len -> ids with a digest

    @classmethod
    def from_entries(cls, entries: Iterable[TokenEntry]) -> RolloutLineage:
        lineage = cls()
        for entry in entries:
            lineage.add_entry(entry)
        return lineage

    def add_entry(self, entry: TokenEntry) -> bool:
        """Index ``entry``; False when it is invisible to resolution.

        A call id seen again with different lookup data (two committed payloads) is a conflict:
        from then on it is no candidate at all.
        """
        node = LineageNode.of(entry)
        if node is None:
            return False
        known = self.nodes.get(node.call_id)
        if known is not None:
            if known != node:
                self.conflicted.add(node.call_id)
            return True
        self.nodes[node.call_id] = node
        self.by_fingerprint.setdefault(node.fingerprint, []).append(node.call_id)
        if node.digest:
            self.by_len.setdefault(node.cum_len, []).append(node.call_id)
        return True

    def resolve_prefix(
        self, prompt: Sequence[int], chain_of: str | None = None
    ) -> tuple[ParentResolutionStatus, LineageNode | None, str]:
        """A token-in request's parent: the call whose prompt + generation ids are the longest
        prefix of ``prompt`` (any dialect recorded it). Calls with equal ids are one candidate
        (the smallest id), so this never guesses; no prefix at all makes the request a root.

        With ``chain_of`` only calls on that call's chain count (it or its descendants by
        recorded parent), so identical calls keep their identities; no such prefix is
        UNRESOLVED ``not_on_named_chain``, never a silent switch to another chain.
        """
        for n in sorted((n for n in self.by_len if 0 < n <= len(prompt)), reverse=True):
            want = compute_digest(prompt[:n])
            hits = [
                self.nodes[c]
                for c in self.by_len[n]
                if c not in self.conflicted
                and self.nodes[c].digest == want
                and (chain_of is None or self._on_chain(c, chain_of))
            ]
            if hits:
                return ParentResolutionStatus.RESOLVED, min(hits, key=lambda c: c.call_id), ""
        if chain_of is not None:
            return ParentResolutionStatus.UNRESOLVED, None, NOT_ON_CHAIN
        return ParentResolutionStatus.ROOT, None, ""

    def _on_chain(self, call_id: str, ancestor: str) -> bool:
        """Whether ``ancestor`` is ``call_id`` or one of its recorded parents."""
        seen: set[str] = set()
        current: str | None = call_id
        while current is not None and current not in seen:
            if current == ancestor:
                return True
            seen.add(current)
            node = self.nodes.get(current)
            current = node.parent_call_id if node is not None else None
        return False

    def resolve_node(
        self, request_items: Sequence[dict[str, Any]], fingerprint: str | None = None
    ) -> tuple[ParentResolutionStatus, LineageNode | None, str]:
        """The decision without tokens: (status, winning node, reason).

        A text request that names a chain (:func:`chain_hint_item`) only matches calls on it
        (that call or its descendants by recorded parent); matches elsewhere alone are
        UNRESOLVED ``not_on_named_chain``, never a silent switch to another chain.
        """
        request_items, chain_of = split_chain_hint(request_items)
        prompt = token_prompt_of(request_items)
        if prompt is not None:
            return self.resolve_prefix(prompt, chain_of or token_prompt_chain_of(request_items))
        fp = assistant_fingerprint(request_items) if fingerprint is None else fingerprint
        if not fp:
            return ParentResolutionStatus.ROOT, None, ""
        matched = self._context_matches(request_items, fp)
        candidates = [c for c in matched if chain_of is None or self._on_chain(c.call_id, chain_of)]
        # Identical token sequences are interchangeable for training: one candidate.
        if (
            len(candidates) > 1
            and candidates[0].digest
            and len({(c.digest, c.cum_len) for c in candidates}) == 1
        ):
            candidates = [min(candidates, key=lambda c: c.call_id)]
        if len(candidates) != 1:
            reason = AMBIGUOUS if candidates else NOT_ON_CHAIN if matched else NO_MATCH
            if _last_turn_textless(request_items):
                reason = TEXTLESS_TURN
            return ParentResolutionStatus.UNRESOLVED, None, reason
        return ParentResolutionStatus.RESOLVED, candidates[0], ""

    def _context_matches(
        self, request_items: Sequence[dict[str, Any]], fp: str
    ) -> list[LineageNode]:
        """The calls with fingerprint ``fp`` whose recorded request the request extends."""
        digests: dict[int, str] = {}
        matched: list[LineageNode] = []
        for call_id in self.by_fingerprint.get(fp, ()):
            node = self.nodes[call_id]
            if call_id in self.conflicted or not node.context_digest:
                continue
            n = node.context_len
            if len(request_items) < n:
                continue
            if n not in digests:
                digests[n] = conversation_digest(request_items[:n])
            if digests[n] == node.context_digest:
                matched.append(node)
        return matched

    def resolve(
        self,
        request_items: Sequence[dict[str, Any]],
        tokens_of: Callable[[LineageNode], Sequence[int] | None],
        fingerprint: str | None = None,
    ) -> LineageResolution:
        """The decision with the winner's cumulative tokens (``tokens_of`` loads them).

        Tokens that cannot be loaded or do not hash to the node's digest fail closed.
        """
        status, node, reason = self.resolve_node(request_items, fingerprint)
        if node is None:
            return LineageResolution(status, reason=reason)
        tokens = tokens_of(node)
        if tokens is None or not _tokens_match(node, tokens):
            return LineageResolution(ParentResolutionStatus.UNRESOLVED, reason=PARENT_UNAVAILABLE)
        return LineageResolution(
            ParentResolutionStatus.RESOLVED,
            match=LineageMatch(
                model_call_id=node.call_id,
                cumulative_token_ids=tuple(tokens),
                digest=node.digest or compute_digest(tokens),
                prev_len=node.cum_len,
            ),
        )


def _last_turn_textless(request_items: Sequence[dict[str, Any]]) -> bool:
    """Whether the last model-authored item echoes no text and no tool call: an empty reply or
    ids that decode to nothing, which text cannot carry back (token-in can)."""
    for item in reversed(request_items):
        if is_model_authored(item):
            return not content_parts(item.get("content")) and not tool_calls(item)
    return False


def _tokens_match(node: LineageNode, tokens: Sequence[int]) -> bool:
    if len(tokens) != node.cum_len:
        return False
    return not node.digest or compute_digest(tokens) == node.digest


def materialize(call_id: str, entries: Mapping[str, TokenEntry]) -> list[int] | None:
    """Cumulative tokens of ``call_id``, walking delta prompts back to a full-prompt anchor.

    ``None`` when a link is missing, the chain cycles, or a delta record has no parent.
    """
    path: list[TokenEntry] = []
    seen: set[str] = set()
    current: str | None = call_id
    while current is not None:
        entry = entries.get(current)
        if entry is None or current in seen:
            return None
        seen.add(current)
        path.append(entry)
        if not entry.prompt_is_delta:
            break
        current = entry.parent_call_id
        if current is None:
            return None
    tokens: list[int] = []
    for entry in reversed(path):
        tokens += entry.prompt_token_ids
        tokens += entry.generation_token_ids
    return tokens


def chain_ids(call_id: str, parents: Mapping[str, tuple[str | None, bool]]) -> list[str]:
    """The call ids ``materialize`` needs for ``call_id`` (from parent/delta metadata)."""
    out: list[str] = []
    current: str | None = call_id
    while current is not None and current not in out:
        out.append(current)
        parent, delta = parents.get(current, (None, False))
        current = parent if delta else None
    return out


def resolve_among(
    request_items: Sequence[dict[str, Any]], entries: Iterable[TokenEntry]
) -> LineageResolution:
    """Resolve against a complete list of one rollout's entries (no caching)."""
    if not has_model_authored_item(request_items):
        return _ROOT
    by_id: dict[str, TokenEntry] = {}
    conflicted: set[str] = set()
    for entry in entries:
        known = by_id.setdefault(entry.model_call_id, entry)
        if known is not entry and known.canonical_bytes() != entry.canonical_bytes():
            conflicted.add(entry.model_call_id)  # two committed payloads: zero candidates
    usable = {cid: e for cid, e in by_id.items() if cid not in conflicted}
    lineage = RolloutLineage.from_entries(usable.values())
    lineage.conflicted |= conflicted
    return lineage.resolve(request_items, lambda node: materialize(node.call_id, usable))


def resolve_from_ledger(
    request_items: Sequence[dict[str, Any]], commits: Iterable[CaptureLedgerCommit]
) -> LineageResolution | None:
    """The parent among framework-staged ledger rows, when the entries gave no answer.

    A ledger ``record`` publishes a staged call for parent resolution: exactly one row must
    carry the request's fingerprint (current version) and a recorded request that the new
    request extends verbatim. The match has no token ids (the framework staged them); it
    names the staging chain, ``prev_len`` and ``chain_hash`` instead. None when no single row
    proves itself (failure rows carry no fingerprint, so they never count).
    """
    request_items = split_chain_hint(request_items)[0]
    fp = assistant_fingerprint(request_items)
    if not fp:
        return None
    rows = [
        c
        for c in commits
        if c.record.continuation_fingerprint == fp
        and c.record.fingerprint_version == FINGERPRINT_VERSION
    ]
    if len(rows) != 1:
        return None
    commit = rows[0]
    n = len(commit.request_items)
    if len(request_items) < n:
        return None
    if conversation_digest(request_items[:n]) != conversation_digest(commit.request_items):
        return None
    record = commit.record
    return LineageResolution(
        ParentResolutionStatus.RESOLVED,
        match=LineageMatch(
            model_call_id=record.model_call_id,
            cumulative_token_ids=(),
            digest=record.digest,
            staging_chain=commit.staging_chain,
            prev_len=record.cum_len,
            chain_hash=record.chain_hash,
        ),
    )


# --------------------------------------------------------------------------- incremental

EntryFetch = Callable[
    [str, Callable[[Mapping[str, str]], Iterable[str]]],
    tuple[Mapping[str, str], Sequence[TokenEntry]],
]
"""A store's blocking read primitive: ``fetch(rollout_id, select)`` takes the rollout's read
lock (or one read transaction), passes the current ``{call_id: entry key}`` map to ``select``,
and returns that map with the entries of the call ids ``select`` chose."""


class _Cached:
    __slots__ = ("keys", "lineage", "parents")

    def __init__(self) -> None:
        self.keys: dict[str, str] = {}
        self.lineage = RolloutLineage()
        self.parents: dict[str, tuple[str | None, bool]] = {}


class IncrementalResolver:
    """A per-client lineage cache over any store (blocking; stores call it off the loop).

    Each look passes the cached ``{call_id: key}`` map to the store's :data:`EntryFetch`
    inside its read lock and reads only the entries that are new. If any cached call is gone
    or changed (a retire, or a delete and re-use of the rollout id) the rollout's cache is
    rebuilt from scratch. A RESOLVED answer loads only the winner (and, for a delta record, its
    chain back to a full prompt) and checks the tokens against the recorded digest.
    """

    def __init__(self, fetch: EntryFetch, *, max_rollouts: int = 4096) -> None:
        if max_rollouts < 1:
            raise ValueError("max_rollouts must be >= 1")
        self._fetch = fetch
        self._max = max_rollouts
        self._cache: OrderedDict[str, _Cached] = OrderedDict()
        self._guard = threading.Lock()
        self._locks = tuple(threading.Lock() for _ in range(64))
        self.entries_read = 0  # how many entries were parsed (tests check incrementality)

    def _cached(self, rollout_id: str) -> _Cached:
        with self._guard:
            cached = self._cache.get(rollout_id)
            if cached is None:
                cached = self._cache[rollout_id] = _Cached()
                while len(self._cache) > self._max:
                    self._cache.popitem(last=False)
            else:
                self._cache.move_to_end(rollout_id)
            return cached

    def _refresh(self, rollout_id: str, cached: _Cached) -> _Cached:
        stale = False

        def select(keys: Mapping[str, str]) -> list[str]:
            nonlocal stale
            known = cached.keys
            stale = len(keys) < len(known) or any(keys.get(c) != k for c, k in known.items())
            if stale:
                return list(keys)
            return [c for c in keys if c not in known]

        keys, entries = self._fetch(rollout_id, select)
        self.entries_read += len(entries)
        if stale:
            cached = _Cached()
            with self._guard:
                if rollout_id in self._cache:
                    self._cache[rollout_id] = cached
        for entry in entries:
            cached.lineage.add_entry(entry)
            cached.parents[entry.model_call_id] = (entry.parent_call_id, entry.prompt_is_delta)
        cached.keys = dict(keys)
        return cached

    def _tokens(self, rollout_id: str, cached: _Cached, node: LineageNode) -> list[int] | None:
        wanted = chain_ids(node.call_id, cached.parents)
        expect = {c: cached.keys.get(c) for c in wanted}
        _, entries = self._fetch(
            rollout_id, lambda keys: [c for c in wanted if keys.get(c) == expect[c]]
        )
        return materialize(node.call_id, {e.model_call_id: e for e in entries})

    def resolve(
        self, rollout_id: str, request_items: Sequence[dict[str, Any]]
    ) -> LineageResolution:
        """Blocking resolve (see :class:`IncrementalResolver`)."""
        bare, _ = split_chain_hint(request_items)
        fp = None if token_prompt_of(bare) is not None else assistant_fingerprint(bare)
        if fp == "":
            return _ROOT
        lock = self._locks[hash(rollout_id) % len(self._locks)]
        with lock:
            cached = self._refresh(rollout_id, self._cached(rollout_id))
            return cached.lineage.resolve(
                request_items, lambda node: self._tokens(rollout_id, cached, node), fp
            )

    def forget(self, rollout_id: str) -> None:
        """Drop a rollout's cache (it is rebuilt on the next look)."""
        with self._guard:
            self._cache.pop(rollout_id, None)
