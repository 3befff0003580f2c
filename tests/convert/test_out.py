"""``zephon convert`` into an object store (``s3://``, a real S3-compatible server on
loopback): the same bytes as a local OUT, read back by zephon and (copied down) by
megatron-core, and killed (SIGKILL) or stopped (SIGTERM) part-way, a second run finishes it
without uploading a finished shard again."""

from __future__ import annotations

import json
import signal
import subprocess
import warnings
from pathlib import Path

import pytest

from tests.cli._preempt import env, wait_for
from tests.cli.conftest import ZEPHON
from tests.convert._corpus import tree_bytes, write_pipeline, write_text_corpus
from tests.io._s3 import BUCKET, S3
from zephon.convert import convert
from zephon.convert._out import LOCK_NAME, Out
from zephon.errors import ConfigError
from zephon.io import Dataset

with warnings.catch_warnings():  # it warns that Transformer Engine and Apex are not installed
    warnings.simplefilter("ignore")
    from megatron.core.datasets.indexed_dataset import IndexedDataset

SHARDS = 24  # 2 files x 240 rows / 20 documents per shard
SLOW = "  - {op: map_transform, fn: 'tests.cli._custom_ops:slow_identity'}\n"


def _objects(s3: S3, prefix: str) -> dict[str, bytes]:
    """Every object under ``prefix`` by relative name."""
    out: dict[str, bytes] = {}
    for page in s3.client.get_paginator("list_objects_v2").paginate(
        Bucket=BUCKET, Prefix=prefix + "/"
    ):
        for item in page.get("Contents", []):
            body = s3.client.get_object(Bucket=BUCKET, Key=item["Key"])["Body"].read()
            out[item["Key"][len(prefix) + 1 :]] = body
    return out


def _local(folder: Path) -> dict[str, bytes]:
    return {k: v for k, v in tree_bytes(folder).items() if k != LOCK_NAME}


def _finished(s3: S3, prefix: str) -> list[str]:
    try:
        body = s3.client.get_object(Bucket=BUCKET, Key=f"{prefix}/zephon-convert.json")["Body"]
        return [s["name"] for s in json.loads(body.read())["shards"]]
    except s3.client.exceptions.NoSuchKey:
        return []


def test_a_remote_out_holds_the_bytes_of_a_local_one(s3: S3, tmp_path: Path) -> None:
    write_text_corpus(tmp_path)
    pipeline = write_pipeline(tmp_path)
    convert(pipeline, tmp_path / "local", workers=1, documents_per_shard=50)
    url = f"s3://{BUCKET}/converted"
    result = convert(pipeline, url, workers=2, documents_per_shard=50)
    assert (result.out, result.shards, result.converted) == (url, 6, 6)
    remote = _objects(s3, "converted")
    assert remote == _local(tmp_path / "local") and len(remote) == 6 * 3 + 1
    ours, theirs = Dataset.from_path("c", url), Dataset.from_path("c", tmp_path / "local")
    for s in range(6):
        rows = range(len(theirs.shards[s]))
        assert [r["input_ids"].tolist() for r in ours.read(s, rows)] == [
            r["input_ids"].tolist() for r in theirs.read(s, rows)
        ]
    down = tmp_path / "down"
    down.mkdir()
    for name, data in remote.items():
        (down / name).write_bytes(data)
    megatron = IndexedDataset(str(down / "web-00000-00000"))
    assert [megatron[i].tolist() for i in range(len(megatron))] == [
        r["input_ids"].tolist() for r in ours.read(0, range(len(ours.shards[0])))
    ]
    again = convert(pipeline, url, workers=1, documents_per_shard=50)
    assert (again.converted, again.skipped) == (0, 6)


def test_a_remote_folder_that_is_not_a_conversion_is_refused(s3: S3, tmp_path: Path) -> None:
    write_text_corpus(tmp_path)
    s3.client.put_object(Bucket=BUCKET, Key="foreign/notes.txt", Body=b"mine")
    with pytest.raises(ConfigError, match="is not a zephon convert output"):
        convert(write_pipeline(tmp_path), f"s3://{BUCKET}/foreign", workers=1)
    assert _objects(s3, "foreign") == {"notes.txt": b"mine"}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("remote-convert")
    write_text_corpus(folder, rows=240)
    write_pipeline(folder, extra=SLOW)
    convert(folder / "pipeline.yaml", folder / "whole", workers=2, documents_per_shard=20)
    return folder


def _start(folder: Path, url: str) -> subprocess.Popen[str]:
    command = [ZEPHON, "convert", "pipeline.yaml", url, "--workers", "2",
               "--documents-per-shard", "20", "--quiet"]  # fmt: skip
    return subprocess.Popen(
        command, cwd=folder, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, start_new_session=True,
    )  # fmt: skip


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM], ids=["kill", "term"])
def test_a_killed_remote_convert_resumes_to_identical_bytes(
    s3: S3, corpus: Path, how: signal.Signals
) -> None:
    prefix = f"killed-{how.name}"
    url = f"s3://{BUCKET}/{prefix}"
    proc = _start(corpus, url)
    wait_for(lambda: len(_finished(s3, prefix)) >= 3, 120)
    proc.send_signal(how)
    _stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == (-9 if how == signal.SIGKILL else 143), stderr
    done = _finished(s3, prefix)
    assert 3 <= len(done) < SHARDS  # it was stopped part-way
    s3.proxy.reset()
    second = _start(corpus, url)
    stdout, stderr = second.communicate(timeout=300)
    assert second.returncode == 0, stderr
    assert f"({SHARDS - len(done)} converted, {len(done)} already done)" in stdout
    puts = {s.path.split("?")[0] for s in s3.proxy.seen if s.method == "PUT"}
    assert puts and not {p for p in puts for n in done if f"/{prefix}/{n}." in p}
    assert _objects(s3, prefix) == _local(corpus / "whole")


def test_two_converts_into_one_url_on_a_machine_are_refused(s3: S3, tmp_path: Path) -> None:
    """An object store has no lock: a lock file in the cache folder, named by the URL, keeps
    a second conversion on this machine out while the first holds it."""
    write_text_corpus(tmp_path, files=1)
    url = f"s3://{BUCKET}/locked"
    refused = pytest.raises(ConfigError, match="another zephon convert is writing")
    with Out(url, None).locked(), refused:
        convert(write_pipeline(tmp_path), url + "/", workers=1)
    assert _objects(s3, "locked") == {}
    assert convert(write_pipeline(tmp_path), url, workers=1).converted == 1
