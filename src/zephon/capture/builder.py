"""Frozen capture -> verified call chains -> one training sequence per rollout.

The builder trusts nothing it cannot re-check. It deduplicates entries, rebuilds delta prompts
and checks them against their recorded digest, drops calls that generated nothing, and links a
call to its recorded parent only if the digest of the child's prompt prefix equals the parent's
digest. An UNRESOLVED (or undecided) call starts a fragment: no parent is ever guessed across
it; a prefix search recovers a link only when the claimed parent is absent from the build and
exactly one earlier call matches. Retries (siblings with the same prompt) keep the one on the
terminal's path, else the one a later call extended, else the smallest id (then the rollout
is masked unless a terminal is attributed). Every decision is written to ``notes.decisions``.

The output of a rollout (:func:`build_rollout`) is its main chain as a :class:`Trajectory`:
token ids, a loss mask (0 on the root prompt and every interstitial, 1 on generated tokens)
and per-token log-probs (the captured ones on generated tokens, 0.0 elsewhere), plus the
masking verdict and its reasons. Facts follow NeMo Gym's ``prefix_merging``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from zephon.capture._refusals import place_refusals
from zephon.capture._terminal import (
    TerminalAttribution as TerminalAttribution,
)
from zephon.capture._terminal import (
    attribute_terminal as attribute_terminal,
)
from zephon.capture.lineage import materialize
from zephon.capture.records import (
    EngineRefusalRecord,
    ParentResolutionStatus,
    TokenCaptureSnapshot,
    TokenEntry,
    compute_digest,
)

__all__: list[str] = []  # its public names are exported by zephon.capture

_I32_MAX = 2**31 - 1


@dataclass(frozen=True, slots=True)
class ChainLink:
    """One call on a chain: its (full-prompt) entry and the prompt tokens added before it."""

    entry: TokenEntry
    interstitial: list[int]

    @property
    def call_id(self) -> str:
        return self.entry.model_call_id


@dataclass
class Chain:
    """A root-to-leaf (or root-to-terminal) path of verified links."""

    chain_id: str
    root_prompt: list[int]
    links: list[ChainLink] = field(default_factory=list)
    refusals: list[EngineRefusalRecord] = field(default_factory=list)  # refusals ending it

    @property
    def call_ids(self) -> list[str]:
        return [link.call_id for link in self.links]

    def to_trajectory(
        self, rollout_id: str = "", group: tuple[str, int, int] | None = None
    ) -> Trajectory:
        """The chain as a training sequence; ``group`` is ``(group id, index, size)`` when it
        is one sample of a group (the rollout is its own group of one otherwise)."""
        tokens: list[int] = list(self.root_prompt)
        mask: list[int] = [0] * len(tokens)
        logprobs: list[float] = [0.0] * len(tokens)
        for link in self.links:
            gen = link.entry.generation_token_ids
            tokens += link.interstitial
            tokens += gen
            mask += [0] * len(link.interstitial)
            mask += [1] * len(gen)
            logprobs += [0.0] * len(link.interstitial)
            logprobs += link.entry.generation_log_probs
        wide = bool(tokens) and max(tokens) > _I32_MAX
        return Trajectory(
            rollout_id=rollout_id,
            input_ids=np.asarray(tokens, dtype=np.int64 if wide else np.int32),
            loss_mask=np.asarray(mask, dtype=np.int8),
            logprobs=np.asarray(logprobs, dtype=np.float32),
            call_ids=tuple(self.call_ids),
            prompt_len=len(self.root_prompt),
            group_id=group[0] if group else rollout_id,
            group_index=group[1] if group else 0,
            group_size=group[2] if group else 1,
        )


@dataclass(frozen=True)
class Trajectory:
    """One training sequence: aligned token ids, loss mask and log-probs."""

    rollout_id: str
    input_ids: np.ndarray
    loss_mask: np.ndarray
    logprobs: np.ndarray
    call_ids: tuple[str, ...]
    prompt_len: int
    group_id: str = ""  # GRPO group: the samples of one n > 1 request share it
    group_index: int = 0
    group_size: int = 1

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def generated_tokens(self) -> int:
        return int(self.loss_mask.sum())

    def to_row(self) -> dict[str, Any]:
        """The pipeline payload: the three aligned arrays plus the rollout and group ids."""
        return {
            "input_ids": self.input_ids,
            "loss_mask": self.loss_mask,
            "logprobs": self.logprobs,
            "rollout_id": self.rollout_id,
            "group_id": self.group_id or self.rollout_id,
        }


@dataclass
class BuildNotes:
    """What the build kept, dropped or could not prove, and why (``decisions``)."""

    builder: str = "prefix_merging"
    roots: int = 0
    chains: int = 0
    generated_tokens_captured: int = 0
    generated_tokens_delivered: int = 0
    delivered_fraction: float = 0.0
    unresolved_retries: list[str] = field(default_factory=list)
    terminal_call_id: str | None = None
    terminal_chain: str = ""  # "", "delivered", "broken", "not_captured"
    empty_generation_calls: list[str] = field(default_factory=list)
    parent_link_failures: dict[str, int] = field(default_factory=dict)
    unresolved_parent_calls: list[str] = field(default_factory=list)
    unplaced_refusals: list[str] = field(default_factory=list)
    # calls whose link failed because the parent generated ids without text (send token-in)
    textless_parent_calls: list[str] = field(default_factory=list)
    decisions: list[str] = field(default_factory=list)

    def fail(self, call_id: str, reason: str, *, boundary: bool = True) -> None:
        self.parent_link_failures[reason] = self.parent_link_failures.get(reason, 0) + 1
        if boundary:
            self.unresolved_parent_calls.append(call_id)


@dataclass
class BuildOutput:
    chains: list[Chain]
    quarantined: list[str] = field(default_factory=list)
    notes: BuildNotes = field(default_factory=BuildNotes)

    @property
    def main(self) -> Chain | None:
        return next((c for c in self.chains if c.chain_id == "main"), None)


class _Node:
    __slots__ = ("boundary", "children", "cumulative", "entry", "parent", "quarantined")

    def __init__(self, entry: TokenEntry) -> None:
        self.entry = entry
        self.cumulative = entry.prompt_token_ids + entry.generation_token_ids
        self.parent: _Node | None = None
        self.children: list[_Node] = []
        self.quarantined = False
        self.boundary = False


class _Trie:
    """Cumulative sequences of earlier calls, for recovering a link to an absent parent."""

    _END = -1  # token ids are never negative

    def __init__(self) -> None:
        self.root: dict[int, Any] = {}

    def add(self, node: _Node) -> None:
        level = self.root
        for token in node.cumulative:
            level = level.setdefault(token, {})
        level.setdefault(self._END, []).append(node)

    def longest_prefix(self, prompt: Sequence[int]) -> list[_Node]:
        best: list[_Node] = []
        level: dict[int, Any] | None = self.root
        for token in prompt:
            level = level.get(token) if level is not None else None
            if level is None:
                break
            best = level.get(self._END, best)
        return best


def _dedupe(entries: Iterable[TokenEntry], notes: BuildNotes) -> list[TokenEntry]:
    out: dict[str, TokenEntry] = {}
    for entry in entries:
        known = out.get(entry.model_call_id)
        if known is None:
            out[entry.model_call_id] = entry
        elif (known.prompt_token_ids, known.generation_token_ids) != (
            entry.prompt_token_ids,
            entry.generation_token_ids,
        ):
            notes.fail(entry.model_call_id, "duplicate_call_id_conflict")
            notes.decisions.append(
                f"{entry.model_call_id}: two copies with different tokens; first kept, "
                "counted as an unresolved parent call"
            )
    return list(out.values())


def _materialize_deltas(entries: list[TokenEntry], notes: BuildNotes) -> list[TokenEntry]:
    by_id = {e.model_call_id: e for e in entries}
    out: list[TokenEntry] = []
    for entry in entries:
        if not entry.prompt_is_delta:
            out.append(entry)
            continue
        cid = entry.model_call_id
        cum = materialize(cid, by_id)
        if cum is None or (entry.digest and compute_digest(cum) != entry.digest):
            notes.fail(cid, "delta_chain_unreconstructable")
            why = "a link is missing" if cum is None else "the rebuilt tokens fail its digest"
            notes.decisions.append(f"{cid}: delta prompt not rebuilt ({why}); excluded")
            continue
        prompt = cum[: len(cum) - len(entry.generation_token_ids)]
        out.append(entry.with_changes(prompt_token_ids=prompt, prompt_is_delta=False))
        notes.decisions.append(f"{cid}: delta prompt rebuilt to {len(prompt)} tokens, digest ok")
    return out


def _link(node: _Node, by_id: dict[str, _Node], trie: _Trie | None, notes: BuildNotes) -> None:
    entry = node.entry
    cid, status, claimed = entry.model_call_id, entry.parent_resolution, entry.parent_call_id
    prompt = entry.prompt_token_ids
    if status is ParentResolutionStatus.ROOT:
        notes.decisions.append(f"{cid}: root (recorded decision)")
        return
    reason: str
    if status is ParentResolutionStatus.UNRESOLVED:
        reason = "parent_unresolved"
    elif status is ParentResolutionStatus.RESOLVED or claimed is not None:
        parent = by_id.get(claimed) if claimed is not None else None
        if claimed is None:
            reason = "resolved_parent_missing_id"
        elif parent is None:
            hits = trie.longest_prefix(prompt) if trie is not None else []
            if len(hits) == 1:
                node.parent = hits[0]
                hits[0].children.append(node)
                notes.fail(cid, "parent_call_id_missing_recovered", boundary=False)
                notes.decisions.append(
                    f"{cid}: parent {claimed} absent; unique prefix match links it to "
                    f"{hits[0].entry.model_call_id}"
                )
                return
            reason = "parent_call_id_missing"
        else:
            n = parent.entry.cum_len if parent.entry.cum_len is not None else len(parent.cumulative)
            want = parent.entry.digest or compute_digest(parent.cumulative)
            if n <= len(prompt) and compute_digest(prompt[:n]) == want:
                node.parent = parent
                parent.children.append(node)
                notes.decisions.append(f"{cid}: child of {claimed} (prefix digest verified)")
                return
            reason = "parent_digest_mismatch"
            if _textless(parent.entry):
                notes.textless_parent_calls.append(cid)
                notes.decisions.append(
                    f"{cid}: parent {claimed} generated {len(parent.entry.generation_token_ids)} "
                    "ids with no text, which a text request cannot carry back; send the prompt "
                    "as token ids (token-in) to continue such a call"
                )
    else:
        reason = "missing_resolution"
    node.boundary = True
    notes.fail(cid, reason)
    notes.decisions.append(f"{cid}: unresolved boundary ({reason}); starts a fragment")


def _textless(entry: TokenEntry) -> bool:
    """Whether a call's output has no text and no tool call (an empty reply, or ids that
    decode to nothing): its next text request cannot echo what it generated."""
    for item in entry.output_items:
        if item.get("type") == "function_call":
            return False
        for part in item.get("content") or []:
            if isinstance(part, dict) and part.get("text"):
                return False
    return True


def _retry_key(node: _Node) -> tuple[int, tuple[int, ...], int]:
    """Calls with one parent and one prompt are retries of each other, except the samples of
    one ``n > 1`` request (told apart by their index)."""
    sample = node.entry.group
    return (
        0 if node.parent is None else id(node.parent),
        tuple(node.entry.prompt_token_ids),
        -1 if sample is None else sample.index,
    )


def _resolve_retries(
    nodes: list[_Node], terminal: _Node | None, quarantined: list[str], notes: BuildNotes
) -> None:
    on_path: set[int] = set()
    walk = terminal
    while walk is not None:
        on_path.add(id(walk))
        walk = walk.parent
    groups: dict[tuple[int, tuple[int, ...], int], list[_Node]] = {}
    for node in nodes:
        groups.setdefault(_retry_key(node), []).append(node)
    for group in groups.values():
        if len(group) < 2:
            continue
        ids = sorted(n.entry.model_call_id for n in group)
        keep = [n for n in group if id(n) in on_path]
        why = "on the terminal's path"
        if not keep:
            keep = [n for n in group if any(not c.quarantined for c in n.children)]
            why = "extended by a later call"
        if not keep:
            keep = [min(group, key=lambda n: n.entry.model_call_id)]
            why = "smallest call id (no later evidence)"
            if terminal is None:
                notes.unresolved_retries.extend(n.entry.model_call_id for n in group)
                why += "; unresolved"
        notes.decisions.append(
            f"retry siblings {ids}: kept {sorted(n.entry.model_call_id for n in keep)} ({why})"
        )
        for node in group:
            if node not in keep and not node.quarantined:
                node.quarantined = True
                quarantined.append(node.entry.model_call_id)


def _path(node: _Node) -> list[_Node]:
    out: list[_Node] = []
    walk: _Node | None = node
    while walk is not None:
        out.append(walk)
        walk = walk.parent
    return out[::-1]


def _chain(path: list[_Node]) -> Chain:
    root = path[0].entry
    chain = Chain(chain_id="", root_prompt=list(root.prompt_token_ids))
    done = len(root.prompt_token_ids)
    for step, node in enumerate(path):
        prompt = node.entry.prompt_token_ids
        chain.links.append(ChainLink(node.entry, [] if step == 0 else prompt[done:]))
        done = len(prompt) + len(node.entry.generation_token_ids)
    return chain


def _kept(entries: Iterable[TokenEntry], notes: BuildNotes) -> list[TokenEntry]:
    """Deduplicated, materialized entries that generated something, shortest prompt first."""
    kept = _materialize_deltas(_dedupe(entries, notes), notes)
    notes.empty_generation_calls = [e.model_call_id for e in kept if not e.generation_token_ids]
    for cid in notes.empty_generation_calls:
        notes.decisions.append(f"{cid}: generated nothing; dropped")
    return sorted(
        (e for e in kept if e.generation_token_ids),
        key=lambda e: (len(e.prompt_token_ids), e.model_call_id),
    )


def _forest(kept: list[TokenEntry], notes: BuildNotes) -> tuple[list[_Node], dict[str, _Node]]:
    """Every entry as a node linked to its parent (in order), and the nodes by call id."""
    present = {e.model_call_id for e in kept}
    missing_parent = any(e.parent_call_id not in present for e in kept if e.parent_call_id)
    trie = _Trie() if missing_parent else None  # only absent parents need the prefix search
    by_id: dict[str, _Node] = {}
    nodes: list[_Node] = []
    for entry in kept:
        node = _Node(entry)
        _link(node, by_id, trie, notes)
        nodes.append(node)
        by_id[entry.model_call_id] = node
        if trie is not None:
            trie.add(node)
    return nodes, by_id


def _terminal_chain(terminal: _Node | None, notes: BuildNotes) -> Chain | None:
    """The chain ending at the terminal call, unless its path is broken."""
    if terminal is None:
        return None
    path = _path(terminal)
    if any(n.quarantined or n.boundary for n in path):
        notes.terminal_chain = "broken"
        notes.decisions.append(f"terminal {notes.terminal_call_id}: its path is broken")
        return None
    notes.terminal_chain = "delivered"
    return _chain(path)


def _chains(
    nodes: list[_Node], terminal: _Node | None, main: Chain | None, notes: BuildNotes
) -> tuple[list[Chain], Chain | None]:
    """Every chain ending at a leaf (main first, named ``main``, the rest ``branch-<n>``) and
    the main chain: the terminal's, or else the one with the earliest root."""
    chains: list[Chain] = []
    for leaf in (n for n in nodes if not n.children):
        path = _path(leaf)
        if any(n.quarantined for n in path) or (main is not None and terminal in path):
            continue
        chains.append(_chain(path))
    if main is None and chains:
        main = min(chains, key=lambda c: (c.links[0].entry.created_at, c.links[0].call_id))
    elif main is not None:
        chains.insert(0, main)
    branches = (c for c in chains if c is not main)
    for branch, chain in enumerate(branches):
        chain.chain_id = f"branch-{branch}"
    if main is not None:
        main.chain_id = "main"
        how = "terminal delivered" if notes.terminal_chain == "delivered" else "earliest root"
        notes.decisions.append(f"main chain {main.call_ids} ({how})")
    return chains, main


