"""tokenize_chat with image parts: each image placeholder becomes the image's vision tokens,
as transformers' Qwen2-VL processor expands it, never supervised."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from tests._media import encoded, picture
from tests._vision_chat import QWEN2_VL, conversation, processor, vision_tokenizer_dir
from tests.ops._chat import make_tokenizer_dir
from zephon import Dataset, Pipeline, StaticMixtureWorkSource
from zephon._ops.tokenize_chat import TokenizeChatOp
from zephon.errors import ChatFormatError, ConfigError, MissingFieldError
from zephon.testing import check_operator
from zephon.types import SampleMeta, SampleRecord, Tombstone

FIELDS = ["jpg", "png"]


def records(n: int) -> list[dict[str, Any]]:
    out = []
    for i in range(n):
        images = 1 + i % 2
        row: dict[str, Any] = {"messages": conversation(i, images)}
        row["jpg"] = encoded(picture(i, (60 + 23 * i, 90)))
        if images == 2:
            row["png"] = encoded(picture(i + 5, (130, 40 + 7 * i)), "PNG")
        out.append(row)
    return out


def run(
    tokenizer: Path, rows: list[dict[str, Any]], *, count: str = "decode_image", **chat: Any
) -> list[Any]:
    source = StaticMixtureWorkSource([Dataset.from_records("c", rows)], chunk_size=4)
    pipe = Pipeline(source)
    pipe = (
        pipe.decode_image(fields=FIELDS)
        if count == "decode_image"
        else pipe.image_tokens(fields=FIELDS)
    )
    pipe.tokenize_chat(str(tokenizer), image_grids="image_grid_thw", **chat)
    return list(pipe.options(runner="inline"))


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return vision_tokenizer_dir(tmp_path_factory.mktemp("tok"))


def test_image_parts_expand_as_the_qwen2_vl_processor_does(tokenizer: Path) -> None:
    hf = processor(tokenizer)
    rows = records(6)
    out = run(tokenizer, rows)
    assert len(out) == 6
    for row, record in zip(rows, out, strict=True):
        images = [Image.open(io.BytesIO(row[f])) for f in FIELDS if f in row]
        text = hf.apply_chat_template(row["messages"], tokenize=False)
        expected = hf(text=[text], images=images, return_tensors="np")
        ids, mask = record.payload["input_ids"], record.payload["loss_mask"]
        assert ids.tolist() == expected["input_ids"][0].tolist()
        assert record.payload["image_grid_thw"] == [
            tuple(g) for g in expected["image_grid_thw"].tolist()
        ]
        vision = ids == hf.image_token_id
        assert vision.sum() == expected["image_grid_thw"].prod(axis=1).sum() // 4
        assert not mask[vision].any() and mask.any()
        answer = hf.tokenizer.decode(ids[mask.astype(bool)])
        assert answer.startswith(row["messages"][1]["content"])


def test_grids_read_from_headers_give_the_same_tokens(tokenizer: Path) -> None:
    rows = records(4)
    decoded = run(tokenizer, rows)
    counted = run(tokenizer, rows, count="image_tokens")
    for a, b in zip(decoded, counted, strict=True):
        assert a.payload["input_ids"].tolist() == b.payload["input_ids"].tolist()
        assert a.payload["loss_mask"].tolist() == b.payload["loss_mask"].tolist()


def test_more_image_parts_than_images_is_an_error(tokenizer: Path) -> None:
    rows = records(2)
    rows[1]["messages"][0]["content"].insert(0, {"type": "image"})
    with pytest.raises(
        ChatFormatError,
        match=r"record .* field 'image_grid_thw': the conversation has 3 image parts but 2 images",
    ):
        run(tokenizer, rows)


def test_a_record_without_grids_is_named(tokenizer: Path) -> None:
    op = TokenizeChatOp(str(tokenizer), image_grids="image_grid_thw")
    record = SampleRecord(SampleMeta((0, 0, 7), 0, 0, 7), {"messages": conversation(0, 1)})
    with pytest.raises(
        MissingFieldError,
        match=r"tokenize_chat: record \(0, 0, 7\) has no field 'image_grid_thw'.*before tokeni",
    ):
        op.process_many([record])  # type: ignore[list-item]


def test_max_length_that_cuts_an_image_drops_the_record(tokenizer: Path) -> None:
    rows = [{"messages": conversation(0, 2), "image_grid_thw": [(1, 4, 6), (1, 2, 2)]}]
    records = [SampleRecord(SampleMeta((0, 0, 0), 0, 0, 0), rows[0])]
    op = TokenizeChatOp(str(tokenizer), image_grids="image_grid_thw")
    full = op.process_many(list(records))[0].payload["input_ids"]  # type: ignore[arg-type]
    last_image = int(np.flatnonzero(full == processor(tokenizer).image_token_id)[-1])
    for limit, kept in [(last_image, False), (len(full) - 1, True)]:
        op = TokenizeChatOp(str(tokenizer), image_grids="image_grid_thw", max_length=limit)
        out = op.process_many(list(records))  # type: ignore[arg-type]
        if kept:
            assert out[0].payload["input_ids"].tolist() == full[:limit].tolist()
        else:
            assert out[0].meta.control == Tombstone(
                "tokenize_chat: max_length cuts an image or a video"
            )


def test_a_tokenizer_without_the_placeholder_is_refused(tmp_path: Path) -> None:
    plain = make_tokenizer_dir(tmp_path / "plain", QWEN2_VL)
    with pytest.raises(
        ConfigError, match=r"no token '<\|image_pad\|>' for image parts; pass image_token="
    ):
        Pipeline(
            StaticMixtureWorkSource([Dataset.from_records("c", records(1))], chunk_size=4)
        ).tokenize_chat(str(plain), image_grids="image_grid_thw")


@pytest.mark.timeout(600)
def test_chats_with_images_pack_exactly_on_every_runner_and_resume(tokenizer: Path) -> None:
    """Grids from headers, image parts expanded, packed with the vision tokens in the text:
    the same rows on every runner and worker count, and after a stop at any point."""
    rows = records(24)
    hf = processor(tokenizer)

    def build() -> Pipeline:
        source = StaticMixtureWorkSource(
            [Dataset.from_records("c", rows, shard_size=8)], chunk_size=4, seed=3
        )
        return (
            Pipeline(source)
            .image_tokens(fields=FIELDS, max_pixels=28 * 28 * 8)
            .tokenize_chat(str(tokenizer), image_grids="image_grid_thw")
            .pack_sequences(
                200, image_grids="image_grid_thw", image_token_id=hf.image_token_id, num_bins=2
            )
            .options(flush_every_k_chunks=2)
        )

    report = check_operator(
        build, runners=("inline", "threads", "process"), workers=(1, 2), stops=range(0, 12)
    )
    assert report.items >= 8
    for row in build():
        for sample, _, offset, tokens in row.payload["image_map"]:
            ids = row.payload["packed_samples"][sample]["input_ids"]
            start = offset - row.payload["cu_seqlens"][sample]
            assert (ids[start : start + tokens] == hf.image_token_id).all()
