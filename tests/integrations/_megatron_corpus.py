"""The batch sizes of the Megatron tests and what a test records of one micro-batch."""

from __future__ import annotations

import hashlib
from typing import Any

from tests.integrations._corpus import row_digest

MICRO, GLOBAL = 2, 8  # accumulation 4 on one DP rank, 2 on two, 1 on four


def batch_digest(batch: dict[str, Any]) -> str:
    """A digest of every key of a Megatron batch (values, shapes and dtypes)."""
    digest = hashlib.sha256()
    for key in sorted(batch):
        value = batch[key]
        digest.update(key.encode())
        if value is not None:
            digest.update(f"{tuple(value.shape)}{value.dtype}".encode())
            digest.update(value.contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]


def batch_line(batch: dict[str, Any]) -> dict[str, Any]:
    return {"rows": [row_digest(r) for r in batch["tokens"]], "batch": batch_digest(batch)}
