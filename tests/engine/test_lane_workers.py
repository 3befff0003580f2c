"""``lane_workers``: whole lanes in worker processes give the rank's output byte for byte,
whatever the count; checkpoints move between them and every other runner; failures name the
worker and lose nothing; nothing is left behind."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader

from tests.engine import _lanes as lanes
from tests.runners._leaks import our_segments, wait_gone
from tests.runners._pipes import describe, digest, key, run_with_stops
from tests.runners.conftest import no_leaks  # noqa: F401  (used below by name)
from zephon import merge_checkpoints
from zephon.errors import ConfigError, EngineProcessError
from zephon.pipeline import Pipeline
from zephon.torch_loader import PipelineDataLoader
from zephon.training import to_training

pytestmark = pytest.mark.usefixtures("no_leaks")

# every runner, and lane workers of each count (the reference first)
RUNS: list[dict[str, Any]] = [
    {"runner": "inline"},
    {"runner": "threads"},
    {"runner": "process"},
    *({"lane_workers": count} for count in (1, 2, 3, "auto")),
]


@pytest.fixture(scope="module")
def corpora(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return lanes.write_corpora(tmp_path_factory.mktemp("corpora"))


@pytest.mark.timeout(240)
@pytest.mark.parametrize("name", sorted(lanes.PIPELINES))
def test_every_runner_and_lane_worker_count_gives_the_same_bytes(
    corpora: Path, hf_tokenizer_dir: Path, name: str
) -> None:
    build = lanes.PIPELINES[name]
    expected = digest(build(corpora, hf_tokenizer_dir, **RUNS[0]))
    assert len(expected) > 12
    width = build(corpora, hf_tokenizer_dir).runtime_options.canonical_replicas
    for options in [*RUNS[1:], {"lane_workers": width}]:
        assert digest(build(corpora, hf_tokenizer_dir, **options)) == expected, options


def chain(build: lanes.Build, corpora: Path, tok: Path, runs: list[dict[str, Any]]):
    """A builder for :func:`run_with_stops` whose n-th pipeline runs with ``runs[n]``."""
    todo = iter(runs)
    return lambda: build(corpora, tok, **next(todo))


def lane_ends(expected: list[Any]) -> list[int]:
    """How many items were out right after each lane's last item (the lane of an item is
    that of its first row, see ``key``)."""
    last = {item[1][0][0]: index + 1 for index, item in enumerate(expected)}
    return sorted(last.values())


@pytest.mark.timeout(240)
def test_checkpoints_move_between_lane_worker_counts_and_runners(
    corpora: Path, hf_tokenizer_dir: Path
) -> None:
    expected = digest(lanes.packed(corpora, hf_tokenizer_dir, runner="inline"))
    ends = lane_ends(expected)
    assert ends[0] < len(expected) - 2  # lanes end at different steps
    near_end = len(expected) - 1
    cases = [
        ([0, 3, 11, near_end], [2, 3, 1, 4, 2]),  # lane workers -> other counts
        ([5, 17], [{"runner": "inline"}, 2, {"runner": "threads"}]),  # inline <-> lane workers
        ([4, near_end], [3, {"runner": "process"}, "auto"]),
        ([ends[0], ends[0] + 1, ends[1]], [2, 4, 3, 2]),  # right after a lane ended
    ]
    for stops, counts in cases:
        runs = [c if isinstance(c, dict) else {"lane_workers": c} for c in counts]
        make = chain(lanes.packed, corpora, hf_tokenizer_dir, runs)
        assert run_with_stops(make, stops) == expected, (stops, counts)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("count", [2, 3, 4])
def test_a_lane_with_no_chunk_and_lanes_of_one_chunk_resume_at_every_step(
    corpora: Path, hf_tokenizer_dir: Path, count: int
) -> None:
    expected = digest(lanes.tiny(corpora, hf_tokenizer_dir, runner="inline"))
    assert sorted({item[1][0][0] for item in expected}) == [0, 2, 3]  # lane 1 has nothing
    assert digest(lanes.tiny(corpora, hf_tokenizer_dir, lane_workers=count)) == expected
    runs = [{"lane_workers": count}] * (len(expected) + 1)
    make = chain(lanes.tiny, corpora, hf_tokenizer_dir, runs)
    assert run_with_stops(make, list(range(1, len(expected) + 1))) == expected


COUNTS = st.sampled_from([{"runner": "inline"}, *({"lane_workers": c} for c in (1, 2, 3))])


@pytest.mark.timeout(240)
@settings(
    max_examples=8,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    stops=st.lists(st.integers(0, 125), min_size=1, max_size=2).map(sorted),
    runs=st.lists(COUNTS, min_size=3, max_size=3),
)
def test_a_mixture_stopped_anywhere_resumes_under_any_count(
    corpora: Path, hf_tokenizer_dir: Path, stops: list[int], runs: list[dict[str, Any]]
) -> None:
    expected = digest(lanes.mixed(corpora, hf_tokenizer_dir, runner="inline"))
    make = chain(lanes.mixed, corpora, hf_tokenizer_dir, runs)
    assert run_with_stops(make, stops) == expected


def take(pipe: Pipeline, limit: int | None = None) -> list[tuple[Any, list[Any]]]:
    """Each item's key and sample ids, up to ``limit`` items; the iterator is closed."""
    out = []
    it = iter(pipe)
    for item in it:
        out.append((key(item), list(item.ids)))
        if limit is not None and len(out) >= limit:
            break
    it.close()  # type: ignore[attr-defined]
    return out


