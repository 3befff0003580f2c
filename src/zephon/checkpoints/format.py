"""The checkpoint format: versioned, JSON-safe, small, and checked before it is used.

A checkpoint describes, per lane, where to regenerate from (the work-source state before the
oldest chunk still in flight, and that chunk's id), the cursor of the last delivered item, how
many items were delivered and whether the lane is done; plus the tail's round-robin position,
the world and the configuration it was taken with. Its size depends on the number of lanes,
never on how far training has gone. Keys are strings (JSON turns integer keys into strings,
so the format never relies on anything else). :func:`parse` checks a checkpoint and returns it
as a :class:`ParsedCheckpoint`, so code that reads one (a training loop, capture's retirement,
``zephon checkpoint inspect``) never walks the dict itself; :func:`build` writes one.

Since version 2 a checkpoint carries a ``checksum`` of everything else in it, so a file that was
edited or damaged after it was written is refused instead of restoring a wrong position.
Version 1 checkpoints (no checksum) are still read.

Since version 3 a lane may restart inside a chunk (``start_offset``: records of the start chunk
already inside the restored snapshot) and ``operator_state`` may hold the open state of packing,
shuffling and mixture correction (buffered records by meta). Version 2 checkpoints restore by
replay from the last flush, as they were written.

Since version 4 the open state of a buffering operator may be deflated (``{"$zz": ...}``) and
the checksum is computed over msgspec's canonical JSON (older checkpoints' checksums, from the
json module, are still accepted). A pass other than the first (``Pipeline.set_epoch``) puts
``epoch`` in the configuration.

Since version 5 the records an operator state names may carry their payloads
(``checkpoint(held_records=True)``), so a restore reads them back instead of rebuilding them
from the source. Only such a checkpoint is written as version 5; every other one is still
version 4, and older readers refuse a version 5 file naming it.

In any version, only the first lane of a rank's checkpoint repeats the work source's settings
summary in its ``source_state`` (the rest keep its fingerprint), which saves about 370 bytes
per lane for one dataset and more for a mixture; every reader checks a lane's source state by
the fingerprint alone.

Since version 6 a lane may carry its own ``epoch``: data-parallel ranks whose passes differ in
length are in different passes at the same step, and their merged checkpoint keeps each lane's
pass. The configuration then holds the earliest pass; a lane in a later one counts as finished
for it and continues when its own pass comes. Only such a checkpoint is written as version 6.

A checkpoint of a source that mixes datasets also says what the mixture delivered: its target
(``mixture``: component names, weights and unit) and per lane the samples and tokens delivered
per component (``lanes[L].mixture``). Both are optional keys in any version: a reader that does
not know them ignores them, and a checkpoint without them restores and inspects as before.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
import xxhash

from zephon._fingerprint import fingerprint
from zephon.errors import CheckpointError
from zephon.types import SampleCursor

FORMAT = "zephon.pipeline-checkpoint"
#: The newest format version this zephon reads and writes.
VERSION = 6
#: The version a checkpoint is written with when it uses nothing newer (older readers read it).
PLAIN_VERSION = 4
#: The first version whose operator states may hold records with their payloads.
HELD_PAYLOADS_VERSION = 5
#: The first version whose lanes may be in a later pass than the configuration's epoch.
LANE_EPOCHS_VERSION = 6
CHECKSUM_KEY = "checksum"

__all__ = [
    "CHECKSUM_KEY",
    "FORMAT",
    "HELD_PAYLOADS_VERSION",
    "LANE_EPOCHS_VERSION",
    "PLAIN_VERSION",
    "VERSION",
    "build",
    "checksum",
    "cursor_from_json",
    "cursor_to_json",
    "fingerprint",
    "first_difference",
    "lanes_version",
    "migrate",
    "to_jsonable",
    "verify_checksum",
]


def to_jsonable(value: Any) -> Any:
    """Normalise operator/source settings into plain JSON data for fingerprints."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, Mapping):
        return {str(k): to_jsonable(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    return f"<{type(value).__name__}>"


def checksum(state: Mapping[str, Any], *, plain_json: bool = False) -> str:
    """xxh64 of the canonical JSON of ``state`` without its ``checksum`` entry.

    The state is normalised to what a JSON round trip gives first (integer keys become strings,
    tuples lists), so the checksum of a state is the same before and after one; ``plain_json``
    says it came from ``json.loads`` already, so there is nothing to normalise. Canonical JSON
    is msgspec's with sorted keys (C speed: a checkpoint per training step stays cheap;
    ``to_builtins`` normalises without encoding and decoding the whole state once more).
    """
    body: Any = {k: v for k, v in state.items() if k != CHECKSUM_KEY}
    if not plain_json:
        body = msgspec.to_builtins(body, str_keys=True)
    return xxhash.xxh64(msgspec.json.encode(body, order="sorted")).hexdigest()


def _legacy_checksum(state: Mapping[str, Any], *, plain_json: bool = False) -> str:
    """The checksum as zephon wrote it up to format version 3 (the json module's encoding)."""
    body: Any = {k: v for k, v in state.items() if k != CHECKSUM_KEY}
    if not plain_json:
        body = json.loads(json.dumps(body))
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"))
    return xxhash.xxh64(canonical.encode()).hexdigest()


def seal(state: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``state`` with a fresh checksum (after adding keys of your own to it)."""
    out = {k: v for k, v in state.items() if k != CHECKSUM_KEY}
    out[CHECKSUM_KEY] = checksum(out)
    return out


def verify_checksum(state: Mapping[str, Any]) -> None:
    """Refuse a version >= 2 checkpoint whose content does not match its checksum."""
    saved = state.get(CHECKSUM_KEY)
    if saved is None:
        raise CheckpointError(
            "checkpoint has no checksum (every version 2 checkpoint has one): it was edited "
            "or is not a complete zephon checkpoint"
        )
    if not any(
        saved == digest(state, plain_json=plain)
        for digest in (checksum, _legacy_checksum)
        for plain in (True, False)
    ):
        raise CheckpointError(
            "checkpoint content does not match its checksum: it was edited or damaged after "
            "it was written; use an older checkpoint (or seal() it again if you edited it on "
            "purpose)"
        )


def first_difference(saved: Any, current: Any, path: str = "") -> str | None:
    """A human description of the first place two configurations differ, or None."""
    if isinstance(saved, dict) and isinstance(current, dict):
        for key in sorted(set(saved) | set(current)):
            where = f"{path}.{key}" if path else key
            if key not in saved:
                return f"{where}: not in the checkpoint, pipeline has {current[key]!r}"
            if key not in current:
                return f"{where}: checkpoint has {saved[key]!r}, pipeline has none"
            diff = first_difference(saved[key], current[key], where)
            if diff:
                return diff
        return None
    if isinstance(saved, list) and isinstance(current, list):
        for i, (a, b) in enumerate(zip(saved, current, strict=False)):
            diff = first_difference(a, b, f"{path}[{i}]")
            if diff:
                return diff
        if len(saved) != len(current):
            return f"{path}: checkpoint has {len(saved)} entries, pipeline has {len(current)}"
        return None
    if saved != current:
        return f"{path}: checkpoint has {saved!r}, pipeline has {current!r}"
    return None


def cursor_to_json(cursor: SampleCursor | None) -> list[Any] | None:
    if cursor is None:
        return None
    return [cursor.chunk_id, cursor.chunk_offset, list(cursor.lineage), list(cursor.sample_id)]


def cursor_from_json(value: Any, where: str) -> SampleCursor | None:
    if value is None:
        return None
    try:
        chunk_id, offset, lineage, sample_id = value
        sid = tuple(int(x) for x in sample_id)
        if len(sid) != 3:
            raise ValueError("sample id needs 3 parts")
        return SampleCursor(int(chunk_id), int(offset), tuple(int(x) for x in lineage), sid)  # type: ignore[arg-type]
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"checkpoint {where} is not a cursor ({value!r}): {exc}") from None


@dataclass(frozen=True)
class LaneCheckpoint:
    """Where one lane restarts and what it has delivered."""

    lane: int
    #: The oldest chunk still in flight: a restore regenerates from it.
    start_chunk_id: int
    #: The work source's ``state_dict`` before that chunk (None: the source keeps no state).
    source_state: Mapping[str, Any] | None
    #: The cursor of the last item delivered (None: nothing delivered yet).
    replay_cursor: SampleCursor | None
    delivered: int
    done: bool
    #: Stage index (str) -> that stateful accumulator's lane state at the restart point.
    operator_state: Mapping[str, Any] | None = None
    #: Records of the start chunk already inside the restored snapshot.
    start_offset: int = 0
    #: Whether ``operator_state`` may hold records with their payloads (a version 5 feature;
    #: not written itself: :func:`build` picks the version by it, :func:`parse` sets it for
    #: the operator states of a version 5 checkpoint).
    held_payloads: bool = False
    #: The lane's own pass when it is later than the checkpoint's epoch (version 6), else None.
    epoch: int | None = None
    #: With ``epoch``: the fingerprint of the configuration of that pass (a restore checks it).
    fingerprint: str | None = None
    #: Samples and tokens the lane delivered per mixture component (by component id) in this
    #: pass, or None (no mixture, or a checkpoint written before they were counted).
    mixture: tuple[tuple[int, ...], tuple[int, ...]] | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "start_chunk_id": self.start_chunk_id,
            "source_state": self.source_state,
            "replay_cursor": cursor_to_json(self.replay_cursor),
            "delivered": self.delivered,
            "done": self.done,
        }
        if self.operator_state is not None:
            out["operator_state"] = dict(self.operator_state)
        if self.start_offset:
            out["start_offset"] = self.start_offset
        if self.epoch is not None:
            out["epoch"] = self.epoch
            out["fingerprint"] = self.fingerprint
        if self.mixture is not None:
            out["mixture"] = {"samples": list(self.mixture[0]), "tokens": list(self.mixture[1])}
        return out


@dataclass(frozen=True)
class SourceInfo:
    """What the configuration says about the work source the checkpoint was taken over."""

    type: str | None
    #: The source's own fingerprint (rows, order, snapshots...), None when it has none.
    fingerprint: str | None
    #: One entry per dataset: ``{"name", "shards", "rows"}`` as the pipeline recorded it.
    datasets: tuple[Any, ...]


@dataclass(frozen=True)
class OperatorInfo:
    """One operator of the checkpointed plan, in plan order."""

    index: int
    type: str | None
    name: str | None
    config: Any


@dataclass(frozen=True)
class ParsedCheckpoint:
    """A checked checkpoint with named fields; ``config`` stays the full configuration that
    a restore compares (and the fingerprint covers)."""

    config: Mapping[str, Any]
    canonical_replicas: int
    lanes: Mapping[int, LaneCheckpoint]
    tail_lanes: list[int]
    tail_order: list[int]
    tail_turn: int
    world: Mapping[str, Any]
    #: The version the checkpoint was written with (older ones are read as they were).
    version: int = VERSION
    #: ``fingerprint(config)``, checked when parsed.
    fingerprint: str = ""
    #: The checksum it was sealed with (None in a version 1 checkpoint).
    checksum: str | None = None
    #: The pass over the data the checkpoint is in (``Pipeline.set_epoch``).
    epoch: int = 0
    source: SourceInfo = SourceInfo(None, None, ())
    operators: tuple[OperatorInfo, ...] = ()
    #: Chunks per lane between flush sentinels, None when the configuration does not say.
    flush_every_k_chunks: int | None = None
    #: The mixture's target as recorded (``{"components", "weights", "unit"}``), or None.
    mixture: Mapping[str, Any] | None = None

    def delivered_mixture(self) -> tuple[list[int], list[int]] | None:
        """Samples and tokens delivered per component over the lanes it describes (None when
        it recorded no mixture, or a lane has no counts)."""
        counts = [lc.mixture for lc in self.lanes.values()]
        if self.mixture is None or not counts or any(c is None for c in counts):
            return None
        size = len(self.mixture.get("components", ()))
        samples, tokens = [0] * size, [0] * size
        for lane_samples, lane_tokens in (c for c in counts if c is not None):
            for i in range(min(size, len(lane_samples))):
                samples[i] += lane_samples[i]
                tokens[i] += lane_tokens[i]
        return samples, tokens

    @property
    def finished(self) -> bool:
        """Whether every lane it describes had delivered its whole stream."""
        return all(lc.done for lc in self.lanes.values())

    def lane_epoch(self, lane: int) -> int:
        """The pass lane ``lane`` is in: its own (version 6) or the checkpoint's."""
        own = self.lanes[lane].epoch
        return self.epoch if own is None else own

    def finished_for(self, lanes: Sequence[int]) -> bool:
        """Whether ``lanes`` (those it describes) have nothing left in :attr:`epoch`: each
        delivered its whole stream or is already in a later pass."""
        return all(
            self.lanes[lane].done or self.lane_epoch(lane) > self.epoch
            for lane in lanes
            if lane in self.lanes
        )

    @property
    def delivered(self) -> int:
        """Items delivered over every lane it describes."""
        return sum(lc.delivered for lc in self.lanes.values())


def _int_or(value: Any, default: int | None) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _source_info(config: Mapping[str, Any]) -> SourceInfo:
    raw = config.get("source")
    source: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
    kind, fp, datasets = source.get("type"), source.get("fingerprint"), source.get("datasets")
    return SourceInfo(
        type=kind if isinstance(kind, str) else None,
        fingerprint=fp if isinstance(fp, str) else None,
        datasets=tuple(datasets) if isinstance(datasets, list) else (),
    )


def _operator_infos(config: Mapping[str, Any]) -> tuple[OperatorInfo, ...]:
    raw = config.get("operators")
    out = []
    for index, op in enumerate(raw if isinstance(raw, list) else []):
        entry: Mapping[str, Any] = op if isinstance(op, Mapping) else {}
        kind, name = entry.get("type"), entry.get("name")
        out.append(
            OperatorInfo(
                index=index,
                type=kind if isinstance(kind, str) else None,
                name=name if isinstance(name, str) else None,
                config=entry.get("config"),
            )
        )
    return tuple(out)


def _need(mapping: Mapping[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if not isinstance(mapping, Mapping) or key not in mapping:
        raise CheckpointError(
            f"checkpoint is missing {where}{key!r} (truncated or not a checkpoint)"
        )
    value = mapping[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise CheckpointError(
            f"checkpoint {where}{key!r} has type {type(value).__name__}, expected "
            f"{getattr(kind, '__name__', kind)}"
        )
    return value


def migrate(state: Mapping[str, Any]) -> Mapping[str, Any]:
    """Bring an older checkpoint to the current version (none older exists yet)."""
    version = state.get("version")
    if not isinstance(version, int):
        raise CheckpointError(f"checkpoint has no integer 'version' (got {version!r})")
    if version > VERSION:
        raise CheckpointError(
            f"checkpoint version {version} is newer than this zephon understands ({VERSION}); "
            "upgrade zephon to restore it"
        )
    if version < 1:
        raise CheckpointError(f"checkpoint version {version} is not a zephon checkpoint version")
    if version >= 2:
        verify_checksum(state)
    return state


def _parse_lane(
    key: str, raw: Any, replicas: int, version: int, config_epoch: int
) -> LaneCheckpoint:
    where = f"lanes[{key}]."
    try:
        lane = int(key)
    except ValueError:
        raise CheckpointError(f"checkpoint lane key {key!r} is not a lane number") from None
    if not 0 <= lane < replicas:
        raise CheckpointError(f"checkpoint lane {lane} is outside 0..{replicas - 1}")
    source_state = raw.get("source_state") if isinstance(raw, Mapping) else None
    if source_state is not None and not isinstance(source_state, Mapping):
        raise CheckpointError(f"checkpoint {where}source_state is not a dict")
    operator_state = raw.get("operator_state") if isinstance(raw, Mapping) else None
    if operator_state is not None and not isinstance(operator_state, Mapping):
        raise CheckpointError(f"checkpoint {where}operator_state is not a dict")
    epoch = _need(raw, "epoch", int, where) if "epoch" in raw else None
    if epoch is not None and not epoch > config_epoch:
        raise CheckpointError(
            f"checkpoint {where}epoch is {epoch}, not later than the checkpoint's epoch "
            f"{config_epoch}: it was edited or is damaged"
        )
    pass_fingerprint = _need(raw, "fingerprint", str, where) if epoch is not None else None
    return LaneCheckpoint(
        mixture=_lane_mixture(raw.get("mixture"), where),
        lane=lane,
        start_chunk_id=_need(raw, "start_chunk_id", int, where),
        source_state=source_state,
        replay_cursor=cursor_from_json(raw.get("replay_cursor"), f"{where}replay_cursor"),
        delivered=_need(raw, "delivered", int, where),
        done=_need(raw, "done", bool, where),
        operator_state=operator_state,
        start_offset=_need(raw, "start_offset", int, where) if "start_offset" in raw else 0,
        held_payloads=version >= HELD_PAYLOADS_VERSION and bool(operator_state),
        epoch=epoch,
        fingerprint=pass_fingerprint,
    )


def _lane_mixture(raw: Any, where: str) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """A lane's ``mixture`` counts (absent in checkpoints written before they were counted)."""
    if raw is None:
        return None
    samples = raw.get("samples") if isinstance(raw, Mapping) else None
    tokens = raw.get("tokens") if isinstance(raw, Mapping) else None
    if isinstance(samples, list) and isinstance(tokens, list) and len(samples) == len(tokens):
        counts = [_int_or(n, -1) for n in [*samples, *tokens]]
        if all(n is not None and n >= 0 for n in counts):
            return tuple(samples), tuple(tokens)
    raise CheckpointError(
        f"checkpoint {where}mixture is not {{samples: [...], tokens: [...]}} of counts "
        "(edited or damaged); use an older checkpoint"
    )


def _mixture_target(state: Mapping[str, Any]) -> Mapping[str, Any] | None:
    raw = state.get("mixture")
    if not isinstance(raw, Mapping) or not isinstance(raw.get("components"), list):
        return None
    return raw


def parse(state: Any) -> ParsedCheckpoint:
    """Validate a checkpoint (as returned by ``checkpoint()`` or after a JSON round trip);
    :class:`CheckpointError` names the first key at fault."""
    if not isinstance(state, Mapping):
        raise CheckpointError(f"a checkpoint is a dict, got {type(state).__name__}")
    if state.get("format") != FORMAT:
        raise CheckpointError(f"not a zephon pipeline checkpoint (format={state.get('format')!r})")
    state = migrate(state)
    config = _need(state, "config", Mapping, "")
    config_fingerprint = _need(state, "fingerprint", str, "")
    if config_fingerprint != fingerprint(config):
        raise CheckpointError("checkpoint is corrupt: its config does not match its fingerprint")
    world = _need(state, "world", Mapping, "")
    replicas = _need(world, "canonical_replicas", int, "world.")
    lanes_raw = _need(state, "lanes", Mapping, "")
    version = state["version"]
    epoch = _int_or(config.get("epoch"), 0) or 0
    lanes = {
        lc.lane: lc
        for lc in (_parse_lane(k, v, replicas, version, epoch) for k, v in lanes_raw.items())
    }
    tail = _need(state, "tail", Mapping, "")
    saved_checksum = state.get(CHECKSUM_KEY)
    return ParsedCheckpoint(
        config=config,
        canonical_replicas=replicas,
        lanes=lanes,
        tail_lanes=[int(x) for x in _need(tail, "lanes", list, "tail.")],
        tail_order=[int(x) for x in _need(tail, "order", list, "tail.")],
        tail_turn=_need(tail, "turn", int, "tail."),
        world=world,
        version=state["version"],
        fingerprint=config_fingerprint,
        checksum=saved_checksum if isinstance(saved_checksum, str) else None,
        epoch=epoch,
        source=_source_info(config),
        operators=_operator_infos(config),
        flush_every_k_chunks=_int_or(config.get("flush_every_k_chunks"), None),
        mixture=_mixture_target(state),
    )


def lanes_version(lanes: Sequence[LaneCheckpoint]) -> int:
    """The oldest format version that can hold ``lanes``."""
    if any(lc.epoch is not None for lc in lanes):
        return LANE_EPOCHS_VERSION
    return HELD_PAYLOADS_VERSION if any(lc.held_payloads for lc in lanes) else PLAIN_VERSION


def build(
    config: Mapping[str, Any],
    world: Mapping[str, Any],
    lanes: Sequence[LaneCheckpoint],
    tail_lanes: Sequence[int],
    tail_order: Sequence[int],
    tail_turn: int,
    config_fingerprint: str | None = None,
    mixture: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A sealed checkpoint; ``config_fingerprint`` is ``fingerprint(config)`` when the caller
    keeps it (the configuration of one iteration never changes); ``mixture``: the target the
    lanes' mixture counts are shares of."""
    state: dict[str, Any] = {
        "format": FORMAT,
        "version": lanes_version(lanes),
        "fingerprint": config_fingerprint or fingerprint(config),
        "config": config,
        "world": dict(world),
        "lanes": {str(lc.lane): lc.to_json() for lc in lanes},
        "tail": {"lanes": list(tail_lanes), "order": list(tail_order), "turn": tail_turn},
    }
    if mixture is not None:
        state["mixture"] = dict(mixture)
    return seal(state)
