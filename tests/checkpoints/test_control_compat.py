"""A checkpoint written before control records were typed still restores: a plan whose stream
carries tombstones (a filter, ``batch(drop_last=True)``), flush sentinels and snapshot markers,
saved mid-epoch, resumes to exactly the batches of an uninterrupted run, on every runner."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.checkpoints._written import as_written_now
from zephon import Dataset, MixtureSpec, Pipeline, StaticMixtureWorkSource

FIXTURE = Path(__file__).with_name("fixtures") / "v4-filter-shuffle-pack-drop-last.json"
STOP = 7  # batches delivered when the fixture was taken


def keep(row: dict[str, Any]) -> bool:
    return len(row["text"]) % 3 != 0


def pipeline(runner: str = "inline") -> Pipeline:
    rows = [{"text": f"document {i} " * (1 + i % 7)} for i in range(240)]
    source = StaticMixtureWorkSource(
        datasets=[Dataset.from_records("docs", rows)],
        mixture=MixtureSpec({"docs": 1.0}),
        chunk_size=16,
        seed=9,
    )
    return (
        Pipeline(source)
        .decode_text()
        .filter(keep, name="keep")
        .tokenize("bytes", max_length=40)
        .shuffle(24, seed=2)
        .pack_flat(48, pad_token_id=0)
        .batch(3, drop_last=True)
        .options(
            canonical_replicas=2,
            runner=runner,
            flush_every_k_chunks=2,
            snapshot_every_records=5,
        )
    )


def rows(batches: Any) -> list[list[Any]]:
    """Every batch in full: ids and every payload field, as plain lists."""
    return [
        [(r.meta.sample_id, {k: list(v) for k, v in r.payload.items()}) for r in b] for b in batches
    ]


def checkpoint_after(batches: int) -> tuple[dict[str, Any], list[list[Any]]]:
    pipe = pipeline()
    it = iter(pipe)
    seen = rows(next(it) for _ in range(batches))
    state = pipe.checkpoint()
    it.close()
    return state, seen


@pytest.mark.parametrize("runner", ["inline", "threads"])
def test_a_checkpoint_written_before_typed_control_records_restores(runner: str) -> None:
    saved = json.loads(FIXTURE.read_text())
    state, seen = checkpoint_after(STOP)
    assert json.dumps(state, indent=1) + "\n" == as_written_now(FIXTURE)
    full = rows(pipeline(runner))
    assert seen == full[:STOP]
    assert seen + rows(pipeline(runner).restore(saved)) == full
