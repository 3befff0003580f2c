"""Lineage by exact ids (token-in) and builds of sample groups, without a server."""

from __future__ import annotations

from zephon.capture.builder import build_rollout
from zephon.capture.lineage import (
    NOT_ON_CHAIN,
    RolloutLineage,
    resolve_among,
    stamp_continuation,
    token_prompt_chain_of,
    token_prompt_item,
    token_prompt_of,
)
from zephon.capture.records import (
    GROUP_FIELD,
    ParentResolutionStatus,
    SampleGroup,
    TokenCaptureSnapshot,
    TokenEntry,
    compute_digest,
)

ROOT, RESOLVED = ParentResolutionStatus.ROOT, ParentResolutionStatus.RESOLVED


def _entry(
    cid: str,
    prompt: list[int],
    gen: list[int],
    parent: str | None = None,
    group: SampleGroup | None = None,
) -> TokenEntry:
    entry = TokenEntry(
        rollout_id="r",
        model_call_id=cid,
        prompt_token_ids=prompt,
        generation_token_ids=gen,
        generation_log_probs=[-0.5] * len(gen),
        cum_len=len(prompt) + len(gen),
        digest=compute_digest([*prompt, *gen]),
        parent_call_id=parent,
        parent_resolution=RESOLVED if parent else ROOT,
    )
    if group is not None:
        entry = entry.with_extra_fields(**{GROUP_FIELD: group.to_wire()})
    return stamp_continuation(entry, [token_prompt_item(prompt)])


def test_a_prompt_continues_the_longest_recorded_id_prefix() -> None:
    a = _entry("a", [1, 2], [3])
    b = _entry("b", [1, 2, 3, 9], [4, 5], parent="a")
    other = _entry("c", [1, 2], [7])  # a sibling with other ids
    entries = [a, b, other]
    cases = {
        (1, 2, 3, 9, 4, 5, 6): "b",  # extends b (and a): the longest wins
        (1, 2, 3, 8): "a",
        (1, 2, 7, 7): "c",
        (1, 2, 3): "a",  # exactly a's ids: continues with an empty interstitial
    }
    for prompt, want in cases.items():
        res = resolve_among([token_prompt_item(list(prompt))], entries)
        assert res.status is RESOLVED and res.match is not None
        assert res.match.model_call_id == want
        assert list(res.match.cumulative_token_ids) == list(prompt[: res.match.prev_len])
    assert resolve_among([token_prompt_item([5, 1, 2])], entries).status is ROOT
    assert resolve_among([token_prompt_item([1])], entries).status is ROOT


def test_equal_ids_are_one_candidate_and_conflicts_none() -> None:
    twins = [_entry("x2", [1], [2]), _entry("x1", [1], [2])]
    res = resolve_among([token_prompt_item([1, 2, 3])], twins)
    assert res.match is not None and res.match.model_call_id == "x1"
    lineage = RolloutLineage.from_entries(twins)
    lineage.conflicted |= {"x1", "x2"}
    assert lineage.resolve_prefix([1, 2, 3])[0] is ROOT


def test_token_prompt_items_round_trip() -> None:
    assert token_prompt_of([token_prompt_item([3, 4])]) == [3, 4]
    assert token_prompt_of([{"role": "user", "content": "x"}]) is None


def _snapshot(entries: list[TokenEntry], incomplete: bool = False) -> TokenCaptureSnapshot:
    return TokenCaptureSnapshot(
        rollout_id="r", entries=tuple(entries), incomplete=incomplete, snapshot_id="s", version=1
    )


def test_a_group_builds_one_trajectory_per_sample() -> None:
    samples = [_entry(f"g-{k}", [1, 2], [10 + k], group=SampleGroup("g", k, 3)) for k in range(3)]
    nxt = _entry("n", [1, 2, 11, 5], [6], parent="g-1")
    build = build_rollout(_snapshot([*samples, nxt]))
    assert not build.masked, build.mask_reasons
    rows = [t.to_row() for t in build.trajectories]
    assert [r["input_ids"].tolist() for r in rows] == [[1, 2, 10], [1, 2, 11, 5, 6], [1, 2, 12]]
    assert {r["group_id"] for r in rows} == {"r/g"}
    assert [t.group_index for t in build.trajectories] == [0, 1, 2]
    assert build.trajectories[1].loss_mask.tolist() == [0, 0, 1, 0, 1]


def test_a_group_missing_a_sample_or_incomplete_is_masked() -> None:
    samples = [_entry(f"g-{k}", [1, 2], [10 + k], group=SampleGroup("g", k, 3)) for k in range(3)]
    assert build_rollout(_snapshot(samples[:2])).mask_reasons == ["group_samples=2/3"]
    assert build_rollout(_snapshot(samples, incomplete=True)).trajectories == []
    plain = build_rollout(_snapshot([_entry("p", [1], [2])]))
    assert plain.trajectories[0].to_row()["group_id"] == "r"


