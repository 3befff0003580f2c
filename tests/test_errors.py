"""Enum-like values given to the Python API get "did you mean" in their ConfigError."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from zephon import Dataset, Pipeline, StaticMixtureWorkSource
from zephon.errors import ConfigError, did_you_mean
from zephon.options import RuntimeOptions


def _pipe() -> Pipeline:
    data = Dataset.from_records("d", [{"text": "a"}])
    return Pipeline(StaticMixtureWorkSource([data], None, chunk_size=1, seed=0))


@pytest.mark.parametrize(
    ("call", "hint"),
    [
        (lambda: _pipe().tokenize("bytes", special_tokens="eso"), "'eos'"),
        (lambda: _pipe().shuffle(8, seed=0, algorithm="blok"), "'block'"),
        (lambda: _pipe().pack_flat(8, pad_token_id=0, flush_strategy="fullst"), "'fullest'"),
        (lambda: RuntimeOptions().updated(runner="thread"), "'threads'"),
        (lambda: RuntimeOptions().updated(on_error="skp"), "'skip'"),
        (lambda: RuntimeOptions().updated(process_pool="shard"), "'shared'"),
    ],
)
def test_mistyped_choices_suggest_the_closest(call: Callable[[], Any], hint: str) -> None:
    with pytest.raises(ConfigError) as info:
        call()
    assert str(info.value).endswith(f"; did you mean {hint}?")


def test_no_suggestion_for_a_value_far_from_every_choice() -> None:
    assert did_you_mean("zzzzzz", ("bos_eos", "eos")) == ""
    assert did_you_mean(3, ("bos_eos", "eos")) == ""
    with pytest.raises(ConfigError) as info:
        RuntimeOptions().updated(runner="qqqqq")
    assert "did you mean" not in str(info.value)
