"""Formats come from one registry: a format registered there works end to end (discovery by
suffix, ``fmt=``, YAML ``format:``, error messages, a pipeline on every runner), and every
list of names (YAML schema, errors, the docs table) is the registry's."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from zephon import Pipeline, StaticMixtureWorkSource
from zephon.config import ConfigFileError, parse_config
from zephon.errors import ConfigError, DataError, MissingDependencyError
from zephon.io import (
    Dataset,
    FormatSpec,
    ReadOptions,
    Row,
    Shard,
    format_names,
    formats,
    formats_markdown,
    list_shards,
    register_format,
    unregister_format,
)
from zephon.types import SampleBatch

DOCS = Path(__file__).resolve().parents[2] / "docs" / "datasets.md"


class TsvShard(Shard):
    """A tab-separated file with a header line: the smallest format a user might add."""

    def __init__(self, path: str, columns: Sequence[str] | None) -> None:
        self.path = path
        lines = Path(path).read_text().splitlines()
        header = lines[0].split("\t")
        self.rows = [dict(zip(header, line.split("\t"), strict=True)) for line in lines[1:]]
        if columns is not None:
            self.rows = [{c: r[c] for c in columns} for r in self.rows]

    @property
    def location(self) -> str:
        return self.path

    def __len__(self) -> int:
        return len(self.rows)

    def read(self, indices: Sequence[int]) -> list[Row]:
        return [dict(self.rows[i]) for i in indices]


def open_tsv(url: str, rows: int | None, options: ReadOptions) -> Shard:
    return TsvShard(url, options.columns)


TSV = FormatSpec("tsv", "*.tsv", suffixes=(".tsv",), open_file=open_tsv)


@pytest.fixture
def tsv() -> Iterator[FormatSpec]:
    register_format(TSV)
    yield TSV
    unregister_format("tsv")


def write_tsv(folder: Path, shards: int = 3, rows: int = 40) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for s in range(shards):
        lines = ["id\ttext"] + [f"{s * rows + i}\tdoc {s}-{i}" for i in range(rows)]
        (folder / f"part-{s}.tsv").write_text("\n".join(lines) + "\n")
    return folder


def batches(ds: Dataset, runner: str) -> list[Any]:
    source = StaticMixtureWorkSource([ds], chunk_size=16, seed=3, shuffle_within_shard=True)
    pipe = Pipeline(source).fetch(parallelism=2).decode_text().batch(8, drop_last=False)
    out = []
    for batch in pipe.options(runner=runner):
        assert isinstance(batch, SampleBatch)
        out.append([(r.meta.sample_id, r.payload["id"], r.payload["text"]) for r in batch])
    return out


def test_builtin_formats_are_registered_in_order() -> None:
    assert format_names()[:8] == (
        "jsonl", "parquet", "arrow", "vortex", "hf", "lance", "mds", "litdata",
    )  # fmt: skip
    assert [s.name for s in formats() if s.folder] == ["hf", "lance", "mds", "litdata", "converted"]


def test_a_registered_format_reads_through_a_pipeline(tmp_path: Path, tsv: FormatSpec) -> None:
    folder = write_tsv(tmp_path / "tsv")
    ds = Dataset.from_path("docs", folder)
    assert ds.counts() == [40, 40, 40]
    inline = batches(ds, "inline")
    assert inline == batches(ds, "threads")
    ids = sorted(int(i) for batch in inline for _, i, _ in batch)
    assert ids == list(range(120))  # every row exactly once
    assert [s[1] for s in list_shards(folder)] == ["tsv"] * 3


def test_a_registered_format_is_known_to_yaml_and_fmt(tmp_path: Path, tsv: FormatSpec) -> None:
    folder = write_tsv(tmp_path / "data", shards=1)
    (folder / "part-0.tsv").rename(folder / "part-0.txt")
    data = {"datasets": [{"name": "d", "path": str(folder), "format": "tsv"}]}
    config = parse_config(data)
    assert config.datasets[0].fmt == "tsv"
    rows = [r.payload for r in config.build()]
    assert sorted(int(r["id"]) for r in rows) == list(range(40))
    projected = Dataset.from_path("d", folder, fmt="tsv", columns=["text"])
    assert projected.read(0, [1]) == [{"text": "doc 0-1"}]


def test_unknown_names_list_the_registry(tmp_path: Path, tsv: FormatSpec) -> None:
    with pytest.raises(ConfigFileError, match=r"format: expected one of .*'tsv' or null"):
        parse_config({"datasets": [{"name": "d", "path": ".", "format": "tvs"}]})
    with pytest.raises(ConfigError, match=r"fmt must be one of .*tsv.*did you mean 'tsv'"):
        Dataset.from_path("d", tmp_path, fmt="tvs")
    (tmp_path / "data.csv").write_text("a,b\n")
    with pytest.raises(DataError, match=r"expected one of .*\*\.tsv"):
        Dataset.from_path("d", tmp_path / "data.csv")


def test_unregistered_format_is_gone(tmp_path: Path) -> None:
    register_format(TSV)
    unregister_format("tsv")
    assert "tsv" not in format_names()
    with pytest.raises(ConfigFileError, match="format: expected one of"):
        parse_config({"datasets": [{"name": "d", "path": ".", "format": "tsv"}]})


def test_registering_twice_needs_replace(tsv: FormatSpec) -> None:
    with pytest.raises(ConfigError, match="already registered"):
        register_format(TSV)
    assert register_format(TSV, replace=True) is TSV


def test_a_spec_is_a_file_or_a_folder_format() -> None:
    with pytest.raises(ConfigError, match="either suffixes and open_file"):
        FormatSpec("half", "*.half", suffixes=(".half",))
    with pytest.raises(ConfigError, match="identifier"):
        FormatSpec("no name", "x", suffixes=(".x",), open_file=open_tsv)


def test_a_missing_library_names_the_spec_extra(tmp_path: Path) -> None:
    def needs_a_library(url: str, rows: int | None, options: ReadOptions) -> Shard:
        import zephon_no_such_library  # type: ignore[import-not-found]  # noqa: F401

        raise AssertionError("unreachable")

    register_format(
        FormatSpec("fancy", "*.fancy", suffixes=(".fancy",), open_file=needs_a_library, extra="x")
    )
    try:
        (tmp_path / "a.fancy").write_text("")
        with pytest.raises(MissingDependencyError, match=r"pip install 'zephon\[x\]'"):
            Dataset.from_path("d", tmp_path)
    finally:
        unregister_format("fancy")


def test_a_registered_folder_format_is_detected(tmp_path: Path) -> None:
    def is_bundle(entry: str, storage_options: dict[str, Any] | None) -> bool:
        return (Path(entry) / "bundle.json").is_file()

    def open_bundle(entry: str, options: ReadOptions) -> list[Shard]:
        names = json.loads((Path(entry) / "bundle.json").read_text())["shards"]
        return [TsvShard(str(Path(entry) / n), options.columns) for n in names]

    register_format(
        FormatSpec("bundle", "a bundle folder", detect=is_bundle, open_folder=open_bundle)
    )
    try:
        folder = write_tsv(tmp_path / "b", shards=2)
        (folder / "bundle.json").write_text(json.dumps({"shards": ["part-1.tsv"]}))
        ds = Dataset.from_path("d", folder)
        assert ds.counts() == [40] and ds.read(0, [0]) == [{"id": "40", "text": "doc 1-0"}]
        assert list_shards(folder) == [(str(folder), "bundle", None)]
    finally:
        unregister_format("bundle")


def test_docs_table_is_the_registry() -> None:
    found = re.search(r"<!-- formats:begin -->\n(.*?)<!-- formats:end -->", DOCS.read_text(), re.S)
    assert found is not None, "docs/datasets.md lost its formats table markers"
    assert found.group(1) == formats_markdown(), (
        "docs/datasets.md's format names table differs from zephon.io.formats(); "
        "replace it with zephon.io.formats_markdown()"
    )
