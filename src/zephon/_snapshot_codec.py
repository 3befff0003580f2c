"""Snapshot states as JSON: held records become their meta (a cursor and its bookkeeping).

An accumulator that buffers records (open pack bins, a shuffle reservoir, mixture queues)
returns them in ``state_dict`` as the ``SampleRecord`` objects themselves. In a checkpoint each
one is written as its meta only, never its payload, so a checkpoint stays small whatever the
records hold; a restore rebuilds the payloads from the source (``snapshots.Rebuilder``).

A checkpoint taken with held payloads (``encode(..., held=HeldPayloads())``) writes each
record with its payload as well (``{"$zrp": [meta, payload]}``), so a restore reads it back
instead of fetching and re-running its source record. Payloads keep their exact types: numpy
arrays as dtype, shape and base64 bytes, numpy scalars and ``bytes`` likewise, tuples and
non-string dict keys tagged as in states. A record whose payload holds anything else (an
object array, a custom class, a payload not built yet) is written by meta and rebuilt.

A lane's saved state of one buffering operator is written deflated (``pack_state``: zlib,
base64 in a one-key ``$zz`` dict) once its JSON passes ``PACK_MIN_BYTES``: a reservoir of a few
hundred record metas is highly repetitive, so a checkpoint per training step stays a few KB.

Values keep their Python types across the round trip (tuples, integer dict keys, cursors,
contributor refs), because the restored records must equal the originals exactly. Tagged forms
are one-key dicts whose key starts with ``$z``; a plain dict with such a key is written tagged.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import zlib
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

import msgspec
import numpy as np

from zephon.errors import CheckpointError, ContractError
from zephon.types import (
    TAG_PACKING,
    ContributorRef,
    SampleCursor,
    SampleMeta,
    SampleRecord,
    control_as_tags,
    control_from_tags,
)

_TUPLE, _DICT, _DEQUE, _CURSOR, _REF, _RECORD, _FLOAT = (
    "$zt",
    "$zd",
    "$zq",
    "$zc",
    "$zr",
    "$zrec",
    "$zf",
)
_REFS, _SEGMENTS = "$zR", "$zS"  # compact forms of contributor refs and packing segments
_PACKED = "$zz"  # a deflated state (see pack_state)
_HELD = "$zrp"  # a record with its payload
_ARRAY, _SCALAR, _BYTES = "$zA", "$zN", "$zB"  # payload values: numpy arrays, scalars, bytes
_TAGS = frozenset(
    {
        _TUPLE,
        _DICT,
        _DEQUE,
        _CURSOR,
        _REF,
        _RECORD,
        _FLOAT,
        _REFS,
        _SEGMENTS,
        _PACKED,
        _HELD,
        _ARRAY,
        _SCALAR,
        _BYTES,
    }
)
PACK_MIN_BYTES = 256
HELD_LEVEL = 1  # zlib level of a state that holds payloads (see pack_state)
STATE_LEVEL = 6  # zlib level of the others


def pack_state(state: Any, *, payloads: bool = False) -> Any:
    """``state`` (checkpoint JSON) as ``{"$zz": base64(zlib(json))}`` when its JSON has at least
    ``PACK_MIN_BYTES`` bytes, else unchanged.

    The JSON is msgspec's (about 10x faster than the json module; its floats are finite here,
    :func:`encode` tags the others, and every float keeps its shortest round-trip form); what it
    refuses (a text with lone surrogates) goes through the json module. A state with held
    ``payloads`` (megabytes, mostly token ids and texts) is deflated at zlib ``HELD_LEVEL``:
    about 5x faster than level 6, for a file some 20 % larger."""
    try:
        raw = msgspec.json.encode(state)
    except (UnicodeEncodeError, TypeError, OverflowError, msgspec.EncodeError):
        raw = json.dumps(state, separators=(",", ":")).encode()
    level = HELD_LEVEL if payloads else STATE_LEVEL
    if len(raw) < PACK_MIN_BYTES and not _is_packed(state):  # a user's own "$zz" key: packed
        return state
    return {_PACKED: base64.b64encode(zlib.compress(raw, level)).decode("ascii")}


def _is_packed(value: Any) -> bool:
    return isinstance(value, dict) and len(value) == 1 and _PACKED in value


def unpack_state(value: Any) -> Any:
    """The inverse of :func:`pack_state` (a state that was not packed comes back as it is)."""
    if not _is_packed(value):
        return value
    try:
        return json.loads(zlib.decompress(base64.b64decode(value[_PACKED], validate=True)))
    except (TypeError, ValueError, binascii.Error, zlib.error) as exc:
        raise CheckpointError(
            f"checkpoint operator state is damaged ({type(exc).__name__}: {exc}); use another "
            "checkpoint"
        ) from None


class HeldRecord:
    """A record named by a restored snapshot, waiting for its payload to be rebuilt."""

    __slots__ = ("meta",)

    def __init__(self, meta: SampleMeta) -> None:
        self.meta = meta


class EncodedTag:
    """A tag of a restored record still in its checkpoint form (see :func:`materialize`).
    Decoded once: the metas a record had in its buffer and as it leaves share this object."""

    __slots__ = ("_decoded", "raw")

    def __init__(self, raw: Any) -> None:
        self.raw = raw
        self._decoded: Any = _UNSET

    def decoded(self) -> Any:
        if self._decoded is _UNSET:
            self._decoded = decode(self.raw)
        return self._decoded


_UNSET: Any = object()


def materialize(meta: SampleMeta) -> SampleMeta:
    """``meta`` with every tag still in checkpoint form decoded."""
    deferred = {k: v for k, v in meta.tags.items() if type(v) is EncodedTag}
    if not deferred:
        return meta
    return meta.with_tags(**{k: v.decoded() for k, v in deferred.items()})


def _cursor(cursor: SampleCursor) -> list[Any]:
    return [cursor[0], cursor[1], list(cursor[2]), list(cursor[3])]


def encode_meta(meta: SampleMeta) -> list[Any]:
    """A meta as JSON; a control record's ``control`` is written in its tag form (see
    ``control_as_tags``), so the format is the one it always was."""
    counts = meta.component_counts
    tags = meta.tags
    if meta.control is not None:
        tags = {**tags, **control_as_tags(meta.control)}
    return [
        list(meta.sample_id),
        meta.lane_id,
        meta.chunk_id,
        meta.chunk_offset,
        list(meta.lineage),
        meta.component_id,
        None if counts is None else encode(dict(counts)),
        encode(dict(tags)) if tags else {},
    ]


class HeldPayloads:
    """Asks :func:`encode` to write held records with their payloads, and counts them:
    ``written`` with a payload, ``by_meta`` by meta only (a payload it cannot write)."""

    __slots__ = ("by_meta", "written")

    def __init__(self) -> None:
        self.written = 0
        self.by_meta = 0


class _Unencodable(Exception):
    """A payload value with no exact JSON form (the record is then written by meta)."""


def _array(value: np.ndarray) -> Any:
    dtype = value.dtype
    if dtype.hasobject or dtype.fields is not None:
        raise _Unencodable(dtype)
    data = base64.b64encode(np.ascontiguousarray(value).tobytes()).decode("ascii")
    return {_ARRAY: [dtype.str, list(value.shape), data]}


def _payload_dict(value: dict[Any, Any]) -> Any:
    if all(type(k) is str and k not in _TAGS for k in value):
        return {k: encode_payload(v) for k, v in value.items()}
    return {_DICT: [[encode_payload(k), encode_payload(v)] for k, v in value.items()]}


_PAYLOAD_ENCODERS: dict[type, Callable[[Any], Any]] = {
    float: lambda value: _float(value, "payload", None),
    list: lambda value: [encode_payload(v) for v in value],
    dict: _payload_dict,
    tuple: lambda value: {_TUPLE: [encode_payload(v) for v in value]},
    np.ndarray: _array,
    bytes: lambda value: {_BYTES: base64.b64encode(value).decode("ascii")},
}


def register_array_view(kind: type[Any], resolve: Callable[[Any], np.ndarray]) -> None:
    """Encode a payload value of type ``kind`` as the array ``resolve(value)`` gives (the
    engine's shared-memory array references: the codec sits below the engine, which
    registers them where it defines them)."""
    _PAYLOAD_ENCODERS[kind] = lambda value: _array(resolve(value))


def encode_payload(value: Any) -> Any:
    """A payload as JSON data that :func:`decode` turns back into an equal value of the same
    types (see the module docstring); raises ``_Unencodable`` for anything else. Types match
    exactly (a subclass of dict or of ndarray would come back as its base)."""
    kind = type(value)
    if value is None or kind is bool or kind is int or kind is str:
        return value
    encoder = _PAYLOAD_ENCODERS.get(kind)
    if encoder is not None:
        return encoder(value)
    if isinstance(value, np.generic) and not value.dtype.hasobject and value.dtype.fields is None:
        return {_SCALAR: [value.dtype.str, base64.b64encode(value.tobytes()).decode("ascii")]}
    raise _Unencodable(kind)


def _record(value: SampleRecord, where: str, held: HeldPayloads | None) -> Any:
    if held is not None:
        try:
            payload = encode_payload(value.payload)
        except _Unencodable:
            held.by_meta += 1
        else:
            held.written += 1
            return {_HELD: [encode_meta(value.meta), payload]}
    return {_RECORD: encode_meta(value.meta)}


_PLAIN = frozenset({bool, int, str, type(None)})
"""Types :func:`encode` returns as they are: containers test for them inline, since a state
is mostly such values (a buffer's offsets, lengths and flags) and a call each costs more
than the test."""


def _list(value: Any, where: str, held: HeldPayloads | None) -> list[Any]:
    plain = _PLAIN
    return [v if type(v) in plain else encode(v, where, held) for v in value]


def _tuple(value: tuple[Any, ...], where: str, held: HeldPayloads | None) -> Any:
    if value and type(value[0]) is ContributorRef:
        return {_REFS: [[*_cursor(r.cursor), bool(r.is_last_child)] for r in value]}
    if value and type(value[0]) is tuple and value[0] and type(value[0][0]) is SampleCursor:
        return {_SEGMENTS: [[*_cursor(c), start, stop] for c, start, stop in value]}
    return {_TUPLE: _list(value, where, held)}


def _mapping(value: Mapping[Any, Any], where: str, held: HeldPayloads | None) -> Any:
    if all(type(k) is str and k not in _TAGS for k in value):
        plain = _PLAIN
        return {k: v if type(v) in plain else encode(v, where, held) for k, v in value.items()}
    return {_DICT: [[encode(k, where, held), encode(v, where, held)] for k, v in value.items()]}


def _float(value: float, where: str, held: HeldPayloads | None) -> Any:
    return value if math.isfinite(value) else {_FLOAT: repr(value)}


_ENCODERS: dict[type, Callable[[Any, str, HeldPayloads | None], Any]] = {
    float: _float,
    list: _list,
    SampleRecord: _record,
    SampleCursor: lambda value, where, held: {_CURSOR: _cursor(value)},
    ContributorRef: lambda value, where, held: {_REF: [_cursor(value.cursor), value.is_last_child]},
    tuple: _tuple,
    deque: lambda value, where, held: {_DEQUE: _list(value, where, held)},
    dict: _mapping,
    EncodedTag: lambda value, where, held: value.raw,  # never decoded: already in checkpoint form
}


def encode(value: Any, where: str = "state", held: HeldPayloads | None = None) -> Any:
    """``value`` as plain JSON data (see the module docstring); with ``held``, records are
    written with their payloads where they can be."""
    kind = type(value)
    if value is None or kind is bool or kind is int or kind is str:
        return value
    encoder = _ENCODERS.get(kind)
    if encoder is not None:
        return encoder(value, where, held)
    if isinstance(value, Mapping):
        return _mapping(value, where, held)
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return _float(float(value), where, held)
    raise ContractError(
        f"{where}: cannot save a {kind.__name__} in a checkpoint; state_dict() may hold JSON "
        "data, tuples, deques, SampleRecord objects and their cursors only"
    )


def _cursor_of(value: Any) -> SampleCursor:
    chunk, offset, lineage, sid = value
    return SampleCursor(int(chunk), int(offset), tuple(lineage), tuple(sid))  # type: ignore[arg-type]


Defer = frozenset[str]


def decode_meta(value: Any, defer: Defer = frozenset()) -> SampleMeta:
    """A record's meta; tags named in ``defer`` stay :class:`EncodedTag` s. Control tags (the
    form ``encode_meta`` writes) become the meta's typed ``control``."""
    sid, lane, chunk, offset, lineage, component, counts, tags = value
    decoded, control = control_from_tags(_tags(tags, defer)) if tags else ({}, None)
    return SampleMeta(
        tuple(sid),  # type: ignore[arg-type]
        lane,
        chunk,
        offset,
        tuple(lineage),
        component,
        None if counts is None else decode(counts),
        decoded,
        control,
    )


