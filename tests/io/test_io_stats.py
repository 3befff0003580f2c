"""Bytes, requests, retries and cache hits reach ``pipeline.stats()``, the Prometheus text, the
``zephon run`` summary (``--json`` too) and statsd, summed over process workers: checked
against what the S3 server on loopback really sent."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.io._corpus import corpus_docs
from tests.io._formats import write_jsonl
from tests.io._s3 import S3
from zephon import Dataset, Pipeline, StaticMixtureWorkSource
from zephon.cli._report import print_summary


@pytest.fixture(scope="module")
def small_remote(s3: S3, tmp_path_factory: Any) -> str:
    folder = write_jsonl(corpus_docs(600), tmp_path_factory.mktemp("io") / "two-shards", 2)
    return s3.upload(folder, "io-stats/jsonl")


def run(ds: Dataset, **options: Any) -> Pipeline:
    source = StaticMixtureWorkSource([ds], chunk_size=60, seed=2, shuffle_within_shard=True)
    pipe = Pipeline(source).fetch(max_batch=20).batch(50, drop_last=False).options(**options)
    for _ in pipe:
        pass
    return pipe


@pytest.mark.parametrize("runner", [pytest.param("inline", marks=pytest.mark.slow), "process"])
def test_pipeline_stats_count_what_the_server_sent(s3: S3, small_remote: str, runner: str) -> None:
    # the client's own retries off: zephon's retry (and count) the two failed reads
    no_retry = {"config_kwargs": {"retries": {"total_max_attempts": 1}}}
    ds = Dataset.from_path("docs", small_remote, storage_options=no_retry)
    s3.proxy.reset(fail=2, status=500, match=lambda method, path: method == "GET")
    here = ds.stats()
    pipe = run(ds, runner=runner)
    stats = pipe.stats()
    assert stats is not None
    gets = s3.proxy.gets("io-stats/jsonl/part-")
    served = [g for g in gets if g.status in (200, 206)]
    assert stats.io.bytes_fetched == sum(g.body_bytes for g in served) > 0
    assert stats.io.requests == len(served)
    assert stats.io.retries == 2
    fetch = stats.operators[0]
    assert fetch.name == "fetch" and fetch.bytes_fetched == stats.io.bytes_fetched
    assert all(op.bytes_fetched == 0 for op in stats.operators[1:])
    text = stats.to_prometheus()
    assert f"zephon_pipeline_io_bytes_fetched_total {stats.io.bytes_fetched}\n" in text
    assert f'zephon_pipeline_op_bytes_fetched_total{{op="fetch"}} {fetch.bytes_fetched}' in text
    assert "fetched" in stats.summary() and f"{stats.io.requests} requests" in stats.summary()
    if runner == "process":  # the workers read: this process's own counters saw nothing
        assert ds.stats() == here


def test_run_summary_json_prometheus_and_statsd(
    s3: S3,
    small_remote: str,
    tmp_path: Path,
    request: pytest.FixtureRequest,
    capsys: pytest.CaptureFixture[str],
) -> None:
    (tmp_path / "p.yaml").write_text(
        f"datasets: [{{name: docs, path: '{small_remote}', cache: {{dir: node-cache}}}}]\n"
        "source: {chunk_size: 60}\n"
        "operators: [{op: batch, microbatch_size: 50, drop_last: false}]\n"
        "runner: process\n"
        "metrics: {prefix: zr, interval_s: 60}\n"
    )
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    request.addfinalizer(udp.close)
    udp.bind(("127.0.0.1", 0))
    s3.proxy.reset()
    cmd = [sys.executable, "-m", "zephon.cli", "run", "p.yaml", "--quiet", "--json"]
    cmd += ["--prometheus-file", "m.prom", "--statsd", f"127.0.0.1:{udp.getsockname()[1]}"]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr
    served = [g for g in s3.proxy.gets("io-stats/jsonl/part-") if g.status in (200, 206)]
    summary = json.loads(proc.stdout)
    # counting the rows brought both shards into the node cache before the run; the workers
    # then read them from there
    io, opened = summary["io"], summary["opened_io"]
    assert opened["cache_downloads"] == 2
    assert opened["bytes_fetched"] == sum(g.body_bytes for g in served) > 0
    assert io["bytes_fetched"] == io["requests"] == 0 and io["cache_hits"] >= 2
    prom = (tmp_path / "m.prom").read_text()
    assert f"zephon_pipeline_io_cache_hits_total {io['cache_hits']}\n" in prom
    udp.settimeout(30)
    gauges: dict[str, str] = {}
    while "zr.op.0_fetch.cache_hits" not in gauges:  # the final push, after the run
        for line in udp.recv(65536).decode().splitlines():
            name, _, value = line.partition(":")
            gauges[name] = value
    assert (
        gauges["zr.io.cache_hits"] == gauges["zr.op.0_fetch.cache_hits"] == f"{io['cache_hits']}|g"
    )
    assert gauges["zr.delivered"] == f"{summary['items']}|g"
    print_summary(summary, None)  # the text summary of a run without --json
    text = capsys.readouterr().out
    assert f"read 0 bytes in 0 requests (0 retries, {io['cache_hits']:,} cache hits)" in text
