"""TRL's GRPOTrainer trains, for real on CPU, from the groups a streaming capture source admits:
a tiny random Llama generated the rollouts, a toy verifier scored them, TRL trains the
admitted groups in order with their captured tokens and rewards, and each is marked trained."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoTokenizer

from tests.capture._pg import connections, drained, pg_dsn, pg_url, tagged  # noqa: F401
from tests.integrations._launch import run_job, torchrun_argv
from tests.integrations._trl_job import JOB_STEPS
from tests.integrations._trl_parts import (
    GROUPS_PER_STEP,
    STEPS,
    N,
    generate,
    grpo_trainer,
    pipeline,
    tiny,
)
from tests.ops._chat import make_tokenizer_dir
from zephon.capture.stores import open_store
from zephon.errors import CheckpointError
from zephon.integrations.trl import CapturedRollouts

pytestmark = [
    pytest.mark.timeout(600),
    pytest.mark.filterwarnings("error::ResourceWarning"),
    pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning"),
    # TRL 1.16 uses names transformers 5.25 deprecated (not ours to fix)
    pytest.mark.filterwarnings("ignore:.*is deprecated and will be removed in v6:FutureWarning"),
]


@pytest.fixture
def captured(tmp_path: Path) -> tuple[str, Any]:
    """A file store whose stream holds every prompt's scored group, and the tokenizer."""
    os.environ["TRL_EXPERIMENTAL_SILENCE"] = "1"
    tok = AutoTokenizer.from_pretrained(make_tokenizer_dir(tmp_path / "tok"))
    tok.pad_token = tok.eos_token
    url = (tmp_path / "capture").as_uri()
    asyncio.run(generate(url, tiny(len(tok)), tok))
    return url, tok


def _rollouts(url: str) -> CapturedRollouts:
    return CapturedRollouts(pipeline(url), url, num_generations=N)


def _trained(url: str) -> set[tuple[int, int]]:
    store = open_store(url)
    ledger = asyncio.run(store.stream_ledger("grpo"))
    asyncio.run(store.close())
    return {(row.position, m.step) for row in ledger.prompts for m in row.members if m.step >= 0}


def test_grpo_trains_the_admitted_groups_with_their_captured_tokens_and_rewards(
    captured: tuple[str, Any], tmp_path: Path
) -> None:
    url, tok = captured
    model = tiny(len(tok))
    before = [p.detach().clone() for p in model.parameters()]
    rollouts = _rollouts(url)
    trainer = grpo_trainer(
        rollouts, model, tok, tmp_path / "out", max_steps=STEPS, save_strategy="no"
    )
    trainer.train()

    assert trainer.state.global_step == STEPS
    served = rollouts.served
    assert len(served) == STEPS * GROUPS_PER_STEP
    versions = [g["trained_version"] for g in served]  # counts dropped groups too
    assert versions == sorted(versions)
    positions = [g["position"] for g in served]
    assert positions == sorted(positions)  # oldest first
    per_step = [served[GROUPS_PER_STEP * s : GROUPS_PER_STEP * (s + 1)] for s in range(STEPS)]
    logs = [h for h in trainer.state.log_history if "reward" in h]
    seen = 0
    for groups, log in zip(per_step, logs, strict=True):  # TRL trained the captured rollouts
        members = [m for g in groups for m in g["members"]]
        assert log["reward"] == pytest.approx(sum(m["reward"] for m in members) / len(members))
        seen += sum(len(m["input_ids"]) for m in members)
        assert log["num_tokens"] == seen
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    rollouts.close()
    assert _trained(url) == {(g["position"], g["trained_version"]) for g in served}


def test_a_run_resumed_from_a_trl_checkpoint_serves_the_next_groups(
    captured: tuple[str, Any], tmp_path: Path
) -> None:
    url, tok = captured
    want = [(r.payload["position"], r.payload["trained_version"]) for r in pipeline(url)]
    out = tmp_path / "out"
    first = _rollouts(url)
    grpo_trainer(first, tiny(len(tok)), tok, out, max_steps=2, save_steps=2).train()
    checkpoint = out / "checkpoint-2"
    assert (checkpoint / "zephon_rollouts.json").exists()
    second = _rollouts(url)  # a new process: a fresh pipeline, model and trainer
    second.resume(checkpoint)
    trainer = grpo_trainer(second, tiny(len(tok)), tok, out, max_steps=STEPS, save_steps=2)
    trainer.train(resume_from_checkpoint=str(checkpoint))
    assert trainer.state.global_step == STEPS
    served = [(g["position"], g["trained_version"]) for g in first.served + second.served]
    assert served == want[: STEPS * GROUPS_PER_STEP]  # none skipped, none twice
    first.close()
    second.close()
    assert _trained(url) == set(served)


