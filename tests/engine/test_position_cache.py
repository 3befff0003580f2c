"""The consumer position is cached per lane: checkpoints stay exactly what they always were."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest

from tests.engine.test_snapshots import build
from zephon._engine.plan.compile import compile as compile_run
from zephon._engine.run.engine import Engine

# sha256 of every checkpoint (sorted-key JSON) taken after each of the 122 items of
# build(records=5, canonical_replicas=4), written by the engine before lane positions
# were cached: a cache that misses a change writes another checkpoint somewhere
GOLDEN = {
    "inline": "b8b3d573942f2061abebd1bb5d7ac8203da095e34e05a4334026de6913d007d4",
    "lane_workers": "48cc4c29bb74a20de67fe74af09feac24ca8f142b8c91d92ac44b604cb44acc5",
}


def _digest(**options: Any) -> tuple[str, int]:
    pipe = build(records=5, canonical_replicas=4, **options)
    digest, items = hashlib.sha256(), 0
    for _ in pipe:
        items += 1
        digest.update(json.dumps(pipe.checkpoint(), sort_keys=True).encode())
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