def elastic(
    corpora: Path, tok: Path, ranks: dict[str, Any], after: dict[str, Any]
) -> list[tuple[Any, list[Any]]]:
    """Two ranks stopped after 5 and 9 items, their checkpoints merged and resumed on one."""
    out, states = [], []
    for rank, stop in ((0, 5), (1, 9)):
        pipe = lanes.filtered(corpora, tok, dp_rank=rank, dp_world_size=2, **ranks)
        out += take(pipe, stop)
        states.append(pipe.checkpoint())
    merged = json.loads(json.dumps(merge_checkpoints(states)))
    return out + take(lanes.filtered(corpora, tok, **after).restore(merged))


@pytest.mark.timeout(240)
def test_elastic_resume_from_two_ranks_of_lane_workers_delivers_each_sample_once(
    corpora: Path, hf_tokenizer_dir: Path
) -> None:
    got = elastic(corpora, hf_tokenizer_dir, {"lane_workers": 2}, {"lane_workers": 3})
    inline = {"runner": "inline"}
    assert got == elastic(corpora, hf_tokenizer_dir, inline, inline)
    ids = [sid for _, item_ids in got for sid in item_ids]
    whole = take(lanes.filtered(corpora, hf_tokenizer_dir, **inline))
    assert len(ids) == len(set(ids))
    assert sorted(ids) == sorted(sid for _, item_ids in whole for sid in item_ids)


def inputs(pipe: Pipeline, limit: int | None = None) -> list[Any]:
    """What ``iter_training(convention="hf")`` hands out, described byte for byte."""
    out = []
    it = pipe.iter_training(convention="hf")
    for batch in it:
        out.append(describe(batch))
        if limit is not None and len(out) >= limit:
            break
    it.close()  # type: ignore[attr-defined]
    return out


@pytest.mark.timeout(240)
def test_iter_training_builds_inputs_in_the_lane_workers_and_resumes(
    corpora: Path, hf_tokenizer_dir: Path
) -> None:
    plain = lanes.packed(corpora, hf_tokenizer_dir, runner="inline")
    expected = [describe(to_training(b, convention="hf")) for b in plain]
    pipe = lanes.packed(corpora, hf_tokenizer_dir, lane_workers=2)
    assert inputs(pipe) == expected
    head = inputs(pipe := lanes.packed(corpora, hf_tokenizer_dir, lane_workers=3), 7)
    state = json.loads(json.dumps(pipe.checkpoint()))
    rest = inputs(lanes.packed(corpora, hf_tokenizer_dir, lane_workers=2).restore(state))
    assert head + rest == expected


