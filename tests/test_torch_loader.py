"""PipelineDataLoader: the state is the last item handed out, whatever the workers prefetched,
and the states of every rank merge into one checkpoint that another world size resumes."""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from tests.engine._sources import RangeSource
from tests.engine.test_torch import build, identity, ids
from zephon import Dataset, MixtureSpec, Pipeline, StaticMixtureWorkSource
from zephon._engine.handoff.shm import segment_files
from zephon.errors import CheckpointError, ConfigError
from zephon.torch_loader import PipelineDataLoader, merge_loader_states


def build_tail() -> Pipeline:
    """31 chunks over 4 lanes: lane 3 ends a chunk before the others, mid-rotation of the
    worker that also runs lane 1 (with 2 workers)."""
    rows = [{"id": i, "text": f"row {i} " * (1 + i % 4)} for i in range(31 * 8)]
    source = RangeSource([Dataset.from_records("rows", rows, shard_size=50)], chunk_size=8)
    return (
        Pipeline(source).decode_text().tokenize("bytes").batch(4)
        .options(canonical_replicas=4, runner="threads")
    )  # fmt: skip


def take(loader: PipelineDataLoader, count: int) -> tuple[list[Any], Any]:
    it = iter(loader)
    return [next(it) for _ in range(count)], it


@pytest.mark.timeout(120)
@pytest.mark.parametrize("workers", [0, 2])
def test_state_is_the_last_item_handed_out_despite_prefetch(workers: int) -> None:
    prefetch = {"prefetch_factor": 4} if workers else {}
    loader = PipelineDataLoader(build(), ids, num_workers=workers, **prefetch)
    head, it = take(loader, 7)
    state = loader.state_dict()
    json.dumps(state)  # plain JSON
    rest = list(it)
    assert sorted(head + rest) == sorted(ids(b) for b in build())
    resumed = PipelineDataLoader(build(), ids, num_workers=workers)
    resumed.load_state_dict(json.loads(json.dumps(state)))
    assert resumed.state_dict() == state  # loaded, not iterated: the same position
    assert list(resumed) == rest
    assert resumed.items_yielded == len(rest)


@pytest.mark.timeout(120)
def test_rank_states_merge_and_resume_on_another_world_size() -> None:
    ranks = [
        PipelineDataLoader(build().options(dp_rank=r, dp_world_size=2), ids, num_workers=2)
        for r in range(2)
    ]
    iters = [take(loader, 5)[1] for loader in ranks]
    merged = merge_loader_states([loader.state_dict() for loader in ranks])
    left = sorted(item for it in iters for item in it)
    one_rank = PipelineDataLoader(build(), ids)
    one_rank.load_state_dict(merged)
    assert sorted(one_rank) == left


def test_a_worker_that_has_not_yielded_reports_its_start() -> None:
    loader = PipelineDataLoader(build(), ids, num_workers=2)
    fresh = loader.state_dict()
    assert len(fresh["checkpoints"]) == 2
    again = PipelineDataLoader(build(), ids, num_workers=2)
    again.load_state_dict(fresh)
    assert sorted(again) == sorted(ids(b) for b in build())


def test_a_worker_count_that_cannot_split_the_lanes_is_refused() -> None:
    with pytest.raises(ConfigError, match="3 DataLoader workers cannot split the 4 lanes"):
        PipelineDataLoader(build(), ids, num_workers=3)


@pytest.mark.timeout(120)
def test_merged_state_keeps_each_ranks_order() -> None:
    def ranks() -> list[PipelineDataLoader]:
        return [
            PipelineDataLoader(build().options(dp_rank=r, dp_world_size=2), ids, num_workers=2)
            for r in range(2)
        ]

    first = ranks()
    iters = [take(loader, count)[1] for loader, count in zip(first, (3, 4))]  # odd and even
    merged = merge_loader_states([loader.state_dict() for loader in first])
    for loader, it in zip(ranks(), iters):
        loader.load_state_dict(merged)
        assert list(loader) == list(it)  # the same order, not only the same items


