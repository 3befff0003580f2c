"""Lineage by exact ids (token-in) and builds of sample groups, without a server."""

from __future__ import annotations

from zephon.capture.builder import build_rollout
from zephon.capture.lineage import (
    RolloutLineage,
    resolve_among,
    stamp_continuation,
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
