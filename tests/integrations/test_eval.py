"""The evaluation helpers on their own: exact token-weighted sums, loss-token counts, an eval
loader that restarts at every iteration, and refused eval pipelines."""

from __future__ import annotations

import logging
import random
from collections import Counter
from fractions import Fraction

import numpy as np
import pytest
import torch

from tests.integrations._corpus import build_pipeline, build_pipeline_unbatched, row_digest
from tests.integrations._eval_corpus import eval_pipeline, eval_rows
from zephon.errors import ConfigError
from zephon.integrations._eval import EvalLoader, TokenLoss, check_eval_pipeline, loss_tokens
from zephon.integrations.lightning import ZephonDataModule
from zephon.torch_data import hf_tensors


def test_the_loss_is_token_weighted_and_exact_in_any_order() -> None:
    rng = random.Random(0)
    batches = [(float(np.float32(rng.uniform(1, 9))), rng.randrange(1, 5000)) for _ in range(500)]
    exact = sum((Fraction(mean) * tokens for mean, tokens in batches), Fraction(0))
    expected = float(exact / sum(tokens for _, tokens in batches))
    results = set()
    for seed in range(4):
        order = batches[:]
        random.Random(seed).shuffle(order)
        metric = TokenLoss()
        for mean, tokens in order:
            metric.update(torch.tensor(mean, dtype=torch.float32), tokens, rows=2)
        assert metric.tokens == sum(tokens for _, tokens in batches)
        assert (metric.rows, metric.batches) == (1000, 500)
        results.add(metric.compute())
    assert results == {expected}  # the same bits in every order
    plain = sum(m * t for m, t in batches) / sum(t for _, t in batches)
    unweighted = sum(m for m, _ in batches) / len(batches)
    assert plain == pytest.approx(expected, rel=1e-12)
    assert abs(unweighted - expected) > 1e-3


def test_batches_without_loss_tokens_add_nothing_and_compute_starts_over() -> None:
    metric = TokenLoss()
    assert np.isnan(metric.compute())  # no loss token at all
    metric.update(float("nan"), 0)  # what a model returns for a batch of padding
    metric.update(2.5, 4)
    assert metric.compute() == 2.5
    assert (metric.tokens, metric.batches, metric.loss_sum) == (0, 0, 0)


def test_loss_tokens_counts_what_the_model_averages_over() -> None:
    labels = torch.tensor([[5, 6, -100, 7], [-100, -100, 8, 9]])
    assert loss_tokens({"labels": labels}) == 4  # shifted: each row's first label is no target
    assert loss_tokens({"labels": labels}, shifts_labels=False) == 5
    assert loss_tokens({"labels": labels, "shift_labels": labels}) == 5
    with pytest.raises(ConfigError, match=r"needs `labels`.*\['input_ids'\]"):
        loss_tokens({"input_ids": labels})


def rows_of(loader: EvalLoader) -> list[str]:
    return [row_digest(r) for inputs in loader for r in inputs["input_ids"]]


def test_every_iteration_reads_the_rank_share_from_its_start(
    caplog: pytest.LogCaptureFixture,
) -> None:
    shares = [
        EvalLoader(eval_pipeline("main"), hf_tensors, rank=rank, world_size=2) for rank in (0, 1)
    ]
    with caplog.at_level(logging.WARNING, logger="zephon"):
        first = [rows_of(share) for share in shares]
        assert [rows_of(share) for share in shares] == first  # again from the start
    assert not caplog.records  # repeating the eval set is on purpose: no warning
    assert sorted(map(len, first)) == [17, 30]  # uneven shares
    assert Counter(first[0] + first[1]) == eval_rows("main")
    assert not hasattr(shares[0], "state_dict")  # frameworks keep no position for it


def test_eval_pipelines_that_would_skip_rows_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"use \.batch\(2, drop_last=False\)"):
        check_eval_pipeline(build_pipeline())
    with pytest.raises(ConfigError, match=r"add \.batch\(n, drop_last=False\)"):
        check_eval_pipeline(build_pipeline_unbatched())
    with pytest.raises(ConfigError, match="per_device_eval_batch_size=2"):
        check_eval_pipeline(eval_pipeline("tiny"), per_device=8)
    with pytest.raises(ConfigError, match="drop_last=False"):
        EvalLoader(build_pipeline(), hf_tensors, rank=0, world_size=1)


def test_the_data_module_validates_only_with_an_eval_pipeline() -> None:
    from lightning.pytorch.utilities.model_helpers import is_overridden

    # without an eval pipeline Lightning sees no val_dataloader (and warns of none missing)
    assert not is_overridden("val_dataloader", ZephonDataModule(build_pipeline()))
    single = ZephonDataModule(build_pipeline(), eval_pipeline=eval_pipeline("tiny"))
    assert is_overridden("val_dataloader", single)
    assert Counter(rows_of(single.val_dataloader())) == eval_rows("tiny")  # type: ignore[arg-type]
    many = ZephonDataModule(build_pipeline(), eval_pipeline=[eval_pipeline("tiny")] * 2)
    assert len(many.val_dataloader()) == 2  # type: ignore[arg-type]
