"""The provenance log: every delivered batch's segments as a folder of Parquet parts.

One table row per segment: ``step``, ``rank``, ``row`` (in the batch), ``segment`` (in the
row), ``dataset``, ``source`` (file or URL), ``dataset_id``, ``shard``, ``source_row``,
``line`` (JSON Lines), ``sample_row`` and ``sample_dataset`` (set only when ``source_row``
and ``dataset`` are not the sample id's row and the run's dataset name: a converted corpus's,
whose other columns name the original document, as :meth:`SampleBatch.provenance` does),
``lineage`` (child indices joined by "."),
``start``/``end`` (span in the row), ``source_start``/``source_end``/``source_length`` (span
in the source document), ``fingerprint`` (the batch's, on its first segment only) and
``extra`` (JSON, capture sources).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from zephon.provenance._extract import content_fingerprint, iter_raw
from zephon.provenance._origin import Origin
from zephon.types import StreamItem

__all__ = ["ProvenanceLog", "read_log"]

PART_RE = re.compile(r"^part-(\d+)-(\d+)\.parquet$")
_INT_COLUMNS = (
    ("step", "int64"),
    ("rank", "int32"),
    ("row", "int32"),
    ("segment", "int32"),
    ("dataset_id", "int32"),
    ("shard", "int32"),
    ("source_row", "int64"),
    ("start", "int32"),
    ("end", "int32"),
    ("source_start", "int32"),
    ("source_end", "int32"),
)


def _parts(folder: Path) -> list[tuple[int, int, Path]]:
    out = []
    if folder.is_dir():
        for p in folder.iterdir():
            m = PART_RE.match(p.name)
            if m:
                out.append((int(m.group(1)), int(m.group(2)), p))
    return sorted(out)


class ProvenanceLog:
    """Writes the segments of every batch it is given, one step per :meth:`write`.

    ``start_step`` is the step of the first batch written (the number of items a restored
    checkpoint says were delivered); parts at or beyond it are removed or cut, so a resumed
    run never logs a step twice. ``origin`` (a pipeline, or taken from the first batch)
    supplies names, files and lines.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        origin: Any = None,
        *,
        rank: int = 0,
        start_step: int = 0,
        flush_every: int = 8192,
    ) -> None:
        self.path = Path(path)
        if self.path.exists() and not self.path.is_dir():
            raise ValueError(
                f"provenance log {self.path} is a file; the log is a folder of Parquet parts "
                "(give a new path or remove the file)"
            )
        self.path.mkdir(parents=True, exist_ok=True)
        self.origin = Origin.of(origin) if origin is not None else None
        self.rank = int(rank)
        self.step = int(start_step)
        self.flush_every = max(1, int(flush_every))
        self.truncate(self.step)
        self._cols: dict[str, list[Any]] = {}
        self._reset()

    @classmethod
    def for_pipeline(
        cls, path: str | os.PathLike[str], pipeline: Any, *, start_step: int = 0
    ) -> ProvenanceLog:
        """A log for ``pipeline`` (its datasets and its ``dp_rank``)."""
        rank = int(pipeline.runtime_options.dp_rank)
        return cls(path, pipeline, rank=rank, start_step=start_step)

    def _reset(self) -> None:
        self._cols = {name: [] for name, _ in _INT_COLUMNS}
        self._cols.update(source_length=[], lineage=[], fingerprint=[])
        self._steps = 0
        self._first = self.step

    # -- writing ------------------------------------------------------------------------------

    def write(self, item: StreamItem, step: int | None = None) -> None:
        """Log ``item`` (a batch or a record) as ``step`` (default: the next step)."""
        if step is not None:
            if self._steps == 0:
                self._first = step
            self.step = step
        if self.origin is None:
            self.origin = getattr(item, "_origin", None)
        cols = self._cols
        step_c, rank_c, row_c, seg_c = cols["step"], cols["rank"], cols["row"], cols["segment"]
        ds_c, shard_c, idx_c = cols["dataset_id"], cols["shard"], cols["source_row"]
        start_c, end_c, ss_c, se_c = (
            cols["start"],
            cols["end"],
            cols["source_start"],
            cols["source_end"],
        )
        len_c, lin_c, fp_c = cols["source_length"], cols["lineage"], cols["fingerprint"]
        step_now, rank = self.step, self.rank
        first = True
        for r, s, (cursor, start, end, src_start, src_end, full) in iter_raw(item):
            sid = cursor[3]
            lineage = cursor[2]
            step_c.append(step_now)
            rank_c.append(rank)
            row_c.append(r)
            seg_c.append(s)
            ds_c.append(sid[0])
            shard_c.append(sid[1])
            idx_c.append(sid[2])
            start_c.append(start)
            end_c.append(end)
            ss_c.append(src_start)
            se_c.append(src_end)
            len_c.append(full)
            lin_c.append(".".join(map(str, lineage)) if lineage else "")
            fp_c.append(content_fingerprint(item) if first else None)
            first = False
        self.step = step_now + 1
        self._steps += 1
        if self._steps >= self.flush_every:
            self.flush()

    def flush(self) -> Path | None:
        """Write what is buffered as one part (atomically); returns its path."""
        if not self._cols["step"]:
            self._reset()
            return None
        import pyarrow.parquet as pq

        table = self._table()
        last = int(self._cols["step"][-1])
        final = self.path / f"part-{self._first:012d}-{last:012d}.parquet"
        tmp = final.with_name(f".{final.name}.tmp-{os.getpid()}")
        try:
            pq.write_table(table, tmp, compression="zstd", compression_level=9)
            with open(tmp, "rb") as fh:
                os.fsync(fh.fileno())
            os.replace(tmp, final)
        except OSError:  # a full disk: no partial part is left; the steps stay buffered
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise
        self._reset()
        return final

    def _table(self) -> Any:
        import pyarrow as pa

        cols = self._cols
        arrays: dict[str, Any] = {
            name: np.asarray(cols[name], dtype=kind) for name, kind in _INT_COLUMNS
        }
        origin = self.origin or Origin([])
        pairs = arrays["dataset_id"].astype(np.int64) << 32 | arrays["shard"].astype(np.int64)
        keys, inverse = np.unique(pairs, return_inverse=True)
        names = [origin.name(int(k >> 32)) for k in keys]
        run_names: list[str | None] = [None] * len(keys)  # where ``names`` gets the original's
        locations = [origin.location(int(k >> 32), int(k & 0xFFFFFFFF)) for k in keys]
        lines = np.full(len(pairs), -1, dtype=np.int64)
        sample_rows = np.full(len(pairs), -1, dtype=np.int64)
        extra: list[str | None] = [None] * len(pairs)
        for i, key in enumerate(keys.tolist()):
            ds, shard = key >> 32, key & 0xFFFFFFFF
            where = np.flatnonzero(inverse == i)
            table = origin.line_table(ds, shard)
            original = _originals(origin, ds, shard, arrays["source_row"][where])
            if original is not None:  # a converted corpus: name the document it was made from
                run_names[i], names[i], locations[i] = names[i], original[0], original[1]
                sample_rows[where] = arrays["source_row"][where]
                arrays["source_row"][where], lines[where] = original[2], original[3]
            elif table is not None:
                lines[where] = table[arrays["source_row"][where]]
            if origin.extra(ds, shard, 0) is not None:
                for j in where.tolist():
                    found = origin.extra(ds, shard, int(arrays["source_row"][j]))
                    extra[j] = json.dumps(found, sort_keys=True) if found else None
        idx = pa.array(inverse.astype(np.int32))
        out = {name: pa.array(arrays[name]) for name, _ in _INT_COLUMNS[:4]}
        out["dataset"] = pa.DictionaryArray.from_arrays(idx, pa.array(names, pa.string()))
        out["source"] = pa.DictionaryArray.from_arrays(idx, pa.array(locations, pa.string()))
        for name, _ in _INT_COLUMNS[4:7]:
            out[name] = pa.array(arrays[name])
        out["line"] = pa.array(lines, mask=lines < 0)
        out["sample_row"] = pa.array(sample_rows, mask=sample_rows < 0)
        out["sample_dataset"] = pa.array(run_names, pa.string()).take(idx).dictionary_encode()
        out["lineage"] = pa.array(cols["lineage"], pa.string()).dictionary_encode()
        for name, _ in _INT_COLUMNS[7:]:
            out[name] = pa.array(arrays[name])
        out["source_length"] = pa.array(cols["source_length"], pa.int32())
        out["fingerprint"] = pa.array(cols["fingerprint"], pa.string())
        out["extra"] = pa.array(extra, pa.string())
        return pa.table(out)

    def truncate(self, step: int) -> None:
        """Drop every logged step at or after ``step`` (what a resume from there re-delivers)."""
        import pyarrow.compute as pc
        import pyarrow.parquet as pq

        for first, last, part in _parts(self.path):
            if first >= step:
                part.unlink()
            elif last >= step:
                table = pq.read_table(part)
                kept = table.filter(pc.less(table["step"], step))
                tmp = part.with_name(f".{part.name}.tmp-{os.getpid()}")
                pq.write_table(kept, tmp, compression="zstd", compression_level=9)
                os.replace(tmp, part.with_name(f"part-{first:012d}-{step - 1:012d}.parquet"))
                part.unlink()

    def close(self) -> None:
        self.flush()

    def __enter__(self) -> ProvenanceLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _originals(
    origin: Origin, ds: int, shard: int, rows: np.ndarray
) -> tuple[str, str, np.ndarray, np.ndarray] | None:
    """Dataset, file, rows and lines (-1: none) of the documents ``rows`` of a converted
    corpus's shard were tokenized from; None for any other shard."""
    if not len(rows) or origin.source_of(ds, shard, int(rows[0])) is None:
        return None
    found = [origin.source_of(ds, shard, r) for r in rows.tolist()]
    places = [f for f in found if f is not None]
    original = np.array([f[2] for f in places], dtype=np.int64)
    lines = np.array([-1 if f[3] is None else f[3] for f in places], dtype=np.int64)
    return places[0][0], places[0][1], original, lines


def read_log(paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]]) -> Any:
    """Every segment of one or more logs (folders or single Parquet files) as one
    ``pyarrow.Table`` sorted by rank, step, row and segment."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    items: Iterable[Any] = [paths] if isinstance(paths, (str, os.PathLike)) else paths
    tables = []
    for p in items:
        path = Path(p)
        files = [part for _, _, part in _parts(path)] if path.is_dir() else [path]
        if not files and not path.exists():
            raise FileNotFoundError(f"provenance log {path} does not exist")
        for f in files:
            table = pq.read_table(f)
            tables.append(table.cast(_unified(table.schema)))
    if not tables:
        return pa.table({})
    table = pa.concat_tables(tables, promote_options="default")
    return table.sort_by(
        [
            ("rank", "ascending"),
            ("step", "ascending"),
            ("row", "ascending"),
            ("segment", "ascending"),
        ]
    )


def _unified(schema: Any) -> Any:
    """Dictionary columns as plain strings, so parts with other dictionaries concatenate."""
    import pyarrow as pa

    fields = [
        pa.field(f.name, pa.string()) if pa.types.is_dictionary(f.type) else f for f in schema
    ]
    return pa.schema(fields)
