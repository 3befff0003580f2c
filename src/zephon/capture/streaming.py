"""A streaming capture source: tails the prompt ledger and serves admitted groups to a pipeline.

Why a log of admissions: which groups are complete when the trainer asks depends on the
clock, so a replay cannot re-decide them. Each admission is therefore appended, durably and
before it is served, to a second ledger stream ``<stream>.admitted`` of the same store (one
entry per admission: the prompt's position and the attempts of its scored members). Admission
``g`` is chunk ``g`` of the work source; its state is how many chunks it generated, so a
pipeline checkpoint names exactly which groups were served in which order, and a restore
(in the same process or after a SIGKILL) replays them from the log, then admits new ones.

The staleness bound is exact: admission ``g`` is trained at weight version
``first_version + g // groups_per_step`` (the trainer steps once per ``groups_per_step``
groups it reads), so :meth:`StreamLedger.admit` is asked at that version, whatever the
pipeline read ahead. When an incomplete group has reached the bound, the source waits for it
(pacing generation), never discards it; only an optional per-member wall-clock cap
(``cap_s``) filters a stuck rollout, and that decision is in the ledger too.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from zephon.capture._oldest_version import OldestVersions
from zephon.capture.builder import build_rollout
from zephon.capture.dataset import run_sync
from zephon.capture.group_ops import store_at
from zephon.capture.ledger import (
    MAX_STREAM_CHARS,
    LedgerTransitionError,
    MemberRef,
    PromptRow,
    PromptState,
    StreamLedger,
    admit_rows,
    member_rollout_id,
    validate_stream,
)
from zephon.capture.protocols import PromptLedger, view_stream
from zephon.capture.store_handle import StoreHandle
from zephon.errors import CheckpointError, ConfigError, DataError, ZephonError
from zephon.io import Dataset, Shard
from zephon.pipeline import Pipeline
from zephon.work import WorkChunk, WorkSource

__all__ = ["LOG_SUFFIX", "StreamingCaptureSource"]

LOG_SUFFIX = ".admitted"
STATE_VERSION = 1
_ENDLESS = 2**62  # the shard's nominal length: admissions are numbered as they happen


class _Core:
    """What every lane clone shares: the store, the admission log and the built groups.

    A core that does not ``admit`` is a worker process's: it only reads admissions the
    source's process logged (durably, before handing their chunks out) and builds them."""

    def __init__(
        self, handle: StoreHandle, stream: str, options: dict[str, Any], *, admits: bool = True
    ) -> None:
        self.handle = handle
        self.url = handle.url
        self.admits = admits
        self.stream = stream
        self.log_stream = stream + LOG_SUFFIX
        self.opts = options
        self.lock = threading.Lock()
        self.log: list[dict[str, Any]] = []
        self.taken: set[int] = set()  # positions admitted (in the log)
        self.loaded = False
        self.records: dict[int, dict[str, Any]] = {}
        self.versions = OldestVersions(None)  # made for the open client by oldest_versions()
        self.timings = {"ledger_s": 0.0, "engine_wait_s": 0.0, "build_s": 0.0}
        self.timings_lock = threading.Lock()
        self.interrupted = threading.Event()  # the run is closing: stop waiting for generation
        self.dataset = Dataset(options["name"], [_GroupShard(self)])

    @property
    def store(self) -> Any:
        """The store client (reopened from the URL after :meth:`close`)."""
        return self.handle.get()

    def oldest_versions(self) -> OldestVersions:
        """The oldest-version cache over the client open now (a reopened client starts one)."""
        store = self.store
        if self.versions.store is not store:
            self.versions = OldestVersions(store)
        return self.versions

    def close(self) -> None:
        """Close the client opened from the URL; the log and built groups stay. A wait for
        generation still running is woken first (it holds the lock: see :meth:`interrupt`)."""
        self.interrupt()
        with self.lock:
            self.handle.close()
            self.interrupted.clear()  # a later iteration admits again

    def interrupt(self) -> None:
        """Wake an admission that waits for generation: it raises, and the lock is free."""
        self.interrupted.set()

    # -- the admission log -----------------------------------------------------------------

    def entry(self, g: int) -> dict[str, Any] | None:
        """Admission ``g`` (from the log, else decided now); None once the stream ended."""
        with self.lock:
            if not self.loaded:
                self._reload()
                self.loaded = True
            if not self.admits and len(self.log) <= g:
                self._reload()  # logged by the source's process after this one last read
            while len(self.log) <= g:
                if not self.admits or not self._admit_next():
                    return None
            return self.log[g]

    def _reload(self) -> None:
        ledger = run_sync(self.store.stream_ledger(self.log_stream))
        self.log = [dict(row.payload) for row in ledger.prompts]
        self.taken = {int(e["position"]) for e in self.log}

    def _admit_next(self) -> bool:
        """Decide admission ``len(self.log)``. Each look is a view of the store's own ledger
        (:func:`~zephon.capture.protocols.view_stream`): the store reads only the moves since its
        last look and the view only the prompts in flight, so an admission costs O(new moves
        + groups in flight)."""
        opts = self.opts
        while True:
            g = len(self.log)
            version = opts["first_version"] + g // opts["groups_per_step"]
            began = time.perf_counter()
            rows, overdue, ended = run_sync(view_stream(self.store, self.stream, self._look))
            if overdue:
                self._filter_overdue(overdue)
            elif (chosen := self._choose(rows, version)) is not None:
                appended = self._append(g, *chosen, version)
                self._count("ledger_s", time.perf_counter() - began)
                return appended
            self._count("ledger_s", time.perf_counter() - began)
            if ended:
                return False
            if not overdue:
                began = time.perf_counter()
                closing = self.interrupted.wait(opts["poll_s"])  # generation still runs: poll
                self._count("engine_wait_s", time.perf_counter() - began)
                if closing:
                    raise ZephonError(
                        f"stream {self.stream!r}: the run closed while admission {g} waited "
                        "for generation; nothing was admitted"
                    )

    def _count(self, what: str, seconds: float) -> None:
        with self.timings_lock:
            self.timings[what] += seconds

    def _look(self, ledger: StreamLedger) -> _Look:
        """The prompts in flight not admitted yet, members overdue, and whether the pass
        ended: what one poll reads of the store's ledger (rows are frozen: safe to keep)."""
        opts, taken = self.opts, self.taken
        cap = opts["cap_s"]
        overdue = ledger.overdue(time.time(), cap) if cap is not None else []
        rows = [r for r in ledger.pending() if r.position not in taken]
        total = opts["prompts"]
        ended = total is not None and ledger.next_position >= total
        ended = ended and all(r.position >= total for r in rows)
        return rows, overdue, ended

    def _choose(self, rows: list[PromptRow], version: int) -> tuple[PromptRow, int] | None:
        """The group to admit at ``version`` and its rollouts' oldest weight version: the
        staleness bound counts from the oldest version a finished member was generated with."""
        aged = run_sync(self.oldest_versions().rows(rows))
        admission = admit_rows(aged, version, self.opts["max_staleness"], 1)
        if not admission.groups:
            return None
        oldest = admission.groups[0]
        issued = next(r for r in rows if r.position == oldest.position)
        return issued, oldest.weight_version

    def _filter_overdue(self, refs: list[MemberRef]) -> None:
        reason = f"over the {self.opts['cap_s']:g} s cap"
        for ref in refs:  # one by one: a member that moved meanwhile is left alone
            try:
                run_sync(self.store.advance(self.stream, [ref], "filtered", reason=reason))
            except LedgerTransitionError:
                continue

    def _append(self, g: int, row: PromptRow, oldest: int, version: int) -> bool:
        entry = {
            "position": row.position,
            "prompt_key": row.prompt_key,
            "weight_version": row.weight_version,
            "oldest_version": oldest,
            "trained_version": version,
            "members": [[m.index, m.attempt] for m in row.members if m.state is PromptState.SCORED],
        }
        try:
            run_sync(
                self.store.issue_prompt(
                    self.log_stream, g, prompt_key=f"p{row.position}", payload=entry
                )
            )
        except LedgerTransitionError:
            self._reload()  # another source admitted g first: serve what it logged
            return len(self.log) > g
        self.log.append(entry)
        self.taken.add(row.position)
        return True

    # -- the served records ----------------------------------------------------------------

    def record(self, g: int) -> dict[str, Any]:
        """The payload of admission ``g``: the group and one built trajectory per sample."""
        cached = self.records.get(g)
        if cached is not None:
            return cached
        # A served admission is already logged: read it without the lock, which the feeder
        # holds while it waits for the next group.
        log = self.log
        entry = log[g] if g < len(log) else self.entry(g)
        if entry is None:
            raise DataError(f"{self.log_stream}: admission {g} was never made")
        began = time.perf_counter()
        record = run_sync(self._build(entry, g))
        self._count("build_s", time.perf_counter() - began)
        self.records[g] = record
        return record

    async def _build(self, entry: Mapping[str, Any], g: int) -> dict[str, Any]:
        members: list[dict[str, Any]] = []
        masked: list[str] = []
        position = int(entry["position"])
        for index, attempt in entry["members"]:
            rid = member_rollout_id(self.stream, position, index, attempt)
            built = build_rollout(await self.store.freeze(rid))
            reward = await self._reward(rid)
            if built.trajectory is None:
                masked.append(rid)  # nothing trainable: built.notes say why
            for t in built.trajectories:
                row = t.to_row()
                members.append({**row, "index": index, "attempt": attempt, "reward": reward})
        return {
            "stream": self.stream,
            "admission": g,
            "position": position,
            "prompt_key": entry["prompt_key"],
            "weight_version": entry["weight_version"],
            "oldest_version": entry.get("oldest_version", entry["weight_version"]),
            "trained_version": entry["trained_version"],
            "members": members,
            "masked": masked,
        }

    async def _reward(self, rid: str) -> float | None:
        scores = await self.store.scores(rid)
        verifier = self.opts["verifier"]
        if verifier is None:
            if len(scores) > 1:
                names = sorted(s.verifier for s in scores)
                raise DataError(
                    f"rollout {rid!r} has scores of {names}: pass verifier= to "
                    "StreamingCaptureSource to pick the reward"
                )
            return scores[0].reward if scores else None
        return next((s.reward for s in scores if s.verifier == verifier), None)


