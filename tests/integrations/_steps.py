"""What a resumed job trained, step by step, against an uninterrupted run's steps.

The jobs train a global batch of one pipeline batch from each of the 4 lanes per step, whatever
their data-parallel size; each rank logs one JSON line per micro-batch with ``iteration`` (the
step) and ``rows`` (the row digests) to ``OUT/<MODE>-r<RANK>.jsonl``.
"""

from __future__ import annotations

from pathlib import Path

from tests.integrations._corpus import build_pipeline, row_digest
from tests.integrations._launch import json_lines


def reference_steps(steps: int) -> list[frozenset[str]]:
    """The rows of each step of an uninterrupted run (4 lanes, one batch each a step)."""
    ranks = [iter(build_pipeline(dp_rank=r, dp_world_size=4)) for r in range(4)]
    return [
        frozenset(row_digest(row.payload["input_ids"]) for it in ranks for row in next(it).records)
        for _ in range(steps)
    ]


def trained(out: Path, mode: str, world: int) -> dict[int, list[str]]:
    """The rows every rank of the job under ``out`` trained, by step."""
    steps: dict[int, list[str]] = {}
    for rank in range(world):
        for line in json_lines(out / f"{mode}-r{rank}.jsonl"):
            steps.setdefault(line["iteration"], []).extend(line["rows"])
    return steps


def assert_each_step(steps: dict[int, list[str]], reference: list[frozenset[str]]) -> None:
    """Each step trained exactly the uninterrupted run's rows of that step, each once."""
    for iteration, rows in steps.items():
        assert len(rows) == len(set(rows)) == len(reference[iteration - 1])
        assert frozenset(rows) == reference[iteration - 1], f"iteration {iteration}"
