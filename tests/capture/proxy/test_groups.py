"""Groups of samples (``n > 1``): one request, n sibling calls, n trajectories sharing a prompt
and a group id (what a GRPO trainer normalises advantages over)."""

from __future__ import annotations

import json
from collections.abc import Callable

import httpx
import numpy as np
import pytest
from tokenizers import Tokenizer

from tests.capture.proxy._harness import CAP, RolloutRun
from tests.capture.proxy._procs import Proc
from tests.capture.proxy._text_groups import Via, text_group_rollout
from tests.capture.proxy._token_in import complete, group_rollout
from tests.capture.proxy.conftest import freeze
from zephon.capture.builder import build_rollout

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def encode(tokenizer: object) -> Callable[[str], list[int]]:
    tok = Tokenizer.from_file(str(tokenizer))
    return lambda text: list(tok.encode(text, add_special_tokens=False).ids)


def _expected(prompt: list[int], gen: list[int]) -> tuple[list[int], list[int]]:
    return [*prompt, *gen], [0] * len(prompt) + [1] * len(gen)


@pytest.mark.parametrize("stream", [False, True])
def test_chat_group_of_four_gives_four_trajectories(
    proxy: Proc, store_url: str, rid: str, stream: bool
) -> None:
    url = proxy.url + CAP.format(rid=rid) + "/v1/chat/completions"
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": f"Group task {rid}"}],
        "n": 4,
        "logprobs": True,
        "return_token_ids": True,
        "stream": stream,
    }
    with httpx.Client(timeout=60) as http:
        resp = http.post(url, json=body)
    assert resp.status_code == 200, resp.text
    assert resp.headers["x-zephon-capture"] == "committed"
    ids = resp.headers["x-zephon-model-call-ids"].split(",")
    assert (
        len(ids) == 4
        and resp.headers["x-zephon-group-id"] == resp.headers["x-zephon-model-call-id"]
    )
    if stream:
        chunks = [json.loads(e[6:]) for e in resp.text.split("\n\n") if e.startswith("data: {")]
        finished = {c["index"]: c["finish_reason"] for k in chunks for c in k["choices"]}
        assert sorted(finished) == [0, 1, 2, 3] and all(finished.values())
        assert resp.text.rstrip().endswith("data: [DONE]")
        assert not build_rollout(freeze(store_url, rid)).masked
        return
    data = resp.json()
    build = build_rollout(freeze(store_url, rid))
    assert not build.masked, build.mask_reasons
    assert len(build.trajectories) == 4
    assert len({t.group_id for t in build.trajectories}) == 1
    assert [t.group_index for t in build.trajectories] == [0, 1, 2, 3]
    prompt = data["prompt_token_ids"]
    gens = set()
    for traj, choice in zip(build.trajectories, data["choices"], strict=True):
        lps = [e["logprob"] for e in choice["logprobs"]["content"]]
        tokens, mask = _expected(prompt, choice["token_ids"])
        assert traj.input_ids.tolist() == tokens
        assert traj.loss_mask.tolist() == mask
        assert np.array_equal(traj.logprobs[len(prompt) :], np.asarray(lps, dtype=np.float32))
        assert traj.to_row()["group_id"] == traj.group_id
        gens.add(tuple(choice["token_ids"]))
    assert len(gens) > 1  # real samples, not four copies


def test_token_in_groups_continue_each_sample(
    proxy: Proc, store_url: str, rid: str, encode: Callable[[str], list[int]]
) -> None:
    with httpx.Client(timeout=60) as http:
        groups = {
            f"{rid}-{g}": group_rollout(http, proxy.url, f"{rid}-{g}", 4, 3, encode)
            for g in range(3)
        }
    trainable = 0
    for grid, runs in groups.items():
        build = build_rollout(freeze(store_url, grid))
        assert not build.masked, build.mask_reasons
        assert len(build.trajectories) == 4
        for traj, run in zip(build.trajectories, runs, strict=True):
            last = run.turns[-1]
            assert traj.input_ids.tolist() == [*last.prompt, *last.generation]
            assert list(traj.call_ids) == [t.call_id for t in run.turns]
            for t in run.turns[1:]:
                assert t.resolution == "resolved"
            trainable += 1
    assert trainable == 12


