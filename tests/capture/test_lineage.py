"""Lineage hashes against NeMo Gym's vectors, dialect invariance, stamping and the matcher."""

from __future__ import annotations

import copy
import hashlib
import json
import pathlib
from typing import Any

import pytest

from zephon.capture import lineage
from zephon.capture.lineage import (
    RolloutLineage,
    assistant_fingerprint,
    canonicalize_tool_arguments,
    conversation_digest,
    resolve_among,
    stamp_continuation,
)
from zephon.capture.protocols import CaptureHistoryUnrepresentable
from zephon.capture.records import ParentResolutionStatus, TokenEntry, compute_digest

VECTORS = json.loads(
    (pathlib.Path(__file__).parent / "fixtures" / "lineage_vectors.json").read_text("utf-8")
)
CASES = {c["name"]: c for c in VECTORS["hash_cases"]}


@pytest.mark.parametrize("name", sorted(CASES))
def test_hashes_match_nemo_gym_vectors(name: str) -> None:
    case = CASES[name]
    assert assistant_fingerprint(case["items"]) == case["fingerprint"]
    assert conversation_digest(case["items"]) == case["digest"]


def test_tool_arguments_match_nemo_gym() -> None:
    for row in VECTORS["tool_arguments"]:
        assert canonicalize_tool_arguments(row["value"]) == row["canonical"], row


def test_stamp_matches_nemo_gym_and_does_not_mutate() -> None:
    s = VECTORS["stamp"]
    entry = TokenEntry(
        rollout_id="r",
        model_call_id="c1",
        prompt_token_ids=[1, 2],
        generation_token_ids=[3],
        generation_log_probs=[-0.25],
        output_items=s["output_items"],
    )
    stamped = stamp_continuation(entry, s["request"])
    assert stamped.continuation_fingerprint == s["continuation_fingerprint"]
    assert stamped.continuation_context_len == s["continuation_context_len"]
    assert stamped.continuation_context_digest == s["continuation_context_digest"]
    assert stamped.fingerprint_version == s["fingerprint_version"] == 2
    assert entry.continuation_fingerprint == ""  # the input entry is untouched


def test_same_conversation_three_dialects() -> None:
    fps = {CASES[f"tools_{d}"]["fingerprint"] for d in ("chat", "responses", "anthropic")}
    assert len(fps) == 1 and fps != {""}
    # Reasoning items never enter the fingerprint; argument formatting does not matter.
    assert CASES["tools_chat_reserialised_args"]["fingerprint"] in fps
    assert CASES["tools_chat_reserialised_args"]["digest"] == CASES["tools_chat"]["digest"]
    text = {d: CASES[f"text_{d}"] for d in ("chat", "responses", "responses_plain", "anthropic")}
    assert len({c["fingerprint"] for c in text.values()}) == 1
    assert (
        text["chat"]["digest"] == text["anthropic"]["digest"] == text["responses_plain"]["digest"]
    )
    # The digest covers every item: an echoed reasoning item is context (pinned by NeMo Gym).
    assert text["responses"]["digest"] != text["responses_plain"]["digest"]


def test_reasoning_is_ignored_by_the_fingerprint() -> None:
    assert assistant_fingerprint(CASES["reasoning_only"]["items"]) == ""
    items = CASES["chat_reasoning_content"]["items"]
    stripped = copy.deepcopy(items)
    del stripped[1]["reasoning_content"]
    assert assistant_fingerprint(items) == assistant_fingerprint(stripped)
    responses = CASES["tools_responses"]["items"]
    without = [i for i in responses if i.get("type") != "reasoning"]
    assert assistant_fingerprint(without) == assistant_fingerprint(responses)


def test_tool_arguments_compare_canonically() -> None:
    base = CASES["tools_chat"]["items"]
    for args in ('{"unit":"C","city":"Paris"}', ' {"city" : "Paris", "unit" : "C"} '):
        items = copy.deepcopy(base)
        items[2]["tool_calls"][0]["function"]["arguments"] = args
        assert assistant_fingerprint(items) == CASES["tools_chat"]["fingerprint"]
    items = copy.deepcopy(base)
    items[2]["tool_calls"][0]["function"]["arguments"] = '{"city": "Lyon", "unit": "C"}'
    assert assistant_fingerprint(items) != CASES["tools_chat"]["fingerprint"]


def _field(tag: bytes, text: str) -> bytes:
    data = text.encode()
    return tag + len(data).to_bytes(8, "big") + data


