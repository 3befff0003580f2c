"""Where two runs first delivered different data: over two provenance logs or two records.

Logs are compared segment by segment (sample id, lineage, spans) and by each step's content
fingerprint, vectorised; ``zephon run --record`` files line by line (sample ids, and the
fingerprint when both have one). The answer names the first differing step and, for it, the
segments (or rows) found in one run only, those both delivered in other places (moves), and
which run stops there when one is a prefix of the other.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from zephon.provenance._log import read_log

__all__ = ["Divergence", "diff"]

_KEY = (
    "rank", "step", "row", "segment", "dataset_id", "shard", "source_row", "lineage", "start",
    "end", "source_start", "source_end", "fingerprint",
)  # fmt: skip
_SEGMENT = ("row", "segment", "dataset", "source", "source_row", "line", "lineage", "start",
            "end", "source_start", "source_end")  # fmt: skip
#: Where a segment sits in a step's batch; the rest of ``_SEGMENT`` names the document piece.
_PLACE = ("row", "segment", "start", "end")


@dataclass
class Divergence:
    """The first step at which two runs differ, and how."""

    step: int
    rank: int
    only_a: list[dict[str, Any]] = field(default_factory=list)
    only_b: list[dict[str, Any]] = field(default_factory=list)
    fingerprint_a: str | None = None
    fingerprint_b: str | None = None
    steps_a: int = 0
    steps_b: int = 0
    #: Pieces both runs delivered at this step in other places: the piece, then each
    #: run's ``row``, ``segment``, ``start``, ``end`` suffixed ``_a`` / ``_b``.
    moved: list[dict[str, Any]] = field(default_factory=list)
    #: ``"A"`` or ``"B"`` when that run delivered nothing at this step and every step before
    #: was the same: it is a prefix of the other (a shorter or stopped run).
    stops: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _is_log(path: Path) -> bool:
    if path.is_dir():
        return True
    with open(path, "rb") as fh:
        return fh.read(4) == b"PAR1"


def diff(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> Divergence | None:
    """The first difference between two runs' provenance logs or ``--record`` files
    (``None``: they delivered the same data at every step)."""
    pa_, pb = Path(a), Path(b)
    kinds = (_is_log(pa_), _is_log(pb))
    if kinds[0] != kinds[1]:
        raise ValueError(
            f"cannot compare {pa_} with {pb}: one is a provenance log and the other a "
            "--record file; compare two of the same kind"
        )
    return _diff_logs(pa_, pb) if kinds[0] else _diff_records(pa_, pb)


def _column(table: Any, name: str) -> np.ndarray:
    col = table[name]
    if name in ("lineage", "fingerprint"):
        return np.asarray(col.fill_null("").to_pylist(), dtype=object)
    return np.asarray(col.to_numpy(zero_copy_only=False))


def _diff_logs(a: Path, b: Path) -> Divergence | None:
    ta, tb = read_log(a), read_log(b)
    n = min(ta.num_rows, tb.num_rows)
    differs = np.zeros(n, dtype=bool)
    for name in _KEY:
        differs |= _column(ta, name)[:n] != _column(tb, name)[:n]
    hits = np.flatnonzero(differs)
    if len(hits):
        i = int(hits[0])
    elif ta.num_rows != tb.num_rows:
        i = n
    else:
        return None
    where = [(int(t["rank"][i].as_py()), int(t["step"][i].as_py())) for t in (ta, tb)
             if i < t.num_rows]  # fmt: skip
    rank, step = min(where)
    seg_a, fp_a = _step_segments(ta, rank, step)
    seg_b, fp_b = _step_segments(tb, rank, step)
    keys_b = {json.dumps(s, sort_keys=True) for s in seg_b}
    keys_a = {json.dumps(s, sort_keys=True) for s in seg_a}
    only_a, only_b, moved = _moves(
        [s for s in seg_a if json.dumps(s, sort_keys=True) not in keys_b],
        [s for s in seg_b if json.dumps(s, sort_keys=True) not in keys_a],
    )
    return Divergence(
        step=step,
        rank=rank,
        only_a=only_a,
        only_b=only_b,
        fingerprint_a=fp_a,
        fingerprint_b=fp_b,
        steps_a=_steps(ta),
        steps_b=_steps(tb),
        moved=moved,
        stops=_stopper(bool(seg_a), bool(seg_b), differed=bool(len(hits))),
    )


def _stopper(has_a: bool, has_b: bool, *, differed: bool) -> str | None:
    """The run that is a prefix of the other: it has nothing at the first differing step."""
    if differed or has_a == has_b:
        return None
    return "B" if has_a else "A"


def _moves(
    only_a: list[dict[str, Any]], only_b: list[dict[str, Any]]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """Pair the pieces both runs delivered at the step, in other places, as moves; what is
    left is delivered by one run only."""
    waiting: dict[str, list[int]] = {}
    for index, seg in enumerate(only_b):
        waiting.setdefault(_piece(seg), []).append(index)
    paired: set[int] = set()
    left_a, moved = [], []
    for seg in only_a:
        candidates = waiting.get(_piece(seg))
        if not candidates:
            left_a.append(seg)
            continue
        other = only_b[candidates.pop(0)]
        paired.add(id(other))
        place = {f"{k}_{side}": s[k] for k in _PLACE for side, s in (("a", seg), ("b", other))}
        moved.append({**{k: v for k, v in seg.items() if k not in _PLACE}, **place})
    return left_a, [s for s in only_b if id(s) not in paired], moved


def _piece(seg: dict[str, Any]) -> str:
    return json.dumps({k: v for k, v in seg.items() if k not in _PLACE}, sort_keys=True)


def _steps(table: Any) -> int:
    import pyarrow.compute as pc

    return 0 if table.num_rows == 0 else len(pc.unique(table["step"]))


def _step_segments(table: Any, rank: int, step: int) -> tuple[list[dict[str, Any]], str | None]:
    import pyarrow.compute as pc

    rows = table.filter(pc.and_(pc.equal(table["rank"], rank), pc.equal(table["step"], step)))
    segs = [{k: r[k] for k in _SEGMENT} for r in rows.to_pylist()]
    fps = [f for f in rows["fingerprint"].to_pylist() if f]
    return segs, (fps[0] if fps else None)


def _diff_records(a: Path, b: Path) -> Divergence | None:
    lines_a = a.read_text(encoding="utf-8").splitlines()
    lines_b = b.read_text(encoding="utf-8").splitlines()
    for step in range(max(len(lines_a), len(lines_b))):
        ra = json.loads(lines_a[step]) if step < len(lines_a) else None
        rb = json.loads(lines_b[step]) if step < len(lines_b) else None
        if ra is not None and rb is not None and _same_item(ra, rb):
            continue
        ids_a = [list(x) for x in ra["ids"]] if ra else []
        ids_b = [list(x) for x in rb["ids"]] if rb else []
        return Divergence(
            step=step,
            rank=0,
            only_a=[{"row": r, "sample_id": x} for r, x in enumerate(ids_a) if x not in ids_b],
            only_b=[{"row": r, "sample_id": x} for r, x in enumerate(ids_b) if x not in ids_a],
            fingerprint_a=ra.get("fingerprint") if ra else None,
            fingerprint_b=rb.get("fingerprint") if rb else None,
            steps_a=len(lines_a),
            steps_b=len(lines_b),
            moved=[
                {"sample_id": x, "row_a": r, "row_b": ids_b.index(x)}
                for r, x in enumerate(ids_a)
                if x in ids_b and ids_b.index(x) != r
            ],
            stops=_stopper(ra is not None, rb is not None, differed=False),
        )
    return None


def _same_item(ra: dict[str, Any], rb: dict[str, Any]) -> bool:
    if ra.get("ids") != rb.get("ids") or ra.get("lane") != rb.get("lane"):
        return False
    fa, fb = ra.get("fingerprint"), rb.get("fingerprint")
    return fa is None or fb is None or fa == fb