def _tags(tags: Any, defer: Defer) -> Any:
    if not defer or (len(tags) == 1 and next(iter(tags)) in _TAGS):
        return decode(tags)  # nothing deferred, or keys that needed the tagged form
    return {k: EncodedTag(v) if k in defer else decode(v) for k, v in tags.items()}


_DECODERS: dict[str, Callable[[Any, Defer], Any]] = {
    _RECORD: lambda body, defer: HeldRecord(decode_meta(body, defer)),
    _REFS: lambda body, defer: tuple(
        ContributorRef(SampleCursor(c, o, tuple(lin), tuple(sid)), last)
        for c, o, lin, sid, last in body
    ),
    _SEGMENTS: lambda body, defer: tuple(
        (SampleCursor(c, o, tuple(lin), tuple(sid)), start, stop)
        for c, o, lin, sid, start, stop in body
    ),
    _CURSOR: lambda body, defer: _cursor_of(body),
    _REF: lambda body, defer: ContributorRef(_cursor_of(body[0]), bool(body[1])),
    _TUPLE: lambda body, defer: tuple(decode(v, defer) for v in body),
    _DEQUE: lambda body, defer: deque(decode(v, defer) for v in body),
    _DICT: lambda body, defer: {decode(k, defer): decode(v, defer) for k, v in body},
    _FLOAT: lambda body, defer: float(body),
    _HELD: lambda body, defer: SampleRecord(decode_meta(body[0]), decode(body[1])),
    _ARRAY: lambda body, defer: _array_of(*body),
    _SCALAR: lambda body, defer: _array_of(body[0], [], body[1])[()],
    _BYTES: lambda body, defer: base64.b64decode(body, validate=True),
}


