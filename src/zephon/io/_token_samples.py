"""Training samples read straight from pre-tokenized files: one row per sample, not per document.

Why a dataset view rather than an operator over document records: the engine's cost is per
record (a few microseconds), and a corpus of 600-token documents would spend it hundreds of
thousands of times a second. Here a row *is* a sample (or ``rows_per_item`` samples at once),
computed from offset arrays with numpy and assembled by slicing the token memmap into one
preallocated array, so a pipeline pays per sample, or per batch. Because samples are rows,
work sources shuffle, mix, shard over lanes and ranks, checkpoint and resume them exactly as
any other rows.

- :func:`token_chunks`: concatenate a file's documents and cut fixed windows (megatron-core's
  ``GPTDataset`` layout: window ``i`` is tokens ``[i*L, i*L + L + 1)`` with ``plus_one``). Row
  counts need only the token count, so opening a corpus reads no index.
- :func:`token_packs`: whole documents packed best-fit into rows of ``L`` tokens from the
  lengths in the index (documents longer than ``L`` are cut in ``L``-token pieces); tokens are
  touched only when a row is read.

Samples never cross files; a file's last partial window is not a sample.
"""

from __future__ import annotations

import itertools
import posixpath
import zlib
from bisect import bisect_left, insort
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from zephon.errors import ConfigError
from zephon.io._dataset import Dataset, Row, checked_indices
from zephon.io._megatron_order import megatron_chunks
from zephon.io._token_files import INPUT_IDS, TokenDocumentShard, TokenFile, TokenFileShard

POSITION_IDS = "position_ids"
CU_SEQLENS = "cu_seqlens"
NUM_TOKENS = "num_tokens"


def _token_file(dataset: Dataset, shard_id: int, view: str) -> TokenFile:
    shard = dataset.shards[shard_id]
    if not isinstance(shard, TokenDocumentShard):
        raise ConfigError(
            f"{view}: shard {shard.location} of dataset {dataset.name!r} is not a pre-tokenized "
            "file; read Megatron .idx/.bin, datatrove .ds or .npy token arrays with "
            "Dataset.from_path"
        )
    return shard.file


def _check(seq_length: int, rows_per_item: int, view: str) -> None:
    if seq_length < 1:
        raise ConfigError(f"{view}: seq_length must be >= 1, got {seq_length}")
    if rows_per_item < 1:
        raise ConfigError(f"{view}: rows_per_item must be >= 1, got {rows_per_item}")


def _segments(bounds: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray]:
    """Position ids restarting at each bound and the ``cu_seqlens`` of one row."""
    cu = np.unique(np.concatenate(([0], bounds, [width]))).astype(np.int32)
    pos = np.arange(width, dtype=np.int64) - np.repeat(cu[:-1], np.diff(cu))
    return pos, cu


def _stack(rows: list[dict[str, Any]], width: int) -> dict[str, Any]:
    """Rows of one item as stacked arrays; ``cu_seqlens`` offset into the flattened block."""
    out: dict[str, Any] = {}
    for key in rows[0]:
        if key == CU_SEQLENS:
            parts = [r[key][:-1] + i * width for i, r in enumerate(rows)]
            out[key] = np.concatenate([*parts, [len(rows) * width]]).astype(np.int32)
        else:
            out[key] = np.stack([r[key] for r in rows])
    return out


