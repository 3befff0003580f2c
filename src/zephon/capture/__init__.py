"""Durable RL token capture: records, protocols, stores and the conformance suite.

See ``docs/capture.md``. Everything here imports without a server stack; the store classes
(``MemoryStore``, ``FileStore``, ``SqliteStore``, ``PostgresStore``) are imported on first
access, so ``import zephon.capture`` never pulls in a database driver.
"""

from __future__ import annotations

from typing import Any

from zephon.capture import stores
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
from zephon.capture.conformance import (
    ConformanceError,
    ConformanceReport,
    ConformanceWarning,
    run_conformance,
    run_conformance_sync,
)
from zephon.capture.ledger import LedgerTransitionError, PromptState, StreamLedger
from zephon.capture.lineage import (
    FINGERPRINT_VERSION,
    IncrementalResolver,
    RolloutLineage,
    assistant_fingerprint,
    canonicalize_tool_arguments,
    conversation_digest,
    stamp_continuation,
)

# The protocols are exported by zephon.capture.protocols; also importable from here.
from zephon.capture.protocols import *  # noqa: F403
from zephon.capture.records import (
    CallRecord,
    CaptureLedgerCommit,
    CaptureRecordError,
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
from zephon.capture.scores import RolloutScore
from zephon.capture.stores import STORE_CLASSES, STORE_SCHEMES, LogCorruptionError, open_store


def __getattr__(name: str) -> Any:
    """The store classes, imported on first access (see the module docstring)."""
    if name not in STORE_CLASSES:
        raise AttributeError(f"module 'zephon.capture' has no attribute {name!r}")
    return getattr(stores, name)


__all__ = [
    "FINGERPRINT_VERSION",
    "STORE_SCHEMES",
    "BuildNotes",
    "BuildOutput",
    "CallRecord",
    "CaptureLedgerCommit",
    "CaptureRecordError",
    "Chain",
    "ChainLink",
    "ConformanceError",
    "ConformanceReport",
    "ConformanceWarning",
    "EngineRefusalRecord",
    "IncrementalResolver",
    "LedgerTransitionError",
    "LogCorruptionError",
    "ManifestFailure",
    "ParentResolutionStatus",
    "PromptState",
    "RolloutBuild",
    "RolloutLineage",
    "RolloutManifest",
    "RolloutRemoval",
    "RolloutScore",
    "StreamLedger",
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
    "open_store",
    "prefix_merging",
    "run_conformance",
    "run_conformance_sync",
    "stamp_continuation",
]
__all__ += [*STORE_CLASSES]  # the protocols' home is zephon.capture.protocols
