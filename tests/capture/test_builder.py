"""Builder fixtures: one scenario per branch of NeMo Gym's ``prefix_merging``, checked against
its chains and verdicts (lineage_vectors.json) and with explicit chains, masks and reasons."""

from __future__ import annotations

import json
import pathlib
from typing import Any

import numpy as np
import pytest

from zephon.capture.builder import RolloutBuild, build_rollout, prefix_merging
from zephon.capture.records import (
    EngineRefusalRecord,
    ParentResolutionStatus,
    TokenCaptureSnapshot,
    TokenEntry,
)

VECTORS = json.loads(
    (pathlib.Path(__file__).parent / "fixtures" / "lineage_vectors.json").read_text("utf-8")
)
SCENARIOS = {s["name"]: s for s in VECTORS["builder_scenarios"]}

# The fixture's token layout (see make_lineage_vectors.py).
P, G1, T1, G2, T2, G3 = [1, 2, 3], [10, 11], [20, 21, 22], [12, 13, 14], [23], [15]


def entries_of(name: str) -> list[TokenEntry]:
    return [TokenEntry.from_dict(e) for e in SCENARIOS[name]["entries"]]


def snapshot_of(
    name: str, *, incomplete: bool = False, refusals: tuple[EngineRefusalRecord, ...] = ()
) -> TokenCaptureSnapshot:
    return TokenCaptureSnapshot(
        rollout_id="r",
        entries=tuple(entries_of(name)),
        incomplete=incomplete,
        snapshot_id="s",
        version=1,
        engine_refusals=refusals,
    )


def build(name: str, *, incomplete: bool = False, **kw: Any) -> RolloutBuild:
    sc = SCENARIOS[name]
    snap = snapshot_of(name, incomplete=incomplete)
    kw.setdefault("terminal_call_id", sc.get("explicit_terminal_call_id"))
    kw.setdefault("terminal_response_id", sc.get("declared_response_id"))
    return build_rollout(snap, **kw)


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_matches_nemo_gym_builder(name: str) -> None:
    want = SCENARIOS[name]["expected"]
    b = build(name)
    assert b.attribution.call_id == want["terminal_call_id"]
    assert b.masked == want["mask_sample"], b.mask_reasons
    out = prefix_merging(entries_of(name), want["terminal_call_id"])
    got = [
        {
            "chain_id": c.chain_id,
            "call_ids": c.call_ids,
            "root_prompt": c.root_prompt,
            "interstitials": [link.interstitial for link in c.links],
        }
        for c in out.chains
    ]
    assert got == want["chains"]
    assert out.quarantined == want["quarantined"]
    n = out.notes
    mine = {k: getattr(n, k) for k in want["notes"]}
    assert mine == want["notes"]
    assert b.notes.decisions[-1].startswith("verdict: ")


def trajectory_of(b: RolloutBuild) -> tuple[list[int], list[int], list[float]]:
    assert b.trajectory is not None, b.mask_reasons
    t = b.trajectory
    assert len(t.input_ids) == len(t.loss_mask) == len(t.logprobs)
    return t.input_ids.tolist(), t.loss_mask.tolist(), t.logprobs.tolist()


def test_linear_chain_tokens_mask_and_logprobs() -> None:
    b = build("linear")
    assert not b.masked and b.mask_reasons == []
    ids, mask, lps = trajectory_of(b)
    assert ids == P + G1 + T1 + G2 + T2 + G3
    assert mask == [0] * 3 + [1] * 2 + [0] * 3 + [1] * 3 + [0] + [1]
    gen_lps = [round(x, 5) for x, m in zip(lps, mask, strict=True) if m]
    assert gen_lps == [-0.5, -0.51, -0.5, -0.51, -0.52, -0.5]
    assert all(x == 0.0 for x, m in zip(lps, mask, strict=True) if not m)
    assert b.trajectory is not None and b.trajectory.call_ids == ("c1", "c2", "c3")
    assert trajectory_of(build("linear_shuffled"))[0] == ids  # capture order is irrelevant


def test_corrupted_prefix_is_a_boundary() -> None:
    b = build("corrupted_prefix")
    assert b.masked and b.trajectory is None
    assert b.notes.parent_link_failures == {"parent_digest_mismatch": 1}
    assert set(b.mask_reasons) == {"unresolved_parent_calls", "roots=2", "chains=2"}
    assert [c.call_ids for c in b.output.chains] == [["c1"], ["c2"]]
    assert any("parent_digest_mismatch" in d for d in b.notes.decisions)


def test_missing_parent_recovered_by_unique_prefix() -> None:
    b = build("missing_parent_recovered")
    assert not b.masked
    ids, mask, _ = trajectory_of(b)
    assert ids == P + G1 + T1 + [30] + G3
    assert mask == [0, 0, 0, 1, 1, 0, 0, 0, 0, 1]
    assert b.notes.empty_generation_calls == ["c2"]


