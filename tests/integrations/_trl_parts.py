"""What the TRL tests and their ``torchrun`` job share: a tiny random Llama, the captured
groups it generated (scored by a toy verifier), the pipeline over them and a GRPO trainer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import LlamaConfig, LlamaForCausalLM
from trl import GRPOConfig, GRPOTrainer

from tests.capture._rl_loop import prompt_pipeline
from zephon.capture import RolloutScore, TokenEntry
from zephon.capture.rl import PromptSource
from zephon.capture.stores import open_store
from zephon.capture.streaming import StreamingCaptureSource
from zephon.integrations.trl import CapturedRollouts

__all__ = [
    "GROUPS_PER_STEP",
    "PROMPTS",
    "STEPS",
    "N",
    "generate",
    "grpo_trainer",
    "pipeline",
    "tiny",
]

PROMPTS, N, STEPS, GROUPS_PER_STEP = 24, 2, 3, 2


def tiny(vocab: int) -> Any:
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


async def generate(url: str, model: Any, tok: Any) -> None:
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


def pipeline(url: str) -> Any:
    source = StreamingCaptureSource(
        url, "grpo", groups_per_step=GROUPS_PER_STEP, max_staleness=8, prompts=PROMPTS
    )
    return source.pipeline().drop_equal_rewards(url)


def grpo_trainer(rollouts: CapturedRollouts, model: Any, tok: Any, out: Path, **args: Any) -> Any:
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
