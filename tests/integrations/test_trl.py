"""TRL's GRPOTrainer trains, for real on CPU, from the groups a streaming capture source admits:
a tiny random Llama generated the rollouts, a toy verifier scored them, TRL trains the
admitted groups in order with their captured tokens and rewards, and each is marked trained."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM
from trl import GRPOConfig, GRPOTrainer

from tests.capture._rl_loop import prompt_pipeline
from tests.ops._chat import make_tokenizer_dir
from zephon.capture import RolloutScore, TokenEntry
from zephon.capture.rl import PromptSource
from zephon.capture.stores import open_store
from zephon.capture.streaming import StreamingCaptureSource
from zephon.errors import CheckpointError
from zephon.integrations.trl import CapturedRollouts

pytestmark = [
    pytest.mark.timeout(600),
    # TRL 1.16 itself still calls transformers' gradient-checkpointing names, deprecated in 5.x.
    pytest.mark.filterwarnings("ignore:.*is deprecated and will be removed in v6:FutureWarning"),
]
PROMPTS, N, STEPS, GROUPS_PER_STEP = 24, 2, 3, 2


def _tiny(vocab: int) -> Any:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
    )
    return LlamaForCausalLM(config)


async def _generate(url: str, model: Any, tok: Any) -> None:
    """Every prompt's group: sampled by the model, captured with its log-probs, scored by a
    toy verifier (an even-sum completion is right)."""
    store = open_store(url)
    source = await PromptSource.open(store, "grpo", prompt_pipeline(), n=N)
    torch.manual_seed(1)
    while (group := await source.next_group(weight_version=0)) is not None:
        prompt = tok(group.payload["prompt"])["input_ids"]
        for m in group.members:
            out = model.generate(
                torch.tensor([prompt]), do_sample=True, max_new_tokens=4, min_new_tokens=4,
                output_scores=True, return_dict_in_generate=True, pad_token_id=tok.pad_token_id,
            )  # fmt: skip
            gen = out.sequences[0, len(prompt) :].tolist()
            scores = model.compute_transition_scores(
                out.sequences, out.scores, normalize_logits=True
            )
            ref = [(group.position, m.index, m.attempt)]
            await store.put(TokenEntry(
                rollout_id=m.rollout_id, model_call_id="c1", prompt_token_ids=prompt,
                generation_token_ids=gen, generation_log_probs=scores[0].tolist(),
                parent_resolution="root", weight_version=0,
            ))  # fmt: skip
            await store.advance("grpo", ref, "captured")
            reward = float(sum(gen) % 2 == 0)
            await store.put_score(
                RolloutScore(rollout_id=m.rollout_id, verifier="even", reward=reward)
            )
            await store.advance("grpo", ref, "scored")
    await store.close()


@pytest.fixture
def captured(tmp_path: Path) -> tuple[str, Any]:
    """A file store whose stream holds every prompt's scored group, and the tokenizer."""
    os.environ["TRL_EXPERIMENTAL_SILENCE"] = "1"
    tok = AutoTokenizer.from_pretrained(make_tokenizer_dir(tmp_path / "tok"))
    tok.pad_token = tok.eos_token
    url = (tmp_path / "capture").as_uri()
    asyncio.run(_generate(url, _tiny(len(tok)), tok))
    return url, tok


def _pipeline(url: str) -> Any:
    source = StreamingCaptureSource(
        url, "grpo", groups_per_step=GROUPS_PER_STEP, max_staleness=8, prompts=PROMPTS
    )
    return source.pipeline().drop_equal_rewards(url)


def _rollouts(url: str) -> CapturedRollouts:
    return CapturedRollouts(_pipeline(url), url, num_generations=N)


def _trainer(rollouts: CapturedRollouts, model: Any, tok: Any, out: Path, **args: Any) -> Any:
    config = GRPOConfig(
        output_dir=str(out), per_device_train_batch_size=GROUPS_PER_STEP * N,
        num_generations=N, max_completion_length=8, learning_rate=1e-2, use_cpu=True,
        report_to=[], logging_steps=1, bf16=False, **args,
    )  # fmt: skip
    return GRPOTrainer(
        model=model, reward_funcs=rollouts.reward, args=config,
        train_dataset=rollouts.train_dataset(64), processing_class=tok,
        rollout_func=rollouts.rollout_func, callbacks=[rollouts.callback()],
    )  # fmt: skip


def _trained(url: str) -> set[tuple[int, int]]:
    ledger = asyncio.run(open_store(url).stream_ledger("grpo"))
    return {(row.position, m.step) for row in ledger.prompts for m in row.members if m.step >= 0}


def test_grpo_trains_the_admitted_groups_with_their_captured_tokens_and_rewards(
    captured: tuple[str, Any], tmp_path: Path
) -> None:
    url, tok = captured
    model = _tiny(len(tok))
    before = [p.detach().clone() for p in model.parameters()]
    rollouts = _rollouts(url)
    trainer = _trainer(rollouts, model, tok, tmp_path / "out", max_steps=STEPS, save_strategy="no")
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
    assert _trained(url) == {(g["position"], g["trained_version"]) for g in served}


def test_a_run_resumed_from_a_trl_checkpoint_serves_the_next_groups(
    captured: tuple[str, Any], tmp_path: Path
) -> None:
    url, tok = captured
    want = [(r.payload["position"], r.payload["trained_version"]) for r in _pipeline(url)]
    out = tmp_path / "out"
    first = _rollouts(url)
    _trainer(first, _tiny(len(tok)), tok, out, max_steps=2, save_steps=2).train()
    checkpoint = out / "checkpoint-2"
    assert (checkpoint / "zephon_rollouts.json").exists()
    second = _rollouts(url)  # a new process: a fresh pipeline, model and trainer
    second.resume(checkpoint)
    trainer = _trainer(second, _tiny(len(tok)), tok, out, max_steps=STEPS, save_steps=2)
    trainer.train(resume_from_checkpoint=str(checkpoint))
    assert trainer.state.global_step == STEPS
    served = [(g["position"], g["trained_version"]) for g in first.served + second.served]
    assert served == want[: STEPS * GROUPS_PER_STEP]  # none skipped, none twice
    assert _trained(url) == set(served)


def test_a_group_of_another_size_and_a_checkpoint_without_the_position_are_refused(
    captured: tuple[str, Any], tmp_path: Path
) -> None:
    url, _ = captured
    rollouts = CapturedRollouts(_pipeline(url), url, num_generations=N + 1)
    with pytest.raises(ValueError, match=rf"keep_per_prompt\(store, {N + 1}\)"):
        rollouts.rollout_func(["slot"] * (N + 1), None)
    with pytest.raises(ValueError, match="not a multiple of num_generations"):
        _rollouts(url).rollout_func(["slot"] * (N + 1), None)
    with pytest.raises(CheckpointError, match="saved without CapturedRollouts' callback"):
        _rollouts(url).resume(tmp_path)
