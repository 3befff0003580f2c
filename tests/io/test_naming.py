"""``Dataset.from_path(path)``: the name comes from the path; ``from_path(name, path)`` and
keyword calls keep working, and every call reads the same rows."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from zephon import Dataset
from zephon.errors import ConfigError
from zephon.io._naming import name_from_path


def _corpus(folder: Path, shards: int = 2, rows: int = 3) -> Path:
    folder.mkdir(parents=True)
    for s in range(shards):
        lines = [json.dumps({"id": s * rows + i, "text": f"row {s}-{i}"}) for i in range(rows)]
        (folder / f"part-{s}.jsonl").write_text("\n".join(lines) + "\n")
    return folder


def _rows(ds: Dataset) -> list[dict[str, object]]:
    return [row for sid, n in enumerate(ds.counts()) for row in ds.read(sid, range(n))]


def test_every_call_form_reads_the_same_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = _corpus(tmp_path / "my data!")
    monkeypatch.chdir(tmp_path)
    want = _rows(Dataset.from_path("web", data))
    calls = {
        "my_data": [
            Dataset.from_path(str(data)),
            Dataset.from_path(data),
            Dataset.from_path("my data!/"),
            Dataset.from_path(path="my data!"),
            Dataset.from_path("my data!/*.jsonl", fmt="jsonl"),
        ],
        "web": [
            Dataset.from_path("web", "my data!"),
            Dataset.from_path(name="web", path="my data!"),
            Dataset.from_path("web", path="my data!"),
            Dataset.from_path("my data!", name="web"),
            Dataset.from_path(path="my data!", name="web"),
        ],
        "part": [Dataset.from_path(["my data!/part-0.jsonl", "my data!/part-1.jsonl"])],
    }
    for name, datasets in calls.items():
        for ds in datasets:
            assert ds.name == name and _rows(ds) == want
    monkeypatch.chdir(data)
    assert Dataset.from_path(".").name == "my_data"


@pytest.mark.parametrize(
    ("path", "name"),
    [
        ("data/", "data"),
        ("data", "data"),
        ("corpora/books-0.parquet", "books-0"),
        ("x/shard.jsonl.zst", "shard"),
        ("x/train.ndjson.gz", "train"),
        ("s3://bucket/code/*.jsonl.zst", "code"),
        ("memory://bucket", "bucket"),
        ("file:///srv/web-2024/", "web-2024"),
        ("hf://org/corpus@v1.0/en/train", "corpus"),
        ("my-data/shard-000[01].jsonl", "my-data"),
        ("notes.v2.jsonl", "notes.v2"),
        (".jsonl", "jsonl"),
        (["b/books-0.parquet", "b/books-1.parquet"], "books"),
        (["a/train.jsonl", "b/train.jsonl"], "train"),
    ],
)
def test_names_derived_from_paths(path: str | list[str], name: str) -> None:
    assert name_from_path(path) == name


def test_paths_that_name_nothing_say_how_to_name_them() -> None:
    for path in ([], "/", "s3://*.jsonl", ["web.jsonl", "code.jsonl"], "!!!/"):
        with pytest.raises(ConfigError, match=r"Dataset.from_path\(NAME, path\)"):
            name_from_path(path)


def test_call_shape_errors_name_the_accepted_forms(tmp_path: Path) -> None:
    data = _corpus(tmp_path / "d")
    forms = "from_path\\(path\\), from_path\\(name, path\\)"
    bad: list[tuple[tuple[object, ...], dict[str, object]]] = [
        ((), {}),
        ((), {"name": "x"}),
        (("x", data, data), {}),
        (("x", data), {"name": "y"}),
        ((data,), {"name": "x", "path": data}),
        ((Path("x"), data), {}),
    ]
    for args, kwargs in bad:
        with pytest.raises(TypeError, match=forms):
            Dataset.from_path(*args, **kwargs)  # type: ignore[call-overload]
    with pytest.raises(TypeError, match="unexpected keyword argument 'paths'"):
        Dataset.from_path(paths=data)  # type: ignore[call-overload]


def test_a_list_of_parquet_files_is_named_by_their_common_start(tmp_path: Path) -> None:
    for k in range(2):
        pq.write_table(pa.table({"x": [k, k + 10]}), tmp_path / f"books-{k}.parquet")
    files = [os.fspath(tmp_path / f"books-{k}.parquet") for k in range(2)]
    ds = Dataset.from_path(files, columns=["x"])
    assert ds.name == "books" and _rows(ds) == [{"x": 0}, {"x": 10}, {"x": 1}, {"x": 11}]