def _identical_group(turns: int) -> list[TokenEntry]:
    """Four identical samples, each continued ``turns - 1`` times with identical ids, every
    continuation naming (and recorded under) its own sample's chain."""
    entries = [_entry(f"g-{k}", [1, 2], [10], group=SampleGroup("g", k, 4)) for k in range(4)]
    for k in range(4):
        parent, cum = f"g-{k}", [1, 2, 10]
        for t in range(1, turns):
            prompt = [*cum, 50 + t]
            res = resolve_among([token_prompt_item(prompt, chain_of=f"g-{k}")], entries)
            assert res.match is not None and res.match.model_call_id == parent
            entries.append(_entry(f"c{t}-{k}", prompt, [60 + t], parent=parent))
            parent, cum = f"c{t}-{k}", [*prompt, 60 + t]
    return entries


def test_identical_calls_resolve_by_the_named_chain() -> None:
    entries = _identical_group(3)
    prompt = [1, 2, 10, 51, 61, 52, 62, 7]
    for k in range(4):
        for named in (f"g-{k}", f"c1-{k}", f"c2-{k}"):  # the sample, or any later call of it
            res = resolve_among([token_prompt_item(prompt, chain_of=named)], entries)
            assert res.status is RESOLVED and res.match is not None
            assert res.match.model_call_id == f"c2-{k}"
            assert list(res.match.cumulative_token_ids) == prompt[:-1]
    # without a name identical calls are one candidate, the smallest id
    res = resolve_among([token_prompt_item(prompt)], entries)
    assert res.match is not None and res.match.model_call_id == "c2-0"


def test_a_named_chain_the_ids_do_not_extend_is_unresolved() -> None:
    entries = _identical_group(2)
    for prompt, named in (([1, 2, 10, 51, 61], "nowhere"), ([9, 9], "g-1"), ([1, 2, 11], "g-1")):
        res = resolve_among([token_prompt_item(prompt, chain_of=named)], entries)
        assert (res.status, res.reason) == (ParentResolutionStatus.UNRESOLVED, NOT_ON_CHAIN)
    # a named chain never makes the request longer than the ids allow: the sample itself
    res = resolve_among([token_prompt_item([1, 2, 10, 99], chain_of="c1-3")], entries)
    assert res.status is ParentResolutionStatus.UNRESOLVED
    res = resolve_among([token_prompt_item([1, 2, 10, 99], chain_of="g-3")], entries)
    assert res.match is not None and res.match.model_call_id == "g-3"
    assert token_prompt_of([token_prompt_item([1], chain_of="g-0")]) == [1]
    assert token_prompt_chain_of([token_prompt_item([1], chain_of="g-0")]) == "g-0"
    assert token_prompt_chain_of([token_prompt_item([1])]) is None


def test_identical_named_chains_build_a_trainable_group_and_a_lost_call_masks_it() -> None:
    entries = _identical_group(3)
    build = build_rollout(_snapshot(entries))
    assert not build.masked, build.mask_reasons
    assert [list(t.call_ids) for t in build.trajectories] == [
        [f"g-{k}", f"c1-{k}", f"c2-{k}"] for k in range(4)
    ]
    rows = [t.input_ids.tolist() for t in build.trajectories]
    assert rows == [[1, 2, 10, 51, 61, 52, 62]] * 4
    lost_sample = [e for e in entries if e.model_call_id != "g-2"]
    assert "group_samples=3/4" in build_rollout(_snapshot(lost_sample)).mask_reasons
    # a lost middle call: three identical calls could stand in, so nothing is guessed
    lost_link = build_rollout(_snapshot([e for e in entries if e.model_call_id != "c1-1"]))
    assert lost_link.masked and "unresolved_parent_calls" in lost_link.mask_reasons
    assert lost_link.notes.parent_link_failures == {"parent_call_id_missing": 1}


def test_identical_samples_continued_without_a_chain_name_say_so() -> None:
    """Without names every continuation resolves to the smallest id: the group is masked with a
    reason that names the cause and the header that fixes it."""
    entries = [_entry(f"g-{k}", [1, 2], [10], group=SampleGroup("g", k, 4)) for k in range(4)]
    for k in range(4):
        prompt = [1, 2, 10, 50 + k]  # each sample's harness adds its own ids
        res = resolve_among([token_prompt_item(prompt)], entries)
        assert res.match is not None and res.match.model_call_id == "g-0"
        entries.append(_entry(f"c-{k}", prompt, [60], parent="g-0"))
    build = build_rollout(_snapshot(entries))
    assert build.masked and "identical_samples_continued_as_one" in build.mask_reasons
    assert "group_samples=7/4" in build.mask_reasons
    note = next(d for d in build.notes.decisions if "x-zephon-parent-call-id" in d)
    assert "['g-1', 'g-2', 'g-3']" in note and "['g-0']" in note
    named = _identical_group(2)
    assert not any(
        "x-zephon-parent-call-id" in d for d in build_rollout(_snapshot(named)).notes.decisions
    )
