"""benchmarks/device_checks.sh: the 16-core GPU checks as one command, tried small on CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.benchmarks._scripts import BENCHMARKS

QUICK = {
    "DOCS": "480",
    "WORKERS": "1",
    "ROUNDS": "1",
    "SIZES": "tiny",
    "STEPS": "1",
    "FEED_WORKERS": "1",
    "FEED_ARGS": "--warmup 1 --seq-len 128 --batch-size 2",
}


def last_json(path: Path) -> dict:
    return json.loads(path.read_text().strip().splitlines()[-1])


@pytest.mark.timeout(600)
def test_device_checks_write_every_table_to_out(tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = {**os.environ, **QUICK, "OUT": str(out), "PYTHON": sys.executable}
    proc = subprocess.run(
        ["bash", str(BENCHMARKS / "device_checks.sh")],
        cwd=BENCHMARKS.parent, env=env, capture_output=True, text=True, timeout=540,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(p.name for p in out.iterdir()) == [
        "gpu_feed_tiny.txt",
        "machine.txt",
        "scaling.txt",
    ]
    assert (out / "machine.txt").read_text().startswith(f"cores: {os.cpu_count()}")
    scaling = last_json(out / "scaling.txt")
    assert scaling["benchmark"] == "scaling" and [r["workers"] for r in scaling["rows"]] == [1]
    feed = last_json(out / "gpu_feed_tiny.txt")
    assert feed["benchmark"] == "gpu_feed" and feed["model_size"] == "tiny"
    assert [r["mode"] for r in feed["rows"]][-1] == "lane_workers"
