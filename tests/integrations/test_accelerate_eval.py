"""prepare_eval_pipeline and evaluate_loss under a real ``accelerate launch`` with one and with
two processes: every eval row once per evaluation (one process holds no batch of one set), the
same token-weighted loss bit for bit, and training between evaluations untouched."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.integrations._eval_corpus import EVAL_DOCS, EVAL_JOB_TIMEOUT_S, eval_rows, evaluated_rows
from tests.integrations._launch import free_port, json_lines, run_job
from tests.integrations.test_transformers import assert_every_lane_once

EVALUATED_AT = (0, 1, 2, 3)
STEPS = 6


def accelerate_argv(out: Path, processes: int, workers: int) -> list[str]:
    multi = ["--multi_gpu", "--num_processes", "2"] if processes == 2 else ["--num_processes", "1"]
    return [
        sys.executable, "-m", "accelerate.commands.launch", *multi, "--num_machines", "1",
        "--mixed_precision", "no", "--dynamo_backend", "no",
        "--main_process_port", str(free_port()),
        "tests/integrations/_accelerate_eval_job.py", str(out), str(workers),
    ]  # fmt: skip


@pytest.mark.timeout(1200)
def test_eval_loss_is_the_same_on_1_and_2_processes_and_every_row_is_evaluated_once(
    tmp_path: Path,
) -> None:
    losses = {}
    for processes, workers in ((1, 2), (2, 0)):
        out = tmp_path / f"processes{processes}"
        out.mkdir()
        run_job(accelerate_argv(out, processes, workers), out, timeout=EVAL_JOB_TIMEOUT_S)
        seen = evaluated_rows(out)
        assert sorted(seen) == sorted(f"{s}-{n}" for s in EVALUATED_AT for n in EVAL_DOCS)
        for label, rows in seen.items():  # each evaluation reads the whole set from its start
            assert rows == eval_rows(label.split("-")[1]), label
        per_rank = [json.loads((out / f"losses-r{r}.json").read_text()) for r in range(processes)]
        assert all(rank == per_rank[0] for rank in per_rank)
        losses[processes] = per_rank[0]
    assert losses[2] == losses[1]
    for name in EVAL_DOCS:  # learning rate 0: the same weights at every evaluation
        assert len({losses[1][f"{s}-{name}"] for s in EVALUATED_AT}) == 1
    # the evaluations between training steps moved nothing: each lane's first batches, in order
    trained = [json_lines(tmp_path / "processes2" / f"steps-r{rank}.jsonl") for rank in (0, 1)]
    assert_every_lane_once(trained[0] + trained[1], accumulation=1, steps=STEPS)
