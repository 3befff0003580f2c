"""ZephonTrainer evaluating pipelines under real torchrun: every eval row once across ranks, even
when a rank holds no eval batch, and the same token-weighted eval_loss on 1 and 2 processes."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from transformers import TrainingArguments

from tests.integrations._corpus import BATCH, build_pipeline, build_pipeline_unbatched, tiny_llama
from tests.integrations._eval_corpus import (
    EVAL_DOCS,
    EVAL_JOB_TIMEOUT_S,
    eval_pipeline,
    eval_rows,
    evaluated_rows,
)
from tests.integrations._launch import json_lines, run_job, torchrun_argv
from tests.integrations.test_transformers import assert_every_lane_once
from zephon.errors import ConfigError
from zephon.integrations.transformers import ZephonTrainer

EVALUATED_AT = (0, 2, 4)  # before training, then every 2 of the 4 steps


@pytest.mark.timeout(1200)
def test_eval_loss_is_the_same_on_1_and_2_processes_and_every_row_is_evaluated_once(
    tmp_path: Path,
) -> None:
    runs = {}
    for nproc, workers in ((1, 0), (2, 2)):
        out = tmp_path / f"nproc{nproc}"
        argv = torchrun_argv("_trainer_eval_job.py", out, workers, nproc=nproc)
        run_job(argv, out, timeout=EVAL_JOB_TIMEOUT_S)
        runs[nproc] = out
        seen = evaluated_rows(out)
        assert sorted(seen) == sorted(f"{s}-{n}" for s in EVALUATED_AT for n in EVAL_DOCS)
        for label, rows in seen.items():  # each evaluation starts from the first row again
            assert rows == eval_rows(label.split("-")[1]), label
    one, two = (
        [json.loads((runs[n] / f"metrics-r{r}.json").read_text()) for r in range(n)] for n in (1, 2)
    )
    # Both ranks report the same metrics; the wall-clock ones (runtime, rates per second) are
    # left out of the comparison, never asserted on.
    wall_clock = {k: v for k, v in two[0].items() if "runtime" in k or "per_sec" in k}
    assert two[0] == two[1] | wall_clock
    for name in EVAL_DOCS:
        loss = one[0][f"eval_{name}_loss"]
        assert math.isfinite(loss)
        assert two[0][f"eval_{name}_loss"] == loss  # exact sums: the same to the last bit
        assert two[0][f"eval_{name}_loss_tokens"] == one[0][f"eval_{name}_loss_tokens"] > 0
    # evaluating in the middle of training moved nothing: each lane's first batches, in order
    trained = [json_lines(runs[2] / f"train-r{rank}.jsonl") for rank in (0, 1)]
    assert_every_lane_once(trained[0] + trained[1], accumulation=1, steps=4)
    assert (runs[2] / "run" / "checkpoint-4" / "zephon-data-state.json").is_file()


def test_eval_loss_is_token_weighted_over_the_whole_set(tmp_path: Path) -> None:
    import torch

    model = tiny_llama()
    args = TrainingArguments(
        output_dir=str(tmp_path), max_steps=1, per_device_train_batch_size=BATCH,
        per_device_eval_batch_size=BATCH, report_to=[], use_cpu=True, disable_tqdm=True,
    )  # fmt: skip
    trainer = ZephonTrainer(
        model=model, args=args, train_pipeline=build_pipeline(), eval_dataset=eval_pipeline("tiny")
    )
    metrics = trainer.evaluate()
    losses, counts = [], []
    with torch.no_grad():
        for batch in eval_pipeline("tiny"):
            inputs = batch.to_training(convention="hf", return_tensors="pt")
            logits = model(input_ids=inputs["input_ids"], position_ids=inputs["position_ids"])
            targets = inputs["labels"][:, 1:]
            per_token = torch.nn.functional.cross_entropy(
                logits.logits[:, :-1].transpose(1, 2).double(), targets, reduction="none"
            )
            losses.append(float(per_token[targets != -100].sum()))
            counts.append(int((targets != -100).sum()))
    assert metrics["eval_loss_tokens"] == sum(counts)
    assert metrics["eval_loss"] == pytest.approx(sum(losses) / sum(counts), rel=1e-5)
    # batch means averaged without weights are another number: the weighting is what is tested
    means = [s / c for s, c in zip(losses, counts, strict=True)]
    assert abs(sum(means) / len(means) - metrics["eval_loss"]) > 1e-4


def test_wrong_eval_setups_are_refused_naming_the_fix(tmp_path: Path) -> None:
    args = TrainingArguments(
        output_dir=str(tmp_path), max_steps=1, per_device_train_batch_size=BATCH,
        per_device_eval_batch_size=BATCH, report_to=[], use_cpu=True, disable_tqdm=True,
    )  # fmt: skip

    def trainer(eval_dataset: object, **kwargs: object) -> ZephonTrainer:
        return ZephonTrainer(
            model=tiny_llama(), args=args, train_pipeline=build_pipeline(),
            eval_dataset=eval_dataset, **kwargs,
        )  # fmt: skip

    with pytest.raises(ConfigError, match=r"\.batch\(2, drop_last=False\)"):
        trainer({"main": build_pipeline()})  # drops the partial last batches
    with pytest.raises(ConfigError, match=r"add \.batch\(2, drop_last=False\)"):
        trainer(build_pipeline_unbatched())
    with pytest.raises(ConfigError, match="per_device_eval_batch_size=3"):
        trainer(build_pipeline_unbatched().batch(3, drop_last=False))
    with pytest.raises(ConfigError, match="drop compute_metrics"):
        trainer(eval_pipeline("tiny"), compute_metrics=lambda p: {}).evaluate()
