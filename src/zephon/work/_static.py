"""StaticMixtureWorkSource: a fixed-weight mixture of datasets dealt to lanes in chunks.

The *global* chunk sequence ``g = 0, 1, 2, ...`` is a pure function of the configuration: chunk
``g`` takes per-dataset quotas (:mod:`zephon.work._mixture`) from each dataset's read order
(:mod:`zephon.work._order`) and interleaves them smoothly. Chunks are dealt to
``canonical_replicas`` lanes one per lane per block of ``L`` consecutive chunks (``permute``: a
keyed permutation per block; ``modulo``: ``g % L``), so lane ``l``'s ``k``-th chunk is
``k*L + j_l(k)`` in closed form. A lane clone advances the source state over the other lanes' chunks
with integer arithmetic only (batched when no dataset can run out in between) and builds
pointers for its own chunks alone. Nothing depends on the number of data-parallel ranks.

End of data (see docs/work-sources.md): ``stop`` ends the source in the chunk where the dataset
runs out; ``repeat`` starts a new (reshuffled) pass, up to ``max_repeats`` extra passes, then
ends the source like ``stop``; ``redistribute`` retires the dataset and renormalises the other
weights from the next chunk on. The chunk in which any of this happens is emitted even though
it is short, so no sample of a pass is lost.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal

import msgspec
import numpy as np
import xxhash

from zephon.errors import CheckpointError, ConfigError, DataError
from zephon.work._base import WorkChunk, WorkSource
from zephon.work._calibration import TokenCalibration
from zephon.work._hashing import TAG_EPOCH, TAG_LANES, mix64, permutation
from zephon.work._mixture import MixtureSpec, allocate, can_batch
from zephon.work._order import DatasetOrder
from zephon.work._schedule import (
    MixtureSchedule,
    check_past,
    needs_measuring,
    resolve,
    token_estimates,
)

if TYPE_CHECKING:
    from zephon.io import Dataset

ExhaustedPolicy = Literal["stop", "repeat", "redistribute"]
LaneAssignment = Literal["permute", "modulo"]
STATE_VERSION = 1
_POLICIES = ("stop", "repeat", "redistribute")


#: Rows per dataset a token mixture is measured on when nothing else is given: the share error
#: is about the relative standard error of each mean (length CV / sqrt(rows)), so larger than
#: TokenCalibration's default; datasets up to this size are measured exactly.
MEASURE_SAMPLES = 4096


class _Unset:
    def __repr__(self) -> str:
        return "<unset>"


_UNSET: Any = _Unset()


def _per_dataset(value: Any, names: Sequence[str], option: str, default: Any) -> list[Any]:
    """Expand a scalar-or-dict option to one value per dataset; unknown keys are errors."""
    if isinstance(value, Mapping):
        unknown = [k for k in value if k not in names]
        if unknown:
            raise ConfigError(
                f"{option} names unknown dataset(s) {unknown}; datasets are {list(names)}"
            )
        return [value.get(n, default) for n in names]
    return [default if value is None else value for _ in names]


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _checked_datasets(datasets: Sequence[Dataset]) -> list[Dataset]:
    """At least one dataset, unique names, none empty."""
    out = list(datasets)
    if not out:
        raise ConfigError("StaticMixtureWorkSource needs at least one dataset")
    names = [d.name for d in out]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ConfigError(f"dataset names must be unique; repeated: {dupes}")
    for d in out:
        if d.total() == 0:
            raise ConfigError(f"dataset {d.name!r} has no rows; remove it from the source")
    return out


def _checked_policies(value: Any, names: Sequence[str]) -> tuple[str, ...]:
    policies = _per_dataset(value, names, "exhausted_policy", "repeat")
    for n, p in zip(names, policies, strict=True):
        if p not in _POLICIES:
            raise ConfigError(f"exhausted_policy for {n!r} must be one of {_POLICIES}, got {p!r}")
    return tuple(policies)


def _checked_repeats(value: Any, names: Sequence[str]) -> tuple[int | None, ...]:
    repeats = _per_dataset(value, names, "max_repeats", None)
    for n, r in zip(names, repeats, strict=True):
        if r is not None and not (_is_int(r) and r >= 0):
            raise ConfigError(f"max_repeats for {n!r} must be an integer >= 0, got {r!r}")
    return tuple(repeats)


def _checked_passes(
    value: Any, names: Sequence[str], policies: Sequence[str], repeats: Sequence[int | None]
) -> int | None:
    """``stop_after_passes``: a positive int or None, and only with plain ``repeat``."""
    if value is None:
        return None
    if not (_is_int(value) and value >= 1):
        raise ConfigError(f"stop_after_passes must be a positive integer or None, got {value!r}")
    bad = [
        n
        for n, p, r in zip(names, policies, repeats, strict=True)
        if p != "repeat" or r is not None
    ]
    if bad:
        raise ConfigError(
            f"stop_after_passes cannot be combined with 'stop'/'redistribute' policies "
            f"or max_repeats (datasets {bad}); use one or the other"
        )
    return int(value)


def _block_sizes(
    value: int | str | None, datasets: Sequence[Dataset], totals: Sequence[int]
) -> list[int | None]:
    """The shuffle block of each dataset's read order (None: no block shuffle)."""
    if value is None:
        return [None] * len(datasets)
    if value == "auto":
        return [8 * max(max(d.counts()) for d in datasets)] * len(datasets)
    if value == "global":
        return list(totals)
    if _is_int(value) and int(value) >= 1:
        return [int(value)] * len(datasets)
    raise ConfigError(
        f"shuffle_block_size must be None, a positive integer, 'auto' or 'global', got {value!r}"
    )


