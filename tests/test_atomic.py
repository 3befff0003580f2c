"""``write_atomic``: the one way zephon replaces a file (checkpoints, manifests, indexes)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from zephon._atomic import write_atomic


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
