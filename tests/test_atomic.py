"""``write_atomic``: the one way zephon replaces a file (checkpoints, manifests, indexes)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from tests._kill_mid_write import kill_mid_write
from zephon._atomic import TEMP_MARK, replace_through, write_atomic
from zephon.capture.testing import RecordingFileSystem


@pytest.mark.parametrize("durable", [True, False])
def test_the_file_is_replaced_whole_with_the_usual_permissions(
    tmp_path: Path, durable: bool
) -> None:
    target = tmp_path / "new" / "folder" / "state.json"
    write_atomic(target, b"old", durable=durable)
    write_atomic(target, "néw", durable=durable)
    assert target.read_text(encoding="utf-8") == "néw"
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(target.stat().st_mode) == 0o666 & ~umask
    assert sorted(p.name for p in target.parent.iterdir()) == ["state.json"]


def test_a_failed_replace_keeps_the_old_file_and_leaves_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "taken"
    target.mkdir()  # a folder where the file should go: the rename fails
    (target / "inside").write_text("kept")
    with pytest.raises(OSError):
        write_atomic(target, b"data")
    assert (target / "inside").read_text() == "kept"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken"]


def test_a_writer_killed_before_its_rename_leaves_the_old_file_and_a_marked_temporary(
    tmp_path: Path,
) -> None:
    target = tmp_path / "state.json"
    write_atomic(target, "old")
    left = kill_mid_write(target, "new")
    assert target.read_text() == "old"
    assert len(left) == 2 and left[0].startswith(f".state.json{TEMP_MARK}")  # what folders skip


def test_the_capture_store_replaces_its_logs_through_the_same_durable_sequence(
    tmp_path: Path,
) -> None:
    fs = RecordingFileSystem()
    path = str(tmp_path / "log")
    replace_through(fs, path, b"new", tmp=f"{path}.tmp", directory=str(tmp_path), mode=0o644)
    kinds = [op.kind for op in fs.ops]
    assert kinds == ["open", "write", "sync", "close", "replace", "sync_dir"]
    assert fs.ops[4].path == f"{path}.tmp" and fs.ops[4].dst == path
    assert fs.ops[5].path == str(tmp_path)
    assert Path(path).read_bytes() == b"new" and not Path(f"{path}.tmp").exists()