class SourceOptions(msgspec.Struct, frozen=True):
    """The validated options of a :class:`StaticMixtureWorkSource`, one value per dataset
    where an option may differ by dataset. Built once by :meth:`validated`."""

    chunk_size: int
    seed: int
    shuffle_shards: bool
    shuffle_within_shard: bool
    shuffle_block_size: int | str | None
    policies: tuple[str, ...]
    max_repeats: tuple[int | None, ...]
    stop_after_passes: int | None
    lane_assignment: str
    reshuffle_on_repeat: bool

    @classmethod
    def validated(
        cls,
        names: Sequence[str],
        *,
        chunk_size: Any,
        seed: Any,
        shuffle_shards: Any,
        shuffle_within_shard: Any,
        shuffle_block_size: Any,
        exhausted_policy: Any,
        max_repeats: Any,
        stop_after_passes: Any,
        lane_assignment: Any,
        reshuffle_on_repeat: Any,
    ) -> SourceOptions:
        """Check every option (as passed, so any value may arrive from YAML) and resolve the
        per-dataset ones; raise ConfigError naming the option."""
        if not (_is_int(chunk_size) and chunk_size >= 1):
            raise ConfigError(f"chunk_size must be a positive integer, got {chunk_size!r}")
        if not _is_int(seed):
            raise ConfigError(f"seed must be an integer, got {seed!r}")
        if lane_assignment not in ("permute", "modulo"):
            raise ConfigError(
                f"lane_assignment must be 'permute' or 'modulo', got {lane_assignment!r}"
            )
        if stop_after_passes is _UNSET:
            explicit = exhausted_policy is not None or max_repeats is not None
            stop_after_passes = None if explicit else 1
        policies = _checked_policies(exhausted_policy, names)
        repeats = _checked_repeats(max_repeats, names)
        return cls(
            chunk_size=chunk_size,
            seed=seed,
            shuffle_shards=bool(shuffle_shards),
            shuffle_within_shard=bool(shuffle_within_shard),
            shuffle_block_size=shuffle_block_size,
            policies=policies,
            max_repeats=repeats,
            stop_after_passes=_checked_passes(stop_after_passes, names, policies, repeats),
            lane_assignment=lane_assignment,
            reshuffle_on_repeat=bool(reshuffle_on_repeat),
        )