def prefix_merging(
    entries: Iterable[TokenEntry], terminal_call_id: str | None = None
) -> BuildOutput:
    """Chains of one rollout's frozen entries (any order); see the module docstring."""
    notes = BuildNotes(terminal_call_id=terminal_call_id)
    kept = _kept(entries, notes)
    notes.terminal_chain = "not_captured" if terminal_call_id else ""
    if not kept:
        return BuildOutput([], [], notes)
    nodes, by_id = _forest(kept, notes)
    roots = [n for n in nodes if n.parent is None]
    terminal = by_id.get(terminal_call_id) if terminal_call_id else None
    quarantined: list[str] = []
    _resolve_retries(nodes, terminal, quarantined, notes)
    chains, main = _chains(nodes, terminal, _terminal_chain(terminal, notes), notes)
    captured = sum(len(e.generation_token_ids) for e in kept)
    delivered = sum(len(link.entry.generation_token_ids) for link in main.links) if main else 0
    notes.roots, notes.chains = len(roots), len(chains)
    notes.generated_tokens_captured = captured
    notes.generated_tokens_delivered = delivered
    notes.delivered_fraction = round(delivered / captured, 4) if captured else 0.0
    return BuildOutput(chains, quarantined, notes)


# --------------------------------------------------------------------------- rollouts


