"""Every format, the same checks: identical batches, exactly once across ranks, runner equality,
stop/restore, projection, and a clear error for a damaged file."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.engine import _resume as resume
from tests.io._corpus import corpus_docs
from tests.io._formats import ELSEWHERE, FORMATS, WRITERS, matrix_formats
from zephon import Dataset, Pipeline, StaticMixtureWorkSource
from zephon.config import load_config
from zephon.errors import DataFormatError
from zephon.io import FormatSpec, format_names, register_format, unregister_format
from zephon.types import SampleBatch

DOCS = corpus_docs()
ROOT = Path(__file__).resolve().parents[2]


def test_every_registered_format_is_in_the_matrix_or_names_its_test_file() -> None:
    assert set(FORMATS) | set(ELSEWHERE) == set(format_names())
    assert set(FORMATS) == set(WRITERS) and not set(FORMATS) & set(ELSEWHERE)
    for fmt, test_file in ELSEWHERE.items():
        assert fmt in (ROOT / test_file).read_text(), f"{test_file} does not test {fmt}"


def _never_opened(url: str, rows: int | None, options: Any) -> Any:
    raise AssertionError(f"the matrix check opened {url}")


def test_a_registered_format_without_a_test_entry_fails_naming_what_to_add() -> None:
    register_format(FormatSpec("tsv", "*.tsv", suffixes=(".tsv",), open_file=_never_opened))
    try:
        with pytest.raises(LookupError, match=r"\['tsv'\] have no entry .* WRITERS .* ELSEWHERE"):
            matrix_formats(format_names())
    finally:
        unregister_format("tsv")
    assert matrix_formats(format_names()) == FORMATS


def build(ds: Dataset, workers: int = 1, **options: Any) -> Pipeline:
    source = StaticMixtureWorkSource([ds], chunk_size=300, seed=5, shuffle_within_shard=True)
    pipe = Pipeline(source).fetch(parallelism=workers).batch(16, drop_last=False)
    return pipe.options(canonical_replicas=4, **options)


def key(batch: Any) -> Any:
    assert isinstance(batch, SampleBatch)
    return (
        batch.lane_id,
        tuple((r.meta.sample_id, tuple(sorted(r.payload.items()))) for r in batch),
    )


def first_shards(path: Path, n: int = 2, **kw: Any) -> Dataset:
    full = Dataset.from_path("docs", path, **kw)
    return Dataset("docs", full.shards[:n])


def shards_for(fmt: str) -> int:
    """Two shards; LitData one (litdata reads item by item, so two make the test
    several seconds longer without checking more: its batches equal JSONL's above)."""
    return 1 if fmt == "litdata" else 2


def test_every_format_gives_identical_batches(corpus_dirs: dict[str, Path]) -> None:
    outputs = {
        fmt: [key(b) for b in build(Dataset.from_path("docs", p))] for fmt, p in corpus_dirs.items()
    }
    reference = outputs["jsonl"]
    rows = [dict(payload) for _, batch in reference for _, payload in batch]
    assert sorted(rows, key=lambda r: r["id"]) == DOCS  # every document once, unchanged
    assert [r["id"] for r in rows] != sorted(r["id"] for r in rows)  # and really shuffled
    for fmt, out in outputs.items():
        assert out == reference, f"{fmt} differs from jsonl"


@pytest.mark.parametrize("fmt", FORMATS)
def test_exactly_once_per_pass_across_ranks(corpus_dirs: dict[str, Path], fmt: str) -> None:
    ds = first_shards(corpus_dirs[fmt], shards_for(fmt))
    expected = sorted(d["id"] for d in DOCS[: ds.total()])
    for world in (1, 2, 4):
        ids = [
            r.payload["id"]
            for rank in range(world)
            for b in build(ds, runner="inline", dp_rank=rank, dp_world_size=world)
            for r in b
        ]
        assert sorted(ids) == expected, f"{world} ranks"


@pytest.mark.parametrize("fmt", FORMATS)
def test_runners_and_stop_restore_agree(corpus_dirs: dict[str, Path], fmt: str) -> None:
    ds = first_shards(corpus_dirs[fmt], shards_for(fmt))
    reference = [key(b) for b in build(ds, runner="inline")]
    assert [key(b) for b in build(ds, runner="threads", workers=3)] == reference
    assert resume.run_with_stops(lambda: build(ds, runner="inline"), key, [37, 251]) == reference


def test_process_runner_reads_every_format(corpus_dirs: dict[str, Path]) -> None:
    """One spawned pool reads a mixture of every format (shards travel pickled)."""
    datasets = [
        Dataset(fmt, Dataset.from_path(fmt, p).shards[:1]) for fmt, p in corpus_dirs.items()
    ]

    def mixed(**options: Any) -> Pipeline:
        source = StaticMixtureWorkSource(datasets, {f: 1.0 for f in FORMATS}, chunk_size=200)
        return Pipeline(source).fetch(parallelism=2).batch(16, drop_last=False).options(**options)

    reference = [key(b) for b in mixed(runner="inline")]
    assert len({r[0][0] for _, batch in reference for r in batch}) == len(FORMATS)
    assert [key(b) for b in mixed(runner="process")] == reference


@pytest.mark.parametrize("fmt", FORMATS)
def test_projection(corpus_dirs: dict[str, Path], fmt: str) -> None:
    ds = Dataset.from_path("docs", corpus_dirs[fmt], columns=["text", "id"])
    assert ds.read(1, [5, 0, 5]) == [
        {"text": DOCS[4000 + i]["text"], "id": 4000 + i} for i in (5, 0, 5)
    ]
    with pytest.raises(DataFormatError, match=r"no column\(s\) \['nope'\]"):
        Dataset.from_path("docs", corpus_dirs[fmt], columns=["nope"]).read(0, [0])


def _damage_jsonl(root: Path) -> Path:
    target = root / "part-01.jsonl"
    lines = target.read_bytes().splitlines(keepends=True)
    lines[6] = b'{"id": 4006, "text": oops}\n'
    target.write_bytes(b"".join(lines))
    return target


def _truncate(pattern: str) -> Callable[[Path], Path]:
    def damage(root: Path) -> Path:
        target = sorted(root.rglob(pattern))[1]
        data = target.read_bytes()
        target.write_bytes(data[: len(data) // 2])
        return target

    return damage


def _flip_mds(root: Path) -> Path:
    target = sorted(root.rglob("*.mds.zstd"))[1]
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0xFF
    target.write_bytes(bytes(data))
    return target


DAMAGE: dict[str, tuple[Callable[[Path], Path], str]] = {
    "jsonl": (_damage_jsonl, r"part-01\.jsonl, line 7: malformed JSON"),
    "parquet": (_truncate("*.parquet"), r"part-01\.parquet is corrupt or not Parquet"),
    "hf": (_truncate("*.arrow"), r"data-00001-of-00005\.arrow is corrupt or not Arrow"),
    "arrow": (_truncate("*.feather"), r"part-02\.feather is corrupt or not Arrow"),
    "lance": (_truncate("*.lance"), r"fragment=\d: rows cannot be read"),
    "mds": (_flip_mds, r"shard\.00000\.mds\.zstd is damaged: its sha1 is"),
    "litdata": (_truncate("*.bin"), r"LitData chunk .*chunk-0-1\.bin, item 6: cannot be read"),
    "vortex": (_truncate("*.vortex"), r"part-01\.vortex is corrupt or not Vortex"),
}


@pytest.mark.parametrize("fmt", FORMATS)
def test_damaged_file_is_a_clear_error(
    corpus_dirs: dict[str, Path], fmt: str, tmp_path: Path
) -> None:
    root = tmp_path / corpus_dirs[fmt].name
    shutil.copytree(corpus_dirs[fmt], root)
    damage, message = DAMAGE[fmt]
    damage(root)
    with pytest.raises(DataFormatError, match=message):
        ds = Dataset.from_path("docs", root)
        for shard in range(ds.shard_count()):
            ds.read(shard, [6, 4000 - 1])


def test_yaml_names_every_format(corpus_dirs: dict[str, Path], tmp_path: Path) -> None:
    lines = ["datasets:"]
    for fmt, path in corpus_dirs.items():
        lines += [
            f"  - name: {fmt}",
            f"    path: {path}",
            f"    format: {fmt}",
            "    columns: [id]",
        ]
        if fmt == "mds":  # compressed shards: decompressed copies go to the derived folder
            lines += ["    cache: {dir: node-cache, max_bytes: 100000000}"]
    lines += ["source: {chunk_size: 500}"]
    lines += ["operators: [{op: batch, microbatch_size: 50, drop_last: false}]"]
    (tmp_path / "p.yaml").write_text("\n".join(lines) + "\n")
    pipe = load_config(tmp_path / "p.yaml").build()
    ids: dict[int, list[int]] = {}
    for batch in pipe:
        for r in batch:
            ids.setdefault(r.meta.sample_id[0], []).append(r.payload["id"])
    assert sorted(ids) == list(range(len(FORMATS)))
    assert all(sorted(v) == list(range(len(DOCS))) for v in ids.values())
    assert (tmp_path / "node-cache" / "derived").is_dir()  # relative to the file's folder
