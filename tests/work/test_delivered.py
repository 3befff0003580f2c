"""MixtureStats: shares of what was delivered, none before anything was, and the target a
checkpoint records read back whole."""

from __future__ import annotations

import pytest

from zephon.work import MixtureStats


def test_shares_are_none_until_something_is_delivered():
    target = MixtureStats.target(["web", "code"], {"web": 0.7, "code": 0.3}, "tokens")
    assert target.sample_shares is None and target.token_shares is None
    assert target.to_dict()["samples"] == {"web": 0, "code": 0}
    counted = target.counted([7, 3], [0, 0])  # before tokenize: samples but no tokens
    assert counted.sample_shares == pytest.approx({"web": 0.7, "code": 0.3})
    assert counted.token_shares is None


def test_the_recorded_target_reads_back_with_its_component_order():
    target = MixtureStats.target(["b", "a"], {"a": 0.25, "b": 0.75}, "samples")
    back = MixtureStats.from_target_json(target.target_json())
    assert back == target and back.components == ["b", "a"]
    assert back.counted([1, 3], [10, 30]).tokens == {"b": 10, "a": 30}
