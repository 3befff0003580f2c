"""ZephonDataModule's eval pipelines under a real ``lightning.Trainer`` with DDP on two CPU
processes: every eval row validated once per validation, also when a rank holds no eval batch at
all, and the token-weighted loss of one process, bit for bit."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.integrations._corpus import tiny_llama
from tests.integrations._eval_corpus import (
    EVAL_JOB_TIMEOUT_S,
    eval_pipeline,
    eval_rows,
    evaluated_rows,
)
from tests.integrations._launch import ROOT, json_lines, run_job
from zephon.integrations.lightning import TokenLoss, loss_tokens
from zephon.torch_data import hf_tensors

VALIDATED_AT = (2, 4)


def one_process_loss(name: str) -> str:
    """The eval set's token-weighted loss at the starting weights, in this process."""
    import torch

    model, metric = tiny_llama(), TokenLoss()
    with torch.no_grad():
        for batch in eval_pipeline(name):
            inputs = hf_tensors(batch)
            metric.update(model(**inputs).loss, loss_tokens(inputs))
    return metric.compute().hex()


@pytest.mark.timeout(600)
# "main": the two ranks hold 9 and 16 batches; "tiny" alone: rank 1 holds none at all
@pytest.mark.parametrize("sets", ["tiny", pytest.param("tiny,main", marks=pytest.mark.slow)])
def test_ddp_validation_sees_every_row_once_with_the_loss_of_one_process(
    tmp_path: Path, sets: str
) -> None:
    script = ROOT / "tests" / "integrations" / "_lightning_eval_job.py"
    argv = [sys.executable, str(script), str(tmp_path), "2", sets]
    run_job(argv, tmp_path, timeout=EVAL_JOB_TIMEOUT_S)
    names = sets.split(",")
    seen = evaluated_rows(tmp_path)
    assert sorted(seen) == sorted(f"{s}-{n}" for s in VALIDATED_AT for n in names)
    for label, rows in seen.items():  # each validation reads the whole set from its start
        assert rows == eval_rows(label.split("-")[1]), label
    per_rank = [json_lines(tmp_path / f"val-r{rank}.jsonl") for rank in (0, 1)]
    assert per_rank[0] == per_rank[1]  # every rank logs the same
    # learning rate 0: every validation sees the starting weights
    expected = {name: one_process_loss(name) for name in names}
    assert [(x["step"], x["set"], x["loss"]) for x in per_rank[0]] == [
        (s, n, expected[n]) for s in VALIDATED_AT for n in names
    ]
