from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from tokenizers import Tokenizer

from tests.engine._sources import RangeSource
from zephon import Dataset, Pipeline
from zephon.errors import ConfigError

TEXTS = ["héllo world", "data lanes and chunks", "x", "seed " * 40]


def tokenize_all(tokenizer, **kwargs) -> list[np.ndarray]:
    rows = [{"text": t} for t in TEXTS]
    pipe = Pipeline(RangeSource([Dataset.from_records("t", rows)], 2)).tokenize(tokenizer, **kwargs)
    return [r.payload["input_ids"] for r in pipe.options(runner="inline")]


def test_bytes_tokenizer_needs_no_files_and_brackets_documents():
    ids = tokenize_all("bytes")
    assert ids[0].dtype == np.int32
    assert ids[0].tolist() == [256, *"héllo world".encode(), 257]
    assert [len(x) for x in ids] == [len(t.encode()) + 2 for t in TEXTS]


def test_truncation_reserves_room_for_specials():
    ids = tokenize_all("bytes", max_length=10)
    assert all(len(x) <= 10 for x in ids)
    assert ids[3].tolist() == [256, *b"seed see", 257]
    assert tokenize_all("bytes", special_tokens="none", max_length=4)[3].tolist() == list(b"seed")
    assert tokenize_all("bytes", special_tokens="eos")[2].tolist() == [ord("x"), 257]
    assert tokenize_all("bytes", special_tokens="bos")[2].tolist() == [256, ord("x")]


def expected_hf(tok: Tokenizer) -> list[list[int]]:
    bos, eos = tok.token_to_id("<s>"), tok.token_to_id("</s>")
    return [[bos, *tok.encode(t, add_special_tokens=False).ids, eos] for t in TEXTS]


def test_hf_tokenizer_in_every_accepted_form(hf_tokenizer_dir: Path):
    tok = Tokenizer.from_file(str(hf_tokenizer_dir / "tokenizer.json"))
    want = expected_hf(tok)

    class TransformersLike:  # the shape of a fast transformers tokenizer, without transformers
        backend_tokenizer = tok
        bos_token_id = tok.token_to_id("<s>")
        eos_token_id = tok.token_to_id("</s>")

    for spec in (
        hf_tokenizer_dir,
        hf_tokenizer_dir / "tokenizer.json",
        str(hf_tokenizer_dir),
        tok,
        TransformersLike(),
    ):
        got = [x.tolist() for x in tokenize_all(spec)]
        assert got == want, spec


def test_tokenizer_without_bos_asks_for_an_id(tmp_path: Path, hf_tokenizer_dir: Path):
    bare = tmp_path / "tokenizer.json"
    data = (hf_tokenizer_dir / "tokenizer.json").read_text().replace('"<s>"', '"<start>"')
    bare.write_text(data)
    with pytest.raises(ConfigError, match=r"defines no BOS token.*bos_token_id: ID"):
        tokenize_all(bare)
    start = Tokenizer.from_file(str(bare)).token_to_id("<start>")
    ids = tokenize_all(bare, bos_token_id=start)
    assert ids[0][0] == start


def test_bad_tokenizer_path_fails_when_building_the_pipeline(tmp_path: Path):
    with pytest.raises(ConfigError, match="never downloads"):
        Pipeline(RangeSource([Dataset.from_records("t", [{"text": "a"}])], 1)).tokenize(
            str(tmp_path / "missing")
        )
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ConfigError, match=r"has no tokenizer\.json"):
        Pipeline(RangeSource([Dataset.from_records("t", [{"text": "a"}])], 1)).tokenize(empty)


def test_non_string_field_says_to_decode_first():
    rows = [{"text": b"raw bytes"}]
    pipe = Pipeline(RangeSource([Dataset.from_records("t", rows)], 1)).tokenize("bytes")
    with pytest.raises(KeyError, match="add decode_text"):
        list(pipe.options(runner="inline"))
    decoded = Pipeline(RangeSource([Dataset.from_records("t", rows)], 1)).decode_text().tokenize()
    (rec,) = list(decoded.options(runner="inline"))
    assert rec.payload["text"] == "raw bytes" and len(rec.payload["input_ids"]) == 11
