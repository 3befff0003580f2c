"""tokenize_chat with video parts: each video placeholder becomes the video's vision tokens,
never supervised, in chats that mix images and videos.

The reference is transformers' Qwen2-VL chat template and processor; its video processor needs
torchvision (not installed here), so the video placeholders are expanded in the rendered text
by the processor's own rule (each ``<|video_pad|>`` repeated ``t * h * w / 4`` times, in order)
and the processor then expands the images and tokenizes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests._media import encoded, picture, video
from tests._qwen2_vl import tiny_qwen2_vl
from tests._vision_chat import processor, vision_tokenizer_dir
from zephon import Dataset, Pipeline, StaticMixtureWorkSource
from zephon._ops.tokenize_chat import TokenizeChatOp
from zephon.errors import ChatFormatError
from zephon.types import SampleBatch, SampleMeta, SampleRecord, Tombstone


def chat(i: int) -> list[dict[str, Any]]:
    """A user turn with a video and (every other sample) an image, in either order."""
    parts: list[dict[str, Any]] = [{"type": "video"}, {"type": "text", "text": f"clip {i}?"}]
    if i % 2:
        parts.insert(0 if i % 4 == 1 else 2, {"type": "image"})
    answer = "it shows " + " ".join(["a cat", "rain", "a road"][: 1 + i % 3])
    return [{"role": "user", "content": parts}, {"role": "assistant", "content": answer}]


def rows(n: int) -> list[dict[str, Any]]:
    out = []
    for i in range(n):
        row: dict[str, Any] = {"id": i, "messages": chat(i), "mp4": video(4 + 2 * (i % 2), seed=i)}
        if i % 2:
            row["jpg"] = encoded(picture(i, (60 + 20 * i, 50)))
        out.append(row)
    return out


def run(tokenizer: Path, records: list[dict[str, Any]], **chat_options: Any) -> list[Any]:
    source = StaticMixtureWorkSource([Dataset.from_records("c", records)], chunk_size=4)
    pipe = (
        Pipeline(source)
        .decode_video(fields=["mp4"], fps=10, min_pixels=28 * 28, max_pixels=28 * 28 * 4)
        .tokenize_chat(
            str(tokenizer),
            image_grids="image_grid_thw",
            video_grids="video_grid_thw",
            **chat_options,
        )
    )
    return list(pipe.options(runner="inline"))


def decode_images(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows with their JPEGs decoded (decode_image needs every row to hold one)."""
    out = []
    for row in records:
        decoded = dict(row)
        if "jpg" in row:
            (one,) = list(
                Pipeline(StaticMixtureWorkSource([Dataset.from_records("i", [row])], chunk_size=1))
                .decode_image(fields=["jpg"], min_pixels=28 * 28, max_pixels=28 * 28 * 4)
                .options(runner="inline")
            )
            decoded["jpg"], decoded["image_grid_thw"] = (
                one.payload["jpg"],
                one.payload["image_grid_thw"],
            )
        else:
            decoded["image_grid_thw"] = []
        out.append(decoded)
    return out


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return vision_tokenizer_dir(tmp_path_factory.mktemp("tok"))