def counted(pipe: Pipeline) -> list[tuple[str, int, int]]:
    stats = pipe.stats()
    assert stats is not None
    return [(op.name, op.elements_in, op.elements_out) for op in stats.operators]


@pytest.mark.timeout(120)
def test_stats_add_up_over_the_lane_workers_and_explain_names_them(
    corpora: Path, hf_tokenizer_dir: Path
) -> None:
    plain = lanes.filtered(corpora, hf_tokenizer_dir, runner="inline")
    count = len(list(plain))
    pipe = lanes.filtered(corpora, hf_tokenizer_dir, lane_workers=3)
    assert len(list(pipe)) == count
    stats = pipe.stats()
    assert stats is not None and stats.delivered == count
    assert counted(pipe) == counted(plain)
    totals = ("tombstones", "samples_read", "samples_done", "chunks", "skipped")
    inline = plain.stats()
    assert [getattr(stats, n) for n in totals] == [getattr(inline, n) for n in totals]
    assert sorted(stats.lanes) == [0, 1, 2, 3]
    assert "lane_workers=3: each worker process runs lanes w::3 of" in str(pipe.explain())


def stamp_pid(batch: Any) -> dict[str, Any]:
    return {**to_training(batch, convention="hf"), "pid": os.getpid()}


@pytest.mark.timeout(120)
def test_the_training_transform_runs_in_the_lane_workers(
    corpora: Path, hf_tokenizer_dir: Path
) -> None:
    pipe = lanes.packed(corpora, hf_tokenizer_dir, lane_workers=2)
    pids: set[int] = set()
    workers: list[int | None] = []
    for batch in pipe.iter_training(stamp_pid):
        pids.add(batch["pid"])
        workers = workers or list(engine_of(pipe).pids)
    assert pids == set(workers) and os.getpid() not in pids


def engine_of(pipe: Pipeline) -> Any:
    engine = pipe._engine
    assert engine is not None and len(engine.pids) >= 2
    return engine


def explode(payload: dict[str, Any]) -> dict[str, Any]:
    if payload["id"] == 77:
        raise ValueError("document 77 is bad")
    return payload


@pytest.mark.timeout(120)
def test_an_operator_error_in_a_lane_worker_reaches_the_consumer_as_inline(corpora: Path) -> None:
    def build(**options: Any) -> Pipeline:
        return (
            Pipeline(lanes.source(corpora)).decode_text().map_transform(explode).batch(4)
            .options(canonical_replicas=4, **options)
        )  # fmt: skip

    with pytest.raises(ValueError, match="document 77 is bad") as plain:
        list(build(runner="inline"))
    with pytest.raises(ValueError, match="document 77 is bad") as info:
        list(build(lane_workers=2))
    assert type(info.value) is type(plain.value)
    assert getattr(info.value, "zephon_op_name", None) == "map_transform"
    notes = "".join(getattr(info.value, "__notes__", []))
    assert "raised in operator 'map_transform'" in notes and "in explode" in notes


def assert_gone(pids: list[int | None]) -> None:
    alive = [pid for pid in pids if pid is not None]
    assert len(alive) == len(pids)
    assert wait_gone(alive, timeout=60) == []
    assert all(our_segments(pid) == [] for pid in alive)


SHM_ALL: dict[str, Any] = {"shm_min_bytes": 1}  # every token array through shared memory


@pytest.mark.timeout(180)
def test_a_killed_lane_worker_is_named_and_the_checkpoint_loses_nothing(
    corpora: Path, hf_tokenizer_dir: Path
) -> None:
    expected = digest(lanes.packed(corpora, hf_tokenizer_dir, runner="inline"))
    # a window of two items: the worker killed cannot have sent all its items before
    pipe = lanes.packed(corpora, hf_tokenizer_dir, lane_workers=2, queue_size=2, **SHM_ALL)
    got: list[Any] = []
    pids: list[int | None] = []
    with pytest.raises(EngineProcessError) as info:
        for item in pipe:
            got.append(key(item))
            if len(got) == 5:
                pids = list(engine_of(pipe).pids)
                os.kill(pids[1], signal.SIGKILL)  # type: ignore[arg-type]
    message = str(info.value)
    assert f"lane worker 1 of 2 (lanes [1, 3], pid {pids[1]}) was killed by SIGKILL" in message
    assert "pipeline.checkpoint()" in message
    assert info.value.exitcode == -signal.SIGKILL
    assert 5 <= len(got) < len(expected)
    assert_gone(pids)
    state = json.loads(json.dumps(pipe.checkpoint()))
    resumed = lanes.packed(corpora, hf_tokenizer_dir, lane_workers=2, **SHM_ALL).restore(state)
    assert got + digest(resumed) == expected


