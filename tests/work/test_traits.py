"""The optional facts a work source offers the engine are typed: a custom source without a
``seed`` gets seed 0 and no fingerprint, one with them gets its own."""

from __future__ import annotations

from tests.engine._sources import RangeSource
from zephon import Dataset, MixtureSpec, Pipeline, StaticMixtureWorkSource
from zephon._engine.plan.plan import op_seed
from zephon.ops import BaseOp, OpContext
from zephon.types import SampleRecord, StreamItem
from zephon.work import (
    FingerprintedSource,
    MixtureSource,
    SeededSource,
    source_fingerprint,
    source_mixture,
    source_seed,
)

ROWS = [{"text": f"row {i}"} for i in range(40)]
DATA = [Dataset.from_records("d", ROWS)]


class SeededRange(RangeSource):
    @property
    def seed(self) -> int:
        return 7

    @property
    def fingerprint(self) -> str:
        return "abc"

    def clone_for_lane(self, lane_id: int, canonical_replicas: int) -> SeededRange:
        return SeededRange(self._datasets, self.chunk_size, lane_id, canonical_replicas)


class SeedOf(BaseOp):
    """Replaces each payload by the operator's seed (from ``setup``'s context)."""

    seed = 0

    def setup(self, ctx: OpContext) -> None:
        self.seed = ctx.seed

    def process_many(self, elems: list[StreamItem]) -> list[StreamItem]:
        return [SampleRecord(e.meta, self.seed) for e in elems]


def test_the_builtin_source_offers_seed_fingerprint_and_mixture() -> None:
    source = StaticMixtureWorkSource(DATA, mixture=MixtureSpec({"d": 1.0}), chunk_size=4, seed=5)
    assert isinstance(source, SeededSource) and source_seed(source) == 5
    assert isinstance(source, FingerprintedSource) and source_fingerprint(source)
    assert isinstance(source, MixtureSource) and source_mixture(source) == source.mixture


def test_a_custom_source_gets_seed_zero_unless_it_has_one() -> None:
    plain, seeded = RangeSource(DATA, 8), SeededRange(DATA, 8)
    assert not isinstance(plain, SeededSource | FingerprintedSource | MixtureSource)
    assert (source_seed(plain), source_fingerprint(plain), source_mixture(plain)) == (0, None, None)
    assert (source_seed(seeded), source_fingerprint(seeded)) == (7, "abc")

    def seeds(source: RangeSource) -> set[int]:
        pipe = Pipeline(source).add_op(SeedOf()).options(runner="inline")
        return {r.payload for r in pipe}

    assert seeds(RangeSource(DATA, 8)) == {op_seed(0, 1, "seed_of")}
    assert seeds(SeededRange(DATA, 8)) == {op_seed(7, 1, "seed_of")}  # the source's seed
    assert Pipeline(seeded).checkpoint()["config"]["source"]["fingerprint"] == "abc"
