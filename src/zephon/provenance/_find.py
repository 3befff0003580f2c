"""Which steps trained on a document: look a file and line (or a sample id) up in logs."""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from zephon.provenance._log import read_log

__all__ = ["FIND_FORMS", "Hit", "find", "parse_query"]

_SAMPLE_ID = re.compile(r"^(\d+)[:/](\d+)[:/](\d+)$")
#: A sample id by dataset name (``web:0:12``, ``c4.en:0:12``): a name's characters (see
#: ``zephon.io._naming``); ``notes.jsonl:3:4`` could also be a file, and is looked up as one
#: when the logs hold no dataset of that name.
_NAMED_SAMPLE_ID = re.compile(r"^([A-Za-z0-9._-]*[A-Za-z._-][A-Za-z0-9._-]*):(\d+):(\d+)$")
#: The forms a query may take, for answers that found nothing.
FIND_FORMS = (
    "FILE:LINE (JSON Lines), FILE#ROW or FILE:ROW (0-based row, formats without lines) or a "
    "sample id DATASET:SHARD:ROW (DATASET a name or a number)"
)


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
    """``("sample", (d, s, i))`` for ``D:S:I`` (``d`` a dataset id or name),
    ``("line", (file, n))`` for ``FILE:LINE`` (``n`` is a 0-based row in a file without lines),
    ``("row", (file, n))`` for ``FILE#ROW`` (0-based, formats without lines)."""
    m = _SAMPLE_ID.match(query)
    if m:
        return "sample", tuple(int(g) for g in m.groups())
    m = _NAMED_SAMPLE_ID.match(query)
    if m:
        return "sample", (m.group(1), int(m.group(2)), int(m.group(3)))
    for sep, kind in (("#", "row"), (":", "line")):
        head, found, tail = query.rpartition(sep)
        if found and head and tail.isdigit():
            return kind, (head, int(tail))
    raise ValueError(f"cannot read {query!r}: give {FIND_FORMS}")


def _same_file(logged: str, wanted: str) -> bool:
    if logged == wanted:
        return True
    clean = wanted[2:] if wanted.startswith("./") else wanted
    if logged.endswith("/" + clean):
        return True
    return os.path.exists(wanted) and os.path.realpath(wanted) == os.path.realpath(logged)


def find(logs: str | os.PathLike[str] | Sequence[str | os.PathLike[str]], query: str) -> list[Hit]:
    """Every logged segment cut from the document ``query`` names, by rank and step."""
    kind, key = parse_query(query)
    table = read_log(logs)
    if table.num_rows == 0:
        return []
    if kind == "sample" and isinstance(key[0], str) and key[0] not in run_dataset_names(table):
        kind, key = _as_file(query)  # ``notes.jsonl:3:4``: no such dataset, so a file's line
    mask = _sample_mask(table, key) if kind == "sample" else _file_mask(table, kind, key)
    picked = table.filter(mask).to_pylist()
    return [Hit(**{f: row[f] for f in Hit.__dataclass_fields__}) for row in picked]


def run_dataset_names(table: Any) -> set[str]:
    """The dataset names of the runs that wrote ``table``: what a sample id's name means (a
    converted corpus's segments name their original dataset; ``sample_dataset`` keeps the
    run's)."""
    import pyarrow.compute as pc

    return {str(n) for n in pc.unique(_run_names(table)).to_pylist() if n is not None}


def _run_names(table: Any) -> Any:
    import pyarrow.compute as pc

    if "sample_dataset" not in table.column_names:  # older logs
        return table["dataset"]
    return pc.coalesce(table["sample_dataset"], table["dataset"])


def _as_file(query: str) -> tuple[str, Any]:
    head, _, tail = query.rpartition(":")
    return "line", (head, int(tail))


def _sample_mask(table: Any, key: tuple[Any, int, int]) -> Any:
    import pyarrow.compute as pc

    d, s, i = key
    dataset = _run_names(table) if isinstance(d, str) else table["dataset_id"]
    rows = table["source_row"]
    if "sample_row" in table.column_names:  # a converted corpus's rows (older logs lack it)
        rows = pc.coalesce(table["sample_row"], rows)
    return pc.and_(pc.and_(pc.equal(dataset, d), pc.equal(table["shard"], s)), pc.equal(rows, i))


def _file_mask(table: Any, kind: str, key: tuple[str, int]) -> Any:
    import pyarrow.compute as pc

    wanted, number = key
    sources = [v for v in pc.unique(table["source"]).to_pylist() if v is not None]
    in_files = pc.is_in(table["source"], value_set=_strings(
        [v for v in sources if _same_file(v, wanted)]
    ))  # fmt: skip
    # FILE:N of a file without lines (Parquet, Arrow, ...) is its row N, as FILE#N
    by_row = kind == "row" or pc.all(pc.is_null(table.filter(in_files)["line"])).as_py()
    column = table["source_row"] if by_row else table["line"]
    return pc.and_(in_files, pc.equal(column, number))


def _strings(values: list[str]) -> Any:
    import pyarrow as pa

    return pa.array(values, pa.string())
