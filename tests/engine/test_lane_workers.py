"""``lane_workers``: whole lanes in worker processes give the rank's output byte for byte,
whatever the count; checkpoints move between them and every other runner; failures name the
worker and lose nothing; nothing is left behind."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.engine import _lanes as lanes
from tests.runners._pipes import digest, key, run_with_stops
from tests.runners.conftest import no_leaks  # noqa: F401  (used below by name)

pytestmark = pytest.mark.usefixtures("no_leaks")

# every runner, and lane workers of each count (the reference first)
RUNS: list[dict[str, Any]] = [
    {"runner": "inline"},
    {"runner": "threads"},
    {"runner": "process"},
    *({"lane_workers": count} for count in (1, 2, 3, "auto")),
]


@pytest.fixture(scope="module")
def corpora(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return lanes.write_corpora(tmp_path_factory.mktemp("corpora"))


@pytest.mark.timeout(240)
@pytest.mark.parametrize("name", sorted(lanes.PIPELINES))
def test_every_runner_and_lane_worker_count_gives_the_same_bytes(
    corpora: Path, hf_tokenizer_dir: Path, name: str
) -> None:
    build = lanes.PIPELINES[name]
    expected = digest(build(corpora, hf_tokenizer_dir, **RUNS[0]))
    assert len(expected) > 12
    width = build(corpora, hf_tokenizer_dir).runtime_options.canonical_replicas
    for options in [*RUNS[1:], {"lane_workers": width}]:
        assert digest(build(corpora, hf_tokenizer_dir, **options)) == expected, options


def chain(build: lanes.Build, corpora: Path, tok: Path, runs: list[dict[str, Any]]):
    """A builder for :func:`run_with_stops` whose n-th pipeline runs with ``runs[n]``."""
    todo = iter(runs)
    return lambda: build(corpora, tok, **next(todo))


def lane_ends(expected: list[Any]) -> list[int]:
    """How many items were out right after each lane's last item (the lane of an item is
    that of its first row, see ``key``)."""
    last = {item[1][0][0]: index + 1 for index, item in enumerate(expected)}
    return sorted(last.values())


@pytest.mark.timeout(240)
def test_checkpoints_move_between_lane_worker_counts_and_runners(
    corpora: Path, hf_tokenizer_dir: Path
) -> None:
    expected = digest(lanes.packed(corpora, hf_tokenizer_dir, runner="inline"))
    ends = lane_ends(expected)
    assert ends[0] < len(expected) - 2  # lanes end at different steps
    near_end = len(expected) - 1
    cases = [
        ([0, 3, 11, near_end], [2, 3, 1, 4, 2]),  # lane workers -> other counts
        ([5, 17], [{"runner": "inline"}, 2, {"runner": "threads"}]),  # inline <-> lane workers
        ([4, near_end], [3, {"runner": "process"}, "auto"]),
        ([ends[0], ends[0] + 1, ends[1]], [2, 4, 3, 2]),  # right after a lane ended
    ]
    for stops, counts in cases:
        runs = [c if isinstance(c, dict) else {"lane_workers": c} for c in counts]
        make = chain(lanes.packed, corpora, hf_tokenizer_dir, runs)
        assert run_with_stops(make, stops) == expected, (stops, counts)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("count", [2, 3, 4])
def test_a_lane_with_no_chunk_and_lanes_of_one_chunk_resume_at_every_step(
    corpora: Path, hf_tokenizer_dir: Path, count: int
) -> None:
    expected = digest(lanes.tiny(corpora, hf_tokenizer_dir, runner="inline"))
    assert sorted({item[1][0][0] for item in expected}) == [0, 2, 3]  # lane 1 has nothing
    assert digest(lanes.tiny(corpora, hf_tokenizer_dir, lane_workers=count)) == expected
    runs = [{"lane_workers": count}] * (len(expected) + 1)
    make = chain(lanes.tiny, corpora, hf_tokenizer_dir, runs)
    assert run_with_stops(make, list(range(1, len(expected) + 1))) == expected
