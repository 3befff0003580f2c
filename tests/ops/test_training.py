"""SampleBatch.to_training: shifted labels, masks, positions and cu_seqlens."""

from __future__ import annotations

import numpy as np
import pytest

from tests.ops._helpers import ListSource, sequential_pointers, token_rows
from zephon import Dataset, Pipeline
from zephon.errors import ConfigError
from zephon.types import TAG_PACKING, SampleBatch, SampleMeta, SampleRecord


def packed_batch():
    # docs of 3 and 4 tokens (ids 1..), one row of 10 -> 3 pad tokens; loss_mask hides token 5
    def row(ids, mask):
        return {"input_ids": np.array(ids, np.int32), "loss_mask": np.array(mask, np.uint8)}

    rows = [row([1, 2, 3], [1, 1, 1]), row([4, 5, 6, 7], [1, 0, 1, 1])]
    ds = Dataset.from_records("d", rows)
    pipe = (
        Pipeline(ListSource([ds], sequential_pointers([ds]), 2))
        .pack_flat(10, 0, algorithm="first_fit")
        .batch(1, drop_last=False)
        .options(runner="inline")
    )
    (batch,) = list(pipe)
    return batch


def test_labels_are_shifted_and_masked():
    t = packed_batch().to_training()
    assert t["input_ids"].tolist() == [[1, 2, 3, 4, 5, 6, 7, 0, 0, 0]]
    ig = -100
    # 3->4 crosses documents; 4 predicts 5 whose loss_mask is 0; 7 is followed by padding
    assert t["labels"].tolist() == [[2, 3, ig, ig, 6, 7, ig, ig, ig, ig]]
    assert t["loss_mask"].tolist() == [[1, 1, 0, 0, 1, 1, 0, 0, 0, 0]]
    assert t["positions"].tolist() == [[0, 1, 2, 0, 1, 2, 3, 0, 1, 2]]
    assert t["document_ids"].tolist() == [[0, 0, 0, 1, 1, 1, 1, -1, -1, -1]]
    assert t["padding_mask"].tolist() == [[False] * 7 + [True] * 3]
    assert t["attention_mask"].tolist() == [[1] * 7 + [0] * 3]
    assert t["cu_seqlens"].tolist() == [0, 3, 7, 10] and t["cu_seqlens"].dtype == np.int32
    assert t["max_seqlen"] == 4 and t["num_valid_tokens"] == 4
    assert t["input_ids"].dtype == np.int64


def test_unshifted_labels_and_sequence_positions():
    t = packed_batch().to_training(shift_labels=False, position_mode="sequence", ignore_index=-1)
    # the first token of each document is nobody's target; 5 has loss_mask 0
    assert t["labels"].tolist() == [[-1, 2, 3, -1, -1, 6, 7, -1, -1, -1]]
    assert t["positions"].tolist() == [list(range(10))]
    assert t["cu_seqlens"].tolist() == [0, 3, 7, 10]  # still the document boundaries


def test_unpacked_rows_are_right_padded():
    def rec(i, ids):
        return SampleRecord(SampleMeta((0, 0, i), 0, 0, i), {"input_ids": np.array(ids)})

    batch = SampleBatch([rec(0, [5, 6, 7]), rec(1, [8, 9])])
    with pytest.raises(ConfigError, match="pass pad_token_id"):
        batch.to_training()
    t = batch.to_training(pad_token_id=0)
    assert t["input_ids"].tolist() == [[5, 6, 7], [8, 9, 0]]
    assert t["labels"].tolist() == [[6, 7, -100], [9, -100, -100]]
    assert t["positions"].tolist() == [[0, 1, 2], [0, 1, 0]]
    assert t["cu_seqlens"].tolist() == [0, 3, 5, 6]


