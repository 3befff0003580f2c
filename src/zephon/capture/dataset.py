"""Frozen rollouts as a pipeline work source: RL training data with exact tokens.

``CaptureSource(store, rollout_ids)`` freezes every rollout, builds it
(:func:`zephon.capture.builder.build_rollout`) and serves the trainable ones as rows of
``input_ids``, ``loss_mask`` and ``logprobs`` (aligned arrays, so ``pack_flat`` packs them
together) plus ``rollout_id``::

    source = CaptureSource(store, rollout_ids, chunk_size=8)
    pipe = Pipeline(source).pack_flat(4096, pad_token_id=0).batch(8)

Determinism: the row order is the given order (or a keyed shuffle with ``shuffle_seed``); chunk
``g`` holds rows ``[g*chunk_size, (g+1)*chunk_size)`` and goes to lane ``g % L``. A lane's state
is the number of its chunks generated, so a pipeline checkpoint says exactly which rollouts
are delivered: :meth:`CaptureSource.retire_consumed` drops (conditionally, with the consumed
``(snapshot_id, version)``) only those, and only when you call it, i.e. after you have made the
checkpoint durable. To resume after retiring, rebuild the source with
:meth:`CaptureSource.from_manifest` (retired rollouts become placeholders that are never read
again because the checkpoint never regenerates their chunks).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Coroutine, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from zephon.capture.builder import RolloutBuild, build_rollout
from zephon.capture.protocols import RolloutRetiredError
from zephon.checkpoints import parse_checkpoint
from zephon.errors import CheckpointError, ConfigError, DataError
from zephon.io import Dataset, Shard
from zephon.work import WorkChunk, WorkSource

if TYPE_CHECKING:
    from zephon.io import Row

__all__ = ["CaptureSource", "RetirementReport", "TrajectoryShard"]

T = TypeVar("T")
MANIFEST_FORMAT = "zephon.capture-source"
STATE_VERSION = 1


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run a store coroutine from sync code (in a helper thread if a loop is running here)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


def _open(store: Any) -> Any:
    if isinstance(store, str):
        from zephon.capture.stores import open_store

        return open_store(store)
    return store


@dataclass(frozen=True)
class _Row:
    """One trainable rollout: where it came from and (unless retired) its trajectory."""

    rollout_id: str
    snapshot_id: str
    version: int
    tokens: int
    payload: dict[str, Any] | None  # None: retired before this source was rebuilt
    call_ids: tuple[str, ...] = ()  # the captured calls the trajectory is made of


class TrajectoryShard(Shard):
    """The built trajectories of a :class:`CaptureSource`, one row per trainable rollout."""

    def __init__(self, rows: Sequence[_Row], location: str = "<capture>") -> None:
        self._rows = list(rows)
        self._location = location

    @property
    def location(self) -> str:
        return self._location

    def __len__(self) -> int:
        return len(self._rows)

    def read(self, indices: Sequence[int]) -> list[Row]:
        out: list[Row] = []
        for i in indices:
            row = self._rows[i]
            if row.payload is None:
                raise DataError(
                    f"{self._location} row {i}: rollout {row.rollout_id!r} was retired after a "
                    "checkpoint covered it and cannot be read again; restore that checkpoint "
                    "(its chunks are never regenerated) instead of re-reading from the start"
                )
            out.append(dict(row.payload))
        return out

    def provenance_of(self, index: int) -> dict[str, Any]:
        """What provenance reports about row ``index``: its rollout and captured calls."""
        row = self._rows[index]
        return {"rollout_id": row.rollout_id, "call_ids": list(row.call_ids)}


@dataclass
class RetirementReport:
    """What :meth:`CaptureSource.retire_consumed` did, by rollout id."""

    dropped: list[str] = field(default_factory=list)
    stale: list[str] = field(default_factory=list)  # changed after freeze: evidence kept
    pending: int = 0  # trainable rollouts the checkpoint does not cover yet


class _Core:
    """What every lane clone shares: the rows, their order, the dataset and the builds."""

    def __init__(
        self,
        store: Any,
        rows: list[_Row],
        builds: dict[str, RolloutBuild],
        masked: list[str],
        chunk_size: int,
        shuffle_seed: int | None,
        name: str,
    ) -> None:
        if chunk_size < 1:
            raise ConfigError(f"CaptureSource: chunk_size must be >= 1, got {chunk_size}")
        self.store = store  # the store object passed in, or its URL
        self.rows = rows
        self.builds = builds
        self.masked = masked
        self.chunk_size = chunk_size
        self.shuffle_seed = shuffle_seed
        order = list(range(len(rows)))
        if shuffle_seed is not None:
            order.sort(
                key=lambda i: hashlib.sha256(
                    f"{shuffle_seed}:{rows[i].rollout_id}".encode()
                ).digest()
            )
        self.order = np.asarray(order, dtype=np.int64)
        self.dataset = Dataset(name, [TrajectoryShard(rows, f"<capture:{name}>")])
        ident = [[r.rollout_id, r.snapshot_id, r.version] for r in rows]
        blob = json.dumps([ident, chunk_size, shuffle_seed, name]).encode()
        self.fingerprint = hashlib.sha256(blob).hexdigest()[:32]
        self.retired: set[str] = {r.rollout_id for r in rows if r.payload is None}

    def rows_of_chunk(self, g: int) -> np.ndarray:
        cs = self.chunk_size
        return self.order[g * cs : (g + 1) * cs]


async def _freeze_and_build(
    store: Any,
    rollout_ids: Sequence[str],
    terminals: Mapping[str, Mapping[str, Any]],
    expected: Mapping[str, tuple[str, int]] | None,
) -> tuple[list[_Row], dict[str, RolloutBuild], list[str]]:
    rows: list[_Row] = []
    builds: dict[str, RolloutBuild] = {}
    masked: list[str] = []
    for rid in rollout_ids:
        want = expected.get(rid) if expected is not None else None
        try:
            snapshot = await store.freeze(rid)
        except RolloutRetiredError:
            if want is None:
                raise
            rows.append(_Row(rid, want[0], want[1], 0, None))
            continue
        if want is not None and (snapshot.snapshot_id, snapshot.version) != want:
            raise CheckpointError(
                f"rollout {rid!r} changed since the manifest was taken (snapshot "
                f"{want[0]}/v{want[1]}, now {snapshot.snapshot_id}/v{snapshot.version}, e.g. a "
                "late mark_incomplete); it can no longer be delivered as recorded"
            )
        built = build_rollout(snapshot, **dict(terminals.get(rid, {})))
        builds[rid] = built
        if built.trajectory is None:
            masked.append(rid)
            continue
        for t in built.trajectories:  # one per sample when the rollout holds a group
            rows.append(
                _Row(rid, snapshot.snapshot_id, snapshot.version, len(t), t.to_row(), t.call_ids)
            )
    return rows, builds, masked


class CaptureSource(WorkSource):
    """Frozen, built rollouts of any capture store as a deterministic, resumable work source.

    Args:
        store: a store object (``open_store(url)``) or its URL.
        rollout_ids: the rollouts to train on, in delivery order; masked ones are left out
            (see :attr:`masked` and :attr:`builds` for why) and keep their evidence.
        chunk_size: rollouts per work chunk.
        shuffle_seed: deliver in a keyed pseudo-random order instead of the given one.
        terminals: per rollout, keyword arguments for :func:`build_rollout`
            (``terminal_call_id``, ``terminal_response_id``, ``response``).
        name: the dataset name (part of the pipeline configuration).
    """

    def __init__(
        self,
        store: Any,
        rollout_ids: Sequence[str],
        *,
        chunk_size: int = 8,
        shuffle_seed: int | None = None,
        terminals: Mapping[str, Mapping[str, Any]] | None = None,
        name: str = "capture",
        _expected: Mapping[str, tuple[str, int]] | None = None,
    ) -> None:
        ids = list(rollout_ids)
        if len(set(ids)) != len(ids):
            dupes = sorted({r for r in ids if ids.count(r) > 1})
            raise ConfigError(f"CaptureSource: rollout ids repeat: {dupes}")
        client = _open(store)
        try:
            rows, builds, masked = run_sync(
                _freeze_and_build(client, ids, terminals or {}, _expected)
            )
        finally:
            if client is not store:  # opened from the URL here: retiring reopens it
                run_sync(client.close())
        self._core = _Core(store, rows, builds, masked, chunk_size, shuffle_seed, name)
        self._lane, self._lanes, self._next = 0, 1, 0

    # -- introspection ----------------------------------------------------------------------

    @property
    def fingerprint(self) -> str:
        """Identifies the rows (ids, snapshots, versions) and the order; part of checkpoints."""
        return self._core.fingerprint

    @property
    def builds(self) -> Mapping[str, RolloutBuild]:
        """Every build by rollout id, masked ones included (notes, verdicts, reasons)."""
        return self._core.builds

    @property
    def masked(self) -> list[str]:
        return list(self._core.masked)

    @property
    def rollout_ids(self) -> list[str]:
        """The trainable rollouts, in row order (one row each; a rollout holding a group of
        samples has a row per sample and is listed once)."""
        return list(dict.fromkeys(r.rollout_id for r in self._core.rows))

    def manifest(self) -> dict[str, Any]:
        """JSON-safe description to rebuild this exact source (:meth:`from_manifest`)."""
        core = self._core
        return {
            "format": MANIFEST_FORMAT,
            "version": 1,
            "name": core.dataset.name,
            "chunk_size": core.chunk_size,
            "shuffle_seed": core.shuffle_seed,
            "rows": [[r.rollout_id, r.snapshot_id, r.version] for r in core.rows],
        }

    @classmethod
    def from_manifest(cls, store: Any, manifest: Mapping[str, Any]) -> CaptureSource:
        """The same source again (e.g. to restore a checkpoint after retiring rollouts)."""
        if manifest.get("format") != MANIFEST_FORMAT or manifest.get("version") != 1:
            raise CheckpointError(
                f"not a CaptureSource manifest (format={manifest.get('format')!r}, "
                f"version={manifest.get('version')!r})"
            )
        rows = [(str(r), str(s), int(v)) for r, s, v in manifest["rows"]]
        source = cls(
            store,
            [r for r, _, _ in rows],
            chunk_size=int(manifest["chunk_size"]),
            shuffle_seed=manifest.get("shuffle_seed"),
            name=str(manifest["name"]),
            _expected={r: (s, v) for r, s, v in rows},
        )
        if source.rollout_ids != [r for r, _, _ in rows]:
            lost = sorted(set(r for r, _, _ in rows) - set(source.rollout_ids))
            raise CheckpointError(f"rollouts {lost} of the manifest are no longer trainable")
        return source

    # -- WorkSource -------------------------------------------------------------------------

    @property
    def datasets(self) -> Sequence[Dataset]:
        return [self._core.dataset]

    def next_chunk(self) -> WorkChunk | None:
        g = self._next * self._lanes + self._lane
        rows = self._core.rows_of_chunk(g)
        if len(rows) == 0:
            return None
        self._next += 1
        pointers = np.zeros((len(rows), 3), dtype=np.int64)
        pointers[:, 2] = rows
        return WorkChunk(pointers, global_index=g)

    def state_dict(self) -> dict[str, Any]:
        return {"version": STATE_VERSION, "next": self._next}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if state.get("version") != STATE_VERSION or not isinstance(state.get("next"), int):
            raise CheckpointError(f"CaptureSource cannot load state {dict(state)!r}")
        self._next = int(state["next"])

    def clone_for_lane(self, lane_id: int, canonical_replicas: int) -> CaptureSource:
        if not 0 <= lane_id < canonical_replicas:
            raise ConfigError(f"lane {lane_id} is outside 0..{canonical_replicas - 1}")
        clone = object.__new__(CaptureSource)
        clone._core = self._core
        clone._lane, clone._lanes, clone._next = lane_id, canonical_replicas, 0
        return clone

    def chunk_size_hint(self) -> int | None:
        return self._core.chunk_size

    # -- retirement -------------------------------------------------------------------------

    def covered(self, checkpoint: Mapping[str, Any]) -> list[str]:
        """Rollouts whose every sample the checkpoint counts as delivered (row order)."""
        parsed = parse_checkpoint(checkpoint)
        fp = parsed.source.fingerprint
        if fp != self.fingerprint:
            raise CheckpointError(
                f"checkpoint was taken over another source (fingerprint {fp!r}, this source "
                f"{self.fingerprint!r}); retire with the CaptureSource that produced it"
            )
        lanes, core = parsed.canonical_replicas, self._core
        total_chunks = -(-len(core.rows) // core.chunk_size)
        rows: list[int] = []
        for lane, lc in parsed.lanes.items():
            if lc.done:
                generated = total_chunks
            elif lc.source_state is not None:
                generated = int(lc.source_state.get("next", 0))
            else:
                generated = 0
            for j in range(generated):
                rows += core.rows_of_chunk(j * lanes + lane).tolist()
        # A rollout with a group of samples has a row per sample: covered once all are.
        delivered = set(rows)
        pending = {r.rollout_id for i, r in enumerate(core.rows) if i not in delivered}
        ids = dict.fromkeys(core.rows[i].rollout_id for i in sorted(delivered))
        return [rid for rid in ids if rid not in pending]

    async def aretire_consumed(self, checkpoint: Mapping[str, Any]) -> RetirementReport:
        """Drop every covered rollout with its consumed snapshot (call after the checkpoint
        is durable). A rollout that changed since its freeze is not dropped (``stale``)."""
        core = self._core
        report = RetirementReport()
        covered = self.covered(checkpoint)
        by_id = {r.rollout_id: r for r in core.rows}
        store = _open(core.store)  # a URL's client is opened for this call and closed after
        try:
            for rid in covered:
                if rid in core.retired:
                    continue
                row = by_id[rid]
                ok = await store.drop(rid, snapshot_id=row.snapshot_id, version=row.version)
                if ok:
                    core.retired.add(rid)
                    report.dropped.append(rid)
                else:
                    report.stale.append(rid)
        finally:
            if store is not core.store:
                await store.close()
        rollouts = {r.rollout_id for r in core.rows}
        report.pending = len(rollouts) - len(core.retired) - len(report.stale)
        return report

    def retire_consumed(self, checkpoint: Mapping[str, Any]) -> RetirementReport:
        """Sync :meth:`aretire_consumed`."""
        return run_sync(self.aretire_consumed(checkpoint))