MORE_WORKERS_THAN_CORES = "ignore:This DataLoader will create:UserWarning"


@pytest.mark.timeout(180)
@pytest.mark.filterwarnings(MORE_WORKERS_THAN_CORES)
@pytest.mark.parametrize(
    "opts",
    [
        {},
        {"dp_rank": 0, "dp_world_size": 2},
        {"dp_rank": 1, "dp_world_size": 2, "mapping": "contiguous"},
    ],
    ids=["1-rank", "2-ranks", "2-ranks-contiguous"],
)
def test_the_batch_order_does_not_depend_on_the_worker_count(opts: dict[str, Any]) -> None:
    reference = [ids(b) for b in build_tail().options(**opts)]
    lanes = sorted({lane for lane, _ in reference})
    for workers in [0, 2, 4] if len(lanes) == 4 else [0, 2]:
        loader = PipelineDataLoader(build_tail().options(**opts), ids, num_workers=workers)
        assert list(loader) == reference, f"num_workers={workers}"


@pytest.mark.timeout(180)
@pytest.mark.parametrize("opts", [{"runner": "process"}, {"engine_process": True}])
def test_one_data_loader_worker_runs_a_pipeline_that_would_start_processes(
    opts: dict[str, Any],
) -> None:
    """The only DataLoader worker is daemonic too: it runs an inline view, as two do."""
    reference = [ids(b) for b in build_tail()]
    loader = PipelineDataLoader(build_tail().options(**opts), ids, num_workers=1)
    assert list(loader) == reference
    dataset = build_tail().options(**opts).to_torch_dataset(ids)
    loaded = DataLoader(dataset, batch_size=None, num_workers=1, collate_fn=identity)
    assert list(loaded) == reference


def test_the_tail_case_is_real() -> None:
    lengths = [sum(1 for lane, _ in map(ids, build_tail()) if lane == n) for n in range(4)]
    assert lengths[3] < lengths[0] == lengths[1] == lengths[2]


@pytest.mark.timeout(180)
@pytest.mark.filterwarnings(MORE_WORKERS_THAN_CORES)
@pytest.mark.parametrize(("before", "after"), [(2, 0), (2, 4), (0, 2)])
def test_a_resume_that_changes_the_worker_count_continues_exactly(before: int, after: int) -> None:
    reference = [ids(b) for b in build_tail()]
    for stop in (7, len(reference) - 5):  # mid-run, and after lane 3 ended
        loader = PipelineDataLoader(build_tail(), ids, num_workers=before)
        head, it = take(loader, stop)
        state = json.loads(json.dumps(loader.state_dict()))
        del it
        resumed = PipelineDataLoader(build_tail(), ids, num_workers=after)
        resumed.load_state_dict(state)
        assert head + list(resumed) == reference, f"stopped after {stop}"


@pytest.mark.parametrize("workers", [0, 2])
def test_history_gives_the_position_after_an_earlier_item(workers: int) -> None:
    loader = PipelineDataLoader(build(), ids, num_workers=workers, history=3)
    head, it = take(loader, 6)  # the consumer trained 4 of them and read 2 ahead
    state = loader.state_dict(upto=3)
    with pytest.raises(CheckpointError, match="raise history"):
        loader.state_dict(upto=2)  # older than the 3 positions kept
    rest = head[4:] + list(it)
    resumed = PipelineDataLoader(build(), ids, num_workers=workers)
    resumed.load_state_dict(state)
    assert list(resumed) == rest


def build_epochs() -> Pipeline:
    """A few batches per epoch over 4 lanes, from a source whose order is keyed by the epoch."""
    rows = [{"text": f"doc {i}: " + "lorem " * (1 + i % 5)} for i in range(48)]
    source = StaticMixtureWorkSource(
        datasets=[Dataset.from_records("docs", rows)],
        mixture=MixtureSpec({"docs": 1.0}),
        chunk_size=6,
        seed=3,
    )
    return (
        Pipeline(source).decode_text().tokenize("bytes").shuffle(8, seed=5).batch(2)
        .options(canonical_replicas=4, runner="inline")
    )  # fmt: skip