_Look = tuple[list[PromptRow], list[MemberRef], bool]
"""One look at the ledger: the group to admit (if any), members over the cap, and whether the
stream ended (every prompt issued and each served or done)."""


class _GroupShard(Shard):
    """Admission ``g`` is row ``g``; rows are built on first read (then kept)."""

    def __init__(self, core: _Core) -> None:
        self._core = core

    @property
    def location(self) -> str:
        return f"<stream:{self._core.stream}>"

    def __len__(self) -> int:
        return _ENDLESS

    def read(self, indices: Sequence[int]) -> list[dict[str, Any]]:
        return [dict(self._core.record(int(i))) for i in indices]

    def release(self) -> None:
        """Close the store client opened from the URL (the reader was torn down)."""
        self._core.close()

    def __deepcopy__(self, memo: dict[int, Any]) -> _GroupShard:
        """Worker copies share the core (its log and built groups)."""
        return self

    def __reduce__(self) -> tuple[Any, tuple[str, str, dict[str, Any]]]:
        """Sent to a worker process (``runner="process"``): it opens its own client of the
        store from its URL and reads the logged admissions there."""
        core = self._core
        if core.url is None:
            raise TypeError(
                f"StreamingCaptureSource of stream {core.stream!r} was given a store object, "
                "which worker processes cannot share: pass the store's URL instead"
            )
        if not core.store.is_process_shared():
            raise TypeError(
                f"StreamingCaptureSource: {core.store.describe()} lives in one process; use "
                "a file, sqlite or postgresql store with runner='process'"
            )
        return _reader_shard, (core.url, core.stream, core.opts)


