"""The new-user walkthrough (scripts/new_user_walkthrough.py) passes end to end."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(180)
def test_new_user_walkthrough(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "new_user_walkthrough.py"),
            "--keep",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=170,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "identical to the uninterrupted run" in proc.stdout
    assert (tmp_path / "ckpt").is_dir() and (tmp_path / "capture").is_dir()
    assert "first hour ok: every message says what to do" in proc.stdout
    assert (tmp_path / "project" / "tok" / "tokenizer.json").is_file()
    assert not (tmp_path / "fresh-cache").exists()  # explain wrote nothing
    assert "walkthrough ok" in proc.stdout
