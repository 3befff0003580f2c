"""Write the same rows in every format, each with its owning library, in shards of equal size.

MDS is the exception: its writer's dependencies are too heavy for the test environment, so the
corpus comes from the committed fixture that ``fixtures/make_mds.py`` wrote with
``mosaicml-streaming``.

The matrix is derived from zephon.io's format registry: every built-in format is either in
:data:`WRITERS` (the matrix runs it) or in :data:`ELSEWHERE` (named with the test file that
covers it); one in neither fails the import, so a new format cannot silently skip the matrix.
"""

from __future__ import annotations

import json
import shutil
import struct
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.feather as feather
import pyarrow.parquet as pq

from zephon.io import format_names

FIXTURES = Path(__file__).with_name("fixtures")

Rows = list[dict[str, Any]]


def _parts(docs: Rows, shards: int) -> list[Rows]:
    size = -(-len(docs) // shards)
    return [docs[i : i + size] for i in range(0, len(docs), size)]


def write_jsonl(docs: Rows, out: Path, shards: int) -> Path:
    out.mkdir(parents=True)
    for s, part in enumerate(_parts(docs, shards)):
        with open(out / f"part-{s:02d}.jsonl", "w") as f:
            f.writelines(json.dumps(d, ensure_ascii=False) + "\n" for d in part)
    return out


def write_parquet(docs: Rows, out: Path, shards: int) -> Path:
    out.mkdir(parents=True)
    for s, part in enumerate(_parts(docs, shards)):
        pq.write_table(
            pa.Table.from_pylist(part), out / f"part-{s:02d}.parquet", row_group_size=500
        )
    return out


def write_hf(docs: Rows, out: Path, shards: int) -> Path:
    import datasets

    datasets.disable_progress_bars()
    datasets.Dataset.from_list(docs).save_to_disk(str(out), num_shards=shards)
    return out


def write_arrow(docs: Rows, out: Path, shards: int) -> Path:
    """Shard 0 in the IPC stream format, the others as Feather v2 (IPC file) with 3 batches."""
    out.mkdir(parents=True)
    for s, part in enumerate(_parts(docs, shards)):
        table = pa.Table.from_pylist(part)
        if s == 0:
            with pa.ipc.new_stream(out / f"part-{s:02d}.arrow", table.schema) as w:
                w.write_table(table, max_chunksize=700)
        else:
            feather.write_feather(
                table, out / f"part-{s:02d}.feather", chunksize=len(part) // 3 + 1
            )
    return out


def write_lance(docs: Rows, out: Path, shards: int) -> Path:
    import lance

    target = out.with_suffix(".lance")
    lance.write_dataset(
        pa.Table.from_pylist(docs), str(target), max_rows_per_file=-(-len(docs) // shards)
    )
    return target


def copy_mds_corpus(docs: Rows, out: Path, shards: int) -> Path:
    from tests.io._corpus import corpus_docs

    assert (docs, shards) == (corpus_docs(), 5), "the MDS fixture holds the 20,000-doc corpus"
    shutil.copytree(FIXTURES / "mds-corpus", out)
    return out


def write_litdata(docs: Rows, out: Path, shards: int) -> Path:
    """zstd-compressed ``.bin`` chunks of equal item counts, one per shard."""
    from litdata.streaming.writer import BinaryWriter

    writer = BinaryWriter(str(out), chunk_size=-(-len(docs) // shards), compression="zstd")
    for i, doc in enumerate(docs):
        writer[i] = doc
    writer.done()
    writer.merge(1)
    return out


def write_vortex(docs: Rows, out: Path, shards: int) -> Path:
    import vortex

    out.mkdir(parents=True)
    for s, part in enumerate(_parts(docs, shards)):
        vortex.io.write(pa.Table.from_pylist(part), str(out / f"part-{s:02d}.vortex"))
    return out


WRITERS: dict[str, Callable[[Rows, Path, int], Path]] = {
    "jsonl": write_jsonl,
    "parquet": write_parquet,
    "hf": write_hf,
    "arrow": write_arrow,
    "lance": write_lance,
    "mds": copy_mds_corpus,
    "litdata": write_litdata,
    "vortex": write_vortex,
}


def write_mds_raw(docs: Rows, out: Path, shards: int) -> Path:
    """Uncompressed MDS shards of ``{"id", "text", "lang"}`` rows, in the layout the format
    documents (``uint32`` count, ``uint32`` offsets, per sample the sizes of its two strings
    then the columns), for corpora the committed fixture cannot provide (thousands of shards)."""
    out.mkdir(parents=True)
    names, encodings, sizes = ["id", "lang", "text"], ["int", "str", "str"], [8, None, None]
    entries = []
    for s, part in enumerate(_parts(docs, shards)):
        samples = []
        for d in part:
            lang, text = d["lang"].encode(), d["text"].encode()
            sizes_le = struct.pack("<II", len(lang), len(text))
            samples.append(sizes_le + struct.pack("<q", d["id"]) + lang + text)
        start = 4 + 4 * (len(samples) + 1)
        offsets = [start]
        for sample in samples:
            offsets.append(offsets[-1] + len(sample))
        data = struct.pack(f"<I{len(offsets)}I", len(samples), *offsets) + b"".join(samples)
        basename = f"shard.{s:05d}.mds"
        (out / basename).write_bytes(data)
        entries.append({
            "column_encodings": encodings, "column_names": names, "column_sizes": sizes,
            "compression": None, "format": "mds", "hashes": [], "samples": len(samples),
            "raw_data": {"basename": basename, "bytes": len(data), "hashes": {}},
            "size_limit": 1 << 26, "version": 2, "zip_data": None,
        })  # fmt: skip
    (out / "index.json").write_text(json.dumps({"version": 2, "shards": entries}))
    return out


ELSEWHERE: dict[str, str] = {
    "converted": "tests/convert/test_convert.py",
    "megatron": "tests/io/test_token_formats.py",
    "datatrove": "tests/io/test_token_formats.py",
    "npy": "tests/io/test_token_formats.py",
    "webdataset": "tests/io/test_webdataset.py",
}
"""Built-in formats of other shapes (token files, tar samples, convert output), each with the
test file that covers it instead of the row matrix."""


def matrix_formats(names: Sequence[str]) -> tuple[str, ...]:
    """The formats of ``names`` the matrix runs; a format in neither table is an error."""
    unknown = [n for n in names if n not in WRITERS and n not in ELSEWHERE]
    if unknown:
        raise LookupError(
            f"format(s) {unknown} have no entry in the test format matrix: add a writer to "
            "WRITERS in tests/io/_formats.py, or name the test file covering it in ELSEWHERE"
        )
    return tuple(n for n in names if n in WRITERS)


FORMATS = matrix_formats(format_names())
"""Every matrix format, in the registry's order."""
