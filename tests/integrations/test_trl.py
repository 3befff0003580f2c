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
from zephon.integrations.trl import CapturedRollouts

pytestmark = pytest.mark.timeout(600)
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


def test_grpo_trains_the_admitted_groups_with_their_captured_tokens_and_rewards(
    tmp_path: Path,
) -> None:
    os.environ["TRL_EXPERIMENTAL_SILENCE"] = "1"
    tok = AutoTokenizer.from_pretrained(make_tokenizer_dir(tmp_path / "tok"))
    tok.pad_token = tok.eos_token
    url = (tmp_path / "capture").as_uri()
    asyncio.run(_generate(url, _tiny(len(tok)), tok))

    model = _tiny(len(tok))
    before = [p.detach().clone() for p in model.parameters()]
    source = StreamingCaptureSource(
        url, "grpo", groups_per_step=GROUPS_PER_STEP, max_staleness=8, prompts=PROMPTS
    )
    rollouts = CapturedRollouts(source.pipeline().drop_equal_rewards(url), url, num_generations=N)
    args = GRPOConfig(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=GROUPS_PER_STEP * N,
        num_generations=N, max_steps=STEPS, max_completion_length=8, learning_rate=1e-2,
        use_cpu=True, report_to=[], logging_steps=1, save_strategy="no", bf16=False,
    )  # fmt: skip
    trainer = GRPOTrainer(
        model=model, reward_funcs=rollouts.reward, args=args,
        train_dataset=rollouts.train_dataset(64), processing_class=tok,
        rollout_func=rollouts.rollout_func, callbacks=[rollouts.callback()],
    )  # fmt: skip
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
    ledger = asyncio.run(open_store(url).stream_ledger("grpo"))
    trained = {(row.position, m.step) for row in ledger.prompts for m in row.members if m.step >= 0}
    assert trained == {(g["position"], g["trained_version"]) for g in served}
