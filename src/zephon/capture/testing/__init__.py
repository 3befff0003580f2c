"""The store author's kit: prove a capture store exactly as zephon proves its own.

* :func:`run_conformance` - every contract check a black box can exercise;
* :data:`MUTATIONS` / :func:`assert_mutation_caught` - each mutant breaks one clause, and the
  suite must notice;
* :class:`RecordingFileSystem` / :func:`power_loss_images` - record the file operations of a
  store built on the file-system seam and rebuild what a power loss at any point leaves;
* :data:`STORE_KINDS` - the registry every parametrised store test runs over, one kind per
  built-in store (:func:`store_kinds` derives it; a store without a kind is an error);
* :func:`sample_commit` - a valid ledger row to record;
* :func:`run_flood` - hostile clients against a running capture proxy while a well-behaved
  one works (latencies, acknowledged calls, peak memory);
* :func:`run_chaos` / :class:`ProcessRole` - random SIGKILLs of an RL loop's processes,
  each triggered by the ledger's progress (:func:`ledger_progress`), on a seeded schedule.

Importable without pytest.
"""

from __future__ import annotations

from zephon.capture._conformance_kit import sample_commit
from zephon.capture.conformance import (
    CHECKS as CHECKS,
)
from zephon.capture.conformance import (
    CheckResult as CheckResult,
)
from zephon.capture.conformance import (
    ConformanceError as ConformanceError,
)
from zephon.capture.conformance import (
    ConformanceReport as ConformanceReport,
)
from zephon.capture.conformance import (
    ConformanceWarning as ConformanceWarning,
)
from zephon.capture.conformance import (
    run_conformance as run_conformance,
)
from zephon.capture.conformance import (
    run_conformance_sync as run_conformance_sync,
)
from zephon.capture.testing._chaos import (
    ChaosError,
    ChaosRole,
    ProcessRole,
    ledger_progress,
    run_chaos,
)
from zephon.capture.testing._flood import FloodPlan, FloodReport, run_flood
from zephon.capture.testing._kinds import STORE_KINDS, StoreKind, durable_kinds, store_kinds
from zephon.capture.testing._mutations import (
    MUTATIONS,
    Mutation,
    Wrapper,
    assert_mutation_caught,
    mutated_factory,
    run_mutation,
)
from zephon.capture.testing._powerloss import (
    Image,
    Op,
    RecordingFileSystem,
    marks_before,
    power_loss_images,
)

__all__ = [
    "MUTATIONS",
    "STORE_KINDS",
    "ChaosError",
    "ChaosRole",
    "FloodPlan",
    "FloodReport",
    "Image",
    "Mutation",
    "Op",
    "ProcessRole",
    "RecordingFileSystem",
    "StoreKind",
    "Wrapper",
    "assert_mutation_caught",
    "durable_kinds",
    "ledger_progress",
    "marks_before",
    "mutated_factory",
    "power_loss_images",
    "run_chaos",
    "run_flood",
    "run_mutation",
    "sample_commit",
    "store_kinds",
]
