"""A stateful pipeline with an operator that fails while armed, and the fail-then-resume run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.engine._sources import RangeSource
from tests.runners._faulty import FailWhileArmedOp
from tests.runners._pipes import key
from zephon import Dataset, Pipeline


def faulty_stateful(
    docs: list[dict[str, Any]], tok: Path, op: FailWhileArmedOp, runner: str, **opts: Any
) -> Pipeline:
    """decode -> (fails while armed) -> tokenize -> shuffle -> pack_flat -> batch, two lanes."""
    ds = Dataset.from_records("docs", docs, shard_size=50)
    return (
        Pipeline(RangeSource([ds], chunk_size=30))
        .decode_text(parallelism=2)
        .add_op(op, parallelism=2)
        .tokenize(tok, max_length=64, parallelism=2)
        .shuffle(48, seed=3, algorithm="block")
        .pack_flat(96, 0)
        .batch(4)
        .options(runner=runner, canonical_replicas=2, flush_every_k_chunks=3, **opts)
    )


def fail_then_resume(
    build: Any, armed: Path, arm_after: int = 0
) -> tuple[list[Any], list[Any], BaseException]:
    """Run until the armed operator fails, checkpoint, disarm, restore and finish.

    ``arm_after``: arm only once that many items were received (the failure then comes after
    them however far ahead the workers ran).
    """
    if not arm_after:
        armed.touch()
    first: list[Any] = []
    pipe = build()
    error: BaseException | None = None
    try:
        for item in pipe:
            first.append(key(item))
            if len(first) == arm_after:
                armed.touch()
    except BaseException as exc:  # KeyboardInterrupt too: that is one of the cases
        error = exc
    assert error is not None, "the armed operator never failed"
    state = json.loads(json.dumps(pipe.checkpoint()))
    armed.unlink()
    resumed = build().restore(state)
    return first, [key(item) for item in resumed], error
