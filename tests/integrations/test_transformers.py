"""ZephonTrainer under real torchrun: every lane trained once across ranks, and a SIGKILL after a
checkpoint resumes bit for bit without reading a trained batch again."""

from __future__ import annotations

import os
import signal
from collections import defaultdict
from pathlib import Path

import pytest
from transformers import Trainer, TrainerCallback, TrainingArguments

from tests.integrations._corpus import (
    BATCH,
    build_pipeline,
    build_pipeline_unbatched,
    epoch_rows,
    follow_lanes,
    lane_streams,
    rank_stream,
    row_digest,
    tiny_llama,
)
from tests.integrations._launch import (
    delivered,
    json_lines,
    run_job,
    run_until_parked_then_kill,
    torchrun_argv,
)
from tests.integrations._trainer_job import (
    ELASTIC_PARK,
    UNEVEN_DOCS,
    RecordingTrainer,
    uneven_plan,
)
from zephon.checkpoints import load_checkpoint
from zephon.errors import CheckpointError, ConfigError
from zephon.integrations.transformers import (
    DATA_STATE_NAME,
    ZephonTrainer,
    latest_complete_checkpoint,
)

STEPS, CHECKPOINT, PARKED, USR1_CHECKPOINT = 40, 20, 22, 16


def reference_positions() -> dict[str, tuple[int, int]]:
    """Row digest -> (lane, index of its batch in that lane) for every batch of the pipeline."""
    positions: dict[str, tuple[int, int]] = {}
    per_lane: dict[int, int] = defaultdict(int)
    for batch in build_pipeline():
        index = per_lane[batch.lane_id]
        per_lane[batch.lane_id] += 1
        for row in batch.to_training(convention="hf")["input_ids"]:
            positions[row_digest(row)] = (batch.lane_id, index)
    return positions


def assert_every_lane_once(lines: list[dict], accumulation: int, steps: int = STEPS) -> None:
    """The trained batches are, lane by lane, each lane's first batches, none twice."""
    positions = reference_positions()
    trained = [positions[line["rows"][0]] for line in lines]
    for line in lines:  # every row of a batch comes from the same reference batch
        assert {positions[d] for d in line["rows"]} == {positions[line["rows"][0]]}
    assert len(set(trained)) == len(trained) == 2 * steps * accumulation
    by_lane: dict[int, list[int]] = defaultdict(list)
    for lane, index in trained:
        by_lane[lane].append(index)
    assert sorted(by_lane) == [0, 1, 2, 3]
    for indexes in by_lane.values():
        assert sorted(indexes) == list(range(len(indexes)))


@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    ("accumulation", "workers"),
    [
        (2, 2),  # accumulation and process workers in one run; the others are the slow tier
        pytest.param(1, 0, marks=pytest.mark.slow),
        pytest.param(2, 0, marks=pytest.mark.slow),
        pytest.param(1, 2, marks=pytest.mark.slow),
    ],
)
def test_torchrun_trainer_trains_every_lane_once_and_resumes_bitwise(
    tmp_path: Path, accumulation: int, workers: int
) -> None:
    reference, killed = tmp_path / "reference", tmp_path / "killed"
    run_job(torchrun_argv("_trainer_job.py", reference, "fresh", accumulation, workers), reference)
    ref = [json_lines(reference / f"fresh-r{r}.jsonl") for r in (0, 1)]
    assert_every_lane_once(ref[0] + ref[1], accumulation)

    run_until_parked_then_kill(
        torchrun_argv("_trainer_job.py", killed, "park", accumulation, workers), killed
    )
    checkpoints = sorted(p.name for p in (killed / "run").iterdir())
    assert checkpoints == ["checkpoint-10", f"checkpoint-{USR1_CHECKPOINT}", "checkpoint-20"]
    # SIGUSR1 reached rank 1 only; both ranks saved together at the next step end.
    assert (killed / "run" / f"checkpoint-{USR1_CHECKPOINT}" / DATA_STATE_NAME).is_file()
    run_job(torchrun_argv("_trainer_job.py", killed, "resume", accumulation, workers), killed)

    for rank in (0, 1):
        parked = json_lines(killed / f"park-r{rank}.jsonl")
        assert parked == [line for line in ref[rank] if line["step"] <= PARKED]
        resumed = json_lines(killed / f"resume-r{rank}.jsonl")
        # every step after the checkpoint: the same rows and the same loss, bit for bit
        assert resumed == [line for line in ref[rank] if line["step"] > CHECKPOINT]
        trained = [line["rows"] for line in ref[rank] if line["step"] <= CHECKPOINT]
        trained_before = {digest for rows in trained for digest in rows}
        read_again = delivered(killed, "resume", rank)
        assert len(read_again) >= len(resumed)
        assert not trained_before & {d for batch in read_again for d in batch}