def _reader_shard(url: str, stream: str, options: dict[str, Any]) -> _GroupShard:
    """A worker process's shard: a reading core over its own client of the store at ``url``."""
    core = _Core(StoreHandle(url=url), stream, options, admits=False)
    return _GroupShard(core)


def _check(name: str, value: object, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ConfigError(f"StreamingCaptureSource {name} is {value!r}: use an int >= {low}")
    return value


class StreamingCaptureSource(WorkSource):
    """Admitted groups of a prompt-ledger stream as a replayable pipeline work source.

    Yields one record per admitted group, oldest first: ``position``, ``prompt_key``,
    ``weight_version`` (at issue), ``trained_version`` (the version it is admitted for),
    ``admission`` (its number) and ``members``, one per built trajectory of a scored member:
    ``input_ids``, ``loss_mask``, ``logprobs``, ``rollout_id``, ``index``, ``attempt``,
    ``reward``; ``masked`` lists the scored members whose build has nothing to train.

    Args:
        store: a store keeping prompt ledgers and scores, or its URL (or a file store's
            folder); with ``runner="process"`` give the URL: worker processes build the
            groups over clients of their own.
        stream: the stream a :class:`~zephon.capture.rl.PromptSource` issues into.
        groups_per_step: groups the trainer reads per optimizer step.
        max_staleness: ``k``: a group issued at version ``v`` is trained by ``v + k``.
        prompts: how many prompts the stream will hold (the source ends once each is
            served or filtered); None: endless.
        first_version: the weight version of the first step.
        verifier: the score whose reward is served (None: the rollout's only score).
        cap_s: filter members still generating after this many seconds (None: wait).
        poll_s: how often to read the ledger while waiting for a group.
    """

    def __init__(
        self,
        store: Any,
        stream: str,
        *,
        groups_per_step: int,
        max_staleness: int,
        prompts: int | None = None,
        first_version: int = 0,
        verifier: str | None = None,
        cap_s: float | None = None,
        poll_s: float = 0.01,
        name: str = "stream",
    ) -> None:
        if len(validate_stream(stream)) > MAX_STREAM_CHARS - len(LOG_SUFFIX):
            raise ConfigError(
                f"stream {stream!r} is too long for its admission log {stream + LOG_SUFFIX!r}: "
                f"use at most {MAX_STREAM_CHARS - len(LOG_SUFFIX)} characters"
            )
        url = store_at(store) if isinstance(store, str) else None
        handle = StoreHandle(url=url) if url is not None else StoreHandle(store=store)
        if not isinstance(opened := handle.get(), PromptLedger):
            handle.close()
            raise TypeError(
                f"{type(opened).__name__} keeps no prompt ledger: open a zephon capture store "
                "with open_store(url)"
            )
        if cap_s is not None and not cap_s > 0:
            raise ConfigError(f"StreamingCaptureSource cap_s is {cap_s!r}: use seconds > 0")
        options = {
            "groups_per_step": _check("groups_per_step", groups_per_step, 1),
            "max_staleness": _check("max_staleness", max_staleness, 0),
            "prompts": None if prompts is None else _check("prompts", prompts, 0),
            "first_version": _check("first_version", first_version, 0),
            "verifier": verifier,
            "cap_s": cap_s,
            "poll_s": float(poll_s),
            "name": name,
        }
        self._core = _Core(handle, stream, options)
        self._lane, self._lanes, self._next = 0, 1, 0

    def pipeline(self) -> Pipeline:
        """A pipeline over this source that hands each group on as soon as it is admitted
        (a flush after every chunk): without it the engine's micro-batches hold groups back,
        and a trainer that paces generation would wait for groups it never receives."""
        return Pipeline(self).options(flush_every_k_chunks=1)

    @property
    def timings(self) -> dict[str, float]:
        """Seconds this source spent so far: ``ledger_s`` reading the ledger and writing the
        admission log, ``engine_wait_s`` waiting for generation (no complete group yet),
        ``build_s`` reading and building the admitted groups' captures. They run on the
        pipeline's source thread, so a trainer waits on them only when nothing is ready."""
        with self._core.timings_lock:
            return dict(self._core.timings)

    @property
    def admissions(self) -> list[dict[str, Any]]:
        """The admission log read or written so far (position, members, versions), in order."""
        # without the core's lock: the source thread holds it while it waits for generation,
        # and a list is appended to or replaced whole, so a copy of it is consistent
        return [dict(e) for e in list(self._core.log)]

    # -- WorkSource -------------------------------------------------------------------------

    @property
    def datasets(self) -> Sequence[Dataset]:
        return [self._core.dataset]

    def next_chunk(self) -> WorkChunk | None:
        g = self._next * self._lanes + self._lane
        if self._core.entry(g) is None:
            return None
        self._next += 1
        return WorkChunk(np.asarray([[0, 0, g]], dtype=np.int64), global_index=g)

    def state_dict(self) -> dict[str, Any]:
        return {"version": STATE_VERSION, "next": self._next}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if state.get("version") != STATE_VERSION or not isinstance(state.get("next"), int):
            raise CheckpointError(f"StreamingCaptureSource cannot load state {dict(state)!r}")
        self._next = int(state["next"])

    def clone_for_lane(self, lane_id: int, canonical_replicas: int) -> StreamingCaptureSource:
        if not 0 <= lane_id < canonical_replicas:
            raise ConfigError(f"lane {lane_id} is outside 0..{canonical_replicas - 1}")
        clone = object.__new__(StreamingCaptureSource)
        clone._core = self._core
        clone._lane, clone._lanes, clone._next = lane_id, canonical_replicas, 0
        return clone

    def release(self) -> None:
        """Close the store client opened from the URL (the iteration ended)."""
        self._core.close()

    def interrupt(self) -> None:
        """Wake the source thread if it waits for generation (the run is closing)."""
        self._core.interrupt()

    def chunk_size_hint(self) -> int | None:
        return 1