def _identical_groups(
    proxy: Proc, rid: str, encode: Callable[[str], list[int]], groups: int, name_chain: bool
) -> dict[str, list[RolloutRun]]:
    """A GRPO loop on a peaked policy (``top_k: 1``): ``groups`` requests of ``n=4`` identical
    samples, each sample continued twice by token-in (the four chains are token-identical)."""
    with httpx.Client(timeout=60) as http:
        return {
            f"{rid}-{g}": group_rollout(
                http,
                proxy.url,
                f"{rid}-{g}",
                4,
                3,
                encode,
                name_chain=name_chain,
                top_k=1,
            )
            for g in range(groups)
        }


def test_identical_samples_named_by_chain_keep_their_identities(
    proxy: Proc, store_url: str, rid: str, encode: Callable[[str], list[int]]
) -> None:
    groups = _identical_groups(proxy, rid, encode, 8, name_chain=True)
    masked = 0
    for grid, runs in groups.items():
        build = build_rollout(freeze(store_url, grid))
        masked += build.masked
        assert not build.masked, (build.mask_reasons, build.notes.decisions)
        rows = [t.input_ids.tolist() for t in build.trajectories]
        assert len(rows) == 4 and all(r == rows[0] for r in rows)  # really identical samples
        for k, (traj, run) in enumerate(zip(build.trajectories, runs, strict=True)):
            assert traj.group_index == k
            assert list(traj.call_ids) == [t.call_id for t in run.turns]
            assert traj.input_ids.tolist() == [*run.turns[-1].prompt, *run.turns[-1].generation]
            for before, turn in zip(run.turns, run.turns[1:], strict=False):
                assert (turn.resolution, turn.parent_call_id) == ("resolved", before.call_id)
    assert masked == 0


def test_identical_samples_without_a_chain_name_are_never_merged_into_one_sample(
    proxy: Proc, store_url: str, rid: str, encode: Callable[[str], list[int]]
) -> None:
    """Ids alone cannot tell identical samples apart: every continuation resolves to the
    smallest id, and the group is masked rather than trained with the wrong identities."""
    groups = _identical_groups(proxy, rid, encode, 1, name_chain=False)
    ((grid, runs),) = groups.items()
    assert {run.turns[1].parent_call_id for run in runs} == {runs[0].turns[0].call_id}
    build = build_rollout(freeze(store_url, grid))
    assert build.masked and "identical_samples_continued_as_one" in build.mask_reasons


def test_a_continuation_off_the_named_chain_masks_its_group(
    proxy: Proc, store_url: str, rid: str, encode: Callable[[str], list[int]]
) -> None:
    """Naming a call the ids do not extend is refused as a parent (never a silent switch to
    another chain), so the sample is lost and its group masked."""
    with httpx.Client(timeout=60) as http:
        runs = group_rollout(http, proxy.url, rid, 4, 1, encode, top_k=1)
        last = runs[2].turns[0]
        nxt = [*last.prompt, *last.generation, *encode(" sample turn 1")]
        other = group_rollout(http, proxy.url, f"{rid}-o", 2, 1, encode)[0].turns[0].call_id
        got = complete(http, proxy.url, rid, nxt, {"x-zephon-parent-call-id": other})
        bad = complete(http, proxy.url, rid, nxt, {"x-zephon-parent-call-id": "a b"})
        text = http.post(
            proxy.url + CAP.format(rid=rid) + "/v1/completions",
            json={"model": "tiny", "prompt": "plain text", "max_tokens": 4},
            headers={"x-zephon-parent-call-id": last.call_id},
        )
    assert got.status_code == 200 and got.headers["x-zephon-capture"] == "committed"
    assert got.headers["x-zephon-parent-resolution"] == "unresolved"
    assert got.headers["x-zephon-parent-resolution-reason"] == "not_on_named_chain"
    assert bad.status_code == 400 and "x-zephon-parent-call-id" in bad.json()["error"]["message"]
    assert text.status_code == 400 and "token-in" in text.json()["error"]["message"]
    build = build_rollout(freeze(store_url, rid))
    assert build.masked and "unresolved_parent_calls" in build.mask_reasons


