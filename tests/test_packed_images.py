"""to_training over packed rows with images: the flat token rows, mRoPE positions and pixels
in the layout Qwen2-VL's forward takes, and a tiny Qwen2-VL whose loss on the packed rows is
its loss on the samples one by one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests._media import encoded, picture
from tests._qwen2_vl import IMAGE_TOKEN, VOCAB, tiny_qwen2_vl
from tests._vision_chat import conversation, processor, vision_tokenizer_dir
from zephon import Dataset, Pipeline, StaticMixtureWorkSource
from zephon._mrope import document_mrope
from zephon.errors import ConfigError, DataError
from zephon.types import SampleBatch, SampleRecord

FIELDS = ["jpg", "png"]


def captions(n: int, *, two_images: bool) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i in range(n):
        row: dict[str, Any] = {"text": "a caption " * (1 + i % 3) + str(i)}
        row["jpg"] = encoded(picture(i, (40 + 17 * i, 60 + 9 * (i % 4))))
        if two_images and i % 2:
            row["png"] = encoded(picture(i + 3, (100, 30 + 11 * i)), "PNG")
        out.append(row)
    return out


def packed_batches(
    n: int = 8, *, two_images: bool = True, rows: int = 2, **packing: Any
) -> list[SampleBatch]:
    source = StaticMixtureWorkSource(
        [Dataset.from_records("c", captions(n, two_images=two_images))], chunk_size=4
    )
    pipe = (
        Pipeline(source)
        .decode_image(fields=FIELDS, min_pixels=28 * 28, max_pixels=28 * 28 * 6)
        .tokenize("bytes")
        .pack_sequences(160, image_grids="image_grid_thw", max_images_per_row=4, **packing)
        .batch(rows, drop_last=False)
        .options(runner="inline")
    )
    return list(pipe)


def inputs(batch: SampleBatch, **options: Any) -> dict[str, Any]:
    options = {"image_fields": FIELDS, **options}
    return batch.to_training(image_token_id=IMAGE_TOKEN, pad_token_id=0, **options)


def test_rows_hold_each_samples_image_tokens_then_its_text() -> None:
    batches = packed_batches()
    seen = 0
    for batch in batches:
        out = inputs(batch, convention="hf")
        ids, positions = out["input_ids"], out["position_ids"]
        assert positions.shape == (4, *ids.shape) and out["mm_token_type_ids"].shape == ids.shape
        for b, record in enumerate(batch.records):
            cu, image_map = record.payload["cu_seqlens"], record.payload["image_map"]
            for i, sample in enumerate(record.payload["packed_samples"]):
                lines = image_map[image_map[:, 0] == i]
                text_at = cu[i] + lines[:, 3].sum()
                assert (ids[b, cu[i] : text_at] == IMAGE_TOKEN).all()
                assert (
                    out["mm_token_type_ids"][b, cu[i] : cu[i + 1]]
                    == (np.arange(cu[i], cu[i + 1]) < text_at)
                ).all()
                assert ids[b, text_at : cu[i + 1]].tolist() == list(sample["input_ids"])
                assert (out["labels"][b, cu[i] : text_at] == -100).all()
                assert positions[0, b, cu[i] : cu[i + 1]].tolist() == list(range(cu[i + 1] - cu[i]))
                offsets = [
                    (int(o - cu[i]), g)
                    for o, g in zip(lines[:, 2], sample["image_grid_thw"], strict=True)
                ]
                expected = document_mrope(int(cu[i + 1] - cu[i]), offsets, 2)
                np.testing.assert_array_equal(positions[1:, b, cu[i] : cu[i + 1]], expected)
                seen += 1
    assert seen == 8


def test_pixels_follow_the_image_tokens() -> None:
    for batch in packed_batches():
        out = inputs(batch)
        samples = [s for r in batch.records for s in r.payload["packed_samples"]]
        grids = [list(g) for s in samples for g in s["image_grid_thw"]]
        assert out["image_grid_thw"].tolist() == grids
        tokens = (out["input_ids"] == IMAGE_TOKEN).sum()
        assert (
            out["pixel_values"].shape[0] == out["image_grid_thw"].prod(axis=1).sum() == 4 * tokens
        )
        assert out["mrope_positions"].shape == (3, *out["input_ids"].shape)
        # the shifted convention's varlen boundaries: every sample, then the padding run
        assert out["cu_seqlens"][-1] == out["input_ids"].size


def test_packed_loss_equals_the_loss_of_each_sample_alone() -> None:
    model = tiny_qwen2_vl()
    batches = packed_batches(6, two_images=False, rows=3)
    assert len(batches) == 1 and len(batches[0].records) > 1
    out = inputs(batches[0], convention="hf", return_tensors="pt")
    with torch.no_grad():
        packed = model(**out)
    packed_sum = packed.loss.item() * int((out["labels"][:, 1:] != -100).sum())
    alone_sum, count = 0.0, 0
    for record in batches[0].records:
        for sample in record.payload["packed_samples"]:
            alone = SampleBatch([SampleRecord(record.meta, sample)])
            one = alone.to_training(image_fields=FIELDS, convention="hf", return_tensors="pt")
            grid = one["image_grid_thw"]
            ids = torch.cat(
                [torch.full((1, int(grid.prod()) // 4), IMAGE_TOKEN), one["input_ids"]], 1
            )
            labels = torch.where(ids == IMAGE_TOKEN, -100, ids)
            with torch.no_grad():  # the model's own rope index, from the token types
                result = model(
                    input_ids=ids,
                    labels=labels,
                    pixel_values=one["pixel_values"],
                    image_grid_thw=grid,
                    mm_token_type_ids=(ids == IMAGE_TOKEN).int(),
                )
            n = int((labels[:, 1:] != -100).sum())
            alone_sum += result.loss.item() * n
            count += n
    assert count == int((out["labels"][:, 1:] != -100).sum())
    assert packed_sum == pytest.approx(alone_sum, rel=1e-6)  # the loss is float32


MARKERS = (VOCAB - 2, VOCAB - 3)  # the tiny model's vision start and end tokens


def model_positions(ids: torch.Tensor, grids: Any) -> np.ndarray:
    """transformers' own mRoPE positions of one sample (from its token types)."""
    positions, _ = tiny_qwen2_vl().model.get_rope_index(
        ids[None],
        mm_token_type_ids=(ids[None] == IMAGE_TOKEN).int(),
        image_grid_thw=torch.tensor(np.asarray(grids, dtype=np.int64)).reshape(-1, 3),
    )
    return positions[:, 0].numpy()  # type: ignore[no-any-return]


