"""expand_chat -> tokenize_chat -> pack_flat -> batch: fan-out lineage, identical output under
every runner and across stop/restore, and training batches whose labels follow the loss mask."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from tests.engine._resume import run_with_stops
from tests.ops._chat import CHATML, CHATML_TAGGED, LLAMA3, chatml_turn, conversations, runs
from tests.ops._helpers import digest
from zephon import Dataset, Pipeline, StaticMixtureWorkSource
from zephon._ops.expand_chat import ExpandChatOp
from zephon.capture.builder import Trajectory
from zephon.types import TAG_PACKING, SampleBatch, SampleMeta, SampleRecord, Tombstone

ROWS = conversations(160, seed=5)
ROWS[7] = {"id": 7, "messages": [{"role": "user", "content": "no reply"}]}
PAD = 0
LENGTH = 256


def source(rows: list[dict[str, Any]] = ROWS) -> StaticMixtureWorkSource:
    return StaticMixtureWorkSource(
        [Dataset.from_records("chat", rows, shard_size=40)], chunk_size=16
    )


def chat_pipe(
    tok: Any, *, limit: int | None = None, runner: str = "inline", workers: int = 1
) -> Pipeline:
    return (
        Pipeline(source())
        .expand_chat(parallelism=workers)
        .tokenize_chat(
            tok, chat_template=CHATML, loss_scope="last_span", max_length=limit, parallelism=workers
        )
    ).options(runner=runner, canonical_replicas=2, flush_every_k_chunks=2)


def packed_pipe(tok: Any, runner: str = "inline", workers: int = 1) -> Pipeline:
    pipe = chat_pipe(tok, limit=LENGTH, runner=runner, workers=workers)
    return pipe.pack_flat(LENGTH, PAD, parallelism=workers).batch(4, drop_last=False)


def test_expand_chat_children_and_scopes(chat_tokenizer_dir, hf_chat_tokenizer):
    out = list(chat_pipe(chat_tokenizer_dir))
    by_parent: dict[tuple[int, int, int], list[Any]] = {}
    for r in out:
        by_parent.setdefault(r.meta.sample_id, []).append(r)
    for sid, children in by_parent.items():
        row = ROWS[sid[1] * 40 + sid[2]]
        assistants = [m for m in row["messages"] if m["role"] == "assistant"]
        assert [c.meta.lineage for c in children] == [(k,) for k in range(len(assistants))]
        closing = [ref.is_last_child for c in children for ref in c.meta.contributors]
        assert closing == [False] * (len(children) - 1) + [True]
        for child, message in zip(children, assistants, strict=True):
            ids, mask = child.payload["input_ids"], child.payload["loss_mask"]
            texts = [hf_chat_tokenizer.decode(ids[a:b].tolist()) for a, b in runs(mask)]
            assert texts == [chatml_turn(message)]  # each child supervises its own last turn
    assert len(by_parent) == len(ROWS) - 1  # the conversation without a reply is a tombstone
    expected = sum(sum(m["role"] == "assistant" for m in r["messages"]) for r in ROWS)
    assert len(out) == expected


# Turns separated by blank lines: a child's text ends right before plain text ("\n\n").
SEPARATED = (
    "{% for m in messages %}{% if not loop.first %}\n\n{% endif %}<|im_start|>{{ m.role }}\n"
    "{{ m.content or '' }}<|im_end|>{% endfor %}"
    "{% if add_generation_prompt %}\n\n<|im_start|>assistant\n{% endif %}"
)


@pytest.mark.parametrize(
    "template", [CHATML_TAGGED, LLAMA3, SEPARATED], ids=["chatml-tags", "llama3", "separated"]
)
def test_expanded_children_match_transformers(template, chat_tokenizer_dir, hf_chat_tokenizer):
    # ChatML and Llama 3 children end right before an added token, so they reuse their longest
    # sibling's encoding; with SEPARATED they end before plain text and are encoded alone.
    pipe = (
        Pipeline(source(ROWS[:60]))
        .expand_chat()
        .tokenize_chat(chat_tokenizer_dir, chat_template=template)
        .options(runner="inline")
    )
    children = list(pipe)
    assert len(children) > 100
    for child in children:
        sid = child.meta.sample_id
        tools = ROWS[sid[1] * 40 + sid[2]].get("tools")
        want = hf_chat_tokenizer.apply_chat_template(
            child_messages(child),
            tools=tools,
            chat_template=template,
            tokenize=True,
            return_dict=True,
            return_assistant_tokens_mask=template is CHATML_TAGGED,
        )
        assert child.payload["input_ids"].tolist() == want["input_ids"]
        if template is CHATML_TAGGED:
            assert child.payload["loss_mask"].tolist() == want["assistant_masks"]


def child_messages(child: Any) -> list[Any]:
    """The messages of an expanded child: up to its assistant turn (lineage index k)."""
    sid = child.meta.sample_id
    messages = ROWS[sid[1] * 40 + sid[2]]["messages"]
    ends = [i + 1 for i, m in enumerate(messages) if m["role"] == "assistant"]
    return messages[: ends[child.meta.lineage[0]]]


def test_dropped_conversations_are_counted(chat_tokenizer_dir):
    pipe = chat_pipe(chat_tokenizer_dir)
    list(pipe)
    stats = pipe.stats()
    assert stats is not None and stats.tombstones == 1
    (tomb,) = ExpandChatOp().process_many([SampleRecord(SampleMeta((0, 0, 7), 0, 0, 7), ROWS[7])])
    assert isinstance(tomb.meta.control, Tombstone)
    assert "no assistant turn" in (tomb.meta.control.reason or "")


RUNS = [("threads", 1), ("threads", 2), ("process", 2)]


@pytest.mark.timeout(180)
def test_every_runner_gives_the_same_batches(chat_tokenizer_dir):
    reference = digest(packed_pipe(chat_tokenizer_dir))
    assert len(reference) > 40
    for runner, workers in RUNS:
        assert digest(packed_pipe(chat_tokenizer_dir, runner, workers)) == reference, runner


@pytest.mark.timeout(180)
def test_stop_and_restore_give_the_same_batches(chat_tokenizer_dir):
    def key(item: Any) -> Any:
        return json.dumps(digest([item]), default=str)

    def build() -> Pipeline:
        return packed_pipe(chat_tokenizer_dir, "threads", 2)

    whole = [key(b) for b in build()]
    assert run_with_stops(build, key, [1, 4, 9, 10]) == whole


def test_training_batches_follow_the_loss_mask(chat_tokenizer_dir):
    unpacked = {r.meta.cursor: r.payload for r in chat_pipe(chat_tokenizer_dir, limit=LENGTH)}
    batches = list(packed_pipe(chat_tokenizer_dir))
    assert all(isinstance(b, SampleBatch) for b in batches)
    supervised = 0
    for batch in batches:
        t = batch.to_training()
        for row, record in enumerate(batch.records):
            want_labels, want_pos, bounds = [], [], []
            for cursor, start, stop in record.meta.tags[TAG_PACKING]["segments"]:
                ids = unpacked[cursor]["input_ids"][start:stop]
                mask = unpacked[cursor]["loss_mask"][start:stop]
                labels = [*np.where(mask[1:] == 1, ids[1:], -100).tolist(), -100]
                want_labels += labels
                want_pos += list(range(stop - start))
                bounds.append(stop - start)
            pad = LENGTH - len(want_labels)
            want_labels += [-100] * pad
            want_pos += list(range(pad))
            assert t["labels"][row].tolist() == want_labels
            assert t["positions"][row].tolist() == want_pos
            supervised += sum(label != -100 for label in want_labels)
        lengths = np.diff(t["cu_seqlens"]).tolist()
        assert t["max_seqlen"] == max(lengths)
        assert t["input_ids"].shape == (len(batch), LENGTH)
    assert supervised > 500


def test_sft_and_rl_rows_give_the_same_training_keys(chat_tokenizer_dir):
    chat = next(iter(packed_pipe(chat_tokenizer_dir))).to_training()
    trajectory = Trajectory(
        rollout_id="r",
        input_ids=np.arange(6, dtype=np.int32),
        loss_mask=np.array([0, 0, 0, 1, 1, 1], dtype=np.int8),
        logprobs=np.zeros(6, dtype=np.float32),
        call_ids=("c",),
        prompt_len=3,
    )
    rl_rows = [trajectory.to_row()]
    rl_source = StaticMixtureWorkSource([Dataset.from_records("rl", rl_rows)], chunk_size=1)
    rl = next(iter(Pipeline(rl_source).pack_flat(8, PAD).batch(1, drop_last=False))).to_training()
    assert set(chat) == set(rl)
    for k in chat:
        assert np.asarray(chat[k]).dtype == np.asarray(rl[k]).dtype, k
    assert rl["labels"][0].tolist() == [-100, -100, 3, 4, 5, -100, -100, -100]