def test_missing_parent_without_evidence_masks() -> None:
    b = build("missing_parent")
    assert b.masked and "unresolved_parent_calls" in b.mask_reasons
    assert b.notes.unresolved_parent_calls == ["c2"]


def test_ambiguous_retries_mask_unless_terminal_names_one() -> None:
    b = build("ambiguous_retries")
    assert b.masked and b.mask_reasons == ["unresolved_retries"]
    assert b.notes.unresolved_retries == ["c2a", "c2b"]
    assert b.output.quarantined == ["c2b"]
    t = build("ambiguous_retries_terminal")
    assert not t.masked and t.notes.terminal_chain == "delivered"
    ids, mask, _ = trajectory_of(t)
    assert ids == P + G1 + T1 + [16, 17] and mask == [0, 0, 0, 1, 1, 0, 0, 0, 1, 1]
    e = build("retry_extended")
    assert not e.masked and e.output.quarantined == ["c2a"]
    assert e.trajectory is not None and e.trajectory.call_ids == ("c1", "c2b", "c3")


def test_unresolved_boundary_is_never_crossed() -> None:
    for name, reason in (
        ("unresolved_boundary", "parent_unresolved"),
        ("missing_resolution", "missing_resolution"),
    ):
        b = build(name)
        assert b.masked
        assert [c.call_ids for c in b.output.chains] == [["c1"], ["c2"]]
        assert b.notes.parent_link_failures == {reason: 1}


def test_empty_generation_dropped() -> None:
    b = build("empty_generation")
    assert not b.masked and b.notes.empty_generation_calls == ["c3"]
    ids, mask, _ = trajectory_of(b)
    assert ids == P + G1 + T1 + G2 and sum(mask) == 5


def test_terminal_delivered_broken_not_captured() -> None:
    side = build("two_roots_no_terminal")
    assert side.masked and side.mask_reasons == ["roots=2", "chains=2"]
    d = build("terminal_delivered")
    assert not d.masked and d.notes.terminal_chain == "delivered"
    assert d.attribution.method == "explicit"
    assert [c.chain_id for c in d.output.chains] == ["main", "branch-0"]
    assert d.trajectory is not None and d.trajectory.call_ids == ("c1", "c2")
    broken = build("terminal_broken")
    assert broken.masked and broken.mask_reasons == ["terminal_broken"]
    missing = build("terminal_not_captured")
    assert missing.masked and missing.mask_reasons == ["terminal_not_captured"]
    declared = build("terminal_declared")
    assert not declared.masked and declared.attribution.method == "declared"
    undeclared = build("terminal_declared_missing")
    assert undeclared.masked and undeclared.mask_reasons == ["terminal_unattributed"]
    assert "declared_terminal_not_captured" in undeclared.attribution.reason


def test_response_witnesses_attribute_or_abstain() -> None:
    entries = entries_of("linear")
    snap = TokenCaptureSnapshot(
        rollout_id="r", entries=tuple(entries), incomplete=False, snapshot_id="s", version=1
    )
    by_id = build_rollout(snap, response={"id": "resp-3", "output": []})
    assert by_id.attribution.call_id == "c3" and by_id.attribution.method == "response_id"
    clash = build_rollout(snap, terminal_call_id="c2", response={"id": "resp-3"})
    assert clash.attribution.call_id is None
    assert "witness_disagreement" in clash.attribution.reason
    assert not clash.masked  # no attribution and a clean single chain: single-chain policy


def test_delta_prompts_rebuilt_and_checked() -> None:
    b = build("delta_prompts")
    assert not b.masked
    assert trajectory_of(b)[0] == trajectory_of(build("linear"))[0]
    bad = build("delta_unreconstructable")
    assert bad.masked and bad.notes.parent_link_failures == {"delta_chain_unreconstructable": 1}


def test_incomplete_or_empty_snapshots_mask() -> None:
    b = build("linear", incomplete=True)
    assert b.masked and b.mask_reasons == ["capture_incomplete"] and b.trajectory is None
    empty = build_rollout(
        TokenCaptureSnapshot(
            rollout_id="r", entries=(), incomplete=False, snapshot_id="s", version=1
        )
    )
    assert empty.masked and empty.mask_reasons == [
        "no_entries",
        "roots=0",
        "chains=0",
        "no_generated_tokens",
    ]


def test_duplicate_conflict_counts_as_unresolved() -> None:
    b = build("duplicate_conflict")
    assert b.masked and "unresolved_parent_calls" in b.mask_reasons
    assert b.notes.parent_link_failures == {"duplicate_call_id_conflict": 1}