def test_padding_length_comes_from_the_meta_not_the_pad_id():
    # the pad id (0) also occurs as a real token: masking must follow TAG_PACKING
    meta = SampleMeta((0, 0, 0), 0, 0, 0, (), 0, None, {TAG_PACKING: {"padding_length": 2}})
    batch = SampleBatch([SampleRecord(meta, {"input_ids": np.array([0, 3, 0, 0])})])
    t = batch.to_training()
    assert t["padding_mask"].tolist() == [[False, False, True, True]]
    assert t["labels"].tolist() == [[3, -100, -100, -100]]


def test_envelopes_and_torch_requests_fail_clearly():
    ds = Dataset.from_records("d", token_rows([3, 4]))
    pipe = (
        Pipeline(ListSource([ds], sequential_pointers([ds]), 2))
        .pack_sequences(10)
        .batch(1, drop_last=False)
        .options(runner="inline")
    )
    (batch,) = list(pipe)
    with pytest.raises(ConfigError, match="use pack_flat"):
        batch.to_training()
    try:
        import torch  # noqa: F401
    except ImportError:
        with pytest.raises(ConfigError, match="needs torch"):
            packed_batch().to_training(return_tensors="pt")
    else:
        t = packed_batch().to_training(return_tensors="pt")
        assert tuple(t["input_ids"].shape) == (1, 10)


# -- convention="hf" -----------------------------------------------------------------------


def test_hf_labels_are_unshifted_and_mask_each_document_start():
    t = packed_batch().to_training(convention="hf")
    ig = -100
    assert t["input_ids"].tolist() == [[1, 2, 3, 4, 5, 6, 7, 0, 0, 0]]
    # 1 and 4 start documents, 5 has loss_mask 0, the last three are padding
    assert t["labels"].tolist() == [[ig, 2, 3, ig, ig, 6, 7, ig, ig, ig]]
    assert t["position_ids"].tolist() == [[0, 1, 2, 0, 1, 2, 3, 0, 1, 2]]
    assert t["cu_seq_lens_q"].tolist() == t["cu_seq_lens_k"].tolist() == [0, 3, 7, 10]
    assert t["max_length_q"] == t["max_length_k"] == 4 and t["use_cache"] is False
    assert "attention_mask" not in t and t["labels"].dtype == np.int64
    # after the model's own shift the targets are exactly the shifted convention's
    shifted = packed_batch().to_training()
    assert t["labels"][:, 1:].tolist() == shifted["labels"][:, :-1].tolist()


def packed_rows(docs: list[list[int]], width: int, rows: list[list[int]]) -> SampleBatch:
    """A pack_flat-like batch: row r holds the documents ``rows[r]``, right-padded to ``width``."""
    records = []
    for r, members in enumerate(rows):
        ids = [t for d in members for t in docs[d]]
        doc_ids = [k for k, d in enumerate(members) for _ in docs[d]]
        positions = [i for d in members for i in range(len(docs[d]))]
        pad = width - len(ids)
        payload = {
            "input_ids": np.array(ids + [0] * pad),
            "document_ids": np.array(doc_ids + [-1] * pad),
            "positions": np.array(positions + list(range(pad))),
        }
        meta = SampleMeta((0, 0, r), 0, 0, r, (), 0, None, {TAG_PACKING: {"padding_length": pad}})
        records.append(SampleRecord(meta, payload))
    return SampleBatch(records)


@pytest.mark.parametrize("seed", range(5))
def test_hf_matches_transformers_data_collator_with_flattening(seed: int):
    from transformers import DataCollatorWithFlattening

    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 9, size=int(rng.integers(1, 6)))
    docs = [rng.integers(1, 250, size=n).tolist() for n in lengths]
    ours = packed_rows(docs, int(lengths.sum()), [list(range(len(docs)))]).to_training(
        convention="hf", return_tensors="pt"
    )
    theirs = DataCollatorWithFlattening(return_flash_attn_kwargs=True)(
        [{"input_ids": d} for d in docs]
    )
    assert set(theirs) <= set(ours)
    for key, value in theirs.items():
        assert np.asarray(ours[key]).tolist() == np.asarray(value).tolist(), key
        assert getattr(ours[key], "dtype", None) == getattr(value, "dtype", None), key


