"""ensure_mixture: per-lane SWRR keeps the output close to the target mixture."""

from __future__ import annotations

import random
from collections import defaultdict

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.ops._helpers import ListSource, token_rows
from zephon import Dataset, Pipeline
from zephon._ops.ensure_mixture import TAG_TARGET_MIXTURE, EnsureMixtureOp
from zephon.errors import ConfigError
from zephon.ops import BaseOp, OpContext, OpTraits
from zephon.types import SampleMeta, SampleRecord

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def datasets(n=400, lengths=None):
    out = []
    for c, name in enumerate("abc"):
        if lengths is None:
            rows = [{"id": i, "c": c} for i in range(n)]
        else:
            rows = token_rows([lengths[c]] * n, first_id=c * n)
        out.append(Dataset.from_records(name, rows))
    return out


def bursty(counts, max_burst, rng):
    """Pointers with exactly ``counts[c]`` samples of component c, in bursts <= max_burst."""
    left = dict(enumerate(counts))
    taken = dict.fromkeys(left, 0)
    out = []
    while any(left.values()):
        c = rng.choice([k for k, v in left.items() if v])
        burst = min(left[c], rng.randint(1, max_burst))
        out += [(c, 0, taken[c] + j) for j in range(burst)]
        taken[c] += burst
        left[c] -= burst
    return out


def mixture_pipe(pointers, chunk=50, replicas=1, k=None, **kw):
    src = ListSource(datasets(), pointers, chunk)
    return (
        Pipeline(src)
        .ensure_mixture(**kw)
        .options(runner="inline", canonical_replicas=replicas, flush_every_k_chunks=k)
    )


def max_deviation(components, target):
    counts = defaultdict(int)
    worst = 0.0
    for n, c in enumerate(components, 1):
        counts[c] += 1
        worst = max(worst, max(abs(counts[k] - w * n) for k, w in target.items()))
    return worst


@SETTINGS
@given(
    n=st.integers(20, 300),
    wa=st.integers(1, 9),
    max_burst=st.integers(1, 12),
    seed=st.integers(0, 1000),
)
def test_deviation_stays_bounded_with_bursty_input(n, wa, max_burst, seed):
    target = {0: wa / 10, 1: 1 - wa / 10}
    counts = [round(n * target[0]), n - round(n * target[0])]
    pointers = bursty(counts, max_burst, random.Random(seed))
    pipe = mixture_pipe(pointers, mixture={"a": wa, "b": 10 - wa}, max_buffer_size=4 * 12 * 10)
    out = [r.meta.component_id for r in pipe]
    assert sorted(out) == sorted(p[0] for p in pointers)  # nothing lost or duplicated
    # Input bursts never overflow the buffer, so every prefix of the output stays within
    # two samples of the target (SWRR), up to the final drain of the rounding remainder.
    assert max_deviation(out[: n - 2], target) <= 2.0


def test_without_correction_the_same_input_deviates_a_lot():
    rng = random.Random(1)
    pointers = bursty([210, 90], 12, rng)
    raw = [p[0] for p in pointers]
    target = {0: 0.7, 1: 0.3}
    corrected = [r.meta.component_id for r in mixture_pipe(pointers, mixture={"a": 7, "b": 3})]
    assert max_deviation(raw, target) > 6
    assert max_deviation(corrected[:-2], target) <= 2


def test_bounded_buffer_drains_under_pressure():
    # 300 'a' then 100 'b': with a 50-record buffer, 'a' must be forced out while waiting.
    pointers = [(0, 0, i) for i in range(300)] + [(1, 0, i) for i in range(100)]
    out = [
        r.meta.component_id
        for r in mixture_pipe(pointers, mixture={"a": 1, "b": 1}, max_buffer_size=50)
    ]
    assert len(out) == 400
    # before any 'b' arrives, 'a' leaves only by draining from 50 down to 40 buffered, so
    # between 40 and 49 'a' records are still waiting when the first 'b' shows up
    waiting = 300 - out.index(1)
    assert 40 <= waiting < 50
    # once 'b' flows, the waiting 'a's pair with it: the output ends balanced
    assert max_deviation(out[out.index(1) :], {0: 0.5, 1: 0.5}) <= 51


def test_strict_mode_drops_the_surplus_with_tombstones():
    pointers = [(0, 0, i) for i in range(100)] + [(1, 0, i) for i in range(20)]
    pipe = mixture_pipe(pointers, mixture={"a": 1, "b": 1}, max_buffer_size=None)
    out = [r.meta.component_id for r in pipe]
    assert out.count(1) == 20 and out.count(0) in (20, 21)
    assert pipe.stats().tombstones == 120 - len(out)
    assert max_deviation(out, {0: 0.5, 1: 0.5}) <= 1


def test_weighting_by_tokens_balances_tokens_not_samples():
    # 'a' records have 10 tokens, 'b' 40: equal token shares need 4x more 'a' samples.
    ds = datasets(n=200, lengths=[10, 40, 5])
    pointers = [(c, 0, i) for i in range(200) for c in (0, 1)]
    pipe = (
        Pipeline(ListSource(ds, pointers, 100))
        .ensure_mixture(mixture={"a": 1, "b": 1}, weight_by="tokens", max_buffer_size=400)
        .options(runner="inline")
    )
    out = [r.meta.component_id for r in pipe]
    head = out[:150]
    tokens = {c: 10 * head.count(0) if c == 0 else 40 * head.count(1) for c in (0, 1)}
    assert abs(tokens[0] - tokens[1]) <= 40
    assert head.count(0) > 3 * head.count(1)


