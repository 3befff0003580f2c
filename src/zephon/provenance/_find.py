"""Which steps trained on a document: look a file and line (or a sample id) up in logs."""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from zephon.provenance._log import read_log

__all__ = ["Hit", "find", "parse_query"]

_SAMPLE_ID = re.compile(r"^(\d+)[:/](\d+)[:/](\d+)$")


@dataclass(frozen=True)
class Hit:
    """One segment of a logged batch that holds (part of) the document looked up."""

    step: int
    rank: int
    row: int
    segment: int
    dataset: str
    source: str
    source_row: int
    line: int | None
    start: int
    end: int
    source_start: int
    source_end: int


def parse_query(query: str) -> tuple[str, Any]:
    """``("sample", (d, s, i))`` for ``D:S:I``, ``("line", (file, n))`` for ``FILE:LINE``,
    ``("row", (file, n))`` for ``FILE#ROW`` (0-based, formats without lines)."""
    m = _SAMPLE_ID.match(query)
    if m:
        return "sample", tuple(int(g) for g in m.groups())
    for sep, kind in (("#", "row"), (":", "line")):
        head, found, tail = query.rpartition(sep)
        if found and head and tail.isdigit():
            return kind, (head, int(tail))
    raise ValueError(
        f"cannot read {query!r}: give FILE:LINE (JSON Lines), FILE#ROW (0-based row, other "
        "formats) or a sample id DATASET:SHARD:ROW"
    )


def _same_file(logged: str, wanted: str) -> bool:
    if logged == wanted:
        return True
    clean = wanted[2:] if wanted.startswith("./") else wanted
    if logged.endswith("/" + clean):
        return True
    return os.path.exists(wanted) and os.path.realpath(wanted) == os.path.realpath(logged)


def find(logs: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], query: str) -> list[Hit]:
    """Every logged segment cut from the document ``query`` names, by rank and step."""
    import pyarrow.compute as pc

    kind, key = parse_query(query)
    table = read_log(logs)
    if table.num_rows == 0:
        return []
    if kind == "sample":
        d, s, i = key
        mask = pc.and_(
            pc.and_(pc.equal(table["dataset_id"], d), pc.equal(table["shard"], s)),
            pc.equal(table["source_row"], i),
        )
    else:
        wanted, number = key
        sources = [v for v in pc.unique(table["source"]).to_pylist() if v is not None]
        files = [v for v in sources if _same_file(v, wanted)]
        column = table["line"] if kind == "line" else table["source_row"]
        mask = pc.and_(
            pc.is_in(table["source"], value_set=_strings(files)), pc.equal(column, number)
        )
    picked = table.filter(mask).to_pylist()
    return [Hit(**{f: row[f] for f in Hit.__dataclass_fields__}) for row in picked]


def _strings(values: list[str]) -> Any:
    import pyarrow as pa

    return pa.array(values, pa.string())