def test_video_and_image_parts_expand_as_the_template_and_processor_do(tokenizer: Path) -> None:
    hf = processor(tokenizer)
    records = decode_images(rows(6))
    out = run(tokenizer, records)
    assert len(out) == 6
    mixed = 0
    for row, record in zip(records, out, strict=True):
        text = hf.apply_chat_template(row["messages"], tokenize=False)
        grids = {hf.video_token: record.payload["video_grid_thw"], hf.image_token: []}
        if "jpg" in row:
            pixels = hf.image_processor(images=[row["jpg"]], do_resize=False, return_tensors="np")
            grids[hf.image_token] = pixels["image_grid_thw"].tolist()
            assert grids[hf.image_token] == [list(g) for g in record.payload["image_grid_thw"]]
        for token, found in grids.items():  # the processor's expansion, placeholder by placeholder
            for t, h, w in found:
                text = text.replace(token, "<|placeholder|>" * (t * h * w // 4), 1)
            text = text.replace("<|placeholder|>", token)
        expected = hf.tokenizer(text)["input_ids"]
        ids, mask = record.payload["input_ids"], record.payload["loss_mask"]
        assert ids.tolist() == expected
        videos = ids == hf.video_token_id
        assert videos.sum() == sum(t * h * w // 4 for t, h, w in record.payload["video_grid_thw"])
        assert not mask[videos | (ids == hf.image_token_id)].any()
        answer = hf.tokenizer.decode(ids[mask.astype(bool)])
        assert answer.startswith(row["messages"][1]["content"])
        mixed += "jpg" in row
    assert mixed == 3


def test_more_video_parts_than_videos_is_an_error(tokenizer: Path) -> None:
    records = decode_images(rows(1))
    records[0]["messages"][0]["content"].append({"type": "video"})
    with pytest.raises(ChatFormatError, match=r"2 video parts but 1 videos have grids"):
        run(tokenizer, records)


def test_max_length_that_cuts_a_video_drops_the_record(tokenizer: Path) -> None:
    payload = {"messages": chat(0), "image_grid_thw": [], "video_grid_thw": [(2, 4, 6)]}
    records = [SampleRecord(SampleMeta((0, 0, 0), 0, 0, 0), payload)]
    grids = {"image_grids": "image_grid_thw", "video_grids": "video_grid_thw"}
    op = TokenizeChatOp(str(tokenizer), **grids)
    full = op.process_many(list(records))[0].payload["input_ids"]  # type: ignore[arg-type]
    last_video = int(np.flatnonzero(full == processor(tokenizer).video_token_id)[-1])
    assert last_video - int(np.flatnonzero(full == processor(tokenizer).video_token_id)[0]) == 11
    for limit, kept in [(last_video, False), (len(full) - 1, True)]:
        op = TokenizeChatOp(str(tokenizer), max_length=limit, **grids)
        out = op.process_many(list(records))  # type: ignore[arg-type]
        if kept:
            assert out[0].payload["input_ids"].tolist() == full[:limit].tolist()
        else:
            assert out[0].meta.control == Tombstone(
                "tokenize_chat: max_length cuts an image or a video"
            )


def test_packed_chats_with_videos_lose_what_each_chat_loses_alone(tokenizer: Path) -> None:
    """Chats with video (and image) parts, packed with their vision tokens inside the text:
    the tiny Qwen2-VL's loss on the packed rows equals its loss on each chat alone."""
    hf = processor(tokenizer)
    image, video_token = hf.image_token_id, hf.video_token_id
    model = tiny_qwen2_vl(len(hf.tokenizer) + 4, image, video_token)
    grids = {"image_grids": "image_grid_thw", "video_grids": "video_grid_thw"}
    source = StaticMixtureWorkSource(
        [Dataset.from_records("c", decode_images(rows(6)))], chunk_size=4
    )
    pipe = (
        Pipeline(source)
        .decode_video(fields=["mp4"], fps=10, min_pixels=28 * 28, max_pixels=28 * 28 * 4)
        .tokenize_chat(str(tokenizer), **grids)
        .pack_sequences(150, image_token_id=image, video_token_id=video_token, **grids)
        .batch(8, drop_last=False)
        .options(runner="inline")
    )
    (batch,) = list(pipe)
    assert 1 < len(batch.records) < 6
    media = {"image_fields": ["jpg"], "video_fields": ["mp4"]}
    out = batch.to_training(
        image_token_id=image,
        video_token_id=video_token,
        pad_token_id=0,
        convention="hf",
        return_tensors="pt",
        **media,
    )
    with torch.no_grad():
        packed_sum = model(**out).loss.item() * int((out["labels"][:, 1:] != -100).sum())
    alone_sum, count = 0.0, 0
    for record in batch.records:
        for sample in record.payload["packed_samples"]:
            one = SampleBatch([SampleRecord(record.meta, sample)]).to_training(
                return_tensors="pt", **media
            )
            ids = torch.from_numpy(sample["input_ids"]).long()[None]
            types = (ids == image).int() + 2 * (ids == video_token).int()
            labels = torch.where(torch.from_numpy(sample["loss_mask"])[None] == 1, ids, -100)
            with torch.no_grad():  # the model's own rope index, from the token types
                result = model(
                    input_ids=ids,
                    labels=labels,
                    mm_token_type_ids=types,
                    **{k: v for k, v in one.items() if ("pixel" in k or "grid" in k) and len(v)},
                )
            n = int((labels[:, 1:] != -100).sum())
            alone_sum += result.loss.item() * n
            count += n
    assert count == int((out["labels"][:, 1:] != -100).sum())
    assert packed_sum == pytest.approx(alone_sum, rel=1e-6)  # the loss is float32