def test_large_token_ids_keep_exact_values() -> None:
    big = 2**40
    e = TokenEntry(
        rollout_id="r",
        model_call_id="c1",
        prompt_token_ids=[big],
        generation_token_ids=[big + 1],
        generation_log_probs=[-1.0],
        parent_resolution="root",  # type: ignore[arg-type]
    )
    snap = TokenCaptureSnapshot(
        rollout_id="r", entries=(e,), incomplete=False, snapshot_id="s", version=1
    )
    t = build_rollout(snap).trajectory
    assert t is not None and t.input_ids.dtype == np.int64
    assert t.input_ids.tolist() == [big, big + 1]


def _with_refusal(name: str, refusal: EngineRefusalRecord) -> RolloutBuild:
    return build_rollout(snapshot_of(name, refusals=(refusal,)))


RESOLVED, UNRESOLVED = ParentResolutionStatus.RESOLVED, ParentResolutionStatus.UNRESOLVED


def test_an_engine_refusal_is_placed_on_the_branch_it_continued() -> None:
    plain = build("linear")
    refused = _with_refusal(
        "linear",
        EngineRefusalRecord.of(
            model_call_id="c4", code="context_length_exceeded", parent_call_id="c3",
            parent_resolution=RESOLVED,
        ),
    )  # fmt: skip
    assert not refused.masked and refused.trajectory is not None
    main = refused.output.main
    assert main is not None and [r.model_call_id for r in main.refusals] == ["c4"]
    assert "engine refusal c4 (context_length_exceeded): ends chain main after c3" in (
        refused.notes.decisions
    )
    assert plain.output.main is not None and plain.output.main.refusals == []
    passed = _with_refusal(
        "linear", EngineRefusalRecord.of(model_call_id="c9", code="http_400",
                                         parent_call_id="c1", parent_resolution=RESOLVED),
    )  # fmt: skip
    assert not passed.masked
    assert any("c9 (http_400): a refused continuation of c1" in d for d in passed.notes.decisions)


@pytest.mark.parametrize("parent", [None, "gone"])
def test_an_engine_refusal_that_cannot_be_placed_masks(parent: str | None) -> None:
    status = UNRESOLVED if parent is None else RESOLVED
    refusal = EngineRefusalRecord.of(
        model_call_id="c4", code="http_400", parent_call_id=parent, parent_resolution=status
    )
    b = _with_refusal("linear", refusal)
    assert b.masked and b.mask_reasons == ["unplaced_engine_refusals"]
    assert b.notes.unplaced_refusals == ["c4"]
    assert not build("linear").masked


def test_a_rollout_spanning_two_weight_versions_has_behaviour_logprobs_and_segments() -> None:
    versions = {"c1": 3, "c2": 3, "c3": 4}  # the weights changed between c2 and c3
    entries = [
        e.with_changes(weight_version=versions[e.model_call_id]) for e in entries_of("linear")
    ]
    snap = TokenCaptureSnapshot(
        rollout_id="r", entries=tuple(entries), incomplete=False, snapshot_id="s", version=1
    )
    b = build_rollout(snap)
    _, mask, lps = trajectory_of(b)
    assert b.trajectory is not None
    # P=0:3 G1=3:5 T1=5:8 G2=8:11 T2=11:12 G3=12:13; T1 is masked inside the v3 segment
    assert b.trajectory.version_segments == ((3, 11, 3), (12, 13, 4))
    assert b.trajectory.oldest_version == 3
    row = b.trajectory.to_row()
    assert row["version_segments"] == [[3, 11, 3], [12, 13, 4]]
    assert row["behaviour_logprobs"].tolist() == lps
    gen_versions = [  # every generated token lies in the segment of its call's version
        next(v for s, e, v in row["version_segments"] if s <= i < e)
        for i, m in enumerate(mask)
        if m
    ]
    assert gen_versions == [3, 3, 3, 3, 3, 4]


def test_a_partly_versioned_rollout_names_its_unversioned_span_and_a_plain_one_none() -> None:
    entries = entries_of("linear")
    mixed = [e.with_changes(weight_version=7) if e.model_call_id == "c3" else e for e in entries]
    snap = TokenCaptureSnapshot(
        rollout_id="r", entries=tuple(mixed), incomplete=False, snapshot_id="s", version=1
    )
    traj = build_rollout(snap).trajectory
    assert traj is not None and traj.version_segments == ((3, 11, None), (12, 13, 7))
    assert traj.oldest_version == 7
    plain = build("linear").trajectory
    assert plain is not None and plain.version_segments == () and plain.oldest_version is None
    assert "version_segments" not in plain.to_row()
    assert "behaviour_logprobs" not in plain.to_row()