def assert_uneven_passes(ranks: list[list[dict]], accumulation: int, steps: int) -> None:
    """Each rank trained its own stream, pass after pass in whole accumulation groups; every
    optimizer step within one pass; every row of a pass at most once (all but the left-out
    groups of the passes both ranks finished)."""
    streams = [
        rank_stream(UNEVEN_DOCS, rank, accumulation, steps * accumulation) for rank in (0, 1)
    ]
    for lines, stream in zip(ranks, streams, strict=True):
        assert [line["rows"] for line in lines] == [rows for _, rows in stream]
        passes = defaultdict(set)
        for line, (epoch, _) in zip(lines, stream, strict=True):
            passes[line["step"]].add(epoch)
        assert len(passes) == steps and all(len(p) == 1 for p in passes.values())
    assert [s[-1][0] for s in streams] != [s[0][0] for s in streams]  # more than one pass
    for epoch in range(min(s[-1][0] for s in streams)):  # passes both ranks finished
        rows = [d for s in streams for e, batch in s if e == epoch for d in batch]
        assert len(rows) == len(set(rows))
        every = {d for batch in epoch_rows(UNEVEN_DOCS, epoch) for d in batch}
        left_out = len(every) - len(rows)
        assert set(rows) <= every and 0 <= left_out < 2 * accumulation * BATCH


@pytest.mark.timeout(900)
@pytest.mark.parametrize("accumulation", [4, pytest.param(1, marks=pytest.mark.slow)])
def test_uneven_ranks_checkpoint_every_step_across_passes_and_resume_bitwise(
    tmp_path: Path, accumulation: int
) -> None:
    steps, park_at = uneven_plan(accumulation)
    reference, killed = tmp_path / "reference", tmp_path / "killed"
    argv = ["fresh", accumulation, 0, "uneven"]
    run_job(torchrun_argv("_trainer_job.py", reference, *argv), reference)
    ref = [json_lines(reference / f"fresh-r{r}.jsonl") for r in (0, 1)]
    assert_uneven_passes(ref, accumulation, steps)
    saved = sorted(int(p.name.split("-")[1]) for p in (reference / "run").iterdir())
    assert saved == list(range(1, steps + 1))  # every step, the final one included
    mixed = load_checkpoint(reference / "run" / f"checkpoint-{park_at - 1}" / DATA_STATE_NAME)
    assert {lane.get("epoch", 0) for lane in mixed["lanes"].values()} == {0, 1}

    argv[0] = "park"
    run_until_parked_then_kill(torchrun_argv("_trainer_job.py", killed, *argv), killed)
    argv[0] = "resume"
    run_job(torchrun_argv("_trainer_job.py", killed, *argv), killed)
    for rank in (0, 1):
        resumed = json_lines(killed / f"resume-r{rank}.jsonl")
        assert resumed == [line for line in ref[rank] if line["step"] >= park_at]


