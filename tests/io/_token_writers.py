"""Writers of the pre-tokenized formats, byte by byte from each format's definition, with numpy
and struct only (no code of the reader under test)."""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np

MEGATRON_CODES = {
    1: np.uint8,
    2: np.int8,
    3: np.int16,
    4: np.int32,
    5: np.int64,
    6: np.float64,
    7: np.float32,
    8: np.uint16,
}


def documents(n: int, seed: int, vocab: int = 120, lo: int = 1, hi: int = 60) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab, size=int(k)).astype(np.int64) for k in rng.integers(lo, hi, n)]


def write_megatron(prefix: Path, docs: list[np.ndarray], code: int = 8) -> Path:
    """``PREFIX.bin`` + ``PREFIX.idx`` (version 1, one document per sequence)."""
    dtype = np.dtype(MEGATRON_CODES[code])
    prefix.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{prefix}.bin", "wb") as f:
        for d in docs:
            f.write(d.astype(dtype).tobytes())
    sizes = np.array([len(d) for d in docs], dtype=np.int32)
    pointers = np.concatenate(([0], np.cumsum(sizes[:-1], dtype=np.int64) * dtype.itemsize))
    doc_idx = np.arange(len(docs) + 1, dtype=np.int64)
    with open(f"{prefix}.idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00")
        f.write(struct.pack("<Q", 1))
        f.write(struct.pack("<B", code))
        f.write(struct.pack("<Q", len(sizes)))
        f.write(struct.pack("<Q", len(doc_idx)))
        f.write(sizes.tobytes())
        f.write(pointers.astype(np.int64).tobytes())
        f.write(doc_idx.tobytes())
    return Path(f"{prefix}.idx")


def write_datatrove(
    path: Path, docs: list[np.ndarray], width: int = 2, loss: list[np.ndarray] | None = None
) -> Path:
    """``NAME.ds`` (tokens, ``<H`` or ``<I``), ``NAME.ds.index`` (``<Q`` document ends) and
    ``NAME.ds.loss`` (one byte per token) when ``loss`` is given."""
    fmt = "H" if width == 2 else "I"
    path.parent.mkdir(parents=True, exist_ok=True)
    ends, at = [], 0
    with open(path, "wb") as f:
        for d in docs:
            f.write(struct.pack(f"<{len(d)}{fmt}", *d.tolist()))
            at += len(d)
            ends.append(at)
    Path(f"{path}.index").write_bytes(struct.pack(f"<{len(ends)}Q", *ends))
    if loss is not None:
        Path(f"{path}.loss").write_bytes(b"".join(m.astype(np.bool_).tobytes() for m in loss))
    return path


def write_npy_raw(path: Path, docs: list[np.ndarray], dtype: str, metadata: bool) -> Path:
    """A headerless token array (dolma); ``NAME.csv.gz`` with ``start,end,id,src,loc`` lines."""
    path.parent.mkdir(parents=True, exist_ok=True)
    np.concatenate(docs).astype(dtype).tofile(path)
    if metadata:
        lines, at = [], 0
        for i, d in enumerate(docs):
            lines.append(f"{at},{at + len(d)},doc-{i},src.jsonl,{i}")
            at += len(d)
        Path(str(path)[:-4] + ".csv.gz").write_bytes(gzip.compress("\n".join(lines).encode()))
    return path


def with_eos(docs: list[np.ndarray], eos: int) -> list[np.ndarray]:
    """Each document followed by ``eos`` (none of the tokens equal it)."""
    return [np.append(np.where(d == eos, eos + 1, d), eos) for d in docs]
