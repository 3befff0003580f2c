"""Megatron .bin/.idx, datatrove .ds and OLMo/dolma .npy token files: written byte by byte from
each format's definition, read back document for document, locally and over S3."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest

from tests.io._s3 import S3
from tests.io._token_writers import (
    MEGATRON_CODES,
    documents,
    with_eos,
    write_datatrove,
    write_megatron,
    write_npy_raw,
)
from zephon.errors import ConfigError, DataFormatError
from zephon.io import Dataset, token_chunks


def _docs_of(ds: Dataset) -> list[list[int]]:
    out: list[list[int]] = []
    for shard, n in enumerate(ds.counts()):
        out += [r["input_ids"].tolist() for r in ds.read(shard, list(range(n)))]
    return out


@pytest.mark.parametrize("code", sorted(MEGATRON_CODES))
def test_megatron_every_dtype_code(tmp_path: Path, code: int) -> None:
    docs = documents(40, seed=code)
    write_megatron(tmp_path / "corpus" / "part", docs, code)
    ds = Dataset.from_path(tmp_path / "corpus")
    assert ds.counts() == [40]
    rows = ds.read(0, list(range(40)))
    assert [r["input_ids"].dtype for r in rows] == [np.dtype(MEGATRON_CODES[code])] * 40
    assert [r["input_ids"].tolist() for r in rows] == [d.tolist() for d in docs]
    assert [r["input_ids"].tolist() for r in ds.read(0, [39, 0, 7])] == [
        docs[39].tolist(),
        docs[0].tolist(),
        docs[7].tolist(),
    ]


def test_megatron_many_files_in_order_and_after_pickling(tmp_path: Path) -> None:
    parts = [documents(10 + i, seed=i) for i in range(3)]
    for i, docs in enumerate(parts):
        write_megatron(tmp_path / f"shard-{i}", docs)
    ds = Dataset.from_path("m", tmp_path)
    assert ds.counts() == [10, 11, 12]
    again = pickle.loads(pickle.dumps(ds))
    assert _docs_of(again) == [d.tolist() for docs in parts for d in docs]


def test_megatron_bad_files_are_named(tmp_path: Path) -> None:
    idx = write_megatron(tmp_path / "a", documents(5, seed=1))
    raw = idx.read_bytes()
    idx.write_bytes(b"XXXXXXX\x00\x00" + raw[9:])
    with pytest.raises(DataFormatError, match=r"a\.idx is not a Megatron index"):
        Dataset.from_path(tmp_path)
    idx.write_bytes(raw[:9] + raw[9:17] + bytes([9]) + raw[18:])
    with pytest.raises(DataFormatError, match="unknown dtype code 9"):
        Dataset.from_path(tmp_path)
    idx.write_bytes(raw[:-8])
    with pytest.raises(DataFormatError, match="truncated"):
        Dataset.from_path(tmp_path)
    idx.write_bytes(raw)
    bin_path = tmp_path / "a.bin"
    bin_path.write_bytes(bin_path.read_bytes()[:-4])
    with pytest.raises(DataFormatError, match=r"a\.idx: document 4 .*a\.bin holds 162 tokens"):
        Dataset.from_path(tmp_path).read(0, [0])


@pytest.mark.parametrize("width", [2, 4])
def test_datatrove_token_widths_and_loss_mask(tmp_path: Path, width: int) -> None:
    vocab = 60_000 if width == 2 else 200_000
    docs = documents(30, seed=width, vocab=vocab)
    masks = [np.arange(len(d)) % 3 != 0 for d in docs]
    write_datatrove(tmp_path / "out" / "000_shuffled.ds", docs, width, masks)
    ds = Dataset.from_path(tmp_path / "out")
    rows = ds.read(0, list(range(30)))
    assert [r["input_ids"].tolist() for r in rows] == [d.tolist() for d in docs]
    assert rows[0]["input_ids"].dtype.itemsize == width
    assert [r["loss_mask"].tolist() for r in rows] == [m.tolist() for m in masks]


def test_datatrove_without_index_says_how_to_fix(tmp_path: Path) -> None:
    path = write_datatrove(tmp_path / "a.ds", documents(3, seed=0))
    Path(f"{path}.index").unlink()
    with pytest.raises(DataFormatError, match=r"a\.ds\.index"):
        Dataset.from_path(tmp_path)


def test_npy_with_dolma_metadata(tmp_path: Path) -> None:
    docs = documents(25, seed=3, vocab=50_000)
    write_npy_raw(tmp_path / "part-0-00000.npy", docs, "uint16", metadata=True)
    ds = Dataset.from_path(tmp_path, format_options={"token_dtype": "uint16"})
    assert _docs_of(ds) == [d.tolist() for d in docs]


def test_npy_split_at_eos(tmp_path: Path) -> None:
    docs = with_eos(documents(25, seed=4), eos=0)
    write_npy_raw(tmp_path / "a.npy", docs, "uint32", metadata=False)
    ds = Dataset.from_path(tmp_path, format_options={"token_dtype": "uint32", "eos_id": 0})
    assert _docs_of(ds) == [d.tolist() for d in docs]
    # A last document without its EOS is still a document.
    write_npy_raw(tmp_path / "a.npy", [*docs, np.array([5, 6, 7])], "uint32", metadata=False)
    ds = Dataset.from_path(tmp_path, format_options={"token_dtype": "uint32", "eos_id": 0})
    assert _docs_of(ds)[-1] == [5, 6, 7]


def test_npy_with_a_header_needs_no_dtype(tmp_path: Path) -> None:
    docs = with_eos(documents(12, seed=5), eos=0)
    np.save(tmp_path / "tokens.npy", np.concatenate(docs).astype(np.int32))
    ds = Dataset.from_path(tmp_path, format_options={"eos_id": 0})
    assert _docs_of(ds) == [d.tolist() for d in docs]
    np.save(tmp_path / "tokens.npy", np.zeros((3, 4), np.int32))
    with pytest.raises(DataFormatError, match="1-D of integers"):
        Dataset.from_path(tmp_path, format_options={"eos_id": 0})


def test_npy_missing_options_say_which(tmp_path: Path) -> None:
    write_npy_raw(tmp_path / "a.npy", documents(3, seed=0), "uint16", metadata=False)
    with pytest.raises(ConfigError, match="token_dtype"):
        Dataset.from_path(tmp_path)
    with pytest.raises(ConfigError, match="eos_id"):
        Dataset.from_path(tmp_path, format_options={"token_dtype": "uint16"})
    with pytest.raises(ConfigError, match="unknown"):
        Dataset.from_path(tmp_path, format_options={"token_dtype": "uint16", "eos": 1})


def test_token_files_over_s3_by_range(s3: S3, tmp_path: Path) -> None:
    docs = documents(200, seed=9, vocab=50_000, lo=100, hi=400)
    write_megatron(tmp_path / "m" / "part", docs)
    write_datatrove(tmp_path / "d" / "part.ds", docs)
    write_npy_raw(tmp_path / "n" / "part.npy", docs, "uint16", metadata=True)
    for kind, opts in (("m", None), ("d", None), ("n", {"token_dtype": "uint16"})):
        url = s3.upload(tmp_path / kind, f"tokens/{kind}")
        ds = Dataset.from_path(url, format_options=opts)
        s3.proxy.reset()
        assert [r["input_ids"].tolist() for r in ds.read(0, [150, 3])] == [
            docs[150].tolist(),
            docs[3].tolist(),
        ]
        data = [g for g in s3.proxy.gets("part") if not g.path.endswith((".idx", ".index", ".gz"))]
        assert len(data) == 2, f"{kind}: one ranged read per document, got {data}"
        chunks = token_chunks(ds, 64)
        flat = np.concatenate(docs)
        assert chunks.read(0, [5])[0]["input_ids"].tolist() == flat[320:385].tolist()
