"""Durable RL token capture: records, protocols, stores and the conformance suite.

See ``docs/capture.md``. Everything here imports without a server stack.
"""

from __future__ import annotations

from zephon.capture.records import (
    CallRecord,
    CaptureLedgerCommit,
    EngineRefusalRecord,
    ManifestFailure,
    ParentResolutionStatus,
    RolloutManifest,
    RolloutRemoval,
    TokenCaptureSnapshot,
    TokenEntry,
    compute_digest,
    cumulative_tokens,
    encode_token_ids,
)

__all__ = [
    "CallRecord",
    "CaptureLedgerCommit",
    "EngineRefusalRecord",
    "ManifestFailure",
    "ParentResolutionStatus",
    "RolloutManifest",
    "RolloutRemoval",
    "TokenCaptureSnapshot",
    "TokenEntry",
    "compute_digest",
    "cumulative_tokens",
    "encode_token_ids",
]
