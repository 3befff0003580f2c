"""ensure_mixture: per-lane smooth weighted round-robin that steers the stream to a target mix.

Each lane keeps what it has emitted per component (``E``, in samples or tokens) and the target
proportions ``T``. The next output should serve the component with the largest deficit
``T[k] * max(1, sum(E)) - E[k]`` (ties: lower component id); records wait in per-component
queues until they are the ideal pick. Records that span several components (packed bins) are
scored by their share-weighted deficit and leave when they serve the ideal component.

Bounded mode (``max_buffer_size=N``): once ``N`` records wait, the best available records leave
until ``drain_target_ratio * N`` remain. Strict mode (``max_buffer_size=None``): nothing is ever
forced; at a flush what cannot be placed without leaving the target is dropped (tombstones).
Records of components outside the target ("obsolete") leave through a slot every
``1 / obsolete_drain_rate`` outputs, or when draining. A flush sentinel emits (or, strict, drops)
the lane's buffer and resets its deficits; decisions depend only on the lane's own stream.

The target is ``mixture=`` (component id -> weight, resolved from dataset names by the builder),
updated by a ``_target_mixture`` tag on a record when the source stamps one and no explicit
mixture was given.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from zephon._ops._bookkeeping import TAG_TARGET_MIXTURE, CloserTracker
from zephon._ops.pack import resolve_tokens_field
from zephon.errors import ConfigError, DataError
from zephon.ops import Accumulator, BaseOp, OpContext, OpTraits, Rebuild
from zephon.ops.accumulators import MicroBatch
from zephon.types import (
    TAG_CONTRIBUTORS,
    TAG_PACKING,
    LaneId,
    SampleRecord,
    StreamItem,
    record_tokens,
    tombstone_meta,
)

log = logging.getLogger("zephon")

__all__ = ["TAG_TARGET_MIXTURE", "EnsureMixtureOp", "MixtureAccumulator"]

MIXED_SCAN = 64
WeightBy = str | Callable[[Any], float]
Entry = tuple[int, SampleRecord, dict[int, float]]


def normalise(weights: Mapping[int, float], where: str) -> dict[int, float]:
    clean = {int(k): float(v) for k, v in weights.items() if float(v) > 0}
    total = sum(clean.values())
    if not clean or total <= 0:
        raise ConfigError(f"{where}: the target mixture needs at least one positive weight")
    return {k: v / total for k, v in sorted(clean.items())}


class _Lane:
    __slots__ = (
        "arrivals",
        "buffered",
        "draining",
        "emitted",
        "mixed",
        "obsolete",
        "outputs",
        "queues",
        "target",
        "tracker",
    )

    def __init__(self, target: dict[int, float]) -> None:
        self.target = target
        self.emitted: dict[int, float] = dict.fromkeys(target, 0.0)
        self.queues: dict[int, deque[Entry]] = {k: deque() for k in target}
        self.mixed: list[Entry] = []
        self.obsolete: deque[Entry] = deque()
        self.buffered = 0
        self.arrivals = 0
        self.outputs = 0
        self.draining = False
        self.tracker = CloserTracker()

    def classify(self, entry: Entry) -> None:
        amounts = entry[2]
        on_target = [k for k in amounts if k in self.target]
        if not on_target:
            self.obsolete.append(entry)
        elif len(amounts) == 1:
            self.queues[on_target[0]].append(entry)
        else:
            self.mixed.append(entry)

    def retarget(self, target: dict[int, float]) -> None:
        entries = sorted(
            [e for q in self.queues.values() for e in q] + self.mixed + list(self.obsolete),
            key=lambda e: e[0],
        )
        self.target = target
        for k in target:
            self.emitted.setdefault(k, 0.0)
        self.queues = {k: deque() for k in target}
        self.mixed = []
        self.obsolete = deque()
        for entry in entries:
            self.classify(entry)

    def deficits(self) -> dict[int, float]:
        emitted = self.emitted
        total = max(1.0, sum(emitted.get(k, 0.0) for k in self.target))
        return {k: w * total - emitted.get(k, 0.0) for k, w in self.target.items()}


class MixtureAccumulator(Accumulator):
    """Per-lane SWRR selector over component queues; see the module docstring."""

    reads_payload = True  # unless weighting by samples (see __init__)
    state_holds_records = True  # queued records are saved by meta and rebuilt
    state_payloads_lazy = True  # payloads are read only at push, so rebuilt on leaving

    def state_dict(self, lane_id: LaneId) -> dict[str, Any]:
        """The lane's target, emitted amounts, queues (records by meta) and counters."""
        lane = self._lanes.get(lane_id)
        if lane is None:
            return {}
        return {
            "target": dict(lane.target),
            "emitted": dict(lane.emitted),
            "queues": {k: list(q) for k, q in lane.queues.items()},
            "mixed": list(lane.mixed),
            "obsolete": list(lane.obsolete),
            "counters": [lane.buffered, lane.arrivals, lane.outputs, lane.draining],
            "deferred": lane.tracker.deferred(),
        }

    def load_state_dict(self, lane_id: LaneId, state: dict[str, Any]) -> None:
        self._lanes.pop(lane_id, None)
        if not state:
            return
        lane = self._lanes[lane_id] = _Lane(dict(state["target"]))
        lane.emitted = dict(state["emitted"])
        lane.queues = {k: deque(q) for k, q in state["queues"].items()}
        lane.mixed = list(state["mixed"])
        lane.obsolete = deque(state["obsolete"])
        lane.buffered, lane.arrivals, lane.outputs, lane.draining = state["counters"]
        held = [e[1].meta for q in lane.queues.values() for e in q]
        held += [e[1].meta for e in lane.mixed] + [e[1].meta for e in lane.obsolete]
        lane.tracker = CloserTracker.of_buffer(held, state["deferred"])

    def __init__(self, op: EnsureMixtureOp) -> None:
        self.op = op
        self.reads_payload = op.weight_by != "samples"  # sample counts live in the meta
        self._lanes: dict[LaneId, _Lane] = {}
        self._period = (
            max(1, round(1.0 / op.obsolete_drain_rate)) if op.obsolete_drain_rate > 0 else 0
        )

    # -- measuring -----------------------------------------------------------------------

    def _amounts(self, record: SampleRecord) -> dict[int, float]:
        op = self.op
        meta = record.meta
        weight_by = op.weight_by
        if weight_by == "samples":
            return {k: float(v) for k, v in meta.counts.items() if v}
        packing = meta.tags.get(TAG_PACKING) if meta.tags else None
        if weight_by == "tokens":
            if packing is not None:
                return {int(k): float(v) for k, v in packing["component_tokens"].items() if v}
            payload = record.payload
            name = resolve_tokens_field(payload, op.tokens_field, meta.sample_id)
            return {meta.component_id: float(len(payload[name]))}
        if callable(weight_by):
            value = float(weight_by(record.payload))
        else:
            try:
                value = float(record.payload[weight_by])
            except (KeyError, TypeError, ValueError):
                raise DataError(
                    f"ensure_mixture: record {meta.sample_id} has no numeric field "
                    f"{weight_by!r} to weight by; use weight_by='samples'|'tokens', another "
                    "field or a callable"
                ) from None
        return {meta.component_id: value} if value > 0 else {}

    def _target_from_tag(self, value: Any) -> dict[int, float] | None:
        if not isinstance(value, Mapping) or not value:
            return None
        names = self.op.component_names
        resolved: dict[int, float] = {}
        for key, w in value.items():
            if isinstance(key, str):
                if key not in names:
                    continue
                key = names.index(key)
            resolved[int(key)] = float(w)
        return normalise(resolved, "ensure_mixture") if resolved else None

    # -- selection -----------------------------------------------------------------------

    def _lane(self, lane_id: LaneId) -> _Lane:
        state = self._lanes.get(lane_id)
        if state is None:
            state = self._lanes[lane_id] = _Lane(dict(self.op.mixture))
        return state

    @staticmethod
    def _best_mixed(state: _Lane, deficits: dict[int, float], need: int | None) -> int:
        best_i, best_score = -1, 0.0
        for i, (_, _, amounts) in enumerate(state.mixed[:MIXED_SCAN]):
            if need is not None and need not in amounts:
                continue
            total = sum(amounts.values())
            score = sum(a * deficits.get(k, 0.0) for k, a in amounts.items()) / total
            if best_i < 0 or score > best_score:
                best_i, best_score = i, score
        return best_i

    def _take(self, state: _Lane, *, force: bool) -> Entry | None:
        """The next entry to emit, or None to wait."""
        if self._period and state.obsolete and (state.outputs + 1) % self._period == 0:
            return state.obsolete.popleft()
        deficits = state.deficits()
        ranked = sorted(deficits, key=lambda k: (-deficits[k], k))
        ideal = ranked[0]
        if state.queues[ideal]:
            return state.queues[ideal].popleft()
        if state.mixed:
            i = self._best_mixed(state, deficits, ideal)
            if i >= 0:
                return state.mixed.pop(i)
        if not force:
            return None
        for k in ranked[1:]:
            if state.queues[k]:
                return state.queues[k].popleft()
        if state.mixed:
            return state.mixed.pop(max(0, self._best_mixed(state, deficits, None)))
        if state.obsolete:
            return state.obsolete.popleft()
        return None

    def _emit(self, state: _Lane, entry: Entry) -> SampleRecord:
        _, record, amounts = entry
        for k, a in amounts.items():
            if k in state.emitted:
                state.emitted[k] += a
        state.buffered -= 1
        state.outputs += 1
        return state.tracker.settled_record(record)

    def _run(self, state: _Lane, out: MicroBatch) -> None:
        cap = self.op.max_buffer_size
        while state.buffered:
            force = False
            if cap is not None:
                if state.buffered >= cap:
                    state.draining = True
                if state.draining:
                    if state.buffered <= self.op.drain_target_ratio * cap:
                        state.draining = False
                    else:
                        force = True
            entry = self._take(state, force=force)
            if entry is None:
                return
            out.append(self._emit(state, entry))

    def push_many(self, elems: Sequence[StreamItem]) -> list[MicroBatch]:
        out: MicroBatch = []
        op = self.op
        for elem in elems:
            if not isinstance(elem, SampleRecord):
                raise ConfigError(
                    "ensure_mixture: cannot reorder SampleBatch elements; use it before batch"
                )
            state = self._lanes.get(elem.meta.lane_id) or self._lane(elem.meta.lane_id)
            tags = elem.meta.tags
            if tags and TAG_TARGET_MIXTURE in tags and not op.explicit:
                target = self._target_from_tag(tags[TAG_TARGET_MIXTURE])
                if target is not None and target != state.target:
                    state.retarget(target)
            amounts = self._amounts(elem)
            if not amounts:  # weighs nothing: cannot move the mixture, leaves at once
                out.append(elem)
                continue
            if tags and TAG_CONTRIBUTORS in tags:
                state.tracker.add(elem.meta)
            state.arrivals += 1
            state.buffered += 1
            state.classify((state.arrivals, elem, amounts))
            self._run(state, out)
        return [out] if out else []

    def _drain(self, lane_id: LaneId, state: _Lane, out: MicroBatch) -> None:
        strict = self.op.max_buffer_size is None
        while state.buffered:
            entry = self._take(state, force=not strict)
            if entry is None:
                break
            out.append(self._emit(state, entry))
        if state.buffered:  # strict: what cannot be placed on target is dropped
            rest = sorted(
                [e for q in state.queues.values() for e in q] + state.mixed + list(state.obsolete),
                key=lambda e: e[0],
            )
            for _, record, _ in rest:
                refs = state.tracker.settle(record.meta)
                tomb = tombstone_meta(
                    record.meta,
                    reason="ensure_mixture strict: surplus",
                    tokens=record_tokens(record),
                )
                out.append(SampleRecord(tomb.with_tags(**{TAG_CONTRIBUTORS: refs}), None))
        self._check_tolerance(lane_id, state)

    def _check_tolerance(self, lane_id: LaneId, state: _Lane) -> None:
        tol = self.op.warn_tolerance
        total = sum(state.emitted.get(k, 0.0) for k in state.target)
        if tol is None or total <= 0:
            return
        worst = max(abs(state.emitted.get(k, 0.0) / total - w) for k, w in state.target.items())
        if worst > tol:
            log.warning(
                "zephon: ensure_mixture lane %d drifted %.4f from its target (tolerance %.4f)",
                lane_id,
                worst,
                tol,
            )

    def flush(self, *, reset: bool = False, lane_id: LaneId | None = None) -> list[MicroBatch]:
        lanes = sorted(self._lanes) if lane_id is None else [lane_id]
        out: MicroBatch = []
        for lane in lanes:
            state = self._lanes.pop(lane, None)
            if state is not None:
                self._drain(lane, state, out)
        return [out] if out else []

    def has_pending_data(self, lane_id: LaneId | None = None) -> bool:
        if lane_id is None:
            return any(s.buffered for s in self._lanes.values())
        state = self._lanes.get(lane_id)
        return state is not None and state.buffered > 0


