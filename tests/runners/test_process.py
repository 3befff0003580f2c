"""The process runner gives byte-identical output to inline, moving arrays through /dev/shm."""

from __future__ import annotations

import itertools
import mmap
import multiprocessing
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tokenizers import Tokenizer

from tests.engine._sources import RangeSource
from tests.runners._leaks import semaphores_mapped_by
from tests.runners._pipes import (
    big_array,
    digest,
    heavy,
    key,
    reference,
    run_with_stops,
    stateful,
)
from zephon import Dataset, Pipeline
from zephon._engine.plan.cores import usable_cores
from zephon._engine.workers import worker_registry
from zephon._engine.workers.process_pool import ProcessWorkerPool
from zephon._engine.workers.worker_registry import shutdown_idle_workers
from zephon.ops import BaseOp, CountingAccumulator, OpTraits

# shm_min_bytes=1 sends every array through shared memory, so the small token arrays of the
# reference pipelines exercise the same path as large payloads.
SHM_ALL: dict[str, Any] = {"shm_min_bytes": 1}


@pytest.mark.timeout(120)
def test_reference_pipeline_process_1_2_4_workers_equal_inline(docs, hf_tokenizer_dir):
    expected = digest(reference(docs, hf_tokenizer_dir, "inline", 1))
    assert len(expected) > 40
    runs = [
        (1, {"shm_min_bytes": 1}),  # every array through shared memory
        (2, {"process_pool": "per_op", "shm_min_bytes": None}),  # a pool per op, pickling
        (4, {}),  # defaults: one shared fleet, 64 KiB threshold
    ]
    for workers, opts in runs:
        got = digest(reference(docs, hf_tokenizer_dir, "process", workers, **opts))
        assert got == expected, f"process runner, {workers} worker(s), {opts} differs from inline"


@pytest.mark.timeout(120)
def test_packing_and_shuffle_process_equal_inline_also_after_restore(docs, hf_tokenizer_dir):
    expected = digest(stateful(docs, hf_tokenizer_dir, "inline", 1))
    assert len(expected) > 20
    opts = {**SHM_ALL, "reuse_workers": True}  # three engines, one set of worker processes
    try:
        pipe = stateful(docs, hf_tokenizer_dir, "process", 2, **opts)
        got, first = [], []
        for item in pipe:
            if not first:
                engine = pipe._engine
                assert engine is not None
                first = sorted({pid for p in engine.resources.pools for pid in p.fleet.pids()})
            got.append(key(item))
        assert got == expected
        resumed = run_with_stops(
            lambda: stateful(docs, hf_tokenizer_dir, "process", 2, **opts), [13]
        )
        assert resumed == expected
        assert sorted(p.pid for p in multiprocessing.active_children()) == first
    finally:
        shutdown_idle_workers()


@pytest.mark.timeout(60)
def test_megabyte_arrays_arrive_through_shared_memory_equal_to_inline():
    inline = list(heavy("inline"))
    process = list(heavy("process"))
    assert [digest_one(b) for b in process] == [digest_one(b) for b in inline]
    pixels = [r.payload["pixels"] for b in process for r in b]
    # Delivered zero-copy: views on the shared mapping, not unpickled copies...
    assert all(isinstance(_root(p), mmap.mmap) for p in pixels)
    assert not any(isinstance(_root(r.payload["pixels"]), mmap.mmap) for b in inline for r in b)
    # ...that stay valid and writable after the engine unlinked every segment.
    pixels[0][0, 0] = -1
    assert pixels[0][0, 0] == -1


def _root(arr: np.ndarray) -> Any:
    base: Any = arr
    while isinstance(base, np.ndarray) and base.base is not None:
        base = base.base
    return base


def digest_one(batch: Any) -> Any:
    return [
        (r.meta.cursor, r.payload["total"], r.payload["pixels"].tobytes(), r.payload["row0"].sum())
        for r in batch
    ]


def worker_cmdline_and_sems(payload: dict[str, Any]) -> dict[str, Any]:
    cmdline = Path("/proc/self/cmdline").read_bytes().replace(b"\0", b" ").decode()
    return {
        **payload,
        "cmdline": cmdline,
        "parent": os.getppid(),
        "sems": sorted(semaphores_mapped_by(os.getpid())),
    }


