"""Object stores: the corpus on a real S3 server (moto, loopback), ranged reads, retries,
errors, and the node cache shared by several processes."""

from __future__ import annotations

import hashlib
import json
import multiprocessing as mp
import re
import warnings
from pathlib import Path
from typing import Any

import pytest

from tests.io._cache_worker import read_everything
from tests.io._formats import FIXTURES
from tests.io._s3 import BUCKET, S3
from zephon import Dataset, Pipeline, StaticMixtureWorkSource
from zephon.errors import CacheThrashingWarning, DataError
from zephon.io import CacheOptions
from zephon.types import SampleBatch

REMOTE = ("jsonl", "parquet", "arrow", "mds")


@pytest.fixture(scope="module")
def remote(s3: S3, corpus_dirs: dict[str, Path]) -> dict[str, str]:
    return {fmt: s3.upload(corpus_dirs[fmt], f"corpus/{fmt}") for fmt in REMOTE}


def batches(ds: Dataset) -> list[Any]:
    source = StaticMixtureWorkSource([ds], chunk_size=500, seed=1)
    pipe = Pipeline(source).fetch(max_batch=500).batch(25, drop_last=False)
    pipe.options(canonical_replicas=2)
    out = []
    for batch in pipe:
        assert isinstance(batch, SampleBatch)
        out.append((batch.lane_id, [(r.meta.sample_id, r.payload) for r in batch]))
    return out


@pytest.mark.parametrize("fmt", REMOTE)
def test_remote_batches_equal_local_with_and_without_cache(
    remote: dict[str, str], corpus_dirs: dict[str, Path], fmt: str, tmp_path: Path
) -> None:
    reference = batches(Dataset.from_path("docs", corpus_dirs[fmt]))
    ranged = Dataset.from_path("docs", remote[fmt])
    assert batches(ranged) == reference
    cached = Dataset.from_path("docs", remote[fmt], cache=CacheOptions(dir=tmp_path / "c"))
    assert batches(cached) == reference
    assert cached.stats().cache_downloads == 5


def _sizes(s3: S3, prefix: str) -> dict[str, int]:
    listing = s3.client.list_objects_v2(Bucket=BUCKET, Prefix=prefix)["Contents"]
    return {o["Key"]: int(o["Size"]) for o in listing}


def _ranged_read(s3: S3, ds: Dataset, shard: int, rows: list[int], key: str) -> int:
    """Read ``rows``; check every GET of ``key`` was ranged and return the bytes fetched."""
    before = ds.stats().bytes_fetched
    s3.proxy.reset()
    got = ds.read(shard, rows)
    fetched = ds.stats().bytes_fetched - before
    gets = s3.proxy.gets(key)
    assert gets and all(g.range for g in gets), f"{key}: a GET without a byte range"
    assert sum(g.body_bytes for g in gets) == fetched
    assert [r["id"] for r in got] == [shard * 4000 + i for i in rows]
    return fetched


def test_ranged_reads_fetch_a_small_part_of_each_shard(
    s3: S3, remote: dict[str, str], tmp_path: Path
) -> None:
    parquet = Dataset.from_path("docs", remote["parquet"])
    rows = [3, 499, 10, 2500, 2501]  # two of the eight row groups
    fetched = _ranged_read(s3, parquet, 2, rows, "part-02.parquet")
    assert fetched < _sizes(s3, "corpus/parquet/part-02")["corpus/parquet/part-02.parquet"] / 3
    # JSONL: nearby lines share a request, lines a MiB apart do not.
    big = tmp_path / "big"
    big.mkdir()
    (big / "big.jsonl").write_text(
        "".join(json.dumps({"id": i, "pad": "x" * 60}) + "\n" for i in range(60_000))
    )
    url = s3.upload(big, "big")
    Dataset.from_path("big", url, cache_dir=tmp_path).read(0, [0])  # builds the offset index
    ds = Dataset.from_path("big", url, cache_dir=tmp_path)
    fetched = _ranged_read(s3, ds, 0, [3, 499, 10, 30_000, 30_001, 59_999], "big.jsonl")
    assert len(s3.proxy.gets("big.jsonl")) == 3
    assert fetched < (big / "big.jsonl").stat().st_size / 50


