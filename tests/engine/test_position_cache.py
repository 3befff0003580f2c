"""The consumer position is cached per lane: checkpoints stay exactly what they always were."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest

from tests.engine.test_snapshots import build
from zephon._engine.plan.compile import compile as compile_run
from zephon._engine.run.engine import Engine

# sha256 of every checkpoint (sorted-key JSON, without the source settings summary that only
# some lanes repeat, and so without the checksum over it) taken after each of the 122 items
# of build(records=5, canonical_replicas=4), written by the engine before lane positions
# were cached: a cache that misses a change writes another checkpoint somewhere
GOLDEN = {
    "inline": "93d2f237658f97e78f155fe9ca628ff9829bade789b80f43f81186d8b3be194e",
    "lane_workers": "b529a4881a201cc86c5bedb6b582a1267620d152893a3df922f71afc9acc9b5e",
}


def _comparable(state: dict[str, Any]) -> dict[str, Any]:
    for lane in state["lanes"].values():
        lane["source_state"].pop("config", None)
    del state["checksum"]
    return state


def _digest(**options: Any) -> tuple[str, int]:
    pipe = build(records=5, canonical_replicas=4, **options)
    digest, items = hashlib.sha256(), 0
    for _ in pipe:
        items += 1
        digest.update(json.dumps(_comparable(pipe.checkpoint()), sort_keys=True).encode())
    return digest.hexdigest(), items


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize(
    ("name", "options"), [("inline", {}), ("lane_workers", {"lane_workers": 2})]
)
def test_checkpoints_after_every_item_are_the_ones_written_before(name, options):
    assert _digest(**options) == (GOLDEN[name], 122)


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("records", [None, 5])
def test_a_cached_lane_position_equals_one_built_afresh(records):
    pipe = build(records=records, canonical_replicas=4)
    engine = Engine(compile_run(pipe._source(), pipe._all_specs(), pipe.runtime_options, None))
    before = None
    reused = 0
    for _ in engine.stream():
        cached = engine.position()
        engine._lane_positions.clear()
        assert engine.position() == cached
        if before is not None:
            reused += sum(a is b for a, b in zip(before.lanes, cached.lanes, strict=True))
        before = engine.position()
        assert before.lanes == cached.lanes
    engine.close()
    assert reused > 0  # lanes that did not move kept their checkpoint object
