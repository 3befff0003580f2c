"""Token capture records, wire-compatible with NeMo Gym's ``TokenEntry`` schema version 1.

Why msgspec: a captured call carries thousands of token ids and log-probs; msgspec decodes and
encodes them several times faster than pydantic, and the canonical bytes (the idempotency key of
``put``) are produced straight from the struct without an intermediate dict.

Compatibility facts this module keeps bit-exact (golden vectors in ``tests/capture/fixtures``):

* canonical bytes = compact JSON of every field (defaults and ``null`` included) plus the
  preserved unknown fields, keys sorted at every level, non-ASCII kept as UTF-8, floats in the
  shortest round-trip form with a ``+`` on positive exponents (``1e+22``);
* ``compute_digest`` = SHA-256 over the tag ``nemo-gym-tokens`` followed by
  ``encode_token_ids`` (version byte 1, u64-BE count, u64-BE ids); the empty list hashes the
  tag alone.
"""

from __future__ import annotations

import enum
import hashlib
import math
import re
import sys
from array import array
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import msgspec

from zephon.errors import ZephonError

__all__ = [
    "DIGEST_VERSION",
    "GROUP_FIELD",
    "MAX_CALL_ID_CHARS",
    "MAX_TOKEN_ID",
    "TOKEN_ENTRY_MIN_SCHEMA_VERSION",
    "TOKEN_ENTRY_RECORD_SCHEMA_VERSION",
    "SampleGroup",
    "canonical_json",
    "entry_key",
    "require_finite",
    "validate_call_id",
    "validate_capture_keys",
    "validate_rollout_id",
]

TOKEN_ENTRY_RECORD_SCHEMA_VERSION = 1
MAX_CALL_ID_CHARS = 256
"""Longest model call id a store accepts: with a 200-character rollout id it stays far below
the size postgres can index (a key of about 2.7 kB), so every store holds the same ids."""
MAX_TOKEN_ID = 2**63 - 1
"""Largest token id a store accepts: what a signed 64-bit tensor (the training side) holds."""
TOKEN_ENTRY_MIN_SCHEMA_VERSION = 1
DIGEST_VERSION = 1
FINGERPRINT_VERSION = 2
STAGING_SCHEMA_VERSION = 2

_DIGEST_TAG = b"nemo-gym-tokens"
_EMPTY_DIGEST = hashlib.sha256(_DIGEST_TAG).hexdigest()
_ROLLOUT_ID_RE = re.compile(r"[A-Za-z0-9._-]{1,200}")
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")
_HEX64_RE = re.compile(r"[0-9a-f]{64}")
# An unsigned exponent (msgspec writes 1e22, NeMo Gym's orjson 1e+22). A hit is a number token
# when the digits before it follow a structural character; a hit inside a string only costs the
# slow path.
_DIGITS = frozenset(b"0123456789")
_NUMBER_CHARS = frozenset(b"0123456789.-")
_ENCODER = msgspec.json.Encoder(order="sorted")


class ParentResolutionStatus(enum.StrEnum):
    """The request-time lineage decision recorded on an entry."""

    ROOT = "root"
    RESOLVED = "resolved"
    UNRESOLVED = "unresolved"


# --------------------------------------------------------------------------- digests


def encode_token_ids(token_ids: Sequence[int]) -> bytes:
    """Version byte 1, u64 big-endian count, then each id as u64 big-endian."""
    try:
        packed = array("Q", token_ids)
    except (OverflowError, TypeError) as exc:
        raise ValueError(
            f"token ids must be integers in [0, 2**64): {exc}; check the engine's token ids"
        ) from None
    if sys.byteorder == "little":
        packed.byteswap()
    return bytes([DIGEST_VERSION]) + len(packed).to_bytes(8, "big") + packed.tobytes()


def compute_digest(token_ids: Sequence[int]) -> str:
    """Hex SHA-256 of a token sequence, bit-compatible with NeMo Gym's ``compute_digest``."""
    if len(token_ids) == 0:
        return _EMPTY_DIGEST
    return hashlib.sha256(_DIGEST_TAG + encode_token_ids(token_ids)).hexdigest()


# --------------------------------------------------------------------------- canonical JSON