def test_a_group_of_another_size_and_a_checkpoint_without_the_position_are_refused(
    captured: tuple[str, Any], tmp_path: Path
) -> None:
    url, _ = captured
    rollouts = CapturedRollouts(pipeline(url), url, num_generations=N + 1)
    with pytest.raises(ValueError, match=rf"keep_per_prompt\(store, {N + 1}\)"):
        rollouts.rollout_func(["slot"] * (N + 1), None)
    with pytest.raises(ValueError, match="not a multiple of num_generations"):
        _rollouts(url).rollout_func(["slot"] * (N + 1), None)
    with pytest.raises(CheckpointError, match="saved without CapturedRollouts' callback"):
        _rollouts(url).resume(tmp_path)
    with _rollouts(url) as closed:
        closed.rollout_func(["slot"] * N, None)
    with pytest.raises(RuntimeError, match="was closed: make a new one"):
        closed.rollout_func(["slot"] * N, None)


def test_closing_the_rollouts_closes_the_stores_they_opened_but_not_one_passed_in(
    pg_dsn: str,  # noqa: F811
    pg_url: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    os.environ["TRL_EXPERIMENTAL_SILENCE"] = "1"
    tok = AutoTokenizer.from_pretrained(make_tokenizer_dir(tmp_path / "tok"))
    tok.pad_token = tok.eos_token
    url, name = tagged(pg_url)
    asyncio.run(generate(url, tiny(len(tok)), tok))
    with _rollouts(url) as rollouts:
        assert len(rollouts.rollout_func(["slot"] * N, None)["prompt_ids"]) == N
        assert connections(pg_dsn, name) >= 1
    assert drained(pg_dsn, name) == 0
    store = open_store(url)
    with CapturedRollouts(pipeline(url), store, num_generations=N) as passed:
        passed.rollout_func(["slot"] * N, None)
        passed.mark_trained()
    ledger = asyncio.run(store.stream_ledger("grpo"))  # still open: the caller's to close
    assert sum(m.step >= 0 for row in ledger.prompts for m in row.members) == N
    asyncio.run(store.close())
    assert drained(pg_dsn, name) == 0


def test_two_data_parallel_ranks_each_train_their_own_groups_exactly_once(
    captured: tuple[str, Any], tmp_path: Path
) -> None:
    url, _ = captured
    out = tmp_path / "job"
    run_job(torchrun_argv("_trl_job.py", out, url, tmp_path / "tok"), out)
    ranks = [json.loads((out / f"served-r{r}.json").read_text()) for r in (0, 1)]
    served: list[tuple[int, int, int]] = []
    for rank, job in enumerate(ranks):
        admissions = [a for a, _, _ in job["served"]]
        assert job["world"] == 2 and len(admissions) == JOB_STEPS * GROUPS_PER_STEP
        assert admissions == sorted(admissions) and {a % 2 for a in admissions} == {rank}
        served += [tuple(g) for g in job["served"]]
    positions = [p for _, p, _ in served]
    assert len(set(positions)) == len(positions)  # no group went to both ranks
    assert _trained(url) == {(p, v) for _, p, v in served}  # each marked trained, by its rank
    store = open_store(url)
    ledger = asyncio.run(store.stream_ledger("grpo"))
    log = asyncio.run(store.stream_ledger("grpo.admitted"))
    asyncio.run(store.close())
    reasons = {r.position: {m.reason for m in r.members} for r in ledger.prompts}
    for rank, job in enumerate(ranks):  # a rank's share, up to its last group: none skipped
        last = job["served"][-1][0]
        for g in range(rank, last + 1, 2):
            position = int(log.prompts[g].payload["position"])
            assert position in positions or reasons[position] == {"all rewards equal"}
