"""Coalesced reads of many byte spans of one file: sorted by offset, nearby spans in one read.

Shared by every shard kind that addresses rows by byte offset (JSONL lines, MDS samples): one
``pread`` or one ranged request covers a run of spans whose gaps are small.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

LOCAL_GAP = 8 << 10  # coalesce spans closer than this: a pread costs about 8 KiB of copying
REMOTE_GAP = 1 << 20  # a ranged request costs milliseconds, about a MiB of transfer
MAX_RUN = 16 << 20


def read_spans(
    read_range: Callable[[int, int], bytes],
    bounds: np.ndarray,
    indices: Sequence[int] | np.ndarray,
    max_gap: int = LOCAL_GAP,
) -> list[bytes]:
    """Bytes of spans ``bounds[indices]`` (``[start, end)`` rows), in the order asked; spans
    less than ``max_gap`` bytes apart share one read."""
    if not len(indices):
        return []
    rows = bounds[np.asarray(indices, dtype=np.int64)]
    order = np.argsort(rows[:, 0], kind="stable")
    out: list[bytes] = [b""] * len(indices)
    sorted_rows = rows[order].tolist()
    order_l = order.tolist()
    i = 0
    n = len(order_l)
    while i < n:
        run_start, run_end = sorted_rows[i]
        j = i + 1
        while j < n:
            s, e = sorted_rows[j]
            if s - run_end > max_gap or e - run_start > MAX_RUN:
                break
            run_end = max(run_end, e)
            j += 1
        buf = read_range(run_start, run_end)
        for k in range(i, j):
            s, e = sorted_rows[k]
            out[order_l[k]] = buf[s - run_start : e - run_start]
        i = j
    return out
