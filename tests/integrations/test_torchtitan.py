"""zephon's torchtitan data loader with real torchtitan 0.3.0 on the CPU: torchtitan's batch format
(per-document positions, the ignore index), its config entry and command line, the refusals, and
torchtitan's ``CheckpointManager`` (DCP) in 2-rank gloo jobs: SIGKILLed after a checkpoint, the
job resumes on 2, 1 and 4 DP ranks with every row trained once (the 2-rank resume's rows and
losses bit for bit the uninterrupted run's), and finite data ends on every rank at once."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torchtitan.components.dataloader import BaseDataLoader
from torchtitan.config import ConfigManager

from tests.integrations._corpus import BATCH, ROW_LENGTH, build_pipeline
from tests.integrations._launch import (
    JOB_TIMEOUT_S,
    json_lines,
    run_job,
    run_until_parked_then_kill,
    torchrun_argv,
)
from tests.integrations._steps import assert_each_step, reference_steps, trained
from tests.integrations._torchtitan_job import FINITE_DOCS, GLOBAL, PARK_AT
from tests.integrations.test_megatron import short_docs_pipeline
from zephon.errors import CheckpointError, ConfigError
from zephon.integrations.torchtitan import (
    IGNORE_INDEX,
    ZephonDataLoader,
    load_pipeline,
    titan_batch,
)

SCRIPT = "_torchtitan_job.py"
STEPS = 6
REGISTRY = "tests.integrations._torchtitan_registry"


def loader(pipeline: str = "tests.integrations._corpus:build_pipeline", **options: Any) -> Any:
    build = {"dp_world_size": 1, "dp_rank": 0, "seq_len": ROW_LENGTH, "local_batch_size": BATCH}
    config = ZephonDataLoader.Config(pipeline=pipeline)
    return config.build(**{**build, **options})


def test_rows_have_torchtitans_keys_positions_per_document_and_the_ignore_index() -> None:
    item = next(iter(short_docs_pipeline()))
    docs = item.to_training(convention="shifted")["document_ids"]
    inputs, labels = titan_batch(item, seq_len=64, local_batch_size=2)
    assert set(inputs) == {"input", "positions"}
    assert inputs["input"].shape == inputs["positions"].shape == labels.shape == (2, 64)
    assert inputs["input"].dtype == inputs["positions"].dtype == labels.dtype == torch.int64
    tokens, positions, targets = (t.numpy() for t in (inputs["input"], inputs["positions"], labels))
    for row in range(2):
        changes = [t for t in range(64) if t == 0 or docs[row, t - 1] != docs[row, t]]
        starts = [t for t in changes if docs[row, t] >= 0]
        assert len(starts) > 2  # several documents in the row
        for start in starts:
            doc = docs[row, start]
            end = start + int((docs[row] == doc).sum())
            assert np.array_equal(positions[row, start:end], np.arange(end - start))
            assert np.array_equal(targets[row, start : end - 1], tokens[row, start + 1 : end])
            assert targets[row, end - 1] == IGNORE_INDEX  # the next document's start: no target
        assert (targets[row][docs[row] < 0] == IGNORE_INDEX).all()  # padding


def test_flat_row_holds_the_batch_end_to_end_padded_to_the_token_budget() -> None:
    item = next(iter(short_docs_pipeline()))
    rows, row_labels = titan_batch(item, seq_len=64, local_batch_size=2)
    flat, labels = titan_batch(item, seq_len=64, num_tokens_per_batch=160, pad_token_id=7)
    assert flat["input"].shape == flat["positions"].shape == labels.shape == (1, 160)
    assert torch.equal(flat["input"][0, :128], rows["input"].flatten())
    assert torch.equal(flat["positions"][0, :128], rows["positions"].flatten())
    assert torch.equal(labels[0, :128], row_labels.flatten())
    assert (flat["input"][0, 128:] == 7).all() and (labels[0, 128:] == IGNORE_INDEX).all()
    assert torch.equal(flat["positions"][0, 128:], torch.arange(32))
    with pytest.raises(ConfigError, match=r"holds 128 tokens but num_tokens_per_batch is 100"):
        titan_batch(item, num_tokens_per_batch=100)


def test_rows_of_another_width_or_count_than_the_trainers_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"rows are 64 tokens but training.seq_len is 128.*"
                                          r"pack_flat\(128\)"):  # fmt: skip
        next(iter(loader(seq_len=128)))
    with pytest.raises(ConfigError, match=r"holds 2 rows but training.local_batch_size is 4.*"
                                          r"\.batch\(4\)"):  # fmt: skip
        next(iter(loader(local_batch_size=4)))
    with pytest.raises(ConfigError, match=r"global_batch_size=6 .* --training.global_batch_size 4"):
        ZephonDataLoader.Config(pipeline="tests.integrations._corpus:build_pipeline",
                                global_batch_size=6).build(dp_world_size=2, dp_rank=0,
                                                           local_batch_size=2)  # fmt: skip


def test_pipeline_comes_from_a_yaml_file_or_a_python_factory(tmp_path: Path) -> None:
    docs = [{"text": f"document {i} " + "xy" * i} for i in range(40)]
    (tmp_path / "docs.jsonl").write_text("".join(json.dumps(doc) + "\n" for doc in docs))
    (tmp_path / "pipeline.yaml").write_text(YAML_PIPELINE)
    from_yaml = loader(str(tmp_path / "pipeline.yaml"), seq_len=32)
    inputs, labels = next(iter(from_yaml))
    assert inputs["input"].shape == labels.shape == (2, 32)
    first = next(iter(loader()))[0]["input"]
    assert torch.equal(first, next(iter(loader(built_pipeline=build_pipeline())))[0]["input"])
    with pytest.raises(ConfigError, match=r"dataloader\.pipeline is empty"):
        load_pipeline("")
    with pytest.raises(ConfigError, match=r"gave a int, not a zephon Pipeline"):
        load_pipeline("tests.integrations._torchtitan_job:PARK_AT")


YAML_PIPELINE = """\
datasets:
  - {name: docs, path: docs.jsonl}
