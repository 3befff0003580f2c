"""Interoperability with megatron-core's own ``IndexedDataset``: it reads the ``.bin/.idx`` pairs
our tests write, and we read the pairs its ``IndexedDatasetBuilder`` writes, for every dtype code
it writes."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

from tests.io._token_writers import MEGATRON_CODES, documents, write_megatron
from zephon.io import Dataset

with warnings.catch_warnings():  # it warns that Transformer Engine and Apex are not installed
    warnings.simplefilter("ignore")
    from megatron.core.datasets.indexed_dataset import IndexedDataset, IndexedDatasetBuilder


@pytest.mark.parametrize("code", sorted(MEGATRON_CODES))
def test_megatron_core_reads_our_files(tmp_path: Path, code: int) -> None:
    docs = documents(30, seed=code)
    write_megatron(tmp_path / "ours", docs, code)
    theirs = IndexedDataset(str(tmp_path / "ours"))
    assert len(theirs) == 30
    assert [theirs[i].tolist() for i in range(30)] == [d.tolist() for d in docs]
    ours = Dataset.from_path(tmp_path / "ours.idx")
    assert theirs.sequence_lengths.tolist() == [
        len(r["input_ids"]) for r in ours.read(0, range(30))
    ]


@pytest.mark.parametrize("dtype", [np.uint16, np.int32, np.int64, np.uint8])
def test_we_read_megatron_core_files(tmp_path: Path, dtype: type[np.number]) -> None:
    docs = documents(30, seed=7)
    builder = IndexedDatasetBuilder(str(tmp_path / "theirs.bin"), dtype=dtype)
    for d in docs:
        builder.add_document(d, [len(d)])  # a numpy array: its torch path warns under numpy 2
    builder.finalize(str(tmp_path / "theirs.idx"))
    ds = Dataset.from_path(tmp_path)
    rows = ds.read(0, list(range(30)))
    assert [r["input_ids"].tolist() for r in rows] == [d.tolist() for d in docs]
    assert rows[0]["input_ids"].dtype == np.dtype(dtype)