class _ViewShard(TokenFileShard):
    """Items of ``rows_per_item`` samples of one token file, in a seeded order."""

    _TRANSIENT: ClassVar[tuple[str, ...]] = ("_order",)

    def __init__(self, file: TokenFile, samples: int, rows_per_item: int, seed: int | None):
        self.file = file
        self.samples = samples
        self.rows_per_item = rows_per_item
        self.seed = seed
        self._init_transient()

    def _init_transient(self) -> None:
        self._order: np.ndarray | None = None

    def __len__(self) -> int:
        return -(-self.samples // self.rows_per_item)

    def order(self) -> np.ndarray:
        """Sample numbers in item order: identity, or a permutation seeded by ``seed`` and
        the file's name."""
        if self._order is None:
            if self.seed is None:
                self._order = np.arange(self.samples, dtype=np.int64)
            else:
                # The file's name, not its folder: a corpus moved or copied keeps its order.
                salt = zlib.crc32(posixpath.basename(self.location).encode())
                rng = np.random.default_rng([self.seed, salt])
                self._order = rng.permutation(self.samples)
        return self._order

    def item_samples(self, item: int) -> np.ndarray:
        lo = item * self.rows_per_item
        return self.order()[lo : min(lo + self.rows_per_item, self.samples)]

    def read(self, indices: Sequence[int]) -> list[Row]:
        idx = checked_indices(indices, len(self), self.location)
        return [self.read_item(i) for i in idx.tolist()]

    def read_item(self, item: int) -> Row:
        raise NotImplementedError


class TokenChunkShard(_ViewShard):
    """Fixed windows of one token file (see :func:`token_chunks`)."""

    def __init__(
        self,
        file: TokenFile,
        seq_length: int,
        *,
        plus_one: bool,
        rows_per_item: int,
        seed: int | None,
        positions: bool,
    ) -> None:
        self.seq_length = seq_length
        self.width = seq_length + 1 if plus_one else seq_length
        self.positions = positions
        extra = self.width - seq_length
        samples = max(0, (file.n_tokens - extra) // seq_length)
        super().__init__(file, samples, rows_per_item, seed)

    def read_item(self, item: int) -> Row:
        L, w = self.seq_length, self.width
        if self.rows_per_item == 1 and not self.positions:  # one window: no block to stack
            window = np.empty(w, dtype=self.file.dtype)
            _copy_spans(self.file, window, ((0, int(self.order()[item]) * L, w),))
            return {INPUT_IDS: window}
        samples = self.item_samples(item)
        starts = (samples * L).tolist()
        out = np.empty((len(starts), w), dtype=self.file.dtype)
        spans = zip(range(0, len(starts) * w, w), starts, itertools.repeat(w))
        _copy_spans(self.file, out.reshape(-1), spans)
        row: Row = {INPUT_IDS: out}
        if self.positions:
            row.update(self._positions(starts))
        if self.rows_per_item == 1:
            row = {k: v[0] if k != CU_SEQLENS else v for k, v in row.items()}
        return row

    def _positions(self, starts: list[int]) -> dict[str, Any]:
        """Position ids that restart at every document start inside each window."""
        doc_starts = self.file.spans()[0]
        rows = []
        for s in starts:
            lo, hi = np.searchsorted(doc_starts, [s + 1, s + self.width])
            pos, cu = _segments(doc_starts[lo:hi] - s, self.width)
            rows.append({POSITION_IDS: pos, CU_SEQLENS: cu})
        return _stack(rows, self.width)


def best_fit(lengths: np.ndarray, capacity: int) -> np.ndarray:
    """The bin of each length, best-fit decreasing (longest first; ties by position), every
    length ``<= capacity``. Deterministic: a function of the lengths alone."""
    bins = np.empty(len(lengths), dtype=np.int64)
    free: list[tuple[int, int]] = []  # (room left, bin), sorted
    opened = 0
    lens = lengths.tolist()
    for i in np.argsort(-lengths, kind="stable").tolist():
        n = lens[i]
        k = bisect_left(free, (n, -1))
        if k < len(free):
            room, b = free.pop(k)
            room -= n
        else:
            b, room = opened, capacity - n
            opened += 1
        bins[i] = b
        if room > 0:
            insort(free, (room, b))
    return bins


@dataclass(frozen=True)
class _PackPlan:
    """A file's packed rows laid out item by item, in item order: the pieces of item ``i``
    are rows ``[piece_at[i], piece_at[i + 1])`` of ``spans`` (place in the item's flat block,
    token offset, length), its ``cu_seqlens`` are ``[cu_at[i], cu_at[i + 1])`` of ``cu`` and
    its segments' lengths the same range of ``seg`` less its last entry. Reading an item is
    then a slice copy per piece and one pass for its position ids, no other per-row work."""

    piece_at: list[int]
    spans: np.ndarray  # (pieces, 3): place in the item's block, token offset, length
    cu_at: list[int]
    cu: np.ndarray
    seg: np.ndarray  # cu[k + 1] - cu[k] (across an item's end: unused)
    used: np.ndarray


class TokenPackShard(_ViewShard):
    """Documents of one token file packed into rows (see :func:`token_packs`)."""

    _TRANSIENT: ClassVar[tuple[str, ...]] = ("_order", "_plan")

    def __init__(
        self, file: TokenFile, seq_length: int, *, rows_per_item: int, seed: int | None, pad_id: int
    ) -> None:
        self.seq_length, self.pad_id = seq_length, pad_id
        starts, lengths = file.spans()
        # Documents longer than a row are cut into seq_length-token pieces.
        pieces = np.maximum(1, -(-lengths // seq_length))
        doc = np.repeat(np.arange(len(lengths)), pieces)
        first = np.repeat(np.cumsum(pieces) - pieces, pieces)
        offset = (np.arange(len(doc)) - first) * seq_length
        self.starts = starts[doc] + offset
        self.lengths = np.minimum(lengths[doc] - offset, seq_length)
        keep = self.lengths > 0
        self.starts, self.lengths = self.starts[keep], self.lengths[keep]
        bins = best_fit(self.lengths, seq_length)
        members = np.lexsort((np.arange(len(bins)), bins))  # pieces by bin, in file order
        self.starts, self.lengths = self.starts[members], self.lengths[members]
        self.bounds = np.zeros(int(bins.max(initial=-1)) + 2, dtype=np.int64)
        np.cumsum(np.bincount(bins, minlength=len(self.bounds) - 1), out=self.bounds[1:])
        super().__init__(file, len(self.bounds) - 1, rows_per_item, seed)

    def _init_transient(self) -> None:
        super()._init_transient()
        self._plan: _PackPlan | None = None

    def plan(self) -> _PackPlan:
        """The item layout, built once per process on the first read (after ``order``)."""
        if self._plan is None:
            self._plan = _pack_plan(
                self.order(),
                self.bounds,
                self.starts,
                self.lengths,
                self.seq_length,
                self.rows_per_item,
            )
        return self._plan

    def read_item(self, item: int) -> Row:
        plan, L, file, per = self.plan(), self.seq_length, self.file, self.rows_per_item
        row = item * per
        used = plan.used[row : row + per]
        a, z = plan.piece_at[item], plan.piece_at[item + 1]
        c, e = plan.cu_at[item], plan.cu_at[item + 1]
        shape = (L,) if per == 1 else (len(used), L)
        # Padding is a segment of its own: with no more segments than pieces there is none,
        # and every token of the block is copied over.
        if e - c - 1 == z - a:
            ids = np.empty(shape, dtype=file.dtype)
        else:
            ids = np.full(shape, self.pad_id, dtype=file.dtype)
        _copy_spans(file, ids.reshape(-1), plan.spans[a:z].tolist())
        cu = plan.cu[c:e].copy()
        return {
            INPUT_IDS: ids,
            POSITION_IDS: _restarting(cu, plan.seg[c : e - 1]).reshape(shape),
            CU_SEQLENS: cu,
            NUM_TOKENS: used[0] if per == 1 else used.copy(),
        }


def _pack_plan(
    order: np.ndarray,
    bounds: np.ndarray,
    starts: np.ndarray,
    lengths: np.ndarray,
    width: int,
    per_item: int,
) -> _PackPlan:
    """Lay the rows (bins ``order``, pieces ``[bounds[b], bounds[b + 1])``) out item by item."""
    counts = np.diff(bounds)[order]
    first = np.cumsum(counts) - counts  # each row's first piece, in the laid-out arrays
    pieces = np.repeat(bounds[order] - first, counts) + np.arange(int(counts.sum()))
    length = lengths[pieces]
    begin = np.cumsum(length) - length  # where each piece starts in the laid-out stream
    row_of = np.repeat(np.arange(len(order)), counts)
    dest = (row_of % per_item) * width + begin - begin[first][row_of]
    used = np.bincount(row_of, weights=length, minlength=len(order)).astype(np.int64)
    # Segments: every piece, each row's padding (when it has any), and each item's end.
    rows = np.arange(len(order))
    items = -(-len(order) // per_item)
    in_item = np.minimum(per_item, len(order) - np.arange(items) * per_item)
    pad = used < width
    seg_item = np.concatenate((row_of // per_item, rows[pad] // per_item, np.arange(items)))
    seg_at = np.concatenate((dest, (rows[pad] % per_item) * width + used[pad], in_item * width))
    seg = np.lexsort((seg_at, seg_item))
    cu_at = np.searchsorted(seg_item[seg], np.arange(items + 1))
    piece_at = np.searchsorted(row_of, np.arange(items + 1) * per_item)
    cu = seg_at[seg].astype(np.int32)
    return _PackPlan(
        piece_at=piece_at.tolist(),
        spans=np.stack((dest, starts[pieces], length), axis=1),
        cu_at=cu_at.tolist(),
        cu=cu,
        seg=np.diff(cu).astype(np.intp),
        used=used,
    )


_RAMPS: dict[int, np.ndarray] = {}


def _ramp(n: int) -> np.ndarray:
    """``arange(n)``, built once per length: position ids are slices of it."""
    found = _RAMPS.get(n)
    if found is None:
        found = _RAMPS[n] = np.arange(n, dtype=np.int32)
    return found


def _restarting(cu: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Position ids ``0, 1, ...`` restarting at every bound of ``cu`` (segment ``lengths``
    from the plan: a diff per item costs as much as the pass): one vectorised pass (a loop
    over segments would cost a step per document)."""
    starts = np.repeat(cu[:-1], lengths)
    np.subtract(_ramp(int(cu[-1])), starts, out=starts)
    return starts


def _copy_spans(file: TokenFile, out: np.ndarray, spans: Iterable[Sequence[int]]) -> None:
    """``out[d:d+n] = tokens[s:s+n]`` for every span ``(d, s, n)``, straight from the memmap
    when the file is local."""
    tokens = file.tokens()
    if tokens is None:
        for d, s, n in spans:
            out[d : d + n] = file.read_tokens(s, s + n)
    elif tokens.dtype.isnative:
        # A memoryview slice costs about half an array slice, and an item is many slices.
        src, dst = tokens.data, out.data
        for d, s, n in spans:
            dst[d : d + n] = src[s : s + n]
    else:  # memoryviews refuse byte-swapped formats
        for d, s, n in spans:
            out[d : d + n] = tokens[s : s + n]


def token_chunks(
    dataset: Dataset,
    seq_length: int,
    *,
    plus_one: bool = True,
    rows_per_item: int = 1,
    seed: int | None = None,
    positions: bool = False,
    order: str = "file",
    samples: int | None = None,
    split: str = "1,0,0",
    part: str = "train",
) -> Dataset:
    """``dataset``'s token files as fixed windows: each file's documents concatenated and cut
    every ``seq_length`` tokens, a window ``seq_length + 1`` long with ``plus_one`` (inputs and
    shifted labels from one row, as ``GPTDataset``). A row is ``{"input_ids": (W,)}``, or with
    ``rows_per_item=B`` an item of ``B`` windows, ``{"input_ids": (B, W)}`` (the file's last item
    may hold fewer). ``seed`` permutes windows inside each file; ``positions`` adds
    ``position_ids`` restarting at document starts and ``cu_seqlens``.

    ``order="megatron"`` reproduces megatron-core's ``GPTDataset`` over the dataset's one file
    for random seed ``seed``, ``samples`` requested (``None``: one epoch), ``split`` and
    ``part``: row ``i`` is its sample ``i``, documents shuffled over as many epochs as
    ``samples`` need and windows crossing documents (read it in one lane, no shuffle)."""
    _check(seq_length, rows_per_item, "token_chunks")
    if order == "megatron":
        if seed is None or rows_per_item != 1 or positions:
            raise ConfigError(
                "token_chunks(order='megatron'): give seed= (Megatron's random_seed); "
                "rows_per_item and positions are not available in Megatron order"
            )
        return megatron_chunks(
            dataset,
            seq_length,
            seed=seed,
            samples=samples,
            plus_one=plus_one,
            split=split,
            part=part,
        )
    if order != "file" or samples is not None:
        raise ConfigError(
            f"token_chunks: order must be 'file' or 'megatron', got {order!r} "
            "(samples, split and part are for order='megatron')"
        )
    shards = [
        TokenChunkShard(
            _token_file(dataset, i, "token_chunks"),
            seq_length,
            plus_one=plus_one,
            rows_per_item=rows_per_item,
            seed=seed,
            positions=positions,
        )
        for i in range(dataset.shard_count())
    ]
    return Dataset(dataset.name, shards)


def token_packs(
    dataset: Dataset,
    seq_length: int,
    *,
    rows_per_item: int = 1,
    seed: int | None = None,
    pad_id: int = 0,
) -> Dataset:
    """``dataset``'s documents packed best-fit decreasing into rows of ``seq_length`` tokens
    (per file, from the index's lengths; a longer document is cut into ``seq_length`` pieces),
    padded with ``pad_id``. A row is ``{"input_ids", "position_ids"}`` of ``(seq_length,)``,
    ``cu_seqlens`` (document bounds, padding its own segment) and ``num_tokens``; with
    ``rows_per_item=B`` the arrays of ``B`` rows stacked and ``cu_seqlens`` over the flattened
    block. ``seed`` permutes rows inside each file."""
    _check(seq_length, rows_per_item, "token_packs")
    shards = [
        TokenPackShard(
            _token_file(dataset, i, "token_packs"),
            seq_length,
            rows_per_item=rows_per_item,
            seed=seed,
            pad_id=pad_id,
        )
        for i in range(dataset.shard_count())
    ]
    return Dataset(dataset.name, shards)
