"""Hugging Face objects and folders, Lance versions: the cases the format matrix does not cover."""

from __future__ import annotations

import pickle
from pathlib import Path

import datasets
import pyarrow as pa
import pytest

from zephon.errors import ConfigError, DataError
from zephon.io import Dataset

ROWS = [{"id": i, "text": f"row {i}"} for i in range(300)]


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    datasets.disable_progress_bars()
    out = tmp_path_factory.mktemp("hf") / "saved"
    datasets.Dataset.from_list(ROWS).save_to_disk(str(out), num_shards=3)
    return out


def test_from_hf_uses_the_mapped_files_when_it_can(saved: Path) -> None:
    loaded = datasets.load_from_disk(str(saved))
    ds = Dataset.from_hf("docs", loaded)
    assert ds.counts() == [100, 100, 100]
    assert ds.read(2, [99, 0]) == [ROWS[299], ROWS[200]]
    assert len(pickle.dumps(ds)) < 4000  # workers get paths, not rows


def test_from_hf_keeps_shuffles_selections_and_projections(saved: Path) -> None:
    loaded = datasets.load_from_disk(str(saved))
    shuffled = loaded.shuffle(seed=3)
    ds = Dataset.from_hf("docs", shuffled, shard_size=128)
    assert ds.counts() == [128, 128, 44]
    assert [r for s in range(3) for r in ds.read(s, range(ds.counts()[s]))] == list(shuffled)
    picked = loaded.select(range(10, 20)).select_columns(["text"])
    assert Dataset.from_hf("p", picked).read(0, [0, 9]) == [{"text": "row 10"}, {"text": "row 19"}]
    in_memory = datasets.Dataset.from_list(ROWS)
    assert Dataset.from_hf("m", in_memory, columns=["id"]).read(0, [7]) == [{"id": 7}]


def test_from_hf_and_dataset_dict_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"takes a datasets\.Dataset, got list"):
        Dataset.from_hf("x", ROWS)
    splits = datasets.DatasetDict({"train": datasets.Dataset.from_list(ROWS)})
    splits.save_to_disk(str(tmp_path / "dd"))
    with pytest.raises(DataError, match=r"DatasetDict with splits \['train'\]; pass .*dd/train"):
        Dataset.from_path("x", tmp_path / "dd")
    assert Dataset.from_path("x", tmp_path / "dd" / "train").total() == 300


def test_lance_shards_are_pinned_to_the_version_discovered(tmp_path: Path) -> None:
    import lance  # not at import time: lance warns about every later fork in the session

    uri = str(tmp_path / "t.lance")
    lance.write_dataset(pa.Table.from_pylist(ROWS), uri, max_rows_per_file=120)
    ds = Dataset.from_path("l", uri)
    assert ds.counts() == [120, 120, 60]
    lance.write_dataset(pa.Table.from_pylist(ROWS[:5]), uri, mode="append")
    lance.dataset(uri).delete("id = 121")
    clone = pickle.loads(pickle.dumps(ds))  # a worker reopens the same version
    assert clone.read(1, [1, 0, 1]) == [ROWS[121], ROWS[120], ROWS[121]]
    now = Dataset.from_path("l", uri)
    assert now.counts() == [120, 119, 60, 5]
    assert now.read(1, [1]) == [ROWS[122]]  # Lance offsets skip deleted rows