class StaticMixtureWorkSource(WorkSource):
    """Reads ``datasets`` in a fixed mixture, deterministically, in chunks of ``chunk_size``.

    Args:
        datasets: the datasets; a pointer's ``dataset_id`` is the position in this list.
        mixture: target proportions by dataset name; ``None`` weights datasets by their size.
        chunk_size: samples per chunk (only the chunk in which a dataset runs out is shorter).
        seed: drives every shuffle and the chunk->lane deal.
        shuffle_shards: permute the shard order of every pass.
        shuffle_within_shard: permute the rows inside each shard (costs O(shard) memory).
        shuffle_block_size: also permute blocks of this many consecutive positions of a pass
            (``"auto"``: 8 x the largest shard; ``"global"``: the whole dataset, O(N) memory).
        exhausted_policy: ``"stop"``, ``"repeat"`` or ``"redistribute"``, or a dict per
            dataset name (unnamed datasets: ``"repeat"``).
        max_repeats: extra passes a dataset may make (int or dict); then it counts as
            exhausted under ``stop`` semantics (``repeat``) or is retired (``redistribute``).
        stop_after_passes: end once every dataset finished this many passes (faster datasets
            repeat meanwhile). Defaults to 1 when neither ``exhausted_policy`` nor
            ``max_repeats`` is given, else to ``None`` (no such limit).
        lane_assignment: ``"permute"`` (default) or ``"modulo"``.
        reshuffle_on_repeat: a repeated pass gets a fresh order (else it repeats the first).
    """

    def __init__(
        self,
        datasets: Sequence[Dataset],
        mixture: MixtureSpec | MixtureSchedule | Mapping[str, float] | None = None,
        chunk_size: int = 16384,
        seed: int = 0,
        *,
        shuffle_shards: bool = True,
        shuffle_within_shard: bool = False,
        shuffle_block_size: int | Literal["auto", "global"] | None = None,
        exhausted_policy: ExhaustedPolicy | Mapping[str, ExhaustedPolicy] | None = None,
        max_repeats: int | Mapping[str, int] | None = None,
        stop_after_passes: int | None = _UNSET,
        lane_assignment: LaneAssignment = "permute",
        reshuffle_on_repeat: bool = True,
    ) -> None:
        self._datasets = _checked_datasets(datasets)
        names = [d.name for d in self._datasets]
        options = SourceOptions.validated(
            names,
            chunk_size=chunk_size,
            seed=seed,
            shuffle_shards=shuffle_shards,
            shuffle_within_shard=shuffle_within_shard,
            shuffle_block_size=shuffle_block_size,
            exhausted_policy=exhausted_policy,
            max_repeats=max_repeats,
            stop_after_passes=stop_after_passes,
            lane_assignment=lane_assignment,
            reshuffle_on_repeat=reshuffle_on_repeat,
        )
        self._set_mixture(mixture, names)
        if (
            self._schedule is not None
            and options.stop_after_passes is not None
            and 0 in self._phases[-1].weights
        ):
            raise ConfigError(
                "the last phase of the mixture schedule leaves out a dataset, so with "
                "stop_after_passes that dataset would never finish its pass; weight every "
                "dataset in the last phase or pass exhausted_policy=..."
            )
        self._chunk_size = options.chunk_size
        self._seed = options.seed
        self._lane_assignment = options.lane_assignment
        self._policies: list[str] = list(options.policies)
        self._max_repeats: list[int | None] = list(options.max_repeats)
        self._stop_after_passes: int | None = options.stop_after_passes
        self._totals = [d.total() for d in self._datasets]
        self._limits: list[int | None] = [
            None if p == "repeat" and r is None else rows * (1 + (r or 0))
            for p, r, rows in zip(self._policies, self._max_repeats, self._totals, strict=True)
        ]
        self._block_sizes: list[int | None] = _block_sizes(
            options.shuffle_block_size, self._datasets, self._totals
        )
        self._shuffle_block_size = options.shuffle_block_size
        self._shuffle_shards = options.shuffle_shards
        self._shuffle_within_shard = options.shuffle_within_shard
        self._reshuffle = options.reshuffle_on_repeat
        self._epoch = 0
        self._config = self._make_config()
        self._fingerprint = xxhash.xxh64_hexdigest(
            json.dumps(self._config, sort_keys=True).encode()
        )
        self._lane_id: int | None = None
        self._lanes: int | None = None
        self._orders: list[DatasetOrder] | None = None
        self._reset_state()

    # -- configuration ------------------------------------------------------------------------

    def _set_mixture(
        self, mixture: MixtureSpec | MixtureSchedule | Mapping[str, float] | None, names: list[str]
    ) -> None:
        """Validate the mixture and resolve it into phases (token estimates measured here)."""
        if mixture is None:
            mixture = MixtureSpec({d.name: float(d.total()) for d in self._datasets})
        elif not isinstance(mixture, MixtureSpec | MixtureSchedule):
            mixture = MixtureSpec(mixture)
        unknown = [k for k in mixture.names() if k not in names]
        if unknown:
            raise ConfigError(
                f"mixture names unknown dataset(s) {unknown}; the source's datasets are {names}"
            )
        missing = [n for n in names if n not in mixture.names()]
        if missing:
            raise ConfigError(
                f"dataset(s) {missing} have no weight in the mixture; add them to the "
                "MixtureSpec or remove them from the source"
            )
        self._schedule = mixture if isinstance(mixture, MixtureSchedule) else None
        self._mixture = mixture.first() if isinstance(mixture, MixtureSchedule) else mixture
        self._full_mixture = mixture
        self._unmeasured = needs_measuring(mixture)
        self._estimates = token_estimates(mixture, self._datasets)
        # until measure_tokens runs, phases as if every sample weighed one token
        provisional = dict.fromkeys(names, 1.0) if self._unmeasured else self._estimates
        self._phases = resolve(mixture, names, provisional)
        self._weights = self._phases[0].weights

    def needs_measuring(self) -> bool:
        """Whether the mixture is in tokens with nothing measured yet (see measure_tokens)."""
        return self._unmeasured

    def measure_tokens(self, count: Callable[[list[Any]], list[int]]) -> bool:
        """Measure a token mixture's estimates with ``count`` (rows -> the tokens each
        becomes in the pipeline) on :data:`MEASURE_SAMPLES` rows per dataset, picked as
        :class:`TokenCalibration` picks them (every row of a smaller dataset). False when the
        mixture needs no measuring. The estimates join the configuration and its
        fingerprint, as calibrated ones do."""
        if not self._unmeasured:
            return False
        names = [d.name for d in self._datasets]
        try:
            sample = TokenCalibration(samples=MEASURE_SAMPLES)
            self._estimates = sample.calibrate(self._datasets, count)
        except DataError as exc:
            raise ConfigError(
                f"token mixture: measuring tokens per sample through the pipeline failed on a "
                f"sampled row: {exc}; fix the data or the operators, or pass "
                "tokens_per_sample={...} or calibration=TokenCalibration(...) to the MixtureSpec"
            ) from None
        self._unmeasured = False
        self._phases = resolve(self._full_mixture, names, self._estimates)
        self._config = self._make_config()
        self._fingerprint = xxhash.xxh64_hexdigest(
            json.dumps(self._config, sort_keys=True).encode()
        )
        self._reset_state()
        return True

    def _require_estimates(self) -> None:
        if self._unmeasured:
            raise ConfigError(
                "the mixture is in tokens (unit='tokens') but nothing measured its tokens per "
                "sample: add .tokenize(...) to the pipeline (it measures them; so does "
                ".tokenize_chat), or pass "
                "tokens_per_sample={dataset: mean tokens} or calibration=TokenCalibration(...) "
                "to the MixtureSpec"
            )

    def _make_config(self) -> dict[str, Any]:
        return {
            "datasets": [
                {
                    "name": d.name,
                    "rows": d.total(),
                    "shards": d.shard_count(),
                    "counts_hash": xxhash.xxh64_hexdigest(
                        np.asarray(d.counts(), dtype=np.int64).tobytes()
                    ),
                }
                for d in self._datasets
            ],
            "weights": self._phases[0].weights if self._schedule is None else "scheduled",
            **self._mixture_config(),
            "chunk_size": self._chunk_size,
            "seed": self._seed,
            "shuffle_shards": self._shuffle_shards,
            "shuffle_within_shard": self._shuffle_within_shard,
            "shuffle_block_size": self._shuffle_block_size,
            "exhausted_policy": self._policies,
            "max_repeats": self._max_repeats,
            "stop_after_passes": self._stop_after_passes,
            "lane_assignment": self._lane_assignment,
            "reshuffle_on_repeat": self._reshuffle,
            **({"epoch": self._epoch} if self._epoch else {}),  # epoch 0 keeps old fingerprints
        }

    def _mixture_config(self) -> dict[str, Any]:
        """Token estimates and the schedule's unit (absent for a plain sample mixture, so
        such configurations keep their fingerprint). Schedule points stay out: only the
        checkpointed past of a schedule must match (see ``load_state_dict``)."""
        out: dict[str, Any] = {}
        if self._estimates is not None:
            out["unit"] = self._mixture.unit
            out["tokens_per_sample"] = self._estimates
        if self._schedule is not None:
            out["schedule_by"] = self._schedule.by
        return out

    def _reset_state(self) -> None:
        k = len(self._datasets)
        self._phase = 0
        self._weights = self._phases[0].weights
        self._g = 0  # next global chunk index to compute
        self._pos = [0] * k  # samples consumed per dataset (over all passes)
        self._debts = [0] * k  # quota debts in units of 1/sum(active weights)
        self._active = [True] * k
        self._done = False
        self._lane_chunks = 0  # chunks this lane has produced
        self._lane_done = False

    @property
    def datasets(self) -> Sequence[Dataset]:
        return self._datasets

    @property
    def mixture(self) -> MixtureSpec:
        return self._mixture

    @property
    def seed(self) -> int:
        """The seed of every shuffle and deal; operators' seeds are derived from it too."""
        return self._seed

    @property
    def lane(self) -> tuple[int, int] | None:
        """``(lane_id, canonical_replicas)`` for a lane clone, else ``None``."""
        if self._lane_id is None or self._lanes is None:
            return None
        return self._lane_id, self._lanes

    @property
    def fingerprint(self) -> str:
        """A hash of the configuration; a state from another configuration is refused."""
        self._require_estimates()
        return self._fingerprint

    @property
    def total_samples(self) -> int:
        """Rows over all datasets (one pass of each)."""
        return sum(self._totals)

    def chunk_size_hint(self) -> int | None:
        return self._chunk_size

    @property
    def epoch(self) -> int:
        return self._epoch

    def with_epoch(self, epoch: int) -> StaticMixtureWorkSource:
        """This source for pass ``epoch`` over the data: shard, row and block orders of every
        dataset pass and the chunk->lane deal are keyed by the epoch as well (epoch 0 is the
        order the source always had), so each epoch is a new order, the same in every run."""
        if not _is_int(epoch) or epoch < 0:
            raise ConfigError(f"epoch must be an integer >= 0, got {epoch!r}")
        if epoch == self._epoch:
            return self
        other = object.__new__(StaticMixtureWorkSource)
        other.__dict__.update(self.__dict__)
        other._epoch = int(epoch)
        other._orders = None
        other._config = other._make_config()
        other._fingerprint = xxhash.xxh64_hexdigest(
            json.dumps(other._config, sort_keys=True).encode()
        )
        other._reset_state()
        return other

    def clone_for_lane(self, lane_id: int, canonical_replicas: int) -> StaticMixtureWorkSource:
        if isinstance(canonical_replicas, bool) or canonical_replicas < 1:
            raise ConfigError(f"canonical_replicas must be >= 1, got {canonical_replicas}")
        if not 0 <= lane_id < canonical_replicas:
            raise ConfigError(f"lane_id must be in [0, {canonical_replicas}), got {lane_id}")
        clone = object.__new__(StaticMixtureWorkSource)
        clone.__dict__.update(self.__dict__)
        clone._orders = None
        clone._lane_id = lane_id
        clone._lanes = canonical_replicas
        clone._reset_state()
        return clone

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_orders"] = None  # caches are rebuilt on demand
        return state

    # -- the global chunk sequence ------------------------------------------------------------

    def _order(self, k: int) -> DatasetOrder:
        if self._orders is None:
            self._orders = [
                DatasetOrder(
                    d.counts(),
                    seed=self._seed,
                    dataset_id=i,
                    shuffle_shards=self._shuffle_shards,
                    shuffle_within_shard=self._shuffle_within_shard,
                    block_size=self._block_sizes[i],
                    reshuffle_on_repeat=self._reshuffle,
                    epoch=self._epoch,
                )
                for i, d in enumerate(self._datasets)
            ]
        return self._orders[k]

    def _active_weights(self) -> list[int]:
        return [w if a else 0 for w, a in zip(self._weights, self._active, strict=True)]

    def _next_switch(self) -> int | None:
        """Global sample index where the next phase starts (None: no later phase)."""
        nxt = self._phase + 1
        return self._phases[nxt].start if nxt < len(self._phases) else None

    def _enter_phase(self) -> None:
        """Switch to every phase whose start has been reached (fresh apportionment)."""
        here = sum(self._pos)
        while (start := self._next_switch()) is not None and here >= start:
            self._phase += 1
            self._weights = self._phases[self._phase].weights
            self._debts = [0] * len(self._debts)

    def _target(self, weights: list[int]) -> dict[str, float]:
        """The chunk's target mixture in the mixture's unit, over the datasets drawn now."""
        unit = self._phases[self._phase].unit_weights
        live = {d.name: float(w) for d, w in zip(self._datasets, weights, strict=True) if w}
        if self._mixture.unit == "tokens":
            live = {n: unit[n] for n in live}
        total = sum(live.values())
        return {n: w / total for n, w in live.items()}

    def _quotas(self, weights: list[int]) -> tuple[list[int], list[int]]:
        """This chunk's per-dataset quotas (cut at the phase end and at each dataset's limit)
        and the quota debts after it."""
        size = self._chunk_size
        switch = self._next_switch()
        if switch is not None:
            size = min(size, switch - sum(self._pos))  # the chunk ends where the phase does
        quotas, debts = allocate(self._debts, weights, size)
        for k, limit in enumerate(self._limits):
            if limit is not None and self._active[k]:
                quotas[k] = min(quotas[k], limit - self._pos[k])
        return quotas, debts

    def _cap_at_passes(self, quotas: list[int]) -> bool:
        """With ``stop_after_passes``: when this chunk completes every dataset's passes, top up
        the lagging datasets to their last pass (in place) and say it is the final chunk."""
        sap = self._stop_after_passes
        if sap is None or not all(
            p + q >= sap * n for p, q, n in zip(self._pos, quotas, self._totals, strict=True)
        ):
            return False
        for k, n in enumerate(self._totals):
            if self._pos[k] < sap * n:
                quotas[k] = sap * n - self._pos[k]
        return True

    def _step(self, generate: bool) -> WorkChunk | None:
        """Compute global chunk ``self._g``; build its pointers only when ``generate``."""
        self._enter_phase()
        weights = self._active_weights()
        if not any(weights):  # every dataset of this phase has been retired
            self._done = True
            return None
        target = self._target(weights)
        quotas, debts = self._quotas(weights)
        final = self._cap_at_passes(quotas)
        exhausted = [
            k
            for k, limit in enumerate(self._limits)
            if limit is not None and self._active[k] and self._pos[k] + quotas[k] >= limit
        ]
        retire = any(self._policies[k] == "redistribute" for k in exhausted)
        final = final or any(self._policies[k] != "redistribute" for k in exhausted)
        chunk: WorkChunk | None = None
        if generate:
            chunk = self._build(quotas, target, exhausted, final)
        for k, q in enumerate(quotas):
            self._pos[k] += q
        self._debts = debts
        if retire:
            for k in exhausted:
                if self._policies[k] == "redistribute":
                    self._active[k] = False
            self._debts = [0] * len(self._debts)  # a new phase with renormalised weights
            if not any(self._active):
                final = True
        self._g += 1
        self._done = final
        return chunk

    def _build(
        self, quotas: list[int], target: dict[str, float], exhausted: list[int], final: bool
    ) -> WorkChunk:
        parts = []
        for k, q in enumerate(quotas):
            if q > 0:
                shard_ids, rows = self._order(k).pointers(self._pos[k], q)
                parts.append((k, q, shard_ids, rows))
        n = sum(q for _, q, _, _ in parts)
        pointers = np.empty((n, 3), dtype=np.int64)
        if len(parts) == 1:
            k, _, shard_ids, rows = parts[0]
            pointers[:, 0] = k
            pointers[:, 1] = shard_ids
            pointers[:, 2] = rows
        elif parts:
            # Smooth interleave: the j-th of q samples sits at ideal position (j + 1/2) / q; ties
            # keep component order (stable sort over the components concatenated in id order).
            ideal = np.concatenate([(2.0 * np.arange(q) + 1.0) / (2.0 * q) for _, q, _, _ in parts])
            order = np.argsort(ideal, kind="stable")
            pointers[:, 0] = np.repeat([k for k, _, _, _ in parts], [q for _, q, _, _ in parts])[
                order
            ]
            pointers[:, 1] = np.concatenate([s for _, _, s, _ in parts])[order]
            pointers[:, 2] = np.concatenate([r for _, _, _, r in parts])[order]
        names = [self._datasets[k].name for k in exhausted]
        if final:
            names += [
                d.name
                for k, d in enumerate(self._datasets)
                if self._active[k] and k not in exhausted
            ]
        return WorkChunk(
            pointers=pointers,
            global_index=self._g,
            target_mixture=target,
            source_exhausted=tuple(names),
        )

    def _safe_batch(self, n: int) -> int:
        """How many of the next ``n`` chunks can be allocated in one step (no event inside)."""
        weights = self._active_weights()
        if not can_batch(weights, self._chunk_size):
            return 0
        s = sum(weights)
        c = self._chunk_size
        m = n
        switch = self._next_switch()
        if switch is not None:
            m = min(m, (switch - sum(self._pos)) // c)

        def chunks_below(k: int, bound: int) -> int:
            # Largest m with pos + A_k(m) < bound guaranteed, using A_k(m) <= (d + W m C)/S + 1.
            room = (bound - self._pos[k] - 1) * s - self._debts[k]
            return max(0, (room - 1) // (weights[k] * c)) if room > 0 else 0

        for k, limit in enumerate(self._limits):
            if limit is not None and weights[k]:
                m = min(m, chunks_below(k, limit))
        sap = self._stop_after_passes
        if sap is not None:
            m = min(
                m,
                max(
                    (
                        chunks_below(k, sap * n_k)
                        for k, n_k in enumerate(self._totals)
                        if weights[k] and self._pos[k] < sap * n_k
                    ),
                    default=0,
                ),
            )
        return m

    def _skip(self, n: int) -> None:
        """Advance the state over ``n`` chunks without building pointers."""
        while n > 0 and not self._done:
            self._enter_phase()
            m = self._safe_batch(n)
            if m >= 1:
                quotas, self._debts = allocate(
                    self._debts, self._active_weights(), self._chunk_size, m
                )
                for k, q in enumerate(quotas):
                    self._pos[k] += q
                self._g += m
                n -= m
            else:
                self._step(generate=False)
                n -= 1

    def deal(self, block: int, lanes: int) -> np.ndarray:
        """The lanes of global chunks ``block*lanes ... block*lanes + lanes - 1``, in order:
        each block of ``lanes`` consecutive chunks gives every lane one."""
        if self._lane_assignment == "modulo" or lanes == 1:
            return np.arange(lanes)
        key = mix64(self._seed, TAG_LANES, block)
        if self._epoch:
            key = mix64(key, TAG_EPOCH, self._epoch)
        return permutation(lanes, key)

    def _lane_target(self, k: int) -> int:
        assert self._lanes is not None and self._lane_id is not None
        perm = self.deal(k, self._lanes)
        return k * self._lanes + int(np.flatnonzero(perm == self._lane_id)[0])

    def planned_samples(self, lanes: Sequence[int], canonical_replicas: int) -> int | None:
        """Samples ``lanes`` emit over the whole run, from the chunk sequence computed without
        building pointers (see :mod:`zephon.work._plan`); ``None`` for an endless source."""
        from zephon.work._plan import planned_samples

        return planned_samples(self, lanes, canonical_replicas)

    def next_chunk(self) -> WorkChunk | None:
        self._require_estimates()
        if self._lane_id is None:
            return None if self._done else self._step(generate=True)
        if self._lane_done:
            return None
        target = self._lane_target(self._lane_chunks)
        self._skip(target - self._g)
        if self._done:
            self._lane_done = True
            return None
        chunk = self._step(generate=True)
        self._lane_chunks += 1
        return chunk

    # -- state ----------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        self._require_estimates()
        return {
            "version": STATE_VERSION,
            "kind": "StaticMixtureWorkSource",
            "fingerprint": self._fingerprint,
            "config": self._config,
            "lane_id": self._lane_id,
            "canonical_replicas": self._lanes,
            "lane_chunks": self._lane_chunks,
            "lane_done": self._lane_done,
            "global_index": self._g,
            "positions": list(self._pos),
            "debts": list(self._debts),
            "active": list(self._active),
            "done": self._done,
            "phase": self._phase,
            "schedule": [p.to_json() for p in self._phases] if self._schedule else None,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if not isinstance(state, Mapping):
            raise CheckpointError(f"work-source state must be a dict, got {type(state).__name__}")
        version = state.get("version")
        if version != STATE_VERSION or state.get("kind") != "StaticMixtureWorkSource":
            raise CheckpointError(
                f"work-source state has kind={state.get('kind')!r} version={version!r}; this "
                f"zephon reads StaticMixtureWorkSource version {STATE_VERSION}"
            )
        if state.get("fingerprint") != self._fingerprint:
            raise CheckpointError(
                "work-source state comes from a different configuration: "
                + _config_diff(state.get("config"), self._config)
            )
        for key, mine in (("lane_id", self._lane_id), ("canonical_replicas", self._lanes)):
            if state.get(key) != mine:
                raise CheckpointError(
                    f"work-source state was saved with {key}={state.get(key)!r} but this source "
                    f"has {key}={mine!r}; load each lane's state into that lane's clone"
                )
        k = len(self._datasets)
        try:
            pos = [int(x) for x in state["positions"]]
            debts = [int(x) for x in state["debts"]]
            active = [bool(x) for x in state["active"]]
            g = int(state["global_index"])
            lane_chunks = int(state["lane_chunks"])
            done = bool(state["done"])
            lane_done = bool(state["lane_done"])
        except (KeyError, TypeError, ValueError) as e:
            raise CheckpointError(f"work-source state is corrupt: {e!r}") from e
        if len(pos) != k or len(debts) != k or len(active) != k or g < 0 or lane_chunks < 0:
            raise CheckpointError("work-source state is corrupt: per-dataset lists have wrong size")
        phase = int(state.get("phase", 0))
        if self._schedule is not None:
            check_past(state.get("schedule"), self._phases, sum(pos))
        if not 0 <= phase < len(self._phases):
            raise CheckpointError(f"work-source state is corrupt: phase {phase} out of range")
        self._pos, self._debts, self._active = pos, debts, active
        self._g, self._lane_chunks, self._done, self._lane_done = g, lane_chunks, done, lane_done
        self._phase, self._weights = phase, self._phases[phase].weights


def _config_diff(saved: Any, current: dict[str, Any]) -> str:
    """Human-readable differences between two configuration summaries."""
    if not isinstance(saved, Mapping):
        return "the state carries no configuration summary"
    diffs = []
    absent = {"epoch": 0}  # keys left out at their default value
    for key in sorted(set(saved) | set(current)):
        a = saved.get(key, absent.get(key, "<missing>"))
        b = current.get(key, absent.get(key, "<missing>"))
        if json.dumps(a, sort_keys=True) != json.dumps(b, sort_keys=True):
            diffs.append(f"{key}: saved {a!r}, now {b!r}")
    return "; ".join(diffs) if diffs else "fingerprints differ"