@dataclass
class RolloutBuild:
    """A rollout's build: the trajectory to train on (None if masked) and why."""

    rollout_id: str
    snapshot_id: str
    version: int
    masked: bool
    mask_reasons: list[str]
    output: BuildOutput
    attribution: TerminalAttribution
    trajectory: Trajectory | None = None
    trajectories: list[Trajectory] = field(default_factory=list)  # a group: one per sample

    @property
    def notes(self) -> BuildNotes:
        return self.output.notes


def _group_verdict(
    snapshot: TokenCaptureSnapshot, out: BuildOutput, group_ids: set[str]
) -> tuple[list[str], list[tuple[Chain, tuple[str, int, int]]]]:
    """A rollout with a group of samples: one chain per sample, nothing unresolved.

    Returns the mask reasons and each sample's chain with its ``(group id, index, size)``.
    """
    notes = out.notes
    reasons = ["capture_incomplete"] if snapshot.incomplete else []
    for flag, why in (
        (notes.unresolved_retries, "unresolved_retries"),
        (notes.unresolved_parent_calls, "unresolved_parent_calls"),
        (notes.unplaced_refusals, "unplaced_engine_refusals"),
    ):
        if flag:
            reasons.append(why)
    if len(group_ids) != 1:
        return [*reasons, f"groups={len(group_ids)}"], []
    samples: list[tuple[Chain, tuple[str, int, int]]] = []
    size = 0
    for chain in out.chains:
        members = [link.entry.group for link in chain.links if link.entry.group is not None]
        if len(members) != 1:
            reasons.append("chain_outside_group")
            continue
        size = members[0].size
        samples.append((chain, (f"{snapshot.rollout_id}/{members[0].id}", members[0].index, size)))
    samples.sort(key=lambda s: s[1][1])
    if sorted(s[1][1] for s in samples) != list(range(size)):
        reasons.append(f"group_samples={len(samples)}/{size}")
    if any(not c.links for c, _ in samples):
        reasons.append("no_generated_tokens")
    return list(dict.fromkeys(reasons)), samples


