"""The runner registry drives options, docs, check_operator and the plan; every runner gives
the same bytes; compiling a pipeline is pure."""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, get_args

import cloudpickle
import pytest

from tests.engine._sources import RangeSource
from zephon import Dataset, Pipeline, options
from zephon._engine.plan.compile import CompiledRun, compile
from zephon._engine.plan.runner_traits import REFERENCE, REGISTRY, available, docs_table
from zephon._engine.run.engine_process import EngineProcess
from zephon._engine.run.runners import RUNNERS_BY_NAME, ThreadsRunner
from zephon.errors import ConfigError
from zephon.io import io_totals
from zephon.ops import BaseOp, OpContext, OpTraits
from zephon.options import ENGINE_PROCESS_RUNNERS, RUNNERS, RunnerName
from zephon.testing import check_operator
from zephon.types import SampleBatch, SampleRecord

DOCS = Path(__file__).resolve().parents[2] / "docs" / "runners.md"


def add_length(payload: dict[str, Any]) -> dict[str, Any]:
    return {**payload, "n_chars": len(payload["text"])}


def build(
    docs: list[dict[str, object]],
    runner: str = REFERENCE,
    extra: BaseOp | None = None,
    **options: Any,
) -> Pipeline:
    """The reference pipeline: element-wise stages (which fuse), packing, a shuffle, batches
    (``extra`` first, after fetch)."""
    ds = Dataset.from_records("docs", docs, shard_size=50)
    pipe = Pipeline(RangeSource([ds], chunk_size=40)).fetch(parallelism=2)
    if extra is not None:
        pipe = pipe.add_op(extra)
    return (
        pipe.decode_text(parallelism=2)
        .map_transform(add_length, parallelism=2)
        .tokenize("bytes", max_length=48, parallelism=2)
        .pack_flat(64, pad_token_id=0)
        .shuffle(buffer_size=16, seed=3)
        .batch(4)
        .options(runner=runner, canonical_replicas=2, **options)
    )


def digest(pipe: Pipeline) -> list[tuple[Any, ...]]:
    """Every batch's lane, cursors and payload bytes."""
    out = []
    for batch in pipe:
        assert isinstance(batch, SampleBatch)
        rows = [
            (r.meta.cursor, hashlib.sha1(r.payload["input_ids"].tobytes()).hexdigest())
            for r in batch
        ]
        out.append((batch.lane_id, rows))
    return out


@pytest.fixture(scope="module")
def ray_if_installed() -> Iterator[None]:
    """A local Ray cluster for the ray runner (when Ray is installed), released afterwards."""
    if "ray" not in available():
        yield
        return
    import ray

    started = not ray.is_initialized()
    if started:
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    from zephon._engine.workers import ray_pool

    ray_pool.release_actors()
    if started:
        ray.shutdown()


# -- the registry drives the option names, the docs and check_operator -----------------------


def test_the_typing_literal_and_the_option_names_are_the_registry() -> None:
    assert get_args(RunnerName) == tuple(REGISTRY) == RUNNERS
    in_engine = tuple(name for name, runner in REGISTRY.items() if runner.in_engine_process)
    assert in_engine == ENGINE_PROCESS_RUNNERS
    assert REFERENCE == "inline"
    with pytest.raises(ConfigError, match=r"runner must be one of \['inline', 'threads'"):
        Pipeline(RangeSource([], 1)).options(runner="thread")


def test_each_runner_is_the_subclass_of_its_traits_in_the_registry() -> None:
    """The plan reads the traits, the engine runs the runner: the two must be one class."""
    assert list(RUNNERS_BY_NAME) == list(REGISTRY)
    for name, runner in RUNNERS_BY_NAME.items():
        assert isinstance(runner, type(REGISTRY[name])), name
        assert runner.name == name


def test_the_docs_table_is_the_registry() -> None:
    text = DOCS.read_text()
    start = text.index("<!-- runner-table")
    table = text[text.index("\n", start) + 1 : text.index("<!-- /runner-table -->")].strip()
    assert table == docs_table(), "regenerate with zephon._engine.plan.runner_traits.docs_table()"
    for name in REGISTRY:
        assert f'| `"{name}"` |' in table


def test_engine_process_refuses_exactly_the_runners_that_say_so() -> None:
    for name, runner in REGISTRY.items():
        pipe = Pipeline(RangeSource([], 1))
        if runner.in_engine_process:
            pipe.options(runner=name, engine_process=True)
        else:
            with pytest.raises(ConfigError, match=f"cannot run runner='{name}'"):
                pipe.options(runner=name, engine_process=True)


class AddOne(BaseOp):
    """A plain element-wise operator for check_operator."""

    name = "add_one"

    def traits(self) -> OpTraits:
        return OpTraits(preserves_cursor_order=True, elementwise=True)

    def process_many(self, elems: list[Any]) -> list[Any]:
        return [SampleRecord(e.meta, {**e.payload, "n": e.payload["n"] + 1}) for e in elems]