def test_byte_layout_pinned() -> None:
    """The documented layout (docs/lineage.md), rebuilt by hand for a tiny conversation."""
    items: list[dict[str, Any]] = [
        {"role": "user", "content": "q"},
        {
            "role": "assistant",
            "content": "a",
            "tool_calls": [{"id": "t", "function": {"name": "f", "arguments": '{"b":1, "a":2}'}}],
        },
        {"role": "tool", "tool_call_id": "t", "content": "r"},
    ]
    fp = hashlib.sha256(
        b"nemo-gym-lineage"
        + _field(b"\x00", "text")
        + _field(b"\x01", "a")
        + _field(b"\x02", "t")
        + _field(b"\x03", "f")
        + _field(b"\x04", '{"a":2,"b":1}')
    ).hexdigest()
    assert assistant_fingerprint(items) == fp
    digest = hashlib.sha256(
        b"nemo-gym-lineage-context"
        + _field(b"\x00", "user")
        + _field(b"\x01", "text")
        + _field(b"\x02", "q")
        + _field(b"\x00", "assistant")
        + _field(b"\x01", "text")
        + _field(b"\x02", "a")
        + _field(b"\x03", "t")
        + _field(b"\x04", "f")
        + _field(b"\x05", '{"a":2,"b":1}')
        + _field(b"\x00", "tool")
        + _field(b"\x01", "text")
        + _field(b"\x02", "r")
        + _field(b"\x06", "t")
        + _field(b"\x07", "r")
    ).hexdigest()
    assert conversation_digest(items) == digest
    assert conversation_digest([]) == hashlib.sha256(b"nemo-gym-lineage-context").hexdigest()


def test_malformed_items_raise_clear_errors() -> None:
    with pytest.raises(ValueError, match="request item #1"):
        assistant_fingerprint([{"role": "user", "content": "q"}, "oops"])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="unsupported message content"):
        conversation_digest([{"role": "user", "content": {"x": 1}}])
    with pytest.raises(ValueError, match="exceeds 64 bits"):
        canonicalize_tool_arguments({"n": 2**70})


# --------------------------------------------------------------------------- matcher


def make_entry(
    call_id: str,
    request: list[dict[str, Any]],
    reply: str,
    prompt: list[int],
    gen: list[int],
    *,
    stamp: bool = True,
) -> TokenEntry:
    output = [
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": reply}],
        }
    ]
    full = prompt + gen
    entry = TokenEntry(
        rollout_id="r",
        model_call_id=call_id,
        prompt_token_ids=prompt,
        generation_token_ids=gen,
        generation_log_probs=[-0.1] * len(gen),
        output_items=output,
        cum_len=len(full),
        digest=compute_digest(full),
        parent_resolution=ParentResolutionStatus.ROOT,
    )
    return stamp_continuation(entry, request) if stamp else entry


REQ = [{"role": "user", "content": "2+2?"}]


def follow(entry: TokenEntry, text: str = "and 3+3?") -> list[dict[str, Any]]:
    return [*REQ, *entry.output_items, {"role": "user", "content": text}]


def test_matcher_resolves_faithful_continuation_only() -> None:
    e = make_entry("c1", REQ, "4", [1, 2], [3])
    res = resolve_among(follow(e), [e])
    assert res.status is ParentResolutionStatus.RESOLVED
    assert res.match is not None and res.match.model_call_id == "c1"
    assert list(res.match.cumulative_token_ids) == [1, 2, 3]
    rewritten = [{"role": "user", "content": "2+3?"}, *follow(e)[1:]]
    assert resolve_among(rewritten, [e]).reason == "no_match"
    assert resolve_among(REQ, [e]).status is ParentResolutionStatus.ROOT


def test_matcher_never_chooses_and_collapses_identical_retries() -> None:
    a = make_entry("c-b", REQ, "4", [1, 2], [3])
    b = make_entry("c-a", REQ, "4", [1, 2], [3])  # identical sequence: interchangeable
    res = resolve_among(follow(a), [a, b])
    assert res.match is not None and res.match.model_call_id == "c-a"
    c = make_entry("c-c", REQ, "4", [1, 2], [9])  # same text, different tokens
    res = resolve_among(follow(a), [a, b, c])
    assert res.status is ParentResolutionStatus.UNRESOLVED and res.reason == "ambiguous"


def test_unstamped_and_other_versions_are_invisible() -> None:
    plain = make_entry("c1", REQ, "4", [1, 2], [3], stamp=False)
    assert resolve_among(follow(plain), [plain]).reason == "no_match"
    v3 = make_entry("c1", REQ, "4", [1, 2], [3]).with_changes(fingerprint_version=3)
    assert not RolloutLineage().add_entry(v3)
    assert resolve_among(follow(v3), [v3]).reason == "no_match"


def test_conflicting_payloads_count_as_zero_candidates() -> None:
    e = make_entry("c1", REQ, "4", [1, 2], [3])
    other = make_entry("c1", REQ, "4", [1, 2], [7])
    lin = RolloutLineage.from_entries([e, other])
    status, node, reason = lin.resolve_node(follow(e))
    assert (status, node, reason) == (ParentResolutionStatus.UNRESOLVED, None, "no_match")