def test_transient_failures_are_retried(
    s3: S3, remote: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ZEPHON_IO_BACKOFF_S", "0.01")
    expected = Dataset.from_path("docs", remote["parquet"]).read(1, [10, 20])
    objects = lambda method, path: method == "GET" and path.endswith("part-01.parquet")  # noqa: E731
    s3.proxy.reset(fail=3, status=503, match=objects)  # botocore's own retries absorb these
    assert Dataset.from_path("docs", remote["parquet"]).read(1, [10, 20]) == expected
    assert sum(1 for g in s3.proxy.gets() if g.status == 503) == 3
    # With the client's retries off, ours do the work (and are counted).
    no_retry = {"config_kwargs": {"retries": {"total_max_attempts": 1}}}
    ds = Dataset.from_path("docs", remote["parquet"], storage_options=no_retry)
    s3.proxy.reset(fail=2, status=500, match=objects)
    before = ds.stats().retries
    assert ds.read(1, [10, 20]) == expected
    assert ds.stats().retries - before == 2
    monkeypatch.setenv("ZEPHON_IO_RETRIES", "2")
    s3.proxy.reset(fail=100, status=503, match=objects)
    with pytest.raises(DataError, match=r"part-01\.parquet: .* failed after 3 attempt\(s\)"):
        Dataset.from_path("docs", remote["parquet"], storage_options=no_retry)
    s3.proxy.reset()


def test_missing_bucket_and_object_are_clear_errors(s3: S3) -> None:
    with pytest.raises(DataError, match=r"bucket 'no-such-bucket' does not exist"):
        Dataset.from_path("x", "s3://no-such-bucket/data/")
    with pytest.raises(DataError, match=rf"s3://{BUCKET}/nothing-here\.jsonl does not exist"):
        Dataset.from_path("x", f"s3://{BUCKET}/nothing-here.jsonl")


def test_four_processes_share_one_download_per_shard(
    s3: S3, remote: dict[str, str], tmp_path: Path
) -> None:
    s3.proxy.reset()
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [
        ctx.Process(target=read_everything, args=(remote["jsonl"], str(tmp_path / "c"), queue))
        for _ in range(4)
    ]
    for p in procs:
        p.start()
    results = [queue.get(timeout=100) for _ in procs]
    for p in procs:
        p.join(timeout=20)
    assert len({digest for digest, _ in results}) == 1
    assert sum(stats["cache_downloads"] for _, stats in results) == 5
    assert sum(stats["cache_hits"] for _, stats in results) >= 15  # 3 ranks x 5 shards
    shards = [k for k in _sizes(s3, "corpus/jsonl/") if k.endswith(".jsonl")]
    for key in shards:
        gets = s3.proxy.gets(f"/{key}")
        assert len(gets) == 1 and gets[0].body_bytes == _sizes(s3, key)[key], key
    copies = (tmp_path / "c" / "objects").glob("*-part-*.jsonl")
    local = Dataset.from_path("docs", sorted(copies, key=lambda p: p.name.split("-", 1)[1]))
    want = hashlib.sha256()
    for shard, n in enumerate(local.counts()):
        want.update(json.dumps(local.read(shard, range(n))).encode())
    assert results[0][0] == want.hexdigest()


def test_lru_eviction_and_thrashing_are_counted(
    s3: S3, remote: dict[str, str], tmp_path: Path
) -> None:
    sizes = _sizes(s3, "corpus/parquet/")
    limit = int(max(sizes.values()) * 2.5)
    cache = CacheOptions(dir=tmp_path / "c", max_bytes=limit)
    ds = Dataset.from_path("docs", remote["parquet"], cache=cache)  # opens all 5: 2 stay
    used = sum(p.stat().st_size for p in (tmp_path / "c" / "objects").glob("*.parquet"))
    assert used <= limit
    assert ds.stats().cache_evictions == 3
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        again = Dataset.from_path("docs", remote["parquet"], cache=cache)  # all 5 again
    thrashed = [str(w.message) for w in caught if w.category is CacheThrashingWarning]
    assert [re.search(r"part-0\d\.parquet was evicted", m) is not None for m in thrashed] == [
        True
    ] * 5
    assert again.stats().cache_refetches == 5
    assert again.read(0, [1]) == ds.read(0, [1])


def test_a_corrupt_download_is_refused_and_not_cached(
    s3: S3, remote: dict[str, str], tmp_path: Path
) -> None:
    cache = CacheOptions(dir=tmp_path / "c")
    object_get = lambda m, p: m == "GET" and p.endswith("/part-03.jsonl")  # noqa: E731
    s3.proxy.reset(corrupt=1, match=object_get)
    with pytest.raises(DataError, match=r"download of s3://.*part-03\.jsonl is corrupt"):
        Dataset.from_path("docs", f"{remote['jsonl']}/part-03.jsonl", cache=cache)
    assert not list((tmp_path / "c" / "objects").glob("*-part-03.jsonl"))
    s3.proxy.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a failed download is not a refetch
        ds = Dataset.from_path("docs", f"{remote['jsonl']}/part-03.jsonl", cache=cache)
    assert ds.read(0, [0])[0]["id"] == 12000


def test_uncompressed_mds_is_read_by_byte_range(s3: S3) -> None:
    url = s3.upload(FIXTURES / "mds-types", "mds-types")
    local = Dataset.from_path("t", FIXTURES / "mds-types")
    ds = Dataset.from_path("t", url)
    s3.proxy.reset()
    assert ds.read(3, [5, 0, 5]) == local.read(3, [5, 0, 5])
    gets = s3.proxy.gets("shard.00003.mds")
    assert len(gets) == 2 and all(g.range for g in gets)  # the offsets, then the samples


def test_lance_reads_through_its_own_object_store_client(
    s3: S3, corpus_dirs: dict[str, Path]
) -> None:
    url = s3.upload(corpus_dirs["lance"], "corpus/docs.lance")
    s3.proxy.reset()
    ds = Dataset.from_path("docs", url, storage_options={"allow_http": "true"})
    assert batches(ds) == batches(Dataset.from_path("docs", corpus_dirs["lance"]))
    assert s3.proxy.gets("docs.lance/data/")  # the rows came over the wire