@pytest.mark.timeout(60)
def test_workers_are_never_forked_from_the_engine_and_hold_no_semaphores(docs, hf_tokenizer_dir):
    # Use the HF tokenizer (its thread pool) in this process first: a worker forked from here
    # would inherit it in an undefined state; the forkserver never ran it.
    tok = Tokenizer.from_file(str(hf_tokenizer_dir / "tokenizer.json"))
    assert len(tok.encode_batch([str(d["text"]) for d in docs[:64]])) == 64
    sems_before = semaphores_mapped_by(os.getpid())
    pipe = (
        Pipeline(RangeSource([Dataset.from_records("d", docs[:120])], chunk_size=20))
        .map_transform(worker_cmdline_and_sems, parallelism=2)
        .tokenize(hf_tokenizer_dir, parallelism=2)
        .options(runner="process")
    )
    out = []
    for record in pipe:
        if not out:
            # Mid-run: the engine process opened no named semaphore for its pool.
            assert semaphores_mapped_by(os.getpid()) - sems_before == set()
            engine = pipe._engine
            assert engine is not None
            pools = [p for p in engine.resources.pools if isinstance(p, ProcessWorkerPool)]
            assert pools and all(p.fleet.pids() for p in pools)
        out.append(record)
    assert len(out) == 120
    assert all("forkserver" in r.payload["cmdline"] for r in out)
    assert {r.payload["parent"] for r in out}.isdisjoint({os.getpid()})
    assert all(r.payload["sems"] == [] for r in out)
    inline = Pipeline(RangeSource([Dataset.from_records("d", docs[:120])], chunk_size=20))
    inline = inline.tokenize(hf_tokenizer_dir).options(runner="inline")
    assert [r.payload["input_ids"].tolist() for r in out] == [
        r.payload["input_ids"].tolist() for r in inline
    ]


def environment_marks(payload: dict[str, Any]) -> dict[str, Any]:
    return {
        **payload,
        "worker": os.getpid(),
        "set": os.environ.get("ZEPHON_TEST_SET_LATER"),
        "gone": os.environ.get("ZEPHON_TEST_UNSET_LATER"),
        "threads": os.environ.get("RAYON_NUM_THREADS"),
    }


def marks_pipe(parallelism: int = 2) -> Pipeline:
    rows = [{"id": i} for i in range(40)]
    source = RangeSource([Dataset.from_records("d", rows)], chunk_size=10)
    return (
        Pipeline(source)
        .map_transform(environment_marks, parallelism=parallelism)
        .options(runner="process", reuse_workers=True)
    )


