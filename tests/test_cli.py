from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from zephon.cli import main
from zephon.demo import run_from_argv


def test_demo_runs_end_to_end_and_prints_the_first_batch(tmp_path: Path, capsys):
    assert run_from_argv(["--docs", "300", "--shards", "3", "--data", str(tmp_path / "d")]) == 0
    out = capsys.readouterr().out
    assert "first batch (lane 0)" in out and "tokens/s" in out
    assert len(list((tmp_path / "d").glob("shard-*.jsonl"))) == 3


def test_cli_dispatches_demo_and_reports_version(tmp_path: Path, capsys):
    assert main(["demo", "--docs", "50", "--shards", "1", "--data", str(tmp_path / "d")]) == 0
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert "zephon 0.1.0" in capsys.readouterr().out


def test_console_script_runs_in_a_fresh_process():
    proc = subprocess.run(
        [sys.executable, "-m", "zephon.cli", "--help"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0
    assert "demo" in proc.stdout and "capture" in proc.stdout
