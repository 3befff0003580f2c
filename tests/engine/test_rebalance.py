"""The threads runner moves worker share toward the bottleneck "auto" stage; output unchanged."""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.engine._sources import RangeSource
from zephon import Dataset, Pipeline
from zephon._engine.stats import OpStats


def fast(payload: dict[str, Any]) -> dict[str, Any]:
    return {**payload, "fast": len(payload["text"])}


def slow(payload: dict[str, Any]) -> dict[str, Any]:
    time.sleep(0.002)  # stands in for CPU-heavy work: this stage is the bottleneck
    return {**payload, "slow": payload["text"].upper()}


def build(runner: str, **options: Any) -> Pipeline:
    records = [{"text": f"row {i}"} for i in range(600)]
    return (
        Pipeline(RangeSource([Dataset.from_records("d", records)], chunk_size=4))
        .map_transform(fast, parallelism="auto", name="fast")
        .map_transform(slow, parallelism="auto", name="slow")
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
def test_an_explicit_inflight_cap_turns_it_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ZEPHON_CPUS", "4")
    _, ops = run(build("threads", max_inflight=2))
    assert (ops["fast"].parallelism, ops["slow"].parallelism) == (2, 2)
    assert ops["fast"].rebalanced == ops["slow"].rebalanced == 0


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("pool", "width"), [("shared", 4), ("per_op", 2)])
def test_the_process_runner_keeps_its_widths(
    monkeypatch: pytest.MonkeyPatch, pool: str, width: int
) -> None:
    """One shared worker set balances by itself (a free worker takes any stage's work), so
    each stage may use every core; separate sets keep the split."""
    monkeypatch.setenv("ZEPHON_CPUS", "4")
    reference, _ = run(build("inline"))
    out, ops = run(build("process", process_pool=pool))
    assert out == reference
    assert ops["slow"].parallelism == ops["fast"].parallelism == width
    assert ops["slow"].rebalanced == 0