@pytest.mark.timeout(900)
@pytest.mark.parametrize("world", [4, pytest.param(1, marks=pytest.mark.slow)])
def test_a_killed_two_rank_job_resumes_on_another_world_size_training_each_row_once(
    tmp_path: Path, world: int
) -> None:
    """2 ranks (passes of 14 and 10 batches) checkpoint every step and are SIGKILLed after
    step 12, with rank 1 in its second pass; the newest checkpoint resumes on ``world`` ranks."""
    checkpoint = ELASTIC_PARK - 1
    argv = [1, 0, "elastic"]
    run_until_parked_then_kill(
        torchrun_argv("_trainer_job.py", tmp_path, "park", *argv, ELASTIC_PARK + 8), tmp_path
    )
    mixed = load_checkpoint(tmp_path / "run" / f"checkpoint-{checkpoint}" / DATA_STATE_NAME)
    assert {lane.get("epoch", 0) for lane in mixed["lanes"].values()} == {0, 1}
    steps = checkpoint + 4
    resume = torchrun_argv("_trainer_job.py", tmp_path, "resume", *argv, steps, nproc=world)
    run_job(resume, tmp_path)
    streams = lane_streams(UNEVEN_DOCS, passes=3)
    at: dict[int, int] | None = dict.fromkeys(streams, 0)
    for mode, ranks, last in (("park", 2, checkpoint), ("resume", world, steps)):
        for rank in range(ranks):
            lines = json_lines(tmp_path / f"{mode}-r{rank}.jsonl")
            assert [line["step"] for line in lines if line["step"] <= last][-1] == last
            trained = [tuple(line["rows"]) for line in lines if line["step"] <= last]
            assert at is not None
            at = follow_lanes(streams, at, list(range(rank, 4, ranks)), trained)
            assert at is not None, f"{mode} rank {rank} of {ranks} skipped or repeated a batch"
    assert at is not None
    for lane, stream in streams.items():  # every batch of the first pass, on 2 ranks then world
        assert at[lane] >= sum(1 for epoch, _ in stream if epoch == 0), f"lane {lane}"


# -- in one process ------------------------------------------------------------------------


def trainer(
    out: Path, mode: str, steps: int, run: str = "run", docs: int | None = None
) -> RecordingTrainer:
    args = TrainingArguments(
        output_dir=str(out / run),
        max_steps=steps,
        per_device_train_batch_size=BATCH,
        save_steps=100,
        learning_rate=1e-3,
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        seed=0,
    )
    pipeline = build_pipeline() if docs is None else build_pipeline(docs=docs)
    t = RecordingTrainer(model=tiny_llama(), args=args, train_pipeline=pipeline)
    t.log_path = out / f"{mode}.jsonl"
    return t


class SigtermAt(TrainerCallback):  # type: ignore[misc]
    def __init__(self, step: int = 5) -> None:
        self.step = step

    def on_step_end(self, args: object, state: object, control: object, **kw: object) -> object:
        if state.global_step == self.step:  # type: ignore[attr-defined]
            os.kill(os.getpid(), signal.SIGTERM)
        return control


def test_sigterm_checkpoints_at_the_next_step_end_exits_143_and_resumes_exactly(
    tmp_path: Path,
) -> None:
    trainer(tmp_path, "reference", 12, run="reference-run").train()
    stopped = trainer(tmp_path, "stopped", 12)
    stopped.add_callback(SigtermAt())
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(SystemExit) as exit_info:
        stopped.train()
    assert exit_info.value.code == 143
    assert signal.getsignal(signal.SIGTERM) is before  # the previous handler is back
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == ["checkpoint-6"]
    assert latest_complete_checkpoint(tmp_path / "run") == str(tmp_path / "run" / "checkpoint-6")
    resumed = trainer(tmp_path, "resumed", 12)
    resumed.train(resume_from_checkpoint=True)
    reference = json_lines(tmp_path / "reference.jsonl")
    assert json_lines(tmp_path / "stopped.jsonl") == reference[:6]
    assert json_lines(tmp_path / "resumed.jsonl") == reference[6:]
    assert resumed.zephon_loader is not None and resumed.zephon_loader.items_yielded == 6


