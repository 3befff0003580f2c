"""Property tests of StaticMixtureWorkSource over random sizes, shards, chunks, lanes, ranks."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from tests.work._helpers import all_samples, dataset, drain, lane_streams
from zephon.work import MixtureSpec, StaticMixtureWorkSource, lanes_for_rank

SETTINGS = settings(max_examples=40, deadline=None)

shard_lists = st.lists(st.integers(min_value=0, max_value=25), min_size=1, max_size=5).filter(
    lambda xs: sum(xs) > 0
)


@st.composite
def configs(draw: st.DrawFn, max_datasets: int = 3) -> dict[str, Any]:
    n = draw(st.integers(min_value=1, max_value=max_datasets))
    datasets = [dataset(f"d{i}", draw(shard_lists)) for i in range(n)]
    weights = {d.name: draw(st.integers(min_value=1, max_value=9)) for d in datasets}
    block = draw(st.sampled_from([None, 1, 3, 10, "auto", "global"]))
    return {
        "datasets": datasets,
        "mixture": MixtureSpec(weights),
        "chunk_size": draw(st.integers(min_value=1, max_value=23)),
        "seed": draw(st.integers(min_value=0, max_value=2**40)),
        "shuffle_shards": draw(st.booleans()),
        "shuffle_within_shard": draw(st.booleans()),
        "shuffle_block_size": block,
        "lane_assignment": draw(st.sampled_from(["permute", "modulo"])),
    }


@SETTINGS
@given(cfg=configs(), lanes=st.integers(min_value=1, max_value=9))
def test_one_pass_delivers_every_sample_exactly_once(cfg: dict[str, Any], lanes: int) -> None:
    # Redistribute: each dataset retires after one pass, the others take over its share.
    src = StaticMixtureWorkSource(**cfg, exhausted_policy="redistribute")
    expected = all_samples(cfg["datasets"])
    streams = lane_streams(src, lanes)
    got = Counter(tuple(p) for chunks in streams.values() for _, ps in chunks for p in ps)
    assert got == expected
    # Lanes partition the global sequence exactly as dealt.
    reference = [(c.global_index, c.pointers.tolist()) for c in drain(src)]
    assert sorted(x for chunks in streams.values() for x in chunks) == reference
    # Only the chunks in which a dataset ran out are short.
    short = [c for c in drain(src) if len(c) < cfg["chunk_size"]]
    assert all(c.source_exhausted for c in short)


@SETTINGS
@given(cfg=configs(max_datasets=1), lanes=st.integers(min_value=1, max_value=8))
def test_default_single_dataset_is_one_exact_pass(cfg: dict[str, Any], lanes: int) -> None:
    src = StaticMixtureWorkSource(**cfg)
    got = Counter(
        tuple(p) for chunks in lane_streams(src, lanes).values() for _, ps in chunks for p in ps
    )
    assert got == all_samples(cfg["datasets"])


@SETTINGS
@given(
    cfg=configs(),
    per_rank=st.integers(min_value=1, max_value=3),
    worlds=st.lists(st.integers(min_value=1, max_value=4), min_size=2, max_size=3, unique=True),
    mapping=st.sampled_from(["contiguous", "interleaved"]),
)
def test_union_over_ranks_does_not_depend_on_world_size(
    cfg: dict[str, Any], per_rank: int, worlds: list[int], mapping: str
) -> None:
    import math

    lanes = per_rank * math.lcm(*worlds)
    src = StaticMixtureWorkSource(**cfg, exhausted_policy="redistribute")
    results = []
    for world in worlds:
        per_lane: dict[int, list[tuple[int, list[list[int]]]]] = {}
        for rank in range(world):
            owned = lanes_for_rank(rank, world, lanes, mapping)  # type: ignore[arg-type]
            per_lane.update(lane_streams(src, lanes, owned))
        assert sorted(per_lane) == list(range(lanes))
        results.append(per_lane)
    assert all(r == results[0] for r in results[1:])


@SETTINGS
@given(
    sizes=st.lists(st.integers(min_value=1, max_value=40), min_size=2, max_size=5),
    weights=st.lists(st.integers(min_value=1, max_value=50), min_size=5, max_size=5),
    chunk_size=st.integers(min_value=1, max_value=64),
    n_chunks=st.integers(min_value=1, max_value=60),
    seed=st.integers(min_value=0, max_value=1000),
)
def test_mixture_within_one_sample_of_target(
    sizes: list[int], weights: list[int], chunk_size: int, n_chunks: int, seed: int
) -> None:
    datasets = [dataset(f"d{i}", [n]) for i, n in enumerate(sizes)]
    w = dict(zip([d.name for d in datasets], weights, strict=False))
    total_w = sum(w.values())
    # Every component is owed at least one sample per chunk: the exact regime.
    chunk_size = max(chunk_size, -(-total_w // min(w.values())))
    src = StaticMixtureWorkSource(
        datasets, MixtureSpec(w), chunk_size=chunk_size, seed=seed, exhausted_policy="repeat"
    )
    counts: Counter[int] = Counter()
    for n in range(1, n_chunks + 1):
        chunk = src.next_chunk()
        assert chunk is not None and len(chunk) == chunk_size
        counts.update(chunk.pointers[:, 0].tolist())
        for k, d in enumerate(datasets):
            assert abs(counts[k] - w[d.name] / total_w * n * chunk_size) < 1


@settings(max_examples=25, deadline=None)
@given(
    weights=st.lists(st.floats(min_value=1e-4, max_value=1.0), min_size=2, max_size=5),
    chunk_size=st.integers(min_value=1, max_value=16),
)
def test_tiny_weights_stay_close_to_target(weights: list[float], chunk_size: int) -> None:
    # Components owed less than one sample per chunk: bounded, documented looser regime.
    datasets = [dataset(f"d{i}", [5]) for i in range(len(weights))]
    spec = MixtureSpec({d.name: w for d, w in zip(datasets, weights, strict=True)})
    src = StaticMixtureWorkSource(datasets, spec, chunk_size=chunk_size, exhausted_policy="repeat")
    counts: Counter[int] = Counter()
    for n in range(1, 200):
        chunk = src.next_chunk()
        assert chunk is not None and len(chunk) == chunk_size
        counts.update(chunk.pointers[:, 0].tolist())
        for k, d in enumerate(datasets):
            assert abs(counts[k] - spec.weights[d.name] * n * chunk_size) < 2


@SETTINGS
@given(cfg=configs(), lanes=st.integers(min_value=1, max_value=6), data=st.data())
def test_state_round_trip_at_any_chunk(
    cfg: dict[str, Any], lanes: int, data: st.DataObject
) -> None:
    policy = data.draw(st.sampled_from([None, "redistribute", "stop"]))
    kw = {} if policy is None else {"exhausted_policy": policy}
    src = StaticMixtureWorkSource(**cfg, **kw)
    for lane in range(lanes):
        full = [c.pointers.tolist() for c in drain(src.clone_for_lane(lane, lanes))]
        cut = data.draw(st.integers(min_value=0, max_value=len(full)))
        a = src.clone_for_lane(lane, lanes)
        for _ in range(cut):
            assert a.next_chunk() is not None
        state = json.loads(json.dumps(a.state_dict()))
        b = StaticMixtureWorkSource(**cfg, **kw).clone_for_lane(lane, lanes)
        b.load_state_dict(state)
        assert [c.pointers.tolist() for c in drain(b)] == full[cut:]
        assert [c.pointers.tolist() for c in drain(a)] == full[cut:]
        assert b.next_chunk() is None


@SETTINGS
@given(cfg=configs())
def test_same_seed_same_order(cfg: dict[str, Any]) -> None:
    a = [c.pointers.tolist() for c in drain(StaticMixtureWorkSource(**cfg))]
    b = [c.pointers.tolist() for c in drain(StaticMixtureWorkSource(**cfg))]
    assert a == b


def test_other_seed_other_order() -> None:
    datasets = [dataset("a", [30, 20, 10]), dataset("b", [40])]
    orders = set()
    for seed in range(6):
        src = StaticMixtureWorkSource(
            datasets, chunk_size=16, seed=seed, shuffle_within_shard=True, shuffle_block_size=8
        )
        orders.add(json.dumps([c.pointers.tolist() for c in drain(src)]))
    assert len(orders) == 6