def pipeline_pass(epoch: int) -> list[Any]:
    return [ids(b) for b in build_epochs().set_epoch(epoch)]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("workers", [0, 2])
def test_set_epoch_passes_the_pipelines_epoch(workers: int) -> None:
    loader = PipelineDataLoader(build_epochs(), ids, num_workers=workers)
    passes = []
    for epoch in range(3):
        loader.set_epoch(epoch)
        assert loader.epoch == epoch
        passes.append(list(loader))
    assert passes == [pipeline_pass(e) for e in range(3)]
    assert passes[0] != passes[1] != passes[2]
    assert sorted(passes[0]) != sorted(passes[1])  # other batches, not only another order


@pytest.mark.timeout(180)
@pytest.mark.parametrize("workers", [0, 2])
def test_auto_epoch_moves_on_after_a_finished_pass_and_a_resume_continues(workers: int) -> None:
    loader = PipelineDataLoader(build_epochs(), ids, num_workers=workers, auto_epoch=True)
    first = list(loader)
    assert loader.epoch_finished and loader.epoch == 0
    second, it = take(loader, 3)
    assert loader.epoch == 1 and not loader.epoch_finished
    state = loader.state_dict()
    assert [first, second + list(it)] == [pipeline_pass(0), pipeline_pass(1)]
    resumed = PipelineDataLoader(build_epochs(), ids, num_workers=workers, auto_epoch=True)
    resumed.load_state_dict(state)
    assert resumed.epoch == 1 and not resumed.epoch_finished
    assert second + list(resumed) == pipeline_pass(1)  # the loaded epoch is finished first
    assert list(resumed) == pipeline_pass(2)


def test_set_epoch_refuses_a_loaded_state_in_the_middle_of_another_epoch() -> None:
    loader = PipelineDataLoader(build_epochs(), ids)
    take(loader, 3)
    state = loader.state_dict()
    resumed = PipelineDataLoader(build_epochs(), ids)
    resumed.load_state_dict(state)
    with pytest.raises(CheckpointError, match=r"middle of epoch 0; call set_epoch\(0\)"):
        resumed.set_epoch(1)
    finished = PipelineDataLoader(build_epochs(), ids)
    list(finished)
    after_the_end = PipelineDataLoader(build_epochs(), ids)
    after_the_end.load_state_dict(finished.state_dict())
    assert after_the_end.epoch_finished
    after_the_end.set_epoch(1)  # that epoch was complete: the new one starts at its beginning
    assert list(after_the_end) == pipeline_pass(1)


# -- ranks of uneven lengths: one endless stream per rank, whole accumulation groups ---------


def build_uneven(rank: int = 0) -> Pipeline:
    """Rank ``rank`` of 2: rank 0's passes hold 17, 18 and 17 batches, rank 1's 18, 17, 18."""
    rows = [{"text": f"doc {i}: " + "lorem " * (1 + i % 5)} for i in range(70)]
    source = StaticMixtureWorkSource(
        datasets=[Dataset.from_records("docs", rows)], chunk_size=6, seed=3
    )
    return (
        Pipeline(source).decode_text().tokenize("bytes").shuffle(8, seed=5).batch(2)
        .options(canonical_replicas=4, runner="inline", dp_rank=rank, dp_world_size=2)
    )  # fmt: skip