def test_each_pass_is_the_next_epoch_and_a_resume_mid_epoch_continues_it(tmp_path: Path) -> None:
    docs = 24  # 10 batches an epoch: 25 steps end in the third epoch
    epochs = [epoch_rows(docs, epoch) for epoch in range(3)]
    assert len(epochs[0]) == 10 and epochs[0] != epochs[1] != epochs[2]
    trainer(tmp_path, "reference", 25, run="reference-run", docs=docs).train()
    reference = json_lines(tmp_path / "reference.jsonl")
    assert [line["rows"] for line in reference] == [b for e in epochs for b in e][:25]
    stopped = trainer(tmp_path, "stopped", 25, docs=docs)
    stopped.add_callback(SigtermAt(13))  # in the second epoch: saves checkpoint-14
    with pytest.raises(SystemExit):
        stopped.train()
    resumed = trainer(tmp_path, "resumed", 25, docs=docs)
    resumed.train(resume_from_checkpoint=True)
    assert json_lines(tmp_path / "resumed.jsonl") == reference[14:]


def test_wrong_setups_are_refused_naming_the_fix(tmp_path: Path) -> None:
    args = TrainingArguments(
        output_dir=str(tmp_path), max_steps=2, per_device_train_batch_size=8, report_to=[],
        use_cpu=True,
    )  # fmt: skip
    with pytest.raises(ConfigError, match="per_device_train_batch_size=2"):
        ZephonTrainer(model=tiny_llama(), args=args, train_pipeline=build_pipeline())
    args.per_device_train_batch_size = BATCH
    with pytest.raises(ConfigError, match=r"ends in \.batch"):
        ZephonTrainer(model=tiny_llama(), args=args, train_pipeline=build_pipeline_unbatched())
    with pytest.raises(ConfigError, match="built for rank 1 of 2"):
        ZephonTrainer(
            model=tiny_llama(), args=args, train_pipeline=build_pipeline(dp_rank=1, dp_world_size=2)
        )
    with pytest.raises(ConfigError, match="do not pass train_dataset"):
        ZephonTrainer(
            model=tiny_llama(), args=args, train_pipeline=build_pipeline(),
            train_dataset=build_pipeline().to_torch_dataset(),
        )  # fmt: skip
    (tmp_path / "checkpoint-3").mkdir()
    t = ZephonTrainer(model=tiny_llama(), args=args, train_pipeline=build_pipeline())
    with pytest.raises(CheckpointError, match=r"holds no zephon-data-state\.json"):
        t.train(resume_from_checkpoint=str(tmp_path / "checkpoint-3"))
    with pytest.raises(CheckpointError, match="no checkpoint with both"):
        t.train(resume_from_checkpoint=True)


def test_accelerate_resharding_a_rank_pipeline_is_refused_naming_zephon_trainer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from accelerate.data_loader import IterableDatasetShard

    monkeypatch.setenv("WORLD_SIZE", "2")  # as under torchrun
    dataset = build_pipeline(dp_rank=0, dp_world_size=2).to_torch_dataset()
    shard = IterableDatasetShard(dataset, batch_size=1, num_processes=2, process_index=0)
    with pytest.raises(ConfigError, match="ZephonTrainer"):
        next(iter(shard))


def test_rows_let_a_plain_trainer_batch_by_per_device_train_batch_size(tmp_path: Path) -> None:
    seen: list[int] = []

    class Recording(Trainer):  # type: ignore[misc]
        def training_step(self, model: object, inputs: dict, num_items: object = None) -> object:
            seen.append(len(inputs["input_ids"]))
            assert set(inputs) == {"input_ids", "labels", "position_ids"}
            return super().training_step(model, inputs, num_items)

    args = TrainingArguments(
        output_dir=str(tmp_path), max_steps=4, per_device_train_batch_size=3, report_to=[],
        use_cpu=True, disable_tqdm=True,
    )  # fmt: skip
    dataset = build_pipeline().to_torch_dataset(rows=True)
    Recording(model=tiny_llama(), args=args, train_dataset=dataset).train()
    assert seen == [3, 3, 3, 3]