@pytest.mark.timeout(120)
def test_leaving_early_stops_every_lane_worker_and_leaves_no_segment(
    corpora: Path, hf_tokenizer_dir: Path
) -> None:
    pipe = lanes.packed(corpora, hf_tokenizer_dir, lane_workers=3, **SHM_ALL)
    it = iter(pipe)
    next(it)
    next(it)
    pids = list(engine_of(pipe).pids)
    it.close()  # type: ignore[attr-defined]
    assert_gone(pids)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"lane_workers": 0}, "lane_workers must be an integer >= 1, 'auto' or None (off), got 0"),
        ({"lane_workers": -1}, "got -1"),
        ({"lane_workers": True}, "got True"),
        ({"lane_workers": "many"}, "got 'many'"),
        ({"lane_workers": 2, "runner": "ray"}, "cannot run with runner='ray': drop one of the two"),
    ],
)
def test_bad_lane_worker_options_are_refused(
    options: dict[str, Any], message: str, corpora: Path, hf_tokenizer_dir: Path
) -> None:
    with pytest.raises(ConfigError) as info:
        lanes.packed(corpora, hf_tokenizer_dir, **options)
    assert message in str(info.value)


@pytest.mark.parametrize("stage", ["explain", "iterate"])
def test_more_lane_workers_than_lanes_is_refused(
    corpora: Path, hf_tokenizer_dir: Path, stage: str
) -> None:
    pipe = lanes.packed(corpora, hf_tokenizer_dir, lane_workers=3, dp_world_size=2)
    with pytest.raises(ConfigError) as info:
        pipe.explain() if stage == "explain" else next(iter(pipe))
    assert "lane_workers=3 but this rank runs 2 lane(s) (canonical_replicas=4" in str(info.value)
    assert "raise canonical_replicas, or use 'auto'" in str(info.value)


def identity(item: Any) -> Any:
    return item


@pytest.mark.timeout(240)
@pytest.mark.parametrize("workers", [0, 1, 2])
def test_a_data_loader_over_lane_workers_gives_the_rank_output_and_resumes(
    corpora: Path, hf_tokenizer_dir: Path, workers: int
) -> None:
    """DataLoader workers are daemonic and run inline views; without them (0) the lane
    workers run under the loader's process."""
    expected = digest(lanes.packed(corpora, hf_tokenizer_dir, runner="inline"))
    loader = PipelineDataLoader(
        lanes.packed(corpora, hf_tokenizer_dir, lane_workers=2), key, num_workers=workers
    )
    assert list(loader) == expected
    it = iter(loader := PipelineDataLoader(loader.pipeline, key, num_workers=workers))
    head = [next(it) for _ in range(9)]
    state = json.loads(json.dumps(loader.state_dict()))
    del it
    pipe = lanes.packed(corpora, hf_tokenizer_dir, lane_workers=3)
    resumed = PipelineDataLoader(pipe, key, num_workers={0: 2, 1: 0, 2: 1}[workers])
    resumed.load_state_dict(state)
    assert head + list(resumed) == expected
    # a plain DataLoader interleaves its workers' items: the same as over the inline run
    loaded = [
        list(DataLoader(ds, batch_size=None, num_workers=workers, collate_fn=identity))
        for options in ({"runner": "inline"}, {"lane_workers": 2})
        for ds in [lanes.packed(corpora, hf_tokenizer_dir, **options).to_torch_dataset(key)]
    ]
    assert loaded[0] == loaded[1] and sorted(map(repr, loaded[1])) == sorted(map(repr, expected))