def _fix_exponents(obj: Any) -> Any:
    """Replace floats whose msgspec form differs from NeMo Gym's with exact raw tokens."""
    if isinstance(obj, float):
        if math.isfinite(obj):
            raw = msgspec.json.encode(obj)
            i = raw.find(b"e")
            if i >= 0 and raw[i + 1 : i + 2] != b"-":
                return msgspec.Raw(raw[: i + 1] + b"+" + raw[i + 1 :])
        return obj
    if isinstance(obj, dict):
        return {k: _fix_exponents(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_fix_exponents(v) for v in obj]
    return obj


def _has_unsigned_exponent(out: bytes) -> bool:
    """Whether a number token like ``1e22`` occurs (cheap: scans only the ``e`` bytes)."""
    i = out.find(b"e", 1)
    while i >= 0:
        if out[i - 1] in _DIGITS and out[i + 1 : i + 2].isdigit():
            j = i - 1
            while j > 0 and out[j - 1] in _NUMBER_CHARS:
                j -= 1
            if j > 0 and out[j - 1] in b"[,:":
                return True
        i = out.find(b"e", i + 1)
    return False


def canonical_json(obj: Any) -> bytes:
    """Sorted-key compact JSON, byte-identical to ``orjson.dumps(obj, OPT_SORT_KEYS)``."""
    out = _ENCODER.encode(obj)
    if not _has_unsigned_exponent(out):
        return out
    return _ENCODER.encode(_fix_exponents(msgspec.to_builtins(obj)))


def entry_key(canonical: bytes) -> str:
    """The per-call idempotency key of a store: hex SHA-256 of the canonical bytes."""
    return hashlib.sha256(canonical).hexdigest()


# --------------------------------------------------------------------------- ids


def validate_rollout_id(rollout_id: object, *, field: str = "rollout_id") -> str:
    """Return ``rollout_id`` if it is 1-200 ASCII letters, digits, ``.``, ``_`` or ``-``.

    The restriction keeps ids usable as file names (no path escape) and SQL keys everywhere.
    """
    if not isinstance(rollout_id, str) or _ROLLOUT_ID_RE.fullmatch(rollout_id) is None:
        raise ValueError(
            f"{field} {rollout_id!r} is invalid: use 1-200 ASCII letters, digits, '.', '_' or '-'"
        )
    if rollout_id in {".", ".."}:
        raise ValueError(f"{field} {rollout_id!r} is invalid: '.' and '..' are reserved")
    return rollout_id


def validate_call_id(call_id: object, *, field: str = "model_call_id") -> str:
    """Return ``call_id`` if every store can hold it as a key, else raise ``ValueError``.

    1 to :data:`MAX_CALL_ID_CHARS` characters of valid Unicode (no lone surrogates) without
    control characters: postgres text refuses NUL and invalid UTF-8, and its index refuses
    long keys, so the rule is what the strictest store holds, applied to all of them alike.
    """
    if not isinstance(call_id, str) or not call_id:
        raise ValueError(f"{field} {call_id!r} is invalid: it must be a non-empty string")
    if len(call_id) > MAX_CALL_ID_CHARS:
        raise ValueError(
            f"{field} {call_id[:40]!r}... is invalid: {len(call_id)} characters, at most "
            f"{MAX_CALL_ID_CHARS}"
        )
    if _CONTROL_RE.search(call_id) is not None:
        raise ValueError(f"{field} {call_id!r} is invalid: it contains a control character")
    try:
        call_id.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"{field} {call_id!r} is invalid: it is not valid Unicode") from None
    return call_id


def validate_capture_keys(keys: str | Iterable[str]) -> list[str]:
    """Validate a whole batch of rollout ids before any mutation; drop repeats, keep order."""
    if isinstance(keys, str):
        keys = [keys]
    seen: dict[str, None] = {}
    for i, key in enumerate(keys):
        seen[validate_rollout_id(key, field=f"capture key #{i}")] = None
    return list(seen)