def test_obsolete_components_leave_through_the_drain_slot():
    pointers = [(c, 0, i) for i in range(100) for c in (0, 1, 2)]
    out = [
        r.meta.component_id
        for r in mixture_pipe(pointers, mixture={"a": 1, "b": 1}, max_buffer_size=1000)
    ]
    assert len(out) == 300
    head = out[:100]
    # one slot in ten goes to the off-target component 'c'; the rest follow the 50/50 target
    assert head.count(2) == 10
    assert abs(head.count(0) - head.count(1)) <= 1


def _rec(lane, comp, i, tags=None):
    return SampleRecord(SampleMeta((comp, 0, i), lane, 0, i, (), comp, None, tags or {}), None)


def test_sentinel_resets_only_that_lane_and_tags_retarget():
    op = EnsureMixtureOp({0: 1.0, 1: 1.0}, component_names=["a", "b"], explicit=False)
    ctx = OpContext(op_name="ensure_mixture", op_index=0)
    acc = op.accumulator(deterministic=True, ctx=ctx)
    emitted = []
    for lane in (0, 1):
        for i in range(5):
            for mb in acc.push_many([_rec(lane, 0, i)]):
                emitted.extend(mb)
    assert len(emitted) == 2  # each lane emitted one 'a', now waits for 'b'
    flushed = [r for mb in acc.flush(reset=True, lane_id=1) for r in mb]
    assert {r.meta.lane_id for r in flushed} == {1} and len(flushed) == 4
    assert acc.has_pending_data(0) and not acc.has_pending_data(1)
    # lane 1 is fresh again: its first 'a' leaves at once, like on a new accumulator
    assert [r.meta.sample_id for mb in acc.push_many([_rec(1, 0, 9)]) for r in mb] == [(0, 0, 9)]
    # a target tag (stamped by a mixture-aware source) switches lane 0 to 'a' only
    tag = {TAG_TARGET_MIXTURE: {"a": 1.0}}
    out = [r for mb in acc.push_many([_rec(0, 0, 7, tag)]) for r in mb]
    assert len(out) == 5  # its 4 waiting records and the new one all serve the new target


@pytest.mark.parametrize("kw", [{"mixture": {"z": 1.0}}, {"max_buffer_size": 0}])
def test_config_errors(kw):
    with pytest.raises(ConfigError, match=r"unknown dataset|max_buffer_size"):
        mixture_pipe([(0, 0, 0)], **{"mixture": {"a": 1.0}, **kw})


def test_mixture_defaults_to_the_sources_mixture():
    src = ListSource(datasets(), [(0, 0, i) for i in range(10)], 5, mixture={"a": 1, "b": 3})
    op = Pipeline(src).ensure_mixture().operators()[-1]
    assert isinstance(op, EnsureMixtureOp)
    assert op.mixture == {0: 0.25, 1: 0.75} and not op.explicit
    nomix = ListSource(datasets(), [(0, 0, 0)], 5)
    with pytest.raises(ConfigError, match="has no mixture"):
        Pipeline(nomix).ensure_mixture()


def test_packed_records_are_weighed_by_their_component_tokens():
    ds = datasets(n=60, lengths=[6, 6, 6])
    pointers = [(c, 0, i) for i in range(60) for c in (0, 0, 1)][:120]
    pipe = (
        Pipeline(ListSource(ds, pointers, 120))
        .pack_flat(12, 0, algorithm="first_fit")
        .ensure_mixture(mixture={"a": 2, "b": 1}, weight_by="tokens")
        .options(runner="inline")
    )
    out = list(pipe)
    comps = [r.meta.tags["_packing_metadata"]["component_tokens"] for r in out]
    assert sum(sum(c.values()) for c in comps) == 120 * 6
    assert all(np.isclose(sum(c.values()), 12) for c in comps)


class StampTarget(BaseOp):
    """Plays a mixture-aware source: stamps a new target on the first record of chunk 2."""

    name = "stamp_target"

    def traits(self):
        return OpTraits(preserves_cursor_order=True)

    def process_many(self, elems):
        out = []
        for e in elems:
            meta = e.meta
            if meta.chunk_id == 2 and meta.chunk_offset == 0:
                meta = meta.with_tags(**{TAG_TARGET_MIXTURE: {"a": 1.0}})
            out.append(SampleRecord(meta, e.payload))
        return out


@pytest.mark.parametrize("packed", [False, True])
def test_a_stamped_target_mixture_is_followed_also_through_packing(packed):
    ds = datasets(n=300, lengths=[4, 4, 4])
    pointers = [(c, 0, i) for i in range(300) for c in (0, 1)]
    src = ListSource(ds, pointers, 100, mixture={"a": 1, "b": 1})
    pipe = Pipeline(src).add_op(StampTarget())
    if packed:  # rows of one record each, so the target tag must ride on the packed row
        pipe = pipe.pack_flat(4, 0, algorithm="first_fit")
    out = list(pipe.ensure_mixture(max_buffer_size=10_000).options(runner="inline"))
    comps = [r.meta.component_id for r in out]
    assert len(out) == 600
    before, after = comps[:200], comps[200:400]
    assert abs(before.count(0) - before.count(1)) <= 1  # 50/50 on the source's mixture
    # from chunk 2 on only 'a' is on target; 'b' leaves through the 1-in-10 obsolete slot
    assert after.count(1) == 20