def test_check_operator_tries_every_available_runner_of_the_registry(
    docs: list[dict[str, object]], ray_if_installed: None
) -> None:
    def small() -> Pipeline:
        ds = Dataset.from_records("n", [{"n": i} for i in range(60)], shard_size=20)
        return (
            Pipeline(RangeSource([ds], chunk_size=10))
            .add_op(AddOne())
            .options(canonical_replicas=2)
        )

    report = check_operator(small, stops=[0, 30], elastic=False, workers=(1, 3))
    checked = {line.split(" x")[0] for line in report.passed if " equals " in line}
    assert checked == set(available()) - {REFERENCE}
    assert "threads x3 equals inline" in report.passed  # threads: the caller's widths
    assert "process x2 equals inline" in report.passed
    with pytest.raises(ConfigError, match="unknown runner"):
        check_operator(small, runners=["inline", "gpu"])


# -- plan decisions come from the registry --------------------------------------------------


def test_the_plan_takes_stage_runners_fusion_and_driver_units_from_the_registry(
    docs: list[dict[str, object]],
) -> None:
    for name, runner in REGISTRY.items():
        plan = build(docs, name).explain()
        worker_stages = {s.runner for s in plan.stages if s.runner != "driver"}
        assert worker_stages == {name}
        assert bool(plan.fused) == runner.fuses, name
        assert bool(plan.chained) == runner.pooled, name
        assert all(all(plan.stages[i].runner == name for i in unit) for unit in plan.on_driver)
        assert not plan.on_driver or runner.width_one_on_driver


def test_a_runner_is_one_entry_in_each_registry(
    docs: list[dict[str, object]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new runner class in both registries, its name in the options' names, is a valid
    option, planned, run and checked."""

    class Spare(ThreadsRunner):
        name = "spare"
        summary = "threads under another name"

    spare = Spare()
    monkeypatch.setitem(REGISTRY, "spare", spare)
    monkeypatch.setitem(RUNNERS_BY_NAME, "spare", spare)
    monkeypatch.setattr(options, "RUNNERS", (*RUNNERS, "spare"))
    monkeypatch.setattr(options, "ENGINE_PROCESS_RUNNERS", (*ENGINE_PROCESS_RUNNERS, "spare"))
    pipe = build(docs, "spare")  # type: ignore[arg-type]
    assert {s.runner for s in pipe.explain().stages} == {"spare", "driver"}
    assert digest(pipe) == digest(build(docs))
    assert '| `"spare"` | threads under another name | - |' in docs_table()


# -- every runner gives the reference's bytes ------------------------------------------------


@pytest.mark.timeout(240)
def test_every_runner_gives_byte_identical_output(
    docs: list[dict[str, object]], ray_if_installed: None
) -> None:
    reference = digest(build(docs))
    assert len(reference) > 20
    for name in available():
        assert digest(build(docs, name)) == reference, f"runner={name!r} differs"


# -- compiling is pure ---------------------------------------------------------------------


class SetupCounter(BaseOp):
    """Counts setup calls: compiling must not set an operator up."""

    name = "setup_counter"
    setups = 0

    def setup(self, ctx: OpContext) -> None:
        type(self).setups += 1

    def process_many(self, elems: list[Any]) -> list[Any]:
        return elems


def _parts(pipe: Pipeline, resume: Any = None) -> tuple[Any, ...]:
    return (pipe.work_source, pipe._all_specs(), pipe.runtime_options, resume)


def test_compile_is_pure(docs: list[dict[str, object]], tmp_path: Path) -> None:
    quarantine = tmp_path / "skipped.jsonl"
    pipe = build(docs, "process", SetupCounter(), quarantine=str(quarantine))
    threads, io = threading.active_count(), io_totals()
    parts = _parts(pipe)
    first, again = compile(*parts), compile(*parts)
    assert isinstance(first, CompiledRun)
    assert first == again
    assert first.plan == pipe.explain()
    # nothing started, read, written or set up
    assert threading.active_count() == threads
    assert io_totals() == io
    assert not os.path.exists(quarantine)
    assert SetupCounter.setups == 0
    with pytest.raises(AttributeError):
        first.lanes = []  # type: ignore[misc]


def test_compile_with_a_checkpoint_is_pure_and_places_the_replay_filter(
    docs: list[dict[str, object]],
) -> None:
    pipe = build(docs)
    items = iter(pipe)
    for _ in range(5):
        next(items)
    state = pipe.checkpoint()
    items.close()
    from zephon.checkpoints import format as ckpt

    parsed = ckpt.parse(state)
    parts = _parts(pipe, parsed)
    first, again = compile(*parts), compile(*parts)
    assert first == again
    assert first.replay_targets and first.replay_targets == again.replay_targets
    names = [s.op.name for s in first.specs]
    assert names[first.replay_index] == "replay_filter"
    assert names[first.replay_index + 1] == "batch"
    assert first.state_key(first.replay_index + 1) == str(len(first.operators) - 1)


def test_the_engine_process_runs_the_pickled_compiled_run(
    docs: list[dict[str, object]],
) -> None:
    run = compile(*_parts(build(docs, "threads", engine_process=True)))
    engine = EngineProcess(run)
    try:
        child: CompiledRun = cloudpickle.loads(engine._blobs[0])
        transform = cloudpickle.loads(engine._blobs[1])
    finally:
        engine.close()
    assert transform is None  # items are sent as they are
    assert isinstance(child, CompiledRun)
    assert child.plan == run.plan
    assert child.config_fingerprint == run.config_fingerprint
    assert child.options.engine_process is False
