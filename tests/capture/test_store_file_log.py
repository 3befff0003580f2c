"""Log primitives of the file store: framing, scanning, durable create/replace/unlink, locks."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from pathlib import Path

import pytest

from zephon.capture.stores._fsio import OS_FS
from zephon.capture.stores._fsutil import (
    create_durable,
    frame,
    open_locked,
    replace_durable,
    scan,
    unlink_durable,
)


def _log(*bodies: bytes) -> bytes:
    return b"".join(frame(b"E", body) for body in bodies)


def test_frame_scan_roundtrip_offsets_and_lines() -> None:
    bodies = [b'{"a":1}', b'{"b":"x y"}', b"{}"]
    buf = _log(*bodies)
    result = scan(buf, offset=0, line=1)
    assert [r.body for r in result.records] == bodies
    assert [r.line for r in result.records] == [1, 2, 3]
    assert result.end == len(buf) and result.torn == 0 and result.lines == 3
    for rec in result.records:
        assert buf[rec.offset : rec.end] == frame(b"E", rec.body)


def test_scan_of_a_tail_continues_offsets_and_line_numbers() -> None:
    head = _log(b"1", b"2")
    tail = _log(b"3")
    result = scan(tail, offset=len(head), line=3)
    assert result.records[0].offset == len(head)
    assert result.records[0].line == 3
    assert result.end == len(head) + len(tail)


@pytest.mark.parametrize("cut", [1, 5, 11, 30])
def test_torn_final_line_is_reported_not_raised(cut: int) -> None:
    good = _log(b'{"a":1}')
    last = frame(b"E", b'{"payload":"' + b"z" * 40 + b'"}')
    buf = good + last[:cut]
    result = scan(buf, offset=0, line=1)
    assert [r.body for r in result.records] == [b'{"a":1}']
    assert result.end == len(good)
    assert result.torn == cut


def test_final_line_with_bad_checksum_counts_as_torn() -> None:
    good = _log(b"ok")
    bad = bytearray(frame(b"E", b"payload"))
    bad[-3] ^= 0x01
    result = scan(good + bytes(bad), offset=0, line=1)
    assert len(result.records) == 1
    assert result.torn == len(bad)


def test_a_damaged_line_with_more_after_it_is_reported_as_followed() -> None:
    bad = bytearray(frame(b"E", b"second"))
    bad[-3] ^= 0x01
    first = _log(b"first")
    buf = first + bytes(bad) + _log(b"third")
    result = scan(buf, offset=100, line=1)
    assert [r.body for r in result.records] == [b"first"]
    assert result.end == 100 + len(first) and result.followed
    assert result.torn == len(buf) - len(first)


def test_pwritev_writes_every_part_at_its_offset(tmp_path: Path) -> None:
    path = tmp_path / "a.log"
    fd = OS_FS.open(str(path), os.O_RDWR | os.O_CREAT)
    try:
        OS_FS.pwritev(fd, [b"x" * 100_000, b"y"], 0)
        OS_FS.pwritev(fd, [b"z"], 3)
    finally:
        os.close(fd)
    assert path.read_bytes() == b"xxxz" + b"x" * 99_996 + b"y"


def test_create_durable_never_overwrites_and_leaves_no_temp(tmp_path: Path) -> None:
    path = str(tmp_path / "r.log")
    assert create_durable(OS_FS, str(tmp_path), path, b"first")
    assert not create_durable(OS_FS, str(tmp_path), path, b"second")
    assert Path(path).read_bytes() == b"first"
    assert os.listdir(tmp_path) == ["r.log"]


def test_open_locked_of_a_missing_file_returns_none(tmp_path: Path) -> None:
    assert open_locked(OS_FS, str(tmp_path / "missing.log"), exclusive=True) is None
    assert not (tmp_path / "missing.log").exists()


_TRY_LOCK = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
flag = fcntl.LOCK_EX if sys.argv[2] == "ex" else fcntl.LOCK_SH
try:
    fcntl.flock(fd, flag | fcntl.LOCK_NB)
    print("got")
except BlockingIOError:
    print("blocked")
"""


def _try_lock_in_child(path: Path, mode: str) -> str:
    out = subprocess.run(
        [sys.executable, "-c", _TRY_LOCK, str(path), mode],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    return out.stdout.strip()


@pytest.mark.timeout(60)
def test_exclusive_lock_excludes_other_processes(tmp_path: Path) -> None:
    path = tmp_path / "r.log"
    path.write_bytes(b"")
    fd = open_locked(OS_FS, str(path), exclusive=True)
    assert fd is not None
    try:
        assert _try_lock_in_child(path, "sh") == "blocked"
        assert _try_lock_in_child(path, "ex") == "blocked"
        fcntl.flock(fd, fcntl.LOCK_UN)
        assert _try_lock_in_child(path, "ex") == "got"
    finally:
        os.close(fd)


@pytest.mark.timeout(60)
def test_shared_locks_coexist_but_exclude_writers(tmp_path: Path) -> None:
    path = tmp_path / "r.log"
    path.write_bytes(b"")
    fd = open_locked(OS_FS, str(path), exclusive=False)
    assert fd is not None
    try:
        assert _try_lock_in_child(path, "sh") == "got"
        assert _try_lock_in_child(path, "ex") == "blocked"
    finally:
        os.close(fd)


def test_open_locked_follows_a_replaced_file(tmp_path: Path) -> None:
    path = tmp_path / "r.log"
    path.write_bytes(b"old")
    stale = os.open(path, os.O_RDONLY)
    try:
        replace_durable(OS_FS, str(tmp_path), str(path), b"new")
        assert os.fstat(stale).st_nlink == 0  # the detached inode is what lockers must detect
        fd = open_locked(OS_FS, str(path), exclusive=True)
        assert fd is not None
        assert os.fstat(fd).st_ino == path.stat().st_ino
        assert os.pread(fd, 10, 0) == b"new"
        os.close(fd)
    finally:
        os.close(stale)
    assert not list(tmp_path.glob("*.tmp"))


def test_unlink_durable_reports_whether_it_removed(tmp_path: Path) -> None:
    path = tmp_path / "r.log"
    path.write_bytes(b"x")
    assert unlink_durable(OS_FS, str(tmp_path), str(path)) is True
    assert unlink_durable(OS_FS, str(tmp_path), str(path)) is False
    assert not path.exists()