def _continued_as_one(entries: Sequence[TokenEntry]) -> str | None:
    """Why a group whose samples have identical ids broke, if its continuations all went to
    some of them: ids alone cannot tell such samples apart (the smallest id wins)."""
    children: dict[str, int] = {}
    for entry in entries:
        if entry.parent_call_id is not None:
            children[entry.parent_call_id] = children.get(entry.parent_call_id, 0) + 1
    twins: dict[str, list[str]] = {}
    for entry in entries:
        if entry.group is not None and entry.digest:
            twins.setdefault(entry.digest, []).append(entry.model_call_id)
    for ids in twins.values():
        busy = sorted(c for c in ids if children.get(c, 0) > 1)
        idle = sorted(c for c in ids if c not in children)
        if len(ids) > 1 and busy and idle:
            return (
                f"samples {idle} have the same ids as {busy}, which took all their "
                "continuations: a continuation that names no chain resolves to the smallest id "
                "among identical calls; name each sample's chain in the "
                "x-zephon-parent-call-id request header of its continuations (chat, responses "
                "or token-in completions)"
            )
    return None


def _build_group(snapshot: TokenCaptureSnapshot, group_ids: set[str]) -> RolloutBuild:
    """Build a rollout holding the samples of an ``n > 1`` request: a trajectory each."""
    out = prefix_merging(snapshot.entries)
    place_refusals(snapshot.engine_refusals, out)
    reasons, samples = _group_verdict(snapshot, out, group_ids)
    merged = _continued_as_one(snapshot.entries)
    if merged is not None:
        reasons.append("identical_samples_continued_as_one")
        out.notes.decisions.append(merged)
    trajectories = [chain.to_trajectory(snapshot.rollout_id, g) for chain, g in samples]
    out.notes.decisions.append(f"group of {len(samples)} sample chains")
    no_terminal = TerminalAttribution(None, "", reason="a group of samples has no one terminal")
    return _finish(snapshot, out, no_terminal, reasons, trajectories)