class CaptureRecordError(ZephonError, ValueError):
    """A capture record's field breaks its schema; ``field`` names it (the message starts with
    it). A ``ValueError`` too, so ``except ValueError`` written before this class still works."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


def _require(cond: bool, field: str, message: str) -> None:
    if not cond:
        raise CaptureRecordError(field, message)


# --------------------------------------------------------------------------- TokenEntry

_ENTRY_FIELDS: tuple[str, ...] = ()  # filled below


class TokenEntry(msgspec.Struct, kw_only=True, dict=True):
    """One captured model call (schema version 1). Unknown wire fields are preserved.

    Build from wire data with :meth:`from_json` / :meth:`from_dict` (full type validation, the
    error names the field); direct construction checks the cross-field rules only. Treat an
    instance as immutable once it has been put: its canonical bytes are its identity.
    """

    schema_version: int = TOKEN_ENTRY_RECORD_SCHEMA_VERSION
    rollout_id: str
    model_call_id: str
    model: str = ""
    prompt_token_ids: list[int]
    generation_token_ids: list[int]
    generation_log_probs: list[float]
    routed_experts: Any | None = None
    output_items: list[dict[str, Any]] = msgspec.field(default_factory=list)
    token_item_index: int | None = None
    response_id: str | None = None
    created_at: float = 0.0
    parent_call_id: str | None = None
    cum_len: int | None = None
    digest: str | None = None
    parent_resolution: ParentResolutionStatus | None = None
    continuation_fingerprint: str = ""
    continuation_context_len: int = 0
    continuation_context_digest: str = ""
    parent_resolution_reason: str = ""
    fingerprint_version: int | None = None
    prompt_is_delta: bool = False
    prefix_requested: bool = False
    prefix_supplied: bool = False
    weight_version: int | None = None
    """The policy weights that generated this call (zephon's field, not NeMo Gym's): a
    rollout whose calls span versions is a partial rollout; None when the engine named none."""

    def __post_init__(self) -> None:
        sv = self.schema_version
        _require(
            TOKEN_ENTRY_MIN_SCHEMA_VERSION <= sv <= TOKEN_ENTRY_RECORD_SCHEMA_VERSION,
            "schema_version",
            f"{sv} is not supported (this reader accepts {TOKEN_ENTRY_MIN_SCHEMA_VERSION}.."
            f"{TOKEN_ENTRY_RECORD_SCHEMA_VERSION}); upgrade zephon to read newer records",
        )
        _require(bool(self.rollout_id), "rollout_id", "must be a non-empty string")
        _require(bool(self.model_call_id), "model_call_id", "must be a non-empty string")
        if type(self.created_at) is not float:
            self.created_at = float(self.created_at)
        lps = self.generation_log_probs
        if not all(type(x) is float for x in lps):
            self.generation_log_probs = [float(x) for x in lps]
        _require(
            len(self.generation_log_probs) == len(self.generation_token_ids),
            "generation_log_probs",
            f"has {len(self.generation_log_probs)} values for "
            f"{len(self.generation_token_ids)} generation_token_ids (one per generated token)",
        )
        idx = self.token_item_index
        if idx is not None:
            _require(
                isinstance(idx, int) and not isinstance(idx, bool),
                "token_item_index",
                f"must be an integer index into output_items or null, got {idx!r}",
            )
            _require(
                0 <= idx < len(self.output_items),
                "token_item_index",
                f"{idx} is out of range for {len(self.output_items)} output_items",
            )
        status = self.parent_resolution
        if status is not None and not isinstance(status, ParentResolutionStatus):
            try:
                self.parent_resolution = status = ParentResolutionStatus(status)
            except ValueError:
                raise ValueError(
                    f"parent_resolution: {status!r} is not one of root, resolved, unresolved"
                ) from None
        if status is ParentResolutionStatus.RESOLVED:
            _require(bool(self.parent_call_id), "parent_call_id", "is required when RESOLVED")
        elif status is not None:
            _require(
                self.parent_call_id is None,
                "parent_call_id",
                f"must be null when parent_resolution is {status.value}",
            )
        if self.prompt_is_delta:
            _require(
                status is ParentResolutionStatus.RESOLVED and bool(self.parent_call_id),
                "prompt_is_delta",
                "a delta prompt needs parent_resolution 'resolved' and a parent_call_id",
            )
        version = self.weight_version
        if version is not None:
            _require(
                type(version) is int and 0 <= version <= MAX_TOKEN_ID,
                "weight_version",
                f"{version!r} is not a version: use an integer from 0 to {MAX_TOKEN_ID} or null",
            )

    # -- unknown fields ------------------------------------------------------------------

    @property
    def extra_fields(self) -> dict[str, Any]:
        """Wire fields this schema does not know, kept verbatim for lossless round trips."""
        extra: dict[str, Any] = self.__dict__.get("_extra", {})
        return extra

    def _set_extra(self, extra: Mapping[str, Any]) -> None:
        clash = set(extra) & set(_ENTRY_FIELDS)
        if clash:
            raise ValueError(f"extra fields {sorted(clash)} collide with TokenEntry fields")
        if extra:
            self.__dict__["_extra"] = dict(extra)

    # -- wire ----------------------------------------------------------------------------

    @classmethod
    def from_json(cls, data: bytes | str) -> TokenEntry:
        """Decode and validate one JSON entry (errors name the field, e.g. ``$.cum_len``)."""
        try:
            entry = _ENTRY_DECODER.decode(data)
            top = _RAW_DECODER.decode(data)
        except msgspec.ValidationError as exc:
            raise ValueError(f"invalid TokenEntry: {exc}") from None
        except msgspec.DecodeError as exc:
            raise ValueError(f"malformed TokenEntry JSON: {exc}") from None
        if len(top) > len(_ENTRY_FIELDS) or not set(top) <= _ENTRY_FIELD_SET:
            entry._set_extra(
                {k: msgspec.json.decode(v) for k, v in top.items() if k not in _ENTRY_FIELD_SET}
            )
        return entry

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TokenEntry:
        """Validate a wire dict (e.g. NeMo Gym's ``model_dump(mode="json")``)."""
        known = {k: v for k, v in data.items() if k in _ENTRY_FIELD_SET}
        try:
            entry = msgspec.convert(known, cls, strict=False)
        except msgspec.ValidationError as exc:
            raise ValueError(f"invalid TokenEntry: {exc}") from None
        extra = {k: v for k, v in data.items() if k not in _ENTRY_FIELD_SET}
        if extra:
            entry._set_extra(msgspec.to_builtins(extra))
        return entry

    def to_dict(self) -> dict[str, Any]:
        """The wire dict: every field (defaults included, ``weight_version`` only when set)
        plus preserved unknown fields."""
        out: dict[str, Any] = msgspec.to_builtins(self)
        if self.weight_version is None:
            del out["weight_version"]
        out.update(self.extra_fields)
        return out

    def canonical_bytes(self) -> bytes:
        """Sorted-key compact JSON; ``put`` compares these byte-for-byte.

        An unset ``weight_version`` is left out, so an entry captured before the field existed
        (and every NeMo Gym entry) keeps its bytes, and with them its identity in a store.
        """
        if "_extra" not in self.__dict__:
            out = canonical_json(self)
            if self.weight_version is None and out.endswith(_NO_VERSION):  # the last key
                return out[: -len(_NO_VERSION)] + b"}"
            return out
        return canonical_json(self.to_dict())

    def with_changes(self, **changes: Any) -> TokenEntry:
        """A validated copy with some fields replaced; unknown fields are carried over."""
        new = msgspec.structs.replace(self, **changes)
        if "_extra" in self.__dict__:
            new.__dict__["_extra"] = dict(self.__dict__["_extra"])
        return new

    def with_extra_fields(self, **extra: Any) -> TokenEntry:
        """A copy with more wire fields outside the schema (kept verbatim, e.g.
        ``zephon_group``); a name the schema knows is refused."""
        new = self.with_changes()
        new._set_extra({**self.extra_fields, **msgspec.to_builtins(extra)})
        return new

    @property
    def group(self) -> SampleGroup | None:
        """The group of samples this call belongs to (one request with ``n > 1``), if any."""
        raw = self.extra_fields.get(GROUP_FIELD)
        if not isinstance(raw, dict):
            return None
        gid, index, size = raw.get("id"), raw.get("index"), raw.get("size")
        if not isinstance(gid, str) or type(index) is not int or type(size) is not int:
            return None
        return SampleGroup(gid, index, size)


GROUP_FIELD = "zephon_group"


@dataclass(frozen=True, slots=True)
class SampleGroup:
    """Sample ``index`` of ``size`` drawn by one request (``n = size``): a GRPO group."""

    id: str
    index: int
    size: int

    def to_wire(self) -> dict[str, Any]:
        return {"id": self.id, "index": self.index, "size": self.size}


def require_finite(entry: TokenEntry) -> None:
    """Refuse an entry with a non-finite float before it is stored.

    JSON has no NaN or infinity: the canonical bytes would carry ``null`` and no reader could
    decode the entry again, so every ``put`` checks this first (the error names field and index).
    """
    lps = entry.generation_log_probs
    if not math.isfinite(sum(lps)):  # one C loop; the index is searched only on failure
        bad = next((i for i, x in enumerate(lps) if not math.isfinite(x)), None)
    else:
        bad = None
    if bad is not None:
        raise ValueError(
            f"rollout {entry.rollout_id!r} call {entry.model_call_id!r}: "
            f"generation_log_probs[{bad}] is {lps[bad]!r}; log-probs must be finite numbers "
            "(fix the engine's logprobs or drop the call)"
        )
    if not math.isfinite(entry.created_at):
        raise ValueError(
            f"rollout {entry.rollout_id!r} call {entry.model_call_id!r}: created_at is "
            f"{entry.created_at!r}; it must be a finite timestamp"
        )


_ENTRY_FIELDS = TokenEntry.__struct_fields__
_NO_VERSION = b',"weight_version":null}'
_ENTRY_FIELD_SET = frozenset(_ENTRY_FIELDS)
_ENTRY_DECODER = msgspec.json.Decoder(TokenEntry)
_RAW_DECODER = msgspec.json.Decoder(dict[str, msgspec.Raw])


def cumulative_tokens(entry: TokenEntry) -> list[int]:
    """Full prompt + generation; a delta record has no full prompt and is refused."""
    if entry.prompt_is_delta:
        raise ValueError(
            f"entry {entry.model_call_id!r} stores its prompt as a delta after parent "
            f"{entry.parent_call_id!r}; materialise the parent chain first"
        )
    return [*entry.prompt_token_ids, *entry.generation_token_ids]


# --------------------------------------------------------------------------- snapshot


class EngineRefusalRecord(msgspec.Struct, frozen=True, kw_only=True):
    """A call the engine declined before generating anything, with its request-time lineage."""

    model_call_id: str
    code: str
    parent_call_id: str | None = None
    parent_resolution: ParentResolutionStatus | None = None

    @classmethod
    def of(
        cls,
        *,
        model_call_id: str,
        code: str,
        parent_call_id: str | None = None,
        parent_resolution: ParentResolutionStatus | str | None = None,
    ) -> EngineRefusalRecord:
        """Build from a sink call's arguments (a status given as text is validated)."""
        return cls(
            model_call_id=model_call_id,
            code=code,
            parent_call_id=parent_call_id,
            parent_resolution=parent_resolution,  # type: ignore[arg-type]  # coerced below
        )

    def __post_init__(self) -> None:
        _require(bool(self.model_call_id), "model_call_id", "must be a non-empty string")
        _require(bool(self.code), "code", "must be a non-empty refusal code")
        status = self.parent_resolution
        if status is not None and not isinstance(status, ParentResolutionStatus):
            try:
                status = ParentResolutionStatus(status)
            except ValueError:
                raise ValueError(
                    f"parent_resolution: {status!r} is not one of root, resolved, unresolved"
                ) from None
            msgspec.structs.force_setattr(self, "parent_resolution", status)
        if status is ParentResolutionStatus.RESOLVED:
            _require(bool(self.parent_call_id), "parent_call_id", "is required when RESOLVED")
        elif status is not None:
            _require(
                self.parent_call_id is None,
                "parent_call_id",
                f"must be null when parent_resolution is {status.value}",
            )


class TokenCaptureSnapshot(msgspec.Struct, frozen=True, kw_only=True):
    """An immutable view of one rollout's frozen capture.

    ``entries`` are unique per ``model_call_id`` (order carries no meaning); ``incomplete`` is
    set by any mark, conflict or dangling intent; ``(snapshot_id, version)`` identify exactly
    this state for a conditional ``drop``; ``engine_refusals`` are in recording order.
    """

    rollout_id: str
    entries: tuple[TokenEntry, ...]
    incomplete: bool
    snapshot_id: str
    version: int
    engine_refusals: tuple[EngineRefusalRecord, ...] = ()

    @property
    def call_ids(self) -> frozenset[str]:
        return frozenset(e.model_call_id for e in self.entries)


# --------------------------------------------------------------------------- ledger rows


def _hex64(value: str | None, field: str, *, optional: bool = False) -> None:
    if value is None and optional:
        return
    _require(
        isinstance(value, str) and _HEX64_RE.fullmatch(value) is not None,
        field,
        f"{value!r} is not 64 lowercase hex characters",
    )


class CallRecord(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One token-free ledger / manifest row of a framework-staged call (staging schema 2)."""

    schema_version: Literal[2] = 2
    digest_version: Literal[2] = 2
    extras_digest_version: Literal[1] = 1
    model_call_id: str
    parent_call_id: str | None = None
    prev_len: int
    delta_len: int
    cum_len: int
    weight_version: int
    digest: str
    extras_digest: str
    staging_key: str
    mode: Literal["token_in", "text"] = "token_in"
    chain_hash: str
    cumulative_hash: str
    response_id: str
    admitted_at: float | None = None
    output_fingerprint: str | None = None
    continuation_fingerprint: str | None = None
    fingerprint_version: int = 0

    def __post_init__(self) -> None:
        for name in ("model_call_id", "staging_key", "response_id"):
            _require(bool(getattr(self, name)), name, "must be a non-empty string")
        if self.parent_call_id is not None:
            _require(bool(self.parent_call_id), "parent_call_id", "must be non-empty or null")
        for name in ("prev_len", "delta_len", "cum_len", "weight_version", "fingerprint_version"):
            _require(getattr(self, name) >= 0, name, "must be >= 0")
        _require(
            self.delta_len > 0 and self.cum_len == self.prev_len + self.delta_len,
            "cum_len",
            f"prev_len {self.prev_len} + delta_len {self.delta_len} must equal cum_len "
            f"{self.cum_len} with delta_len > 0",
        )
        if self.parent_call_id is None:
            _require(self.mode == "text", "mode", "a parentless row must use 'text' mode")
            _require(self.prev_len == 0, "prev_len", "a parentless row must have prev_len 0")
        else:
            _require(self.mode == "token_in", "mode", "a child row must use 'token_in' mode")
            _require(self.prev_len > 0, "prev_len", "a child row must have prev_len > 0")
        for name in ("digest", "extras_digest", "chain_hash", "cumulative_hash"):
            _hex64(getattr(self, name), name)
        _hex64(self.output_fingerprint, "output_fingerprint", optional=True)
        _hex64(self.continuation_fingerprint, "continuation_fingerprint", optional=True)
        if self.admitted_at is not None:
            _require(math.isfinite(self.admitted_at), "admitted_at", "must be finite")


class ManifestFailure(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A poison row: the call did not commit, so finalisation must reject the rollout."""

    schema_version: Literal[2] = 2
    model_call_id: str
    reason: str

    def __post_init__(self) -> None:
        _require(bool(self.model_call_id), "model_call_id", "must be a non-empty string")
        _require(bool(self.reason), "reason", "must be a non-empty reason code")


class RolloutManifest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The token-free ledger of one rollout: committed rows and failure rows."""

    schema_version: Literal[2] = 2
    rollout_id: str
    records: tuple[CallRecord, ...] = ()
    failures: tuple[ManifestFailure, ...] = ()

    def to_wire(self) -> dict[str, Any]:
        out: dict[str, Any] = msgspec.json.decode(msgspec.json.encode(self))
        return out

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> RolloutManifest:
        try:
            return msgspec.convert(dict(data), cls, strict=False)
        except msgspec.ValidationError as exc:
            raise ValueError(f"invalid RolloutManifest: {exc}") from None


class CaptureLedgerCommit(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The argument of ``CaptureLedger.record``: a row plus what lineage resolution needs."""

    schema_version: Literal[2] = 2
    rollout_id: str
    record: CallRecord
    staging_chain: tuple[str, ...] = ()
    request_items: list[dict[str, Any]]
    response_items: list[dict[str, Any]]

    def __post_init__(self) -> None:
        validate_rollout_id(self.rollout_id)
        for i, key in enumerate(self.staging_chain):
            _require(bool(key), f"staging_chain[{i}]", "must be a non-empty staging key")

    def canonical_bytes(self) -> bytes:
        return canonical_json(self)


class RolloutRemoval(msgspec.Struct, frozen=True, kw_only=True):
    """The result of ``retire`` / ``delete`` over a batch of capture keys, as wire data.

    ``capture_keys`` lists every key acted on (validated, repeats removed, in order);
    ``changed`` the subset whose state actually changed (the rest were already in the target
    state, which makes retrying a batch safe).
    """

    action: Literal["retire", "delete"]
    capture_keys: tuple[str, ...] = ()
    changed: tuple[str, ...] = ()

    def to_wire(self) -> dict[str, Any]:
        out: dict[str, Any] = msgspec.json.decode(msgspec.json.encode(self))
        return out