@pytest.mark.timeout(60)
def test_workers_see_the_environment_the_engine_has_when_they_get_their_operators(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Forked from a forkserver started earlier, and then reused: neither start may leave a
    # worker with an environment older than the engine's. Each of the 2 workers gets half the
    # cores for the tokenizers' thread pool unless the user chose a number.
    monkeypatch.delenv("ZEPHON_TEST_SET_LATER", raising=False)
    monkeypatch.setenv("ZEPHON_TEST_UNSET_LATER", "before")
    monkeypatch.delenv("RAYON_NUM_THREADS", raising=False)
    share = str(max(1, usable_cores().count // 2))
    try:
        first = list(marks_pipe())
        marks = {(r.payload["set"], r.payload["gone"], r.payload["threads"]) for r in first}
        assert marks == {(None, "before", share)}
        assert "RAYON_NUM_THREADS" not in os.environ
        monkeypatch.setenv("ZEPHON_TEST_SET_LATER", "after")
        monkeypatch.delenv("ZEPHON_TEST_UNSET_LATER")
        monkeypatch.setenv("RAYON_NUM_THREADS", "3")
        # The workers that served the first run were kept (a slot whose worker had not finished
        # starting when the short first run ended is not); the second run's one slot reuses one.
        kept = {proc.pid for proc, _ in worker_registry._IDLE}
        assert {r.payload["worker"] for r in first} <= kept
        second = list(marks_pipe(parallelism=1))
        assert len({r.payload["worker"] for r in second} & kept) == 1
        marks = {(r.payload["set"], r.payload["gone"], r.payload["threads"]) for r in second}
        assert marks == {("after", None, "3")}
    finally:
        shutdown_idle_workers()


@pytest.mark.timeout(120)
def test_processes_forked_after_a_pool_ran_start_workers_of_their_own() -> None:
    """DataLoader workers forked from a training process that used the process runner and
    kept its workers: neither the forkserver nor the idle workers are theirs to use."""
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-m", "tests.runners._fork_after_pool"],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root)},
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def explode_on_30(payload: dict[str, Any]) -> dict[str, Any]:
    if payload["id"] == 30:
        raise ValueError("bad record 30")
    return payload


@pytest.mark.timeout(60)
def test_operator_exception_with_arrays_in_flight_leaves_no_segment():
    ds = Dataset.from_records("rows", [{"id": i} for i in range(64)], shard_size=16)
    pipe = (
        Pipeline(RangeSource([ds], chunk_size=8))
        .map_transform(big_array, parallelism=2)
        .map_transform(explode_on_30, parallelism=2)
        .options(runner="process")
    )
    with pytest.raises(ValueError, match="bad record 30") as info:
        list(pipe)
    assert "operator 'map_transform'" in "\n".join(getattr(info.value, "__notes__", []))
    # the autouse no_leaks fixture asserts that no segment of this process is left


class SeesPayload(CountingAccumulator):
    """Records the type of ``payload["pixels"]`` at the accumulator (engine process)."""

    def __init__(self, seen: list[str], reads_payload: bool) -> None:
        super().__init__(4)
        self.seen = seen
        self.reads_payload = reads_payload

    def push_many(self, elems):
        self.seen.extend(type(e.payload["pixels"]).__name__ for e in elems)
        return super().push_many(elems)


class Probe(BaseOp):
    def __init__(self, name: str, reads_payload: bool) -> None:
        super().__init__(name=name)
        self.reads_payload = reads_payload  # kept under its name: config() reads it
        self.seen: list[str] = []

    def accumulator(self, *, deterministic, ctx):
        return SeesPayload(self.seen, self.reads_payload)

    def traits(self) -> OpTraits:
        return OpTraits(preserves_cursor_order=True)

    def process_many(self, elems):
        return elems


@pytest.mark.timeout(60)
def test_accumulators_see_handles_unless_they_declare_reads_payload():
    ds = Dataset.from_records("rows", [{"id": i} for i in range(16)], shard_size=8)
    lazy, eager = Probe("lazy", False), Probe("eager", True)
    pipe = (
        Pipeline(RangeSource([ds], chunk_size=4))
        .map_transform(big_array, parallelism=2)
        .add_op(lazy)
        .add_op(eager)
        .options(runner="process")
    )
    out = list(pipe)
    assert lazy.seen == ["ShmArrayRef"] * 16  # metadata-only accumulators: nothing mapped
    assert eager.seen == ["ndarray"] * 16  # reads_payload=True: resolved first
    assert all(type(r.payload["pixels"]) is np.ndarray for r in out)  # and at the tail


def _nap(payload: dict[str, Any]) -> dict[str, Any]:
    time.sleep(0.005)
    return payload


@pytest.mark.timeout(120)
@pytest.mark.parametrize("pool", ["shared", "per_op"])
def test_the_fleet_reports_each_stage_s_busy_time(pool: str) -> None:
    """What the rebalancer reads: the time workers ran a stage's micro-batches, per stage."""
    rows = [{"text": f"row {i}"} for i in range(48)]
    pipe = (
        Pipeline(RangeSource([Dataset.from_records("d", rows)], chunk_size=4))
        .map_transform(_nap, parallelism=2, name="nap")
        .map_transform(lambda p: p, parallelism=2, name="quick")
        .options(runner="process", process_pool=pool, fuse=False)
    )
    it = iter(pipe)
    head = list(itertools.islice(it, 40))
    engine = pipe._engine
    assert engine is not None
    pools = {p.stage: p for p in engine.resources.pools if isinstance(p, ProcessWorkerPool)}
    by_name = {s.op_name: pools.get(s.index) for s in pipe.explain().stages}
    nap, quick = by_name["nap"], by_name["quick"]
    assert nap is not None and quick is not None
    assert nap.busy_ns() >= len(head) * 5_000_000  # each delivered row slept 5 ms in a worker
    assert quick.busy_ns() > 0
    it.close()
