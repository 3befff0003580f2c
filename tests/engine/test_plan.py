"""Ray resource requests: checked when the pipeline is built, carried to the Ray stage only."""

from __future__ import annotations

import pytest

from tests.engine._sources import RangeSource
from zephon import Dataset, Pipeline
from zephon._engine.plan.plan import ray_resources
from zephon.errors import ConfigError


def pipe() -> Pipeline:
    return Pipeline(RangeSource([Dataset.from_records("d", [{"text": "a"}])], chunk_size=4))


def test_resources_need_remote_placement():
    with pytest.raises(ConfigError, match=r"tokenize: resources=.*add placement='remote'"):
        pipe().tokenize("bytes", resources={"cpu": 1})
    with pytest.raises(ConfigError, match=r"fetch: resources="):
        pipe().fetch(resources={"io": 1})


def test_resources_are_names_to_non_negative_amounts():
    with pytest.raises(ConfigError, match=r"amounts >= 0, got 'gpu': -1"):
        ray_resources("op", {"gpu": -1}, "remote")
    assert ray_resources("op", {"b": 1, "a": 0.5}, "remote") == (("a", 0.5), ("b", 1.0))
    assert ray_resources("op", None, "local") == ()


def test_only_the_ray_stage_sees_its_resources():
    p = pipe().decode_text().tokenize("bytes", placement="remote", resources={"cpu": 1})
    stages = {s.op_name: s.runner for s in p.explain().stages}
    assert stages["tokenize"] == "ray"
    specs = {s.op.name: s.resources for s in p._all_specs()}
    assert specs == {"fetch": (), "decode_text": (), "tokenize": (("cpu", 1.0),)}
