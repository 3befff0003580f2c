"""Where the real-engine suite puts vLLM's answers: the tracked fixtures change only on request.

By default each answer is written to a scratch folder and compared with the tracked fixture of
the same name: ``unchanged`` (same bytes), ``values_changed`` (same field paths and value
types, other values: another vLLM version, other sampled ids), ``shape_changed`` (a field
appeared, vanished or changed type: the stand-in engine may no longer answer like vLLM) or
``new`` (no tracked fixture). The last two are stale fixtures. With ``update`` (the suite's
``--update-fixtures``, ``ZEPHON_UPDATE_FIXTURES=1`` or ``make test-vllm UPDATE_FIXTURES=1``) the
tracked fixtures are rewritten instead.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

UPDATE_ENV = "ZEPHON_UPDATE_FIXTURES"
STALE = ("shape_changed", "new")
TOKEN_ID = re.compile(r"^token_id:\d+$")


def update_requested(flag: bool, environ: Mapping[str, str] = os.environ) -> bool:
    """Whether to rewrite the tracked fixtures: the flag, or ``ZEPHON_UPDATE_FIXTURES`` set to
    a true value (``1``, ``true``, ``yes``)."""
    return flag or environ.get(UPDATE_ENV, "").strip().lower() in ("1", "true", "yes")


def _leaf(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, int | float):
        return "number"
    return type(v).__name__


def field_paths(
    v: Any, at: str = "$", out: dict[str, set[str]] | None = None
) -> dict[str, set[str]]:
    """Every path of a JSON value (list items merged under ``[]``) with its value types."""
    out = {} if out is None else out
    if isinstance(v, dict):
        out.setdefault(at, set()).add("object")
        for k, x in v.items():  # keys that name tokens (completions top_logprobs) are one
            field_paths(x, f"{at}.{'token_id:N' if TOKEN_ID.match(k) else k}", out)
    elif isinstance(v, list):
        out.setdefault(at, set()).add("list")
        for x in v:
            field_paths(x, f"{at}[]", out)
    else:
        out.setdefault(at, set()).add(_leaf(v))
    return out


def fixture_text(doc: dict[str, Any]) -> str:
    """A fixture's bytes as tracked: sorted keys, one-space indent, a final newline."""
    return json.dumps(doc, indent=1, sort_keys=True) + "\n"


class FixtureRecorder:
    """Writes each answer to ``tracked`` (``update``) or to ``scratch`` with a verdict."""

    def __init__(self, tracked: Path, scratch: Path, *, update: bool) -> None:
        self.tracked = tracked
        self.update = update
        self.out = tracked if update else scratch
        self.verdicts: dict[str, str] = {}

    def save(self, name: str, doc: dict[str, Any]) -> str:
        """Write ``name.json`` and return its verdict (``written`` when updating)."""
        text = fixture_text(doc)
        old = self.tracked / f"{name}.json"
        if self.update:
            verdict = "written"
        elif not old.is_file():
            verdict = "new"
        elif old.read_text() == text:
            verdict = "unchanged"
        else:
            before = field_paths(json.loads(old.read_text())["body"])
            same = before == field_paths(doc["body"])
            verdict = "values_changed" if same else "shape_changed"
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / f"{name}.json").write_text(text)
        self.verdicts[name] = verdict
        return verdict

    def stale(self) -> list[str]:
        """The fixtures the tracked copies no longer stand for (shape changed, or missing)."""
        return sorted(n for n, v in self.verdicts.items() if v in STALE)

    def report(self) -> dict[str, Any]:
        return {"written_to": str(self.out), "verdicts": dict(sorted(self.verdicts.items()))}
