"""prepare_pipeline under a real ``accelerate launch`` with two processes: every lane trained once
across the processes, and ``save_state``/``load_state`` continue the data bit for bit."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.integrations._launch import free_port, json_lines, run_job
from tests.integrations.test_transformers import assert_every_lane_once

STEPS, SAVED_AT = 20, 10


def accelerate_argv(out: Path, workers: int) -> list[str]:
    return [
        sys.executable, "-m", "accelerate.commands.launch",
        "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
        "--mixed_precision", "no", "--dynamo_backend", "no",
        "--main_process_port", str(free_port()),
        "tests/integrations/_accelerate_job.py", str(out), str(workers),
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
