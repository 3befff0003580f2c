"""A corpus of many more shards than the process may open files: each runner reads all 5,000
under a real ``ulimit -n 256`` (set in the child), because descriptors are leased from a bounded
pool and closed when evicted, not kept open per shard read. The same holds for every format
(Parquet files, memory-mapped Arrow, Lance fragments, MDS) read as one mixture."""

from __future__ import annotations

import gc
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from tests.io._corpus import corpus_docs
from tests.io._formats import FORMATS, WRITERS, write_mds_raw
from zephon.config import load_config
from zephon.demo import make_corpus
from zephon.io._descriptors import DescriptorPool

ROOT = Path(__file__).resolve().parents[2]
ZEPHON = str(Path(sys.executable).parent / "zephon")
SHARDS = 5000
LIMIT = 256

YAML = """\
datasets:
  - {name: many, path: many}
source: {chunk_size: 64, seed: 1}
operators:
  - decode_text
  - {op: tokenize, tokenizer: bytes, max_length: 64, truncation: true}
options: {canonical_replicas: 2}
"""


@pytest.fixture(scope="module")
def many(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("many-shards")
    make_corpus(folder / "many", docs=SHARDS, shards=SHARDS)
    (folder / "p.yaml").write_text(YAML)
    return folder


def _low_fd_limit() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (LIMIT, LIMIT))


def _run(folder: Path, runner: str, *extra: str) -> bytes:
    record = folder / f"{runner}.jsonl"
    record.unlink(missing_ok=True)
    command = [ZEPHON, "run", "p.yaml", "--quiet", "--runner", runner, "--record", record.name]
    proc = subprocess.run(
        [*command, *extra], cwd=folder, capture_output=True, text=True, timeout=300,
        preexec_fn=_low_fd_limit,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return record.read_bytes()


@pytest.mark.timeout(900)
def test_every_runner_reads_5000_shards_under_ulimit_n_256(many):
    inline = _run(many, "inline")
    ids = {tuple(json.loads(line)["ids"][0]) for line in inline.splitlines()}
    assert len(ids) == inline.count(b"\n") == SHARDS  # every document of every shard, once
    for runner in ("threads", "process"):
        assert _run(many, runner) == inline


def _open_on(fd: int, path: Path) -> bool:
    """Whether ``fd`` is an open descriptor of ``path`` (a closed number may have been reused)."""
    try:
        st = os.fstat(fd)
    except OSError:
        return False
    return (st.st_dev, st.st_ino) == (path.stat().st_dev, path.stat().st_ino)


def test_the_pool_closes_the_least_recently_used_idle_descriptor(tmp_path):
    files = [tmp_path / f"f{i}" for i in range(4)]
    for i, path in enumerate(files):
        path.write_bytes(bytes([i]) * 8)
    pool = DescriptorPool(cap=2)
    fds = {}
    with pool.lease("f0", lambda: os.open(files[0], os.O_RDONLY)) as held:
        for i in (1, 2, 3):
            with pool.lease(f"f{i}", lambda i=i: os.open(files[i], os.O_RDONLY)) as fd:
                fds[i] = fd
        assert len(pool) == 2
        assert _open_on(held, files[0])  # evicted while in use: not closed under its reader
        assert os.pread(held, 1, 0) == b"\x00"
    assert not _open_on(held, files[0])  # its last reader returned it: closed
    assert not _open_on(fds[1], files[1])  # the least recently used idle one
    assert _open_on(fds[2], files[2]) and _open_on(fds[3], files[3])
    pool.close("f3")
    assert len(pool) == 1 and not _open_on(fds[3], files[3])


def test_a_long_lived_process_holds_no_more_descriptors_after_each_pipeline(many):
    def run_once() -> int:
        for _ in load_config(many / "p.yaml").build().options(runner="threads"):
            pass
        gc.collect()
        return len(os.listdir("/proc/self/fd"))

    # The count is the whole process's: what earlier tests left behind may close meanwhile
    # (so it can drop), but a pipeline that leaked would raise it with every run.
    first = run_once()
    assert all(count <= first for count in [run_once() for _ in range(4)])


def write_formats(root: Path, shards: int, rows: int) -> Path:
    """``shards`` shards of ``rows`` documents in every format (distinct ids per format)."""
    n = shards * rows
    writers = {**WRITERS, "mds": write_mds_raw}  # the fixture has 5 shards only
    for k, fmt in enumerate(FORMATS):
        docs = [{**d, "id": d["id"] + k * n} for d in corpus_docs(n, seed=k)]
        writers[fmt](docs, root / fmt, shards)
    return root


def read_formats(
    root: Path, limit: int, *runners: str, timeout: int = 300
) -> dict[str, list[object]]:
    """Digests per runner of the mixture of all formats, read under ``ulimit -n limit``."""
    proc = subprocess.run(
        [sys.executable, "-m", "tests.io._many_formats", str(root), str(limit), *runners],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
        text=True, timeout=timeout,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    out: dict[str, list[object]] = json.loads(proc.stdout.splitlines()[-1])
    return out


# per format more shards than the limit (a CI-sized corpus: 420 shards under ``ulimit -n 64``)
SMALL_LIMIT, FORMAT_SHARDS = 64, 70


@pytest.mark.timeout(600)
def test_every_format_reads_more_shards_than_ulimit_n_on_every_local_runner(tmp_path):
    root = write_formats(tmp_path, FORMAT_SHARDS, rows=2)
    out = read_formats(root, SMALL_LIMIT, "inline", "threads", "process")  # Ray: -m slow
    assert out["inline"][1:] == [len(FORMATS) * FORMAT_SHARDS * 2] * 2  # every row, once
    assert out["threads"] == out["process"] == out["inline"]


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_every_format_reads_5000_shards_under_ulimit_n_256_on_every_runner(tmp_path):
    shards = 5000 // len(FORMATS) + 1
    root = write_formats(tmp_path, shards, rows=2)
    out = read_formats(root, LIMIT, "inline", "threads", "process", "ray", timeout=3300)
    assert out["inline"][1:] == [len(FORMATS) * shards * 2] * 2  # every row, once
    assert out["threads"] == out["process"] == out["ray"] == out["inline"]