def _check_sample_chains(build: object, runs: list[RolloutRun]) -> None:
    """One trajectory per sample, each the sample's own chain of calls, turn after turn."""
    trajectories = build.trajectories  # type: ignore[attr-defined]
    assert len(trajectories) == 4
    rows = [t.input_ids.tolist() for t in trajectories]
    assert all(r == rows[0] for r in rows)  # really identical samples
    for k, (traj, run) in enumerate(zip(trajectories, runs, strict=True)):
        assert traj.group_index == k and not run.failures
        assert list(traj.call_ids) == [t.call_id for t in run.turns]
        assert traj.input_ids.tolist() == [*run.turns[-1].prompt, *run.turns[-1].generation]
        for before, turn in zip(run.turns, run.turns[1:], strict=False):
            assert (turn.resolution, turn.parent_call_id) == ("resolved", before.call_id)
    assert len({c for t in trajectories for c in t.call_ids}) == 4 * len(runs[0].turns)


@pytest.mark.parametrize("via", ["chat", "responses"])
def test_identical_text_samples_named_by_chain_keep_their_identities(
    proxy: Proc, store_url: str, rid: str, via: Via
) -> None:
    """A GRPO loop on a peaked policy whose samples are continued over text: every echoed
    history is identical, the header tells the samples apart, and no group is masked."""
    masked = 0
    with httpx.Client(timeout=60) as http:
        for g in range(4):
            runs = text_group_rollout(http, proxy.url, f"{rid}-{g}", 3, via=via, top_k=1)
            build = build_rollout(freeze(store_url, f"{rid}-{g}"))
            masked += build.masked
            assert not build.masked, (build.mask_reasons, build.notes.decisions)
            _check_sample_chains(build, runs)
    assert masked == 0


@pytest.mark.parametrize("via", ["chat", "responses"])
def test_a_really_lost_text_sample_still_masks_its_group(
    proxy: Proc, store_url: str, rid: str, via: Via
) -> None:
    """Naming chains never hides a loss: an engine error on sample 2's continuation (the
    engine may have generated) masks the group, while its siblings kept their chains."""
    with httpx.Client(timeout=60) as http:
        runs = text_group_rollout(http, proxy.url, rid, 3, via=via, lose=2, top_k=1)
    assert [len(r.turns) for r in runs] == [3, 3, 1, 3]
    assert runs[2].failures and runs[2].failures[0][0] == 500
    for run in (runs[0], runs[1], runs[3]):
        assert [t.parent_call_id for t in run.turns[1:]] == [t.call_id for t in run.turns[:-1]]
    build = build_rollout(freeze(store_url, rid))
    assert build.masked and "capture_incomplete" in build.mask_reasons
    assert build.trajectories == []


def test_identical_text_samples_without_a_chain_name_are_never_merged(
    proxy: Proc, store_url: str, rid: str
) -> None:
    """Without the header an echoed history cannot tell identical samples apart: every
    continuation resolves to the smallest id and the group is masked, saying why."""
    with httpx.Client(timeout=60) as http:
        runs = text_group_rollout(http, proxy.url, rid, 2, via="chat", name_chain=False, top_k=1)
    assert {run.turns[1].parent_call_id for run in runs} == {min(r.turns[0].call_id for r in runs)}
    build = build_rollout(freeze(store_url, rid))
    assert build.masked and "identical_samples_continued_as_one" in build.mask_reasons
    note = next(d for d in build.notes.decisions if "x-zephon-parent-call-id" in d)
    assert "chat, responses" in note