def _array_of(dtype_str: str, shape: list[int], data: str) -> np.ndarray:
    """A writable array from its ``$zA`` form (the byte count checked against the shape)."""
    dtype = np.dtype(dtype_str)
    raw = base64.b64decode(data, validate=True)
    out = np.empty(tuple(shape), dtype)
    if len(raw) != out.nbytes:
        raise ValueError(f"{len(raw)} bytes for an array of {out.nbytes}")
    if out.nbytes:
        out = np.frombuffer(bytearray(raw), dtype).reshape(out.shape)
    return out


def decode(value: Any, defer: Defer = frozenset()) -> Any:
    """The inverse of :func:`encode`; records come back as :class:`HeldRecord` s. Their tags
    named in ``defer`` stay in checkpoint form until :func:`materialize` (a restore that may
    never need them, for records that leave before anyone reads those tags, skips the work)."""
    if isinstance(value, list):
        return [decode(v, defer) for v in value]
    if not isinstance(value, dict):
        return value
    if len(value) == 1:
        ((key, body),) = value.items()
        decoder = _DECODERS.get(key)
        if decoder is not None:
            try:
                return decoder(body, defer)
            except (TypeError, ValueError, AttributeError) as exc:
                raise CheckpointError(
                    f"checkpoint operator state is damaged at {key}: {exc}"
                ) from None
    return {k: decode(v, defer) for k, v in value.items()}


