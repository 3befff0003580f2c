"""A run that truncates more than 5 % of its tokens says so while it runs, once."""

from __future__ import annotations

import logging

import pytest

from zephon import Dataset
from zephon.pipeline import Pipeline
from zephon.work import StaticMixtureWorkSource

DOCS = 600


def _run(lengths: list[int], caplog: pytest.LogCaptureFixture) -> tuple[list[int], int]:
    """Deliver documents of ``lengths`` bytes, truncated to 256 tokens; the positions in the
    run at which a cut warning was logged, and how many items the run delivered."""
    docs = [{"text": "x" * n} for n in lengths]
    data = Dataset.from_records("d", docs)
    pipe = (
        Pipeline(StaticMixtureWorkSource([data], None, chunk_size=16, seed=0))
        .tokenize("bytes", max_length=256)
        .options(runner="threads", queue_size=1)
    )
    warned_at: list[int] = []
    delivered = 0
    with caplog.at_level(logging.WARNING, logger="zephon"):
        for _ in pipe:
            delivered += 1
            messages = [r.getMessage() for r in caplog.records if "has cut" in r.getMessage()]
            warned_at += [delivered] * (len(messages) - len(warned_at))
    return warned_at, delivered


@pytest.mark.timeout(120)
def test_a_run_cutting_more_than_five_percent_warns_once_before_it_ends(
    caplog: pytest.LogCaptureFixture,
) -> None:
    warned_at, delivered = _run([400] * DOCS, caplog)  # 146 of 402 tokens cut from each
    assert len(warned_at) == 1 and warned_at[0] < delivered // 2, (warned_at, delivered)
    message = next(r.getMessage() for r in caplog.records if "has cut" in r.getMessage())
    assert "tokenize has cut 36." in message and "max_length=256" in message
    assert "split_long_samples=True" in message and "'wrap'" in message


@pytest.mark.timeout(120)
def test_a_run_cutting_less_than_five_percent_does_not_warn(
    caplog: pytest.LogCaptureFixture,
) -> None:
    lengths = [300 if i % 10 == 0 else 200 for i in range(DOCS)]  # 46 of ~2,100 tokens cut
    warned_at, delivered = _run(lengths, caplog)
    assert delivered == DOCS and warned_at == []
