"""Stop, checkpoint (through JSON) and restore a pipeline repeatedly; shared by resume tests."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from zephon import Pipeline


def run_with_stops(
    build: Callable[[], Pipeline], key: Callable[[Any], Any], stops: list[int]
) -> list[Any]:
    """Items (as ``key``) delivered when the run is stopped after each count in ``stops``,
    checkpointed, and resumed in a freshly built pipeline."""
    out: list[Any] = []
    state = None
    for stop in [*stops, None]:
        pipe = build()
        if state is not None:
            pipe.restore(json.loads(json.dumps(state)))
        it = iter(pipe)
        for item in it:
            out.append(key(item))
            if stop is not None and len(out) >= stop:
                break
        state = pipe.checkpoint()
        it.close()  # type: ignore[attr-defined]
    return out
