"""Runtime options: how a pipeline runs. None of them change a rank's batches except the
topology ones (``canonical_replicas``, ``dp_rank``, ``dp_world_size``, ``mapping``), which only
choose *which* lanes this rank runs, and ``flush_every_k_chunks``, which sets epoch boundaries.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields, replace
from typing import Any, Literal, get_args

from zephon.errors import ConfigError, did_you_mean

__all__ = ["RUNNERS", "RunnerName", "RuntimeOptions", "default_workers"]

RunnerName = Literal["inline", "threads", "process", "ray"]
"""The runners' names for typing; the runner registry defines them (a test keeps the two
equal)."""
RUNNERS: tuple[str, ...] = get_args(RunnerName)
ENGINE_PROCESS_RUNNERS: tuple[str, ...] = ("inline", "threads", "process")
"""The runners that may run inside ``engine_process=True`` (the registry's
``in_engine_process``; a test keeps the two equal). Options sit below the engine, so they
name the runners rather than reading the engine's registry."""


def default_workers() -> int:
    return max(1, min(8, os.cpu_count() or 1))


@dataclass(frozen=True)
class RuntimeOptions:
    """Settings for :meth:`zephon.Pipeline.options`.

    ``mapping``: which lanes rank ``dp_rank`` of ``dp_world_size`` runs: ``"interleaved"``
    (default; ``dp_rank::dp_world_size``, which keeps global steps across rank counts, see
    docs/guarantees.md) or ``"contiguous"`` (one block per rank).

    ``runner``: ``"threads"`` (default), ``"inline"`` (everything on the calling thread, the
    reference) or ``"process"`` (worker processes). ``deterministic=False`` releases
    micro-batches in completion order and allows latency-bound flushes. ``queue_size`` is the
    capacity, in micro-batches, of each bounded channel between stages. ``max_inflight`` caps
    micro-batches in flight per operator (default: 2 x its parallelism). ``track_stats``
    keeps per-operator counters for ``pipeline.stats()`` (per micro-batch, so it is cheap);
    ``log_every_s`` logs a progress line at INFO on the ``zephon`` logger.

    ``runner="ray"`` runs every worker operator on Ray actors (``ray.init()`` is called when
    Ray is not initialised; it honours ``RAY_ADDRESS``). ``max_worker_retries``: re-runs of a
    micro-batch after the worker process or actor running it died (then a
    ``WorkerCrashedError`` names the operator); a Ray actor lost with its node costs none.
    ``shm_min_bytes``: numpy arrays at least this large cross process boundaries through
    /dev/shm (None: always pickled). ``process_pool``:
    ``"shared"`` (one set of worker processes for every process stage, as many as the widest)
    or ``"per_op"``. ``reuse_workers``: keep the worker processes after an iteration and reuse
    them in the next one of this process. ``worker_deadline_s``: a process worker that has not
    answered a micro-batch within max(this, 10 x the slowest recent micro-batch of its
    operator) is reported, killed and respawned, and the micro-batch sent again (None: wait
    for ever). See docs/runners.md.

    ``fuse``: run adjacent element-wise operators (fetch, decode_text, map_transform, filter,
    tokenize) that share a runner as one worker task each micro-batch, saving a hand-off per
    operator, and let consecutive driver operators (replay filter, batch) share a driver thread;
    the output is the same either way, and ``explain()`` names the fused and chained operators.

    ``snapshot_every_chunks`` / ``snapshot_every_records``: how often a plan with packing,
    shuffling or mixture correction takes an aligned snapshot of its open state (at every
    ``snapshot_every_chunks``-th chunk start, and within a chunk every
    ``snapshot_every_records`` records, 32 by default: a restore replays at most that many
    records per lane; element-wise operators before the first order-changing one carry a
    marker inside their micro-batch, so a short interval does not shrink micro-batches). A
    restore starts at the newest
    delivered snapshot instead of the last flush, re-fetching only the records the snapshot
    names. Neither
    changes the output; ``snapshot_every_chunks=0`` turns snapshots off (restores replay from
    the last flush).

    ``engine_process``: run the whole engine (source, operators, tail) in a child
    process and hand finished items to this one through shared memory, so a consumer that
    holds the GIL (a training loop) and the engine's own Python work do not slow each other
    down. Checkpoints stay exact: they are taken where you receive the items. See
    docs/runners.md.

    ``lane_workers``: run whole lanes in that many worker processes (``"auto"``: as many as
    the cores this process may use, at most one per lane; None: off). Each worker runs every
    operator of its share of the rank's lanes (lanes ``w::lane_workers``) inline, from
    fetch to ``batch``, and this process only takes their finished items in the rank's
    round-robin, so the engine's serial work is per item, not per document. The output is
    the rank's, byte for byte, whatever the count: the unit of parallel work is the lane, so
    give the rank lanes to share (``canonical_replicas``; 64 serves a 16-64-core node).
    Operators and the ``iter_training`` transform travel to the workers with cloudpickle.

    ``quarantine``: a JSONL file that receives one line per record skipped with
    ``on_error="skip"`` (dataset, shard, row, file, line, reason), each record once even across
    restores. Skipped records are logged and counted in ``stats()`` with or without it.
    """

    runner: RunnerName = "threads"
    deterministic: bool = True
    canonical_replicas: int = 1
    dp_rank: int = 0
    dp_world_size: int = 1
    mapping: Literal["contiguous", "interleaved"] = "interleaved"
    flush_every_k_chunks: int | None = None
    queue_size: int = 8
    max_inflight: int | None = None
    on_error: Literal["raise", "skip"] = "raise"
    max_worker_retries: int = 3
    shm_min_bytes: int | None = 64 * 1024
    process_pool: Literal["shared", "per_op"] = "shared"
    reuse_workers: bool = False
    worker_deadline_s: float | None = 300.0
    track_stats: bool = True
    log_every_s: float | None = None
    quarantine: str | os.PathLike[str] | None = None
    fuse: bool = True
    snapshot_every_chunks: int = 1
    snapshot_every_records: int | None = 32
    engine_process: bool = False
    lane_workers: int | Literal["auto"] | None = None
    # (worker, workers): this view runs the rank's lanes ``worker::workers`` (a DataLoader
    # worker's share; set by zephon.torch_data.worker_pipeline, never by users)
    _worker_share: tuple[int, int] = (0, 1)

    def updated(self, **changes: Any) -> RuntimeOptions:
        known = {f.name for f in fields(self)}
        unknown = sorted(set(changes) - known)
        if unknown:
            public = sorted(name for name in known if not name.startswith("_"))
            raise ConfigError(f"unknown pipeline option(s) {unknown}; known options: {public}")
        opts = replace(self, **changes)
        opts.validate()
        return opts

    def validate(self) -> None:
        self._validate_runner()
        self._validate_topology()
        self._validate_lane_workers()
        if self.queue_size < 1:
            raise ConfigError(f"queue_size must be >= 1, got {self.queue_size}")
        if self.max_inflight is not None and self.max_inflight < 1:
            raise ConfigError(f"max_inflight must be >= 1, got {self.max_inflight}")
        if self.flush_every_k_chunks is not None and self.flush_every_k_chunks < 0:
            raise ConfigError(
                f"flush_every_k_chunks must be >= 0 or None, got {self.flush_every_k_chunks}"
            )
        if self.snapshot_every_chunks < 0:
            raise ConfigError(
                f"snapshot_every_chunks must be >= 0 (0: no snapshots), got "
                f"{self.snapshot_every_chunks}"
            )
        if self.snapshot_every_records is not None and self.snapshot_every_records < 1:
            raise ConfigError(
                f"snapshot_every_records must be >= 1 or None, got {self.snapshot_every_records}"
            )
        if self.log_every_s is not None and self.log_every_s <= 0:
            raise ConfigError(f"log_every_s must be positive or None, got {self.log_every_s}")
        if self.worker_deadline_s is not None and not self.worker_deadline_s > 0:
            raise ConfigError(
                f"worker_deadline_s must be positive or None (no deadline), "
                f"got {self.worker_deadline_s}"
            )
        if self.max_worker_retries < 0:
            raise ConfigError(f"max_worker_retries must be >= 0, got {self.max_worker_retries}")
        if self.shm_min_bytes is not None and self.shm_min_bytes < 1:
            raise ConfigError(
                f"shm_min_bytes must be >= 1 or None (never use shared memory), "
                f"got {self.shm_min_bytes}"
            )
        if self.process_pool not in ("shared", "per_op"):
            raise ConfigError(
                f"process_pool must be 'shared' or 'per_op', got {self.process_pool!r}"
                + did_you_mean(self.process_pool, ("shared", "per_op"))
            )
        if self.on_error not in ("raise", "skip"):
            raise ConfigError(
                f"on_error must be 'raise' or 'skip', got {self.on_error!r}"
                + did_you_mean(self.on_error, ("raise", "skip"))
            )

    def _validate_lane_workers(self) -> None:
        value = self.lane_workers
        if value is None or value == "auto":
            pass
        elif isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(
                f"lane_workers must be an integer >= 1, 'auto' or None (off), got {value!r}"
            )
        if value is not None and self.runner == "ray":
            raise ConfigError(
                "lane_workers runs whole lanes in worker processes of this machine; it cannot "
                "run with runner='ray': drop one of the two"
            )

    def _validate_topology(self) -> None:
        """Lane and rank counts in range (``dp_rank < dp_world_size`` is checked when the
        lanes are dealt: the two may be set in separate ``options()`` calls)."""
        for name in ("canonical_replicas", "dp_world_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.dp_rank < 0:
            raise ConfigError(f"dp_rank must be >= 0, got {self.dp_rank}")

    def _validate_runner(self) -> None:
        """``runner`` is a registered runner that can run where ``engine_process`` puts it."""
        if self.runner not in RUNNERS:
            raise ConfigError(
                f"runner must be one of {list(RUNNERS)}, got {self.runner!r}"
                + did_you_mean(self.runner, list(RUNNERS))
            )
        if self.engine_process and self.runner not in ENGINE_PROCESS_RUNNERS:
            usable = list(ENGINE_PROCESS_RUNNERS)
            raise ConfigError(
                f"engine_process=True cannot run runner={self.runner!r}: its stages belong to "
                f"the session of the process that iterates; use runner= one of {usable} "
                "with engine_process, or drop engine_process"
            )