class EnsureMixtureOp(BaseOp):
    """Reorders each lane so its output tracks the target mixture; see the module docstring.

    ``mixture``: ``{component_id: weight}``; ``component_names`` maps names in tags to ids.
    ``weight_by``: ``"samples"``, ``"tokens"`` (the token field; packed records use their
    per-component token counts), a numeric payload field name, or ``fn(payload) -> float``.
    """

    name = "ensure_mixture"

    # the names come from the source (which the fingerprint describes); the tolerance only
    # decides when a warning is logged
    config_exclude = ("component_names", "warn_tolerance")

    def __init__(
        self,
        mixture: Mapping[int, float],
        *,
        component_names: Sequence[str] = (),
        explicit: bool = True,
        weight_by: WeightBy = "samples",
        max_buffer_size: int | None = 1000,
        drain_target_ratio: float = 0.8,
        obsolete_drain_rate: float = 0.1,
        warn_tolerance: float | None = None,
        tokens_field: str = "auto",
    ) -> None:
        super().__init__()
        if max_buffer_size is not None and max_buffer_size < 1:
            raise ConfigError(
                f"ensure_mixture: max_buffer_size must be >= 1 or None (strict), got "
                f"{max_buffer_size}"
            )
        if not 0.0 <= drain_target_ratio < 1.0:
            raise ConfigError(
                f"ensure_mixture: drain_target_ratio must be in [0, 1), got {drain_target_ratio}"
            )
        if not 0.0 <= obsolete_drain_rate <= 1.0:
            raise ConfigError(
                f"ensure_mixture: obsolete_drain_rate must be in [0, 1], got {obsolete_drain_rate}"
            )
        if not callable(weight_by) and not isinstance(weight_by, str):
            raise ConfigError(
                "ensure_mixture: weight_by must be 'samples', 'tokens', a field name or a "
                f"callable, got {weight_by!r}"
            )
        self.mixture = normalise(mixture, "ensure_mixture")
        self.component_names = list(component_names)
        self.explicit = explicit
        self.weight_by = weight_by
        self.max_buffer_size = max_buffer_size
        self.drain_target_ratio = drain_target_ratio
        self.obsolete_drain_rate = obsolete_drain_rate
        self.warn_tolerance = warn_tolerance
        self.tokens_field = tokens_field

    def accumulator(self, *, deterministic: bool, ctx: OpContext) -> Accumulator:
        return MixtureAccumulator(self)

    def traits(self) -> OpTraits:
        # All decisions are serial; process_many is a passthrough, so keep it on the driver.
        return OpTraits(
            preserves_cursor_order=False,
            parallelism=1,
            runs_in_driver=True,
            rebuild=Rebuild.UNCHANGED,
        )

    def config(self) -> Mapping[str, Any]:
        wb = self.weight_by
        return {
            "mixture": self.mixture,
            "explicit": self.explicit,
            "weight_by": wb if isinstance(wb, str) else getattr(wb, "__qualname__", repr(wb)),
            "max_buffer_size": self.max_buffer_size,
            "drain_target_ratio": self.drain_target_ratio,
            "obsolete_drain_rate": self.obsolete_drain_rate,
            "tokens_field": self.tokens_field,
        }

    def process_many(self, elems: list[StreamItem]) -> list[StreamItem]:
        return elems