def whole_groups(rank: int, group: int, passes: int = 3) -> list[Any]:
    """Each pass of the rank cut to whole groups of ``group`` batches, one after the other."""
    out = []
    for epoch in range(passes):
        batches = [ids(b) for b in build_uneven(rank).set_epoch(epoch)]
        out += batches[: len(batches) // group * group]
    return out


@pytest.mark.timeout(300)
@pytest.mark.parametrize(("workers", "group"), [(0, 1), (0, 4), (2, 3)])
def test_endless_goes_from_pass_to_pass_in_whole_groups_and_resumes_exactly(
    workers: int, group: int
) -> None:
    assert [build_uneven(0).pass_length(e) for e in range(3)] == [17, 18, 17]
    expected = whole_groups(0, group)
    loader = PipelineDataLoader(
        build_uneven(0), ids, num_workers=workers, endless=True, accumulation_steps=group
    )
    got, it = take(loader, len(expected))
    assert got == expected and loader.epoch == 2
    it.close()
    assert loader.left_out == sum(length % group for length in (17, 18))
    # a state at the end of a pass's last whole group, and one a group into the next pass
    # (a consumer saves at optimizer steps: between groups)
    for stop in (17 // group * group, 17 // group * group + group):
        head = PipelineDataLoader(
            build_uneven(0), ids, num_workers=workers, endless=True, accumulation_steps=group
        )
        seen, it = take(head, stop)
        state = json.loads(json.dumps(head.state_dict()))
        it.close()
        resumed = PipelineDataLoader(build_uneven(0), ids, endless=True, accumulation_steps=group)
        resumed.load_state_dict(state)
        rest, it = take(resumed, len(expected) - stop)
        it.close()
        assert seen + rest == expected, stop


@pytest.mark.timeout(300)
@pytest.mark.parametrize("workers", [0, 2])
def test_ranks_in_different_passes_merge_and_resume_on_one_rank(workers: int) -> None:
    loaders = [
        PipelineDataLoader(build_uneven(rank), ids, endless=True, accumulation_steps=2)
        for rank in (0, 1)
    ]
    heads = [take(loader, 18)[0] for loader in loaders]  # rank 0 is in pass 1, rank 1 in pass 0
    assert [loader.epoch for loader in loaders] == [1, 0] and loaders[0].left_out == 1
    merged = merge_loader_states([loader.state_dict() for loader in loaders])
    one_rank = build_uneven(0).options(dp_world_size=1, dp_rank=0)
    one = PipelineDataLoader(one_rank, ids, num_workers=workers, endless=True)
    one.load_state_dict(merged)
    # every batch of passes 0 and 1 once, but the one rank 0 left out of its pass 0
    every = [ids(b) for e in (0, 1) for r in (0, 1) for b in build_uneven(r).set_epoch(e)]
    left_out = [ids(b) for b in build_uneven(0)][16:]
    rest, it = take(one, len(every) - len(left_out) - 36)
    assert one.epoch == 1  # the lanes restored in pass 1 went on there, not from its start
    it.close()
    assert sorted(heads[0] + heads[1] + rest + left_out) == sorted(every)


def test_without_workers_the_state_is_taken_between_groups_only() -> None:
    loader = PipelineDataLoader(build_uneven(0), ids, endless=True, accumulation_steps=4)
    _, it = take(loader, 6)
    with pytest.raises(CheckpointError, match="after item 2 of a group of accumulation_steps=4"):
        loader.state_dict()
    next(it), next(it)
    state = loader.state_dict()  # after 8: between groups
    it.close()
    resumed = PipelineDataLoader(build_uneven(0), ids, endless=True, accumulation_steps=4)
    resumed.load_state_dict(state)
    assert take(resumed, 4)[0] == whole_groups(0, 4)[8:12]


def test_endless_refuses_a_pass_that_holds_no_whole_group() -> None:
    loader = PipelineDataLoader(build_uneven(0), ids, endless=True, accumulation_steps=20)
    with pytest.raises(ConfigError, match="pass 0 of this rank's lanes handed out no item"):
        next(iter(loader))
    with pytest.raises(ConfigError, match="accumulation_steps must be an integer >= 1"):
        PipelineDataLoader(build_uneven(0), ids, accumulation_steps=0)


def test_the_torch_dataset_goes_on_from_pass_to_pass_when_endless() -> None:
    passes = [[ids(b) for b in build_uneven(1).set_epoch(e)] for e in range(3)]
    dataset = build_uneven(1).to_torch_dataset(ids, endless=True)
    it = iter(dataset)
    head = [next(it) for _ in range(20)]
    state = json.loads(json.dumps(dataset.state_dict()))
    it.close()
    resumed = build_uneven(1).to_torch_dataset(ids, endless=True)
    resumed.load_state_dict(state)
    it = iter(resumed)
    rest = [next(it) for _ in range(len(passes[1]) + len(passes[2]) - 2)]
    assert head + rest == passes[0] + passes[1] + passes[2]


def sample_rows(batch: Any) -> dict[str, Any]:
    """A batch as one array of row names (lane and sample id), for ``rows=True``."""
    return {"row": np.array([f"{batch.lane_id}:{sid}" for sid in batch.ids])}


@pytest.mark.parametrize("rows", [False, True])
def test_the_torch_dataset_hands_out_whole_groups_and_resumes_inside_one(rows: bool) -> None:
    transform = sample_rows if rows else ids

    def dataset() -> Any:
        return build_uneven(0).to_torch_dataset(
            transform, rows=rows, endless=True, accumulation_steps=4
        )

    per_batch = 2 if rows else 1  # the rows of a batch, or the batch
    expected = whole_groups(0, 4)  # the same cut as PipelineDataLoader's
    if rows:
        expected = [f"{lane}:{sid}" for lane, sids in expected for sid in sids]
    full = dataset()
    it = iter(full)
    got = [next(it) for _ in range(len(expected))]
    it.close()
    assert _names(got) == expected
    assert len(got) == 48 * per_batch and full.left_out == 17 % 4 + 18 % 4
    # a state after the pass's last whole group, and two items (or rows) into the next group
    for stop in (16 * per_batch, 18 * per_batch + 1):
        head = dataset()
        it = iter(head)
        seen = [next(it) for _ in range(stop)]
        state = json.loads(json.dumps(head.state_dict()))
        it.close()
        resumed = dataset()
        resumed.load_state_dict(state)
        it = iter(resumed)
        rest = [next(it) for _ in range(len(got) - stop)]
        it.close()
        assert _names(seen + rest) == _names(got), stop


def _names(units: list[Any]) -> list[Any]:
    return [str(u["row"]) if isinstance(u, dict) else u for u in units]


def test_the_torch_dataset_refuses_what_would_break_its_groups() -> None:
    with pytest.raises(ConfigError, match="to_torch_dataset: accumulation_steps must be"):
        build_uneven(0).to_torch_dataset(ids, accumulation_steps=0)
    grouped = build_uneven(0).to_torch_dataset(ids, accumulation_steps=4)
    loader = DataLoader(grouped, batch_size=None, collate_fn=identity, num_workers=2)
    with pytest.raises(ConfigError, match=r"2 DataLoader workers: .* use num_workers=0 or 1"):
        next(iter(loader))
    it = iter(grouped)
    next(it)
    state = grouped.state_dict()
    it.close()
    other = build_uneven(0).to_torch_dataset(ids, accumulation_steps=2)
    other.load_state_dict(state)
    with pytest.raises(CheckpointError, match=r"to_torch_dataset\(accumulation_steps=4, rows=F"):
        next(iter(other))
    single = build_uneven(0).to_torch_dataset(ids, endless=True, accumulation_steps=20)
    with pytest.raises(ConfigError, match="pass 0 of this view's lanes handed out no item"):
        next(iter(single))


def model_inputs(batch: Any) -> Any:
    return batch.to_training(return_tensors="pt", pad_token_id=0)


@pytest.mark.timeout(120)
def test_workers_hand_over_model_inputs_in_one_shared_block_unchanged() -> None:
    expected = [model_inputs(b) for b in build()]
    got = list(PipelineDataLoader(build(), model_inputs, num_workers=2))
    assert len(got) == len(expected)
    for mine, theirs in zip(got, expected, strict=True):
        assert list(mine) == list(theirs)
        for key, value in theirs.items():
            if isinstance(value, torch.Tensor):
                assert mine[key].dtype == value.dtype and torch.equal(mine[key], value), key
            else:
                assert mine[key] == value, key
        tensors = [t for t in mine.values() if torch.is_tensor(t)]
        start = min(t.data_ptr() for t in tensors)
        span = max(t.data_ptr() + t.nbytes for t in tensors) - start
        # one shared-memory block per item, not a mapping (of whole pages) per tensor
        assert span <= sum(t.nbytes + 64 for t in tensors)


@pytest.mark.timeout(240)
def test_a_resume_from_every_items_state_gives_the_rest_of_the_uninterrupted_run() -> None:
    reference = [ids(b) for b in build()]
    loader = PipelineDataLoader(build(), ids, num_workers=2, history=len(reference))
    assert list(loader) == reference
    for index in range(len(reference)):
        resumed = PipelineDataLoader(build(), ids)
        resumed.load_state_dict(loader.state_dict(upto=index))
        assert list(resumed) == reference[index + 1 :], f"after item {index}"


@pytest.mark.parametrize("workers", [0, 2])
def test_a_state_handed_out_is_the_callers_own(workers: int) -> None:
    loader = PipelineDataLoader(build(), ids, num_workers=workers, history=2)
    _, it = take(loader, 3)
    state = loader.state_dict()
    kept = json.dumps(state, sort_keys=True)
    state["checkpoints"][0]["lanes"] = "changed by the caller"
    assert json.dumps(loader.state_dict(), sort_keys=True) == kept
    assert json.dumps(loader.state_dict(upto=2), sort_keys=True) == kept
    it.close()


@pytest.mark.timeout(120)
def test_items_the_workers_wrote_but_the_loader_never_handed_out_leave_no_file() -> None:
    loader = PipelineDataLoader(build(), model_inputs, num_workers=2, prefetch_factor=4)
    _, it = take(loader, 2)
    prefix = loader._dataset.shm_prefix
    assert prefix.startswith(f"zephon-shm-{os.getpid()}-loader")
    it.close()  # prefetched items the workers wrote are never received
    assert segment_files(prefix) == []


def ids_and_pid(batch: Any) -> tuple[Any, ...]:
    return (*ids(batch), os.getpid())


@pytest.mark.timeout(180)
def test_without_workers_an_engine_process_runs_the_transform_and_states_stay_exact() -> None:
    reference = [ids(b) for b in build()]
    loader = PipelineDataLoader(build().options(engine_process=True), ids_and_pid, history=3)
    head, it = take(loader, 6)
    assert {pid for *_, pid in head} != {os.getpid()}  # built in the engine process
    state, last = loader.state_dict(upto=3), loader.state_dict()
    rest = [item[:-1] for item in head[4:] + list(it)]
    assert [item[:-1] for item in head[:4]] + rest == reference
    for saved, after in ((state, 4), (last, 6)):
        resumed = PipelineDataLoader(build(), ids)
        resumed.load_state_dict(json.loads(json.dumps(saved)))
        assert list(resumed) == reference[after:]


@pytest.mark.timeout(120)
def test_without_workers_history_gives_the_checkpoint_of_its_item_taken_later() -> None:
    pipe = build()
    loader = PipelineDataLoader(pipe, ids, history=100)
    taken = []
    for _ in loader:  # what checkpoint() said right after each item was handed out
        taken.append(json.dumps(pipe.checkpoint(), sort_keys=True))
    assert len(taken) > 10
    for index, expected in enumerate(taken):
        state = loader.state_dict(upto=index)["checkpoints"][0]
        assert json.dumps(state, sort_keys=True) == expected, f"after item {index}"
