"""Durable RL token capture: records, protocols, stores and the conformance suite.

See ``docs/capture.md``. Everything here imports without a server stack.
"""

from __future__ import annotations

from zephon.capture.builder import (
    BuildNotes,
    BuildOutput,
    Chain,
    ChainLink,
    RolloutBuild,
    TerminalAttribution,
    Trajectory,
    attribute_terminal,
    build_rollout,
    prefix_merging,
)
from zephon.capture.lineage import (
    FINGERPRINT_VERSION,
    IncrementalResolver,
    RolloutLineage,
    assistant_fingerprint,
    canonicalize_tool_arguments,
    conversation_digest,
    stamp_continuation,
)
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
    "FINGERPRINT_VERSION",
    "BuildNotes",
    "BuildOutput",
    "CallRecord",
    "CaptureLedgerCommit",
    "Chain",
    "ChainLink",
    "EngineRefusalRecord",
    "IncrementalResolver",
    "ManifestFailure",
    "ParentResolutionStatus",
    "RolloutBuild",
    "RolloutLineage",
    "RolloutManifest",
    "RolloutRemoval",
    "TerminalAttribution",
    "TokenCaptureSnapshot",
    "TokenEntry",
    "Trajectory",
    "assistant_fingerprint",
    "attribute_terminal",
    "build_rollout",
    "canonicalize_tool_arguments",
    "compute_digest",
    "conversation_digest",
    "cumulative_tokens",
    "encode_token_ids",
    "prefix_merging",
    "stamp_continuation",
]
