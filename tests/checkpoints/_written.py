"""Fixtures written by older releases, as this one writes the same checkpoint."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from zephon.checkpoints import seal


def as_written_now(fixture: Path) -> str:
    """``fixture``'s text with the source settings summary kept in the first lane only (the
    one change to what a checkpoint holds since), resealed, in ``save_checkpoint``'s layout."""
    state: dict[str, Any] = json.loads(fixture.read_text())
    for lane in list(state["lanes"].values())[1:]:
        lane["source_state"].pop("config")
    return json.dumps(seal(state), indent=1) + "\n"
