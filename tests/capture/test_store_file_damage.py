"""File-store damage: every bit flip or truncation of an acknowledged record is reported.

The matrix damages complete logs written by the store (every record acknowledged) at 20
offsets inside each kind of record, by flipping one bit and by truncating there, then opens
the log in a cold client. Allowed outcomes: a :class:`LogCorruptionError` naming the file and
byte offset, or a snapshot with every entry intact, or (only where the newest write is hit) a
snapshot marked incomplete, durably, with a warning. Never fewer entries without saying so.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, Literal, TypeVar

import pytest

from tests.capture._workload import make_entry
from zephon.capture.protocols import TokenCaptureRetiredError
from zephon.capture.records import TokenCaptureSnapshot
from zephon.capture.stores._file import FileStore, reset_process_cache
from zephon.capture.stores._filelog import read_log
from zephon.capture.stores._fsutil import LogCorruptionError, frame

T = TypeVar("T")
RID = "dmg"
CALLS = [f"c{i}" for i in range(1, 6)]
Damage = Literal["flip", "truncate"]


def _run(coro: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coro)


async def _write(directory: Path, *, freeze: bool, retire: bool) -> None:
    store = FileStore(str(directory))
    for cid in CALLS:
        await store.begin_call(RID, cid)
        await store.put(make_entry(RID, cid))
    if freeze:
        await store.freeze(RID)
    if retire:
        await store.retire(RID)
    await store.close()


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    """Pristine logs: ending in a put, ending in an event (freeze), and a retired one."""
    out = {}
    for name, freeze, retire in [("put", False, False), ("event", True, False), ("S", True, True)]:
        d = tmp_path_factory.mktemp(f"log-{name}")
        _run(_write(d, freeze=freeze, retire=retire))
        out[name] = (d / f"{RID}.log").read_bytes()
    reset_process_cache()
    return out


def _regions(logs: dict[str, bytes]) -> dict[str, tuple[str, int, int]]:
    """Record kind -> (log, start, end) of one record of that kind."""
    head, result = read_log(logs["put"])
    recs = result.records
    slot0, slot1 = head.slot_offsets
    _, event_scan = read_log(logs["event"])
    _, state_scan = read_log(logs["S"])
    return {
        "header": ("put", 0, slot0),
        "slot0": ("put", slot0, slot1),
        "slot1": ("put", slot1, head.start),
        "intent": ("put", recs[2].offset, recs[2].end),
        "put": ("put", recs[3].offset, recs[3].end),
        "last_put": ("put", recs[-1].offset, recs[-1].end),
        "last_event": ("event", event_scan.records[-1].offset, event_scan.records[-1].end),
        "state": ("S", state_scan.records[0].offset, state_scan.records[0].end),
    }


KINDS = ["header", "slot0", "slot1", "intent", "put", "last_put", "last_event", "state"]
OFFSETS = 20


def _damaged(data: bytes, how: Damage, at: int) -> bytes:
    if how == "truncate":
        return data[:at]
    flipped = bytearray(data)
    flipped[at] ^= 1 << (at % 8)
    return bytes(flipped)


async def _open(path: Path) -> TokenCaptureSnapshot | LogCorruptionError | str:
    reset_process_cache()
    store = FileStore(str(path.parent))
    try:
        return await store.freeze(RID)
    except LogCorruptionError as exc:
        return exc
    except TokenCaptureRetiredError:
        return "retired"
    finally:
        await store.close()


def _check_reported(got: object, path: Path, size: int) -> None:
    assert isinstance(got, LogCorruptionError), got
    assert got.path == str(path) and 0 <= got.offset <= size
    assert f"byte {got.offset}" in str(got) and str(path) in str(got)


@pytest.mark.parametrize("how", ["flip", "truncate"])
@pytest.mark.parametrize("kind", KINDS)
def test_damage_matrix(
    kind: str,
    how: Damage,
    logs: dict[str, bytes],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    source, start, end = _regions(logs)[kind]
    pristine = logs[source]
    expected = {cid: make_entry(RID, cid).canonical_bytes() for cid in CALLS}
    path = tmp_path / f"{RID}.log"
    step = max(1, (end - start) // OFFSETS)
    offsets = sorted({min(start + i * step, end - 1) for i in range(OFFSETS)})
    assert len(offsets) == OFFSETS
    for at in offsets:
        caplog.clear()
        damaged = _damaged(pristine, how, at)
        path.write_bytes(damaged)
        with caplog.at_level(logging.WARNING, logger="zephon.capture"):
            got = _run(_open(path))
        where = f"{kind} {how} at byte {at}"
        if kind == "header" or (how == "truncate" and kind not in ("last_put", "last_event")):
            _check_reported(got, path, len(damaged))
            if kind == "header":
                assert path.read_bytes() == damaged, f"{where}: a foreign-looking file changed"
            continue
        if kind in ("slot0", "slot1"):  # one damaged slot: the other still proves the length
            assert isinstance(got, TokenCaptureSnapshot), f"{where}: {got!r}"
            assert {e.model_call_id for e in got.entries} == set(CALLS) and not got.incomplete
            continue
        if kind in ("intent", "put", "state"):
            _check_reported(got, path, len(damaged))
            continue
        # The newest record: in flight at a crash or damaged after its acknowledgement.
        assert isinstance(got, TokenCaptureSnapshot), f"{where}: {got!r}"
        assert got.incomplete, f"{where}: a lost newest record must mask the rollout"
        assert str(path) in caplog.text and "incomplete" in caplog.text
        want = set(CALLS) if kind == "last_event" else set(CALLS[:-1])
        assert {e.model_call_id for e in got.entries} == want, where
        for entry in got.entries:
            assert entry.canonical_bytes() == expected[entry.model_call_id], where
        again = _run(_open(path))  # the verdict is durable: a second cold open agrees
        assert isinstance(again, TokenCaptureSnapshot) and again.incomplete, where


def _five_puts(tmp_path: Path) -> Path:
    store = FileStore(str(tmp_path))
    for cid in CALLS:
        _run(store.put(make_entry(RID, cid)))
    return Path(store.log_path(RID))


def test_a_flipped_bit_in_the_last_record_masks_the_rollout(tmp_path: Path) -> None:
    log = _five_puts(tmp_path)
    last = read_log(log.read_bytes())[1].records[-1]
    data = bytearray(log.read_bytes())
    data[last.offset + 200] ^= 0x04
    log.write_bytes(bytes(data))
    snap = _run(_open(log))
    assert isinstance(snap, TokenCaptureSnapshot)
    assert len(snap.entries) == 4 and snap.incomplete


@pytest.mark.parametrize("where", ["inside_last", "boundary_before_last", "earlier_boundary"])
def test_truncation_is_never_silent(tmp_path: Path, where: str) -> None:
    log = _five_puts(tmp_path)
    recs = read_log(log.read_bytes())[1].records
    cut = {
        "inside_last": recs[-1].offset + 100,
        "boundary_before_last": recs[-1].offset,
        "earlier_boundary": recs[-2].offset,
    }[where]
    with open(log, "r+b") as f:
        f.truncate(cut)
    got = _run(_open(log))
    if where == "earlier_boundary":
        _check_reported(got, log, cut)
        assert got.offset == cut  # type: ignore[union-attr]
    else:
        assert isinstance(got, TokenCaptureSnapshot)
        assert len(got.entries) == 4 and got.incomplete


@pytest.mark.parametrize("action", ["retire", "delete"])
def test_retire_and_delete_clear_a_damaged_rollout(tmp_path: Path, action: str) -> None:
    log = _five_puts(tmp_path)
    middle = read_log(log.read_bytes())[1].records[1]
    with open(log, "r+b") as f:
        f.seek(middle.offset + 30)
        f.write(b"#")
    reset_process_cache()
    cold = FileStore(str(tmp_path))
    with pytest.raises(LogCorruptionError):
        _run(cold.freeze(RID))
    removal = _run(getattr(cold, action)(RID))
    assert removal.changed == (RID,)
    if action == "retire":
        with pytest.raises(TokenCaptureRetiredError):
            _run(cold.put(make_entry(RID, "late")))
        assert cold.state_of(RID).retired
        assert _run(cold.delete(RID)).changed == (RID,)
    assert not log.exists()
    _run(cold.put(make_entry(RID, "fresh")))  # the id is usable again
    assert [e.model_call_id for e in _run(cold.freeze(RID)).entries] == ["fresh"]


def test_a_checksummed_header_of_the_wrong_shape_is_reported_and_kept(tmp_path: Path) -> None:
    log = tmp_path / f"{RID}.log"
    data = frame(b"H", b'{"format":"zephon-capture-log","version":"two"}') + b"rest\n"
    log.write_bytes(data)
    got = _run(_open(log))
    _check_reported(got, log, len(data))
    assert "header does not decode" in str(got)
    assert log.read_bytes() == data