def _finish(
    snapshot: TokenCaptureSnapshot,
    out: BuildOutput,
    attribution: TerminalAttribution,
    reasons: list[str],
    trajectories: list[Trajectory],
) -> RolloutBuild:
    """The build with its verdict noted: trajectories only when nothing masks it."""
    out.notes.decisions.append(
        "verdict: masked (" + ", ".join(reasons) + ")" if reasons else "verdict: trainable"
    )
    return RolloutBuild(
        rollout_id=snapshot.rollout_id,
        snapshot_id=snapshot.snapshot_id,
        version=snapshot.version,
        masked=bool(reasons),
        mask_reasons=reasons,
        output=out,
        attribution=attribution,
        trajectory=None if reasons or not trajectories else trajectories[0],
        trajectories=[] if reasons else trajectories,
    )


def _verdict(
    snapshot: TokenCaptureSnapshot,
    out: BuildOutput,
    attribution: TerminalAttribution,
    declared: bool,
) -> list[str]:
    notes = out.notes
    reasons: list[str] = []
    if snapshot.incomplete:
        reasons.append("capture_incomplete")
    if not snapshot.entries:
        reasons.append("no_entries")
    if notes.terminal_chain != "delivered":
        if attribution.attributed or declared:
            reasons.append(f"terminal_{notes.terminal_chain or 'unattributed'}")
        else:
            if notes.unresolved_retries:
                reasons.append("unresolved_retries")
            if notes.unresolved_parent_calls:
                reasons.append("unresolved_parent_calls")
            if notes.unplaced_refusals:
                reasons.append("unplaced_engine_refusals")
            if notes.roots != 1:
                reasons.append(f"roots={notes.roots}")
            if notes.chains != 1:
                reasons.append(f"chains={notes.chains}")
    if out.main is None or notes.generated_tokens_delivered == 0:
        reasons.append("no_generated_tokens")
    return list(dict.fromkeys(reasons))


