"""`zephon cache ls/clean`, and read-only commands leave the data folder alone."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import fsspec
import pytest

from zephon.cli import main
from zephon.io import CacheOptions, Dataset


@pytest.fixture
def filled(tmp_path: Path) -> Path:
    fs = fsspec.filesystem("memory")
    for s in range(2):
        rows = "".join(json.dumps({"s": s, "i": i}) + "\n" for i in range(50 + s))
        fs.pipe(f"/zephon-cache-cli/part-{s}.jsonl", rows.encode())
    try:
        ds = Dataset.from_path("m", "memory://zephon-cache-cli", cache=CacheOptions(tmp_path / "c"))
        assert ds.read(1, [50]) == [{"s": 1, "i": 50}]
    finally:
        fs.rm("/zephon-cache-cli", recursive=True)
    return tmp_path / "c"


def test_ls_lists_shards_and_verify_finds_damage(
    filled: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["cache", "ls", "--dir", str(filled)]) == 0
    out = capsys.readouterr().out
    assert "2 shards" in out and "zephon-cache-cli/part-1.jsonl" in out
    (copy,) = (filled / "objects").glob("*-part-1.jsonl")
    copy.write_bytes(copy.read_bytes().replace(b'"i": 7', b'"i": 8'))  # same size, other bytes
    assert main(["cache", "ls", "--dir", str(filled), "--verify", "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert {Path(s["url"]).name: s["ok"] for s in doc["shards"]} == {
        "part-0.jsonl": True,
        "part-1.jsonl": False,
    }
    assert doc["derived_bytes"] > 0  # the offset indexes
    assert main(["cache", "clean", "--dir", str(filled), "--corrupt"]) == 0
    assert "removed 1 shards" in capsys.readouterr().out
    assert [p.name.split("-", 1)[1] for p in (filled / "objects").glob("*.jsonl")] == [
        "part-0.jsonl"
    ]


def test_clean_to_a_size_then_everything(filled: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sizes = sorted(p.stat().st_size for p in (filled / "objects").glob("*.jsonl"))
    assert main(["cache", "clean", "--dir", str(filled), "--max-bytes", str(sizes[1])]) == 0
    assert "removed 1 shards" in capsys.readouterr().out
    assert len(list((filled / "objects").glob("*.jsonl"))) == 1
    assert (filled / "derived").is_dir()  # a size limit keeps the small derived files
    assert main(["cache", "clean", "--dir", str(filled)]) == 0
    assert not list((filled / "objects").glob("*.jsonl")) and not (filled / "derived").exists()
    assert main(["cache", "clean", "--dir", str(filled), "--max-bytes", "-1"]) == 2


def test_explain_reads_metadata_only(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ZEPHON_CACHE_DIR", str(workdir / "cache"))
    shard = next((workdir / "my-data").glob("*.jsonl"))
    with open(shard, "rb") as src, gzip.open(f"{shard}.gz", "wb") as dst:
        dst.write(src.read())
    shard.unlink()  # one compressed shard: explain must not decompress it
    before = sorted(p.name for p in (workdir / "my-data").iterdir())
    assert main(["explain", str(workdir / "pipeline.yaml")]) == 0
    assert sorted(p.name for p in (workdir / "my-data").iterdir()) == before
    assert not (workdir / "cache").exists()  # no index, no decompressed copy anywhere
    assert main(["run", str(workdir / "pipeline.yaml"), "--quiet", "--max-batches", "1"]) == 0
    assert list((workdir / "cache").rglob("*.zidx"))  # a run builds them, in the cache
