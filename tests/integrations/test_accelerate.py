"""prepare_pipeline under a real ``accelerate launch`` with two processes: every lane trained once
across the processes, and ``save_state``/``load_state`` continue the data bit for bit."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from tests.integrations._launch import free_port, json_lines, run_job, run_until_parked_then_kill
from tests.integrations._trainer_job import uneven_plan
from tests.integrations.test_transformers import assert_every_lane_once, assert_uneven_passes

STEPS, SAVED_AT = 20, 10


def accelerate_argv(out: Path, workers: int, *uneven: object) -> list[str]:
    return [
        sys.executable, "-m", "accelerate.commands.launch",
        "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
        "--mixed_precision", "no", "--dynamo_backend", "no",
        "--main_process_port", str(free_port()),
        "tests/integrations/_accelerate_job.py", str(out), str(workers), *map(str, uneven),
    ]  # fmt: skip


@pytest.mark.timeout(300)
def test_two_process_accelerate_trains_every_lane_once_and_load_state_continues(
    tmp_path: Path,
) -> None:
    run_job(accelerate_argv(tmp_path, 2), tmp_path)
    lines = [json_lines(tmp_path / f"steps-r{rank}.jsonl") for rank in (0, 1)]
    first = [[line for line in rank if line["pass"] == 1] for rank in lines]
    assert_every_lane_once(first[0] + first[1], accumulation=1, steps=STEPS)
    for rank in (0, 1):
        again = [line for line in lines[rank] if line["pass"] == 2]
        after_save = first[rank][SAVED_AT:]
        assert [(x["rows"], x["loss"]) for x in again] == [
            (x["rows"], x["loss"]) for x in after_save
        ]


@pytest.mark.timeout(900)
@pytest.mark.parametrize("accumulation", [4, pytest.param(1, marks=pytest.mark.slow)])
def test_uneven_ranks_save_state_every_step_across_passes_and_resume_bitwise(
    tmp_path: Path, accumulation: int
) -> None:
    steps, park_at = uneven_plan(accumulation)
    reference, killed = tmp_path / "reference", tmp_path / "killed"
    reference.mkdir(), killed.mkdir()
    run_job(accelerate_argv(reference, 0, "uneven", accumulation, "fresh"), reference)
    ref = [json_lines(reference / f"fresh-r{rank}.jsonl") for rank in (0, 1)]
    assert_uneven_passes(ref, accumulation, steps)
    state = reference / f"state-{park_at - 1}" / "custom_checkpoint_0.pkl"
    mixed = torch.load(state, weights_only=False)
    assert {lane.get("epoch", 0) for lane in mixed["lanes"].values()} == {0, 1}
    run_until_parked_then_kill(accelerate_argv(killed, 0, "uneven", accumulation, "park"), killed)
    run_job(accelerate_argv(killed, 0, "uneven", accumulation, "resume"), killed)
    for rank in (0, 1):
        resumed = json_lines(killed / f"resume-r{rank}.jsonl")
        assert resumed == [line for line in ref[rank] if line["step"] >= park_at]
