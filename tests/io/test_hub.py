"""``hf://`` datasets through huggingface_hub against a loopback Hub: revision pinning, the
Parquet conversion fallback, the offline cache and errors."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.io._hub import Hub, Repo, Revision
from zephon import Pipeline, StaticMixtureWorkSource
from zephon.config import load_config
from zephon.errors import ConfigError, DataError
from zephon.io import Dataset

Rows = list[dict[str, Any]]


def parquet(rows: Rows) -> bytes:
    buf = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), buf)
    return buf.getvalue()


def rows(tag: str, start: int, n: int) -> Rows:
    return [{"id": i, "text": f"{tag} {i}"} for i in range(start, start + n)]


def corpus(tag: str) -> dict[str, bytes]:
    return {
        "README.md": b"# corpus\n",
        "data/train-00000-of-00002.parquet": parquet(rows(tag, 0, 30)),
        "data/train-00001-of-00002.parquet": parquet(rows(tag, 30, 25)),
        "data/test-00000-of-00001.parquet": parquet(rows(tag, 100, 7)),
    }


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Hub]:
    server = Hub()
    v1 = Revision("a" * 40, corpus("v1"))
    server.repos["org/corpus"] = Repo({"main": Revision("b" * 40, corpus("v2")), "v1": v1})
    converted = {
        "default/train/0000.parquet": parquet(rows("conv", 0, 12)),
        "other/train/0000.parquet": parquet(rows("other", 0, 5)),
    }
    server.repos["org/scripted"] = Repo(
        {
            "main": Revision("c" * 40, {"scripted.py": b"import datasets\n", "raw.bin": b"\0"}),
            "refs/convert/parquet": Revision("d" * 40, converted),
        }
    )
    monkeypatch.setenv("HF_ENDPOINT", server.endpoint)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    yield server
    server.close()


def read_all(ds: Dataset) -> Rows:
    return [r for s, n in enumerate(ds.counts()) for r in ds.read(s, range(n))]


def test_revision_pins_the_commit(hub: Hub) -> None:
    pinned = Dataset.from_path("c", "hf://org/corpus@v1/train")
    assert read_all(pinned) == rows("v1", 0, 55)
    assert pinned.shard_count() == 2 and all("a" * 40 in s.location for s in pinned.shards)
    latest = Dataset.from_path("c", "hf://org/corpus/train")
    assert read_all(latest) == rows("v2", 0, 55)
    by_commit = Dataset.from_path("c", f"hf://org/corpus@{'a' * 40}/test")
    assert read_all(by_commit) == rows("v1", 100, 7)


def test_offline_reads_the_cache_and_makes_no_request(
    hub: Hub, monkeypatch: pytest.MonkeyPatch
) -> None:
    online = read_all(Dataset.from_path("c", "hf://org/corpus@v1/train"))
    hub.repos["org/corpus"].refs["v1"] = Revision("e" * 40, corpus("moved"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    before = len(hub.requests)
    assert read_all(Dataset.from_path("c", "hf://org/corpus@v1/train")) == online
    assert len(hub.requests) == before
    with pytest.raises(DataError, match=r"HF_HUB_OFFLINE is set and the cache .* holds no file"):
        Dataset.from_path("c", "hf://org/corpus@v1/test")


def test_parquet_conversion_is_the_fallback(hub: Hub) -> None:
    assert read_all(Dataset.from_path("s", "hf://org/scripted/train")) == rows("conv", 0, 12)
    assert read_all(Dataset.from_path("s", "hf://org/scripted/other/train")) == rows("other", 0, 5)
    assert any("refs%2Fconvert%2Fparquet" in r for r in hub.requests)


def test_a_pipeline_over_the_hub_equals_one_over_local_files(hub: Hub, tmp_path: Path) -> None:
    local = tmp_path / "local"
    local.mkdir()
    for name, data in corpus("v1").items():
        if "/train-" in name:
            (local / Path(name).name).write_bytes(data)

    def ids(ds: Dataset) -> list[Any]:
        source = StaticMixtureWorkSource([ds], chunk_size=8, seed=3, shuffle_within_shard=True)
        pipe = Pipeline(source).batch(4, drop_last=False)
        return [[r.payload["id"] for r in b] for b in pipe]

    assert ids(Dataset.from_path("c", "hf://org/corpus@v1/train")) == ids(
        Dataset.from_path("c", local)
    )


def test_yaml_takes_a_hub_path(hub: Hub, tmp_path: Path) -> None:
    config = {
        "datasets": [{"name": "c", "path": "hf://org/corpus@v1/test", "columns": ["id"]}],
        "operators": [{"op": "batch", "microbatch_size": 7}],
    }
    (tmp_path / "p.yaml").write_text(json.dumps(config))
    batches = list(load_config(tmp_path / "p.yaml").build())
    assert sorted(r.payload["id"] for r in batches[0]) == list(range(100, 107))


def test_errors_name_the_path_and_the_fix(hub: Hub) -> None:
    with pytest.raises(DataError, match=r"hf://org/nope@main/train: no such dataset at http"):
        Dataset.from_path("x", "hf://org/nope/train")
    with pytest.raises(DataError, match=r"has no revision 'v9'"):
        Dataset.from_path("x", "hf://org/corpus@v9/train")
    with pytest.raises(DataError, match=r"no file of split 'dev' .* files: README\.md"):
        Dataset.from_path("x", "hf://org/corpus/dev")
    with pytest.raises(ConfigError, match=r"hf://ORG/NAME\[@REVISION\]\[/CONFIG\]/SPLIT"):
        Dataset.from_path("x", "hf://corpus")
