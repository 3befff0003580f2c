"""The threads runner and the shared process pool move worker share toward the bottleneck
"auto" stage; output unchanged."""

from __future__ import annotations

import time
from itertools import islice
from typing import Any

import pytest

from tests.engine._sources import RangeSource
from zephon import Dataset, Pipeline
from zephon._engine.run.threaded import OpDriver
from zephon._engine.stats import OpStats
from zephon._engine.workers.process_pool import ProcessWorkerPool


def fast(payload: dict[str, Any]) -> dict[str, Any]:
    return {**payload, "fast": len(payload["text"])}


def slow(payload: dict[str, Any]) -> dict[str, Any]:
    time.sleep(0.002)  # stands in for CPU-heavy work: this stage is the bottleneck
    return {**payload, "slow": payload["text"].upper()}


def slower(payload: dict[str, Any]) -> dict[str, Any]:
    """``slow`` for the process runner: its workers' busy time counts the pipe and a loaded
    machine's scheduling delays, so the bottleneck must stand out further."""
    time.sleep(0.008)
    return {**payload, "slow": payload["text"].upper()}


def build(runner: str, slow_stage: Any = slow, **options: Any) -> Pipeline:
    records = [{"text": f"row {i}"} for i in range(600)]
    return (
        Pipeline(RangeSource([Dataset.from_records("d", records)], chunk_size=4))
        .map_transform(fast, parallelism="auto", name="fast")
        .map_transform(slow_stage, parallelism="auto", name="slow")
        .options(runner=runner, fuse=False, **options)
    )


def run(pipe: Pipeline) -> tuple[list[tuple[Any, ...]], dict[str, OpStats]]:
    out = [(r.meta.cursor, r.payload["fast"], r.payload["slow"]) for r in pipe]
    stats = pipe.stats()
    assert stats is not None
    return out, {o.name: o for o in stats.operators}


@pytest.mark.timeout(120)
def test_share_moves_to_the_slow_stage(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ZEPHON_CPUS", "4")
    reference, _ = run(build("inline"))
    plan = {s.op_name: s.parallelism for s in build("threads").explain().stages}
    assert (plan["fast"], plan["slow"]) == (2, 2)
    out, ops = run(build("threads"))
    assert out == reference  # only concurrency moved, never what or in which order
    assert ops["slow"].parallelism == 3 and ops["fast"].parallelism == 1
    assert ops["slow"].rebalanced >= 1 and ops["fast"].rebalanced >= 1
    assert ops["slow"].auto == "auto: 3 of 4 cores, moved toward the bottleneck slow"
    assert ops["fast"].auto == "auto: 1 of 4 cores, moved toward the bottleneck slow"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("runner", ["threads", "process"])
def test_an_explicit_inflight_cap_turns_it_off(
    monkeypatch: pytest.MonkeyPatch, runner: str
) -> None:
    monkeypatch.setenv("ZEPHON_CPUS", "4")
    _, ops = run(build(runner, max_inflight=2))
    assert (ops["fast"].parallelism, ops["slow"].parallelism) == (2, 2)
    assert ops["fast"].rebalanced == ops["slow"].rebalanced == 0


@pytest.mark.timeout(120)
@pytest.mark.parametrize("options", [{}, {"max_inflight": 2}, {"track_stats": False}])
def test_the_shared_worker_set_has_a_worker_per_share(
    monkeypatch: pytest.MonkeyPatch, options: dict[str, Any]
) -> None:
    """The shares split one worker set, whether they move or not."""
    monkeypatch.setenv("ZEPHON_CPUS", "4")
    pipe = build("process", **options)
    it = iter(pipe)
    assert len(list(islice(it, 10))) == 10
    engine = pipe._engine
    assert engine is not None
    pools = [p for p in engine.resources.pools if isinstance(p, ProcessWorkerPool)]
    assert len({id(p.fleet) for p in pools}) == 1
    assert len(pools[0].fleet.pids()) == 4
    it.close()


@pytest.mark.timeout(240)
def test_the_shared_process_pool_moves_share_to_the_slow_stage(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One worker set of 4 processes; the shares are the stages' in-flight caps on it."""
    monkeypatch.setenv("ZEPHON_CPUS", "4")
    reference, _ = run(build("inline"))
    plan = {s.op_name: s.parallelism for s in build("process").explain().stages}
    assert (plan["fast"], plan["slow"]) == (2, 2)
    fixed, _ = run(build("process", slower, max_inflight=4))
    assert fixed == reference
    out, ops = run(build("process", slower))
    assert out == reference
    assert ops["slow"].parallelism == 3 and ops["fast"].parallelism == 1
    assert ops["slow"].rebalanced >= 1 and ops["fast"].rebalanced >= 1
    assert ops["slow"].auto == "auto: 3 of 4 cores, moved toward the bottleneck slow"


@pytest.mark.timeout(240)
def test_a_restore_mid_rebalancing_is_exact(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ZEPHON_CPUS", "4")
    reference, _ = run(build("inline"))
    first = build("process", slower)
    it = iter(first)
    head = [(r.meta.cursor, r.payload["fast"], r.payload["slow"]) for r in islice(it, 350)]
    ckpt = first.checkpoint()
    it.close()
    moved = first.stats()
    assert moved is not None and sum(o.rebalanced for o in moved.operators) > 0
    second = build("process", slower)
    second.restore(ckpt)
    tail, _ = run(second)
    assert head + tail == reference


@pytest.mark.timeout(240)
@pytest.mark.parametrize("runner", ["threads", "process"])
def test_it_moves_without_stats_too(monkeypatch: pytest.MonkeyPatch, runner: str) -> None:
    """The busy times come from the pools, not the stats: a run without them still moves
    (else the slow stage would keep half of a shared worker set)."""
    monkeypatch.setenv("ZEPHON_CPUS", "4")
    pipe = build(runner, slower if runner == "process" else slow, track_stats=False)
    it = iter(pipe)
    head = list(islice(it, 450))
    engine = pipe._engine
    assert engine is not None
    caps = {t.role: t.max_inflight for t in engine.resources.threads if isinstance(t, OpDriver)}
    it.close()
    assert len(head) == 450
    assert caps["slow"] > caps["fast"]  # 2 in flight per share; 2 + 2 shares at the start


@pytest.mark.timeout(120)
def test_per_op_process_pools_keep_their_widths(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pool each: growing one stage's share would mean more processes for every stage."""
    monkeypatch.setenv("ZEPHON_CPUS", "4")
    reference, _ = run(build("inline"))
    stages = {s.op_name: s for s in build("process", process_pool="per_op").explain().stages}
    assert stages["slow"].auto.endswith(
        "; kept while running (process_pool='per_op': each stage has its own workers)"
    )
    out, ops = run(build("process", process_pool="per_op"))
    assert out == reference
    assert ops["slow"].parallelism == ops["fast"].parallelism == 2
    assert ops["slow"].rebalanced == ops["fast"].rebalanced == 0