operators:
  - decode_text
  - {op: tokenize, tokenizer: bytes, max_length: 32}
  - {op: pack_flat, max_length: 32, pad_token_id: 0}
  - {op: batch, microbatch_size: 2}
runner: inline
"""


def test_torchtitans_config_registry_and_command_line_select_the_loader(tmp_path: Path) -> None:
    config = ConfigManager().parse_args(
        ["--module", REGISTRY, "--config", "zephon_debugmodel",
         "--dataloader.pipeline", "tests.integrations._corpus:build_pipeline",
         "--dataloader.global_batch_size", "8"]
    )  # fmt: skip
    assert isinstance(config.dataloader, ZephonDataLoader.Config)
    built = config.dataloader.build(  # what torchtitan's Trainer passes
        dp_world_size=1, dp_rank=0, tokenizer=None, seq_len=config.training.seq_len,
        local_batch_size=config.training.local_batch_size, snapshot_every_n_steps=None,
    )  # fmt: skip
    assert isinstance(built, BaseDataLoader)
    assert built.accumulation_steps == 4
    inputs, labels = next(iter(built))
    assert inputs["input"].shape == labels.shape == (BATCH, ROW_LENGTH)


def test_state_loads_before_the_first_batch_only_and_only_zephons() -> None:
    first = loader()
    batches = iter(first)
    for _ in range(3):
        next(batches)
    saved = first.state_dict()
    assert set(saved) == {"format", "dp_world_size", "state"} and isinstance(saved["state"], str)
    resumed = loader()
    resumed.load_state_dict(saved)
    assert torch.equal(next(iter(resumed))[0]["input"], next(batches)[0]["input"])
    with pytest.raises(CheckpointError, match="load the checkpoint before training starts"):
        resumed.load_state_dict(saved)
    foreign = {"dp_rank_0": b"...", "world_size": 1}  # torchtitan's own text loader's state
    with pytest.raises(CheckpointError, match=r"not a zephon torchtitan state.*exclude_from"):
        loader().load_state_dict(foreign)
    damaged = {**saved, "state": saved["state"].replace('"delivered": 1', '"delivered": 0', 1)}
    assert damaged != saved
    with pytest.raises(CheckpointError, match="checkpoint content does not match"):
        loader().load_state_dict(damaged)


def step_lines(out: Path, mode: str, rank: int) -> list[dict[str, Any]]:
    return json_lines(out / f"{mode}-r{rank}.jsonl")


@pytest.mark.timeout(7 * JOB_TIMEOUT_S)
def test_sigkill_then_resume_on_two_one_and_four_ranks_trains_every_row_once(
    tmp_path: Path,
) -> None:
    full = tmp_path / "full"
    done = run_job(torchrun_argv(SCRIPT, full, "full", STEPS), full)
    per_rank = re.findall(r"rank (\d) trained (\d+) rows", done.stdout)
    assert sorted(per_rank) == [("0", str(STEPS * GLOBAL // 2)), ("1", str(STEPS * GLOBAL // 2))]
    print("rows trained per rank (2 ranks):", dict(per_rank))
    states = [step_lines(full, "full-states", rank) for rank in range(2)]
    assert len(states[0]) == STEPS and states[0] == states[1]  # one state, the same on each rank
    killed = tmp_path / "killed"
    run_until_parked_then_kill(torchrun_argv(SCRIPT, killed, "park", STEPS), killed)
    reference = reference_steps(STEPS)
    assert_each_step(trained(full, "full", 2), reference)
    before = trained(killed, "park", 2)
    assert sorted(before) == list(range(1, PARK_AT + 1))
    for world in (2, 1, 4):
        resumed = tmp_path / f"resumed-{world}"
        shutil.copytree(killed / "checkpoint", resumed / "checkpoint")
        run_job(torchrun_argv(SCRIPT, resumed, "resume", STEPS, nproc=world), resumed)
        after = trained(resumed, "resume", world)
        assert sorted(after) == list(range(PARK_AT + 1, STEPS + 1)), f"resumed on {world}"
        assert_each_step(after, reference)
    for rank in range(2):  # the same DP size continues bit for bit: rows and losses
        lines = step_lines(killed, "park", rank)
        lines += step_lines(tmp_path / "resumed-2", "resume", rank)
        assert lines == step_lines(full, "full", rank)


@pytest.mark.timeout(2 * JOB_TIMEOUT_S)
def test_finite_data_ends_at_the_same_step_on_every_rank(tmp_path: Path) -> None:
    held = [sum(1 for _ in build_pipeline(docs=FINITE_DOCS, dp_rank=rank, dp_world_size=2))
            for rank in range(2)]  # fmt: skip
    assert held[1] < held[0]
    done = run_job(torchrun_argv(SCRIPT, tmp_path, "finite", 1000), tmp_path)
    per_rank = [step_lines(tmp_path, "finite", rank) for rank in range(2)]
    assert len(per_rank[0]) == len(per_rank[1]) == held[1]  # no rank waited on one that ran out
    rows = [row for lines in per_rank for line in lines for row in line["rows"]]
    assert len(rows) == len(set(rows)) == 2 * held[1] * BATCH
    assert sorted(re.findall(r"rank (\d) trained (\d+) rows", done.stdout)) == [
        ("0", str(held[1] * BATCH)),
        ("1", str(held[1] * BATCH)),
    ]


@pytest.mark.timeout(2 * JOB_TIMEOUT_S)
def test_ranks_sharing_a_dp_rank_save_that_ranks_position_once(tmp_path: Path) -> None:
    run_job(torchrun_argv(SCRIPT, tmp_path, "peers", 3), tmp_path)
    saved = [json.loads((tmp_path / f"peers-r{rank}.json").read_text()) for rank in range(2)]
    alone = loader()
    batches = iter(alone)
    for _ in range(3):
        next(batches)
    assert saved[0] == saved[1] == alone.state_dict()