def build_rollout(
    snapshot: TokenCaptureSnapshot,
    *,
    terminal_call_id: str | None = None,
    terminal_response_id: str | None = None,
    response: dict[str, Any] | None = None,
) -> RolloutBuild:
    """Attribute the terminal, build the chains, decide the verdict, project the main chain.

    Masked when the capture is incomplete or empty, when an attributed (or declared) terminal
    was not delivered clean, or, without attribution, when anything is unresolved or the
    rollout is not exactly one root and one chain; never when the terminal chain is delivered
    (off-path calls are then excluded instead). An empty delivery is always masked.

    A rollout that holds the samples of an ``n > 1`` request (a GRPO group) yields one
    trajectory per sample in :attr:`RolloutBuild.trajectories`, each carrying the group id.
    """
    entries = list(snapshot.entries)
    group_ids = {e.group.id for e in entries if e.group is not None}
    if group_ids:
        return _build_group(snapshot, group_ids)
    attribution = attribute_terminal(
        entries, call_id=terminal_call_id, response_id=terminal_response_id, response=response
    )
    out = prefix_merging(entries, attribution.call_id)
    place_refusals(snapshot.engine_refusals, out)
    if attribution.attributed:
        out.notes.decisions.insert(
            0, f"terminal {attribution.call_id} attributed by {attribution.method}"
        )
    elif attribution.reason:
        out.notes.decisions.insert(0, f"no terminal attributed ({attribution.reason})")
    reasons = _verdict(snapshot, out, attribution, bool(terminal_response_id))
    main = out.main
    trajectories = [main.to_trajectory(snapshot.rollout_id)] if main is not None else []
    return _finish(snapshot, out, attribution, reasons, trajectories)