def held_records(value: Any) -> list[HeldRecord]:
    """Every :class:`HeldRecord` in a decoded state, in walk order."""
    out: list[HeldRecord] = []
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, HeldRecord):
            out.append(item)
        elif isinstance(item, (list, tuple, deque)):
            stack.extend(item)
        elif isinstance(item, dict):
            stack.extend(item.values())
    return out


def fill(value: Any, payloads: Mapping[int, Any]) -> Any:
    """A decoded state with each held record replaced by a record with its rebuilt payload
    (``payloads`` by ``id()`` of the held record)."""
    if isinstance(value, HeldRecord):
        return SampleRecord(value.meta, payloads[id(value)])
    if isinstance(value, list):
        return [fill(v, payloads) for v in value]
    if isinstance(value, tuple):
        return tuple(fill(v, payloads) for v in value)
    if isinstance(value, deque):
        return deque(fill(v, payloads) for v in value)
    if isinstance(value, dict):
        return {k: fill(v, payloads) for k, v in value.items()}
    return value


def named_sources(states: Mapping[str, Any]) -> set[tuple[int, int, tuple[int, ...]]]:
    """The source records ``(chunk id, offset, sample id)`` a restore re-reads to rebuild the
    records one lane's encoded operator states name (a packed record names its segments')."""
    out: set[tuple[int, int, tuple[int, ...]]] = set()
    for state in states.values():
        for held in held_records(decode(unpack_state(state))):
            packing = held.meta.tags.get(TAG_PACKING)
            cursors = [seg[0] for seg in packing["segments"]] if packing else [held.meta.cursor]
            out.update((c[0], c[1], tuple(c[3])) for c in cursors)
    return out
