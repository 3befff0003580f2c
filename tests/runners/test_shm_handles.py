"""Payloads are walked for shared-memory handles only once the process has made one: a run
whose arrays all stay below ``min_bytes`` never walks them; a payload-heavy run still gets
every array resolved."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

CHILD = textwrap.dedent(
    """
    import numpy as np
    import zephon._engine.handoff.shm as shm
    from tests.engine._sources import RangeSource
    from tests.runners._pipes import heavy
    from zephon import Dataset, Pipeline

    def small(payload):
        return {**payload, "row": np.arange(payload["id"] + 1, dtype=np.int32)}

    if __name__ == "__main__":
        ds = Dataset.from_records("rows", [{"id": i} for i in range(40)], shard_size=10)
        pipe = Pipeline(RangeSource([ds], chunk_size=8))
        pipe = pipe.map_transform(small, parallelism=2).batch(4)
        rows = [r.payload["row"] for b in pipe.options(runner="process") for r in b]
        assert [len(row) for row in rows] == list(range(1, 41))
        print("small", shm._HANDLES_MADE)
        arrays = [r.payload["pixels"] for b in heavy("process", rows=8) for r in b]
        assert all(type(a) is np.ndarray and a.shape == (256, 1024) for a in arrays)
        print("heavy", shm._HANDLES_MADE)
    """
)


@pytest.mark.timeout(180)
def test_handles_are_looked_for_only_after_one_was_made(tmp_path: Path):
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    root = Path(__file__).resolve().parents[2]
    path = os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH")) if p)
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=root,
        env={**os.environ, "PYTHONPATH": path},
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["small", "False", "heavy", "True"]