def test_hf_loss_of_a_real_llama_equals_the_per_document_loss():
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
    )  # fmt: skip
    model = LlamaForCausalLM(config).double().eval()
    rng = np.random.default_rng(1)
    docs = [rng.integers(1, 64, size=n).tolist() for n in (5, 7, 4, 9, 3)]
    batch = packed_rows(docs, 16, [[0, 1, 2], [3, 4]])  # the second row has 4 padding tokens
    with torch.no_grad():
        packed = model(**batch.to_training(convention="hf", return_tensors="pt")).loss
        total, count = 0.0, 0
        for doc in docs:  # each document alone: no packing, no padding
            ids = torch.tensor([doc])
            logits = model(input_ids=ids).logits[0].float()
            total += torch.nn.functional.cross_entropy(logits[:-1], ids[0, 1:], reduction="sum")
            count += len(doc) - 1
    assert torch.allclose(packed, total / count, rtol=1e-6, atol=0)


def _token_view(tmp_path, view: str, per_item: int):
    """``token_packs`` or ``token_chunks`` (with positions) of one Megatron file, seeded."""
    from tests.io._token_writers import documents, write_megatron
    from zephon.io import token_chunks, token_packs

    prefix = tmp_path / "tokens" / "part"
    if not prefix.with_suffix(".idx").exists():
        write_megatron(prefix, documents(90, seed=4, lo=1, hi=40))
    ds = Dataset.from_path("t", prefix.parent)
    if view == "packs":
        return token_packs(ds, 16, rows_per_item=per_item, seed=2, pad_id=0)
    return token_chunks(ds, 16, rows_per_item=per_item, seed=2, positions=True)


def _records(payloads) -> SampleBatch:
    return SampleBatch(
        [SampleRecord(SampleMeta((0, 0, i), 0, 0, i), p) for i, p in enumerate(payloads)]
    )


def _same(a, b) -> None:
    assert set(a) == set(b)
    for key in a:
        if isinstance(a[key], np.ndarray):
            assert a[key].dtype == b[key].dtype and a[key].tolist() == b[key].tolist(), key
        else:
            assert a[key] == b[key], key


@pytest.mark.parametrize("view", ["packs", "chunks"])
@pytest.mark.parametrize(
    "options", [{}, {"shift_labels": False}, {"convention": "hf"}, {"position_mode": "sequence"}]
)
def test_blocks_of_rows_train_as_the_same_rows_one_record_each(tmp_path, view, options):
    blocks, rows = _token_view(tmp_path, view, 4), _token_view(tmp_path, view, 1)
    last = blocks.counts()[0] - 1
    assert rows.counts()[0] % 4 != 0  # the last item holds fewer rows
    # items 1, 2 and the last are rows 4..11 and the last rows of the same seeded order
    items = _records(blocks.read(0, [1, 2, last]))
    one_each = _records(rows.read(0, [*range(4, 12), *range(4 * last, rows.counts()[0])]))
    _same(items.to_training(**options), one_each.to_training(**options))


def test_packed_blocks_keep_documents_and_padding_apart(tmp_path):
    (item,) = _token_view(tmp_path, "packs", 4).read(0, [0])
    t = _records([item]).to_training()
    ids, pos, real = item["input_ids"].astype(np.int64), item["position_ids"], item["num_tokens"]
    cols = np.arange(ids.shape[1])
    assert t["padding_mask"].tolist() == (cols[None, :] >= real[:, None]).tolist()
    assert t["positions"].tolist() == pos.tolist()
    assert t["cu_seqlens"].tolist() == item["cu_seqlens"].tolist()
    # a token's target is the next one when that is in the same document, not padding
    same_doc = (pos[:, 1:] != 0) & (cols[None, 1:] < real[:, None])
    expected = np.full(ids.shape, -100)
    expected[:, :-1] = np.where(same_doc, ids[:, 1:], -100)
    assert t["labels"].tolist() == expected.tolist()
    assert t["num_valid_tokens"] == int(same_doc.sum()) < int(real.sum())
