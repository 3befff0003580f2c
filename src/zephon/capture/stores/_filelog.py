"""The file store's log format: a header, two commit slots, then records.

Why commit slots: a log alone cannot tell a torn write that was never acknowledged from an
acknowledged record that was later cut off or damaged, and a truncation at a record boundary
leaves a perfectly valid, shorter log. So the head of every log holds two fixed-size slots,
each ``(sequence, length)`` with its own checksum. A write appends its record, overwrites the
slot ``(seq + 1) % 2`` with the new length, and syncs both with one ``fdatasync``; only then is
it acknowledged. The other slot still holds the previous length, which was synced before this
write began. On reading, with ``claimed`` the newest valid slot's length and ``durable`` the
other slot's:

* data valid up to ``claimed`` or beyond: clean (bytes after the valid end are a torn write
  that no slot claims, so no caller was told it is durable; a writer cuts them off);
* valid up to ``durable`` but not ``claimed``: the newest write was either in flight at a power
  loss or acknowledged and then damaged. The two cannot be told apart, so the rollout is marked
  incomplete (durably, with a warning naming file and offset) and the tail is cut;
* valid data ends before ``durable``: acknowledged records are gone, which is reported as
  :class:`~._fsutil.LogCorruptionError` naming the file and byte offset.

A log is created whole (temp file, sync, hard link) and compacted whole (temp file, rename), so
a file whose first line is not a valid header was not written by this store and is never
modified.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

import msgspec

from zephon.capture.stores._fsutil import LogCorruptionError, Scan, frame, parse_line, scan

__all__ = [
    "HEAD_READ",
    "LOG_FORMAT",
    "LOG_VERSION",
    "Head",
    "Verdict",
    "judge",
    "looks_like_capture_log",
    "new_log",
    "parse_head",
    "read_log",
    "slot_line",
]

LOG_FORMAT = "zephon-capture-log"
LOG_VERSION = 2
HEAD_READ = 1024  # bytes read to parse a head; a header line is far shorter
_HEADER = b"H"
_SLOT = b"C"
_SLOT_LEN = len(frame(_SLOT, b"%016x %016x" % (0, 0)))
_MAGIC = re.compile(rb'^H [0-9a-f]{8} \{[^\n]*"format":"zephon-capture-log"')


class _Header(msgspec.Struct):
    format: str
    version: int
    rollout_id: str


def slot_line(seq: int, length: int) -> bytes:
    """One commit slot: the log is acknowledged up to ``length`` as of write ``seq``."""
    return frame(_SLOT, b"%016x %016x" % (seq, length))


def new_log(rollout_id: str, records: bytes = b"") -> bytes:
    """A complete log: header, both slots claiming everything, then ``records``."""
    header = frame(_HEADER, msgspec.json.encode(_Header(LOG_FORMAT, LOG_VERSION, rollout_id)))
    end = len(header) + 2 * _SLOT_LEN + len(records)
    return header + slot_line(0, end) * 2 + records


@dataclass(frozen=True, slots=True)
class Head:
    """A parsed log head: where records start, where the slots sit, what they claim."""

    start: int
    slot_offsets: tuple[int, int]
    seq: int
    claimed: int
    durable: int

    def next_slot(self, seq: int) -> int:
        """The file offset of the slot that write ``seq`` overwrites."""
        return self.slot_offsets[seq % 2]


def looks_like_capture_log(data: bytes) -> bool:
    """Whether ``data`` starts like a header this store writes (even if damaged after)."""
    return _MAGIC.match(data) is not None


def _parse_slot(data: bytes) -> tuple[int, int] | None:
    if len(data) != _SLOT_LEN or not data.endswith(b"\n"):
        return None
    parsed = parse_line(data[:-1])
    if parsed is None or parsed[0] != _SLOT:
        return None
    seq, _, length = parsed[1].partition(b" ")
    try:
        return int(seq, 16), int(length, 16)
    except ValueError:
        return None


def _damaged(path: str, offset: int, what: str) -> LogCorruptionError:
    fix = "restore the file from a backup, or retire or delete the rollout to clear it"
    message = f"capture log {path} is damaged at byte {offset}: {what}; {fix}"
    return LogCorruptionError(message, path=path, offset=offset)


def parse_head(data: bytes, path: str, rollout_id: str | None) -> Head:
    """Parse the header and slots at the start of a log (``data``: its first bytes)."""
    if not looks_like_capture_log(data):
        raise LogCorruptionError(
            f"{path} is not a zephon capture log (no capture log header at byte 0); this "
            "store never modifies it: move it out of the store directory",
            path=path,
            offset=0,
        )
    nl = data.find(b"\n")
    parsed = None if nl < 0 else parse_line(data[:nl])
    if parsed is None or parsed[0] != _HEADER:
        raise _damaged(path, 0, "its header line is truncated or fails its checksum")
    try:
        header = msgspec.json.decode(parsed[1], type=_Header)
    except msgspec.DecodeError as exc:
        raise _damaged(path, 0, f"its header does not decode ({exc})") from None
    if header.version != LOG_VERSION or rollout_id not in (None, header.rollout_id):
        raise LogCorruptionError(
            f"capture log {path} (header at byte 0) holds version {header.version} of rollout "
            f"{header.rollout_id!r}; this reader handles version {LOG_VERSION} of "
            f"{rollout_id!r} (a renamed or foreign file): move it out of the store directory",
            path=path,
            offset=0,
        )
    first = nl + 1
    offsets = (first, first + _SLOT_LEN)
    slots = [_parse_slot(data[o : o + _SLOT_LEN]) for o in offsets]
    valid = sorted(s for s in slots if s is not None)
    if not valid:
        raise _damaged(path, first, "both commit slots fail their checksums")
    (seq, claimed), durable = valid[-1], valid[-1][1]
    if len(valid) == 2 and valid[0][0] >= seq - 1:
        durable = min(valid[0][1], claimed)
    return Head(first + 2 * _SLOT_LEN, offsets, seq, claimed, durable)


def read_log(data: bytes, path: str = "<log>") -> tuple[Head, Scan]:
    """The head and the valid records of a whole log's bytes (inspection and tests)."""
    head = parse_head(data[:HEAD_READ], path, None)
    return head, scan(data[head.start :], offset=head.start, line=4)


Verdict = Literal["clean", "torn", "lost_tail"]


def judge(head: Head, valid_end: int, size: int, path: str) -> Verdict:
    """Classify a log whose valid records end at ``valid_end`` (see the module doc)."""
    valid_end = min(valid_end, size)  # a file cut inside its head has no records at all
    if valid_end >= head.claimed:
        return "clean" if valid_end == size else "torn"
    if valid_end >= head.durable:
        return "lost_tail"
    what = (
        f"acknowledged records up to byte {head.durable} are missing"
        if valid_end == size
        else f"the record there is altered, while acknowledged data runs to byte {head.durable}"
    )
    raise _damaged(path, valid_end, what)