def test_delta_parent_is_materialised_and_verified() -> None:
    root = make_entry("c1", REQ, "4", [1, 2], [3])
    req2 = follow(root)
    full2 = [1, 2, 3, 5, 6, 7]
    child = stamp_continuation(
        TokenEntry(
            rollout_id="r",
            model_call_id="c2",
            prompt_token_ids=[5, 6],
            generation_token_ids=[7],
            generation_log_probs=[-0.2],
            output_items=[{"role": "assistant", "content": "6"}],
            parent_call_id="c1",
            parent_resolution=ParentResolutionStatus.RESOLVED,
            prompt_is_delta=True,
            cum_len=len(full2),
            digest=compute_digest(full2),
        ),
        req2,
    )
    req3 = [*req2, *child.output_items, {"role": "user", "content": "bye"}]
    res = resolve_among(req3, [root, child])
    assert res.match is not None and list(res.match.cumulative_token_ids) == full2
    forged = child.with_changes(digest=compute_digest([0]))
    res = resolve_among(req3, [root, forged])
    assert res.status is ParentResolutionStatus.UNRESOLVED
    assert res.reason == lineage.PARENT_UNAVAILABLE


def test_conflicting_payloads_for_one_call_id_are_zero_candidates() -> None:
    good = make_entry("c1", REQ, "4", [1, 2], [3])
    other = make_entry("c1", REQ, "4", [1, 2], [7])  # same call id, different committed bytes
    for order in ([good, other], [other, good]):
        res = resolve_among(follow(good), order)
        assert res.status is ParentResolutionStatus.UNRESOLVED, order
    assert resolve_among(follow(good), [good, good]).status is ParentResolutionStatus.RESOLVED


def test_unrepresentable_history_raises_the_typed_error() -> None:
    deep: Any = []
    for _ in range(300):
        deep = [deep]
    items = [{"role": "user", "content": [{"type": "input_image", "image": deep}]}]
    with pytest.raises(CaptureHistoryUnrepresentable, match="nesting deeper than 254"):
        lineage.conversation_digest(items)
    with pytest.raises(CaptureHistoryUnrepresentable, match="item #0 is a str"):
        lineage.assistant_fingerprint(["hi"])  # type: ignore[list-item]


def _identical_text_group() -> tuple[list[TokenEntry], list[dict[str, Any]]]:
    """Four samples with the same reply and ids, each continued by the same text, every
    continuation recorded under its own sample; and the third turn's request (the same for all)."""
    samples = [make_entry(f"s{k}", REQ, "4", [1, 2], [3]) for k in range(4)]
    second = follow(samples[0])
    nexts = [
        make_entry(f"c{k}", second, "6", [1, 2, 3, 4], [5]).with_changes(
            parent_call_id=f"s{k}", parent_resolution=ParentResolutionStatus.RESOLVED
        )
        for k in range(4)
    ]
    third = [*second, *nexts[0].output_items, {"role": "user", "content": "and 4+4?"}]
    return [*samples, *nexts], third


def test_a_chain_hint_keeps_identical_text_calls_apart() -> None:
    entries, third = _identical_text_group()
    second = follow(entries[0])
    for k in range(4):
        res = resolve_among([*second, lineage.chain_hint_item(f"s{k}")], entries)
        assert res.match is not None and res.match.model_call_id == f"s{k}"
        for named in (f"s{k}", f"c{k}"):  # the sample, or any later call of its chain
            res = resolve_among([*third, lineage.chain_hint_item(named)], entries)
            assert res.match is not None and res.match.model_call_id == f"c{k}"
            assert list(res.match.cumulative_token_ids) == [1, 2, 3, 4, 5]
    # without a hint identical calls are one candidate, the smallest id
    assert resolve_among(third, entries).match.model_call_id == "c0"  # type: ignore[union-attr]


def test_a_chain_hint_never_switches_chains_and_is_never_hashed() -> None:
    entries, third = _identical_text_group()
    unresolved = (ParentResolutionStatus.UNRESOLVED, "not_on_named_chain")
    # c1 is later than the calls the second turn echoes: none of them is on its chain
    for req in ([*follow(entries[0]), "c1"], [*third, "elsewhere"]):
        res = resolve_among([*req[:-1], lineage.chain_hint_item(req[-1])], entries)
        assert (res.status, res.reason) == unresolved
    fresh = [*REQ, {"role": "user", "content": "x"}, lineage.chain_hint_item("s1")]
    assert resolve_among(fresh, entries).status is ParentResolutionStatus.ROOT
    rewritten = [{"role": "user", "content": "2+3?"}, *third[1:], lineage.chain_hint_item("s1")]
    assert resolve_among(rewritten, entries).reason == "no_match"
    hinted = lineage.split_chain_hint([*third, lineage.chain_hint_item("s2")])
    assert (list(hinted[0]), hinted[1]) == (third, "s2")
    assert lineage.split_chain_hint(third) == (third, None)
    with pytest.raises(CaptureHistoryUnrepresentable, match="chain_of"):
        lineage.split_chain_hint([*third, {"type": "zephon_chain_of", "chain_of": 7}])