def test_image_markers_make_the_models_rope_index_agree_on_several_images() -> None:
    samples = 0
    for marked, plain in zip(packed_batches(image_markers=MARKERS), packed_batches(), strict=True):
        out = inputs(marked, convention="hf", return_tensors="pt")
        bare = inputs(plain, convention="hf", return_tensors="pt")
        for b, record in enumerate(marked.records):
            cu = record.payload["cu_seqlens"]
            for i, sample in enumerate(record.payload["packed_samples"]):
                ids = out["input_ids"][b, cu[i] : cu[i + 1]]
                grids = sample["image_grid_thw"]
                tokens = [t * h * w // 4 for t, h, w in grids]
                expected = [x for n in tokens for x in (MARKERS[0], *[IMAGE_TOKEN] * n, MARKERS[1])]
                assert ids.tolist() == expected + list(sample["input_ids"])
                assert (out["labels"][b, cu[i] : cu[i] + len(expected)] == -100).all()
                np.testing.assert_array_equal(
                    out["position_ids"][1:, b, cu[i] : cu[i + 1]].numpy(),
                    model_positions(ids, grids),
                )
                if len(grids) == 2:  # back to back, the model takes the two images for one
                    cu_bare = plain.records[b].payload["cu_seqlens"]
                    ids = bare["input_ids"][b, cu_bare[i] : cu_bare[i + 1]]
                    with pytest.raises(RuntimeError, match="must match the existing size"):
                        model_positions(ids, grids)
                    samples += 1
    assert samples == 4


def test_packed_loss_with_markers_equals_the_models_own_loss_per_sample() -> None:
    model = tiny_qwen2_vl()
    (batch,) = packed_batches(6, rows=3, image_markers=MARKERS)
    out = inputs(batch, convention="hf", return_tensors="pt")
    with torch.no_grad():
        packed = model(**out)
    packed_sum = packed.loss.item() * int((out["labels"][:, 1:] != -100).sum())
    alone_sum, at = 0.0, 0
    for b, record in enumerate(batch.records):
        cu = record.payload["cu_seqlens"]
        for i, sample in enumerate(record.payload["packed_samples"]):
            ids = out["input_ids"][b : b + 1, cu[i] : cu[i + 1]]
            grids = torch.tensor(np.asarray(sample["image_grid_thw"], dtype=np.int64))
            patches = int(grids.prod(dim=1).sum())
            with torch.no_grad():  # no positions given: the model's own rope index
                result = model(
                    input_ids=ids,
                    labels=out["labels"][b : b + 1, cu[i] : cu[i + 1]],
                    pixel_values=out["pixel_values"][at : at + patches],
                    image_grid_thw=grids,
                    mm_token_type_ids=(ids == IMAGE_TOKEN).int(),
                )
            at += patches
            labels = out["labels"][b : b + 1, cu[i] : cu[i + 1]]
            alone_sum += result.loss.item() * int((labels[:, 1:] != -100).sum())
    assert at == out["pixel_values"].shape[0]
    assert packed_sum == pytest.approx(alone_sum, rel=1e-6)


def test_image_markers_are_checked() -> None:
    for bad in ({"image_markers": (1,)}, {"image_markers": (1, 2), "image_token_id": 5}):
        with pytest.raises(ConfigError, match="image_markers"):
            packed_batches(**bad)


def test_missing_image_token_id_is_an_error() -> None:
    batch = packed_batches()[0]
    with pytest.raises(ConfigError, match=r"image_token_id=\.\.\. \(the model's image placeholder"):
        batch.to_training(image_fields=FIELDS, pad_token_id=0)


def test_rows_of_different_lengths_need_a_pad_token() -> None:
    batch = next(
        b for b in packed_batches() if len({r.payload["cu_seqlens"][-1] for r in b.records}) > 1
    )
    with pytest.raises(ConfigError, match="packed rows have different lengths"):
        batch.to_training(image_fields=FIELDS, image_token_id=IMAGE_TOKEN)


def test_pixels_of_other_fields_than_the_grids_are_an_error() -> None:
    batch = packed_batches()[0]
    with pytest.raises(DataError, match="decode_image every image field before pack_sequences"):
        inputs(batch, image_fields=["jpg"])


def test_packed_chat_rows_lose_what_the_processors_samples_lose(tmp_path: Path) -> None:
    """Conversations with image parts (images inside the text, between vision start and end
    tokens), packed: the loss equals the loss on transformers' processor output per sample."""
    tokenizer = vision_tokenizer_dir(tmp_path / "tok")
    hf = processor(tokenizer)
    image_token = hf.image_token_id
    model = tiny_qwen2_vl(len(hf.tokenizer) + 4, image_token)
    rows = []
    for i in range(6):
        row: dict[str, Any] = {"id": i, "messages": conversation(i, 1 + i % 2)}
        row["jpg"] = encoded(picture(i, (50 + 13 * i, 70)))
        if i % 2:
            row["png"] = encoded(picture(i + 2, (90, 40 + 5 * i)), "PNG")
        rows.append(row)
    source = StaticMixtureWorkSource([Dataset.from_records("c", rows)], chunk_size=4)
    pipe = (
        Pipeline(source)
        .decode_image(fields=FIELDS, min_pixels=28 * 28, max_pixels=28 * 28 * 6)
        .tokenize_chat(str(tokenizer), image_grids="image_grid_thw")
        .pack_sequences(160, image_grids="image_grid_thw", image_token_id=image_token)
        .batch(8, drop_last=False)
        .options(runner="inline")
    )
    (batch,) = list(pipe)
    assert 1 < len(batch.records) < 6
    out = batch.to_training(
        image_fields=FIELDS,
        image_token_id=image_token,
        pad_token_id=0,
        convention="hf",
        return_tensors="pt",
    )
    with torch.no_grad():
        packed = model(**out)
    packed_sum = packed.loss.item() * int((out["labels"][:, 1:] != -100).sum())
    alone_sum, count = 0.0, 0
    for sample in [s for r in batch.records for s in r.payload["packed_samples"]]:
        text = hf.apply_chat_template(rows[sample["id"]]["messages"], tokenize=False)
        images = [sample[f] for f in FIELDS if f in sample]
        one = hf(text=[text], images=images, do_resize=False, return_tensors="pt")
        ids = one["input_ids"]
        assert ids[0].tolist() == sample["input_ids"].tolist()
        labels = torch.where(torch.from_numpy(sample["loss_mask"])[None] == 1, ids, -100)
        with torch.no_grad():  # the model's own rope index, from the token types
            result = model(**one, labels=labels)
        n = int((labels[:, 1:] != -100).sum())
        alone_sum += result.loss.item() * n
        count += n
    assert count == int((out["labels"][:, 1:] != -100).sum())
    assert packed_sum == pytest.approx(alone_sum, rel=1e-6)  # the loss is float32
