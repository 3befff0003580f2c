"""Ranks in separate processes gather their checkpoints; any world size restores the merge."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.engine._stateful import REFERENCE_CFG, build, key, lane_streams
from zephon.distributed import gather_checkpoints
from zephon.errors import CheckpointError

ROOT = Path(__file__).resolve().parents[2]


def run_ranks(tmp_path: Path, mode: str, world: int, steps: int) -> list[dict]:
    where = tmp_path / ("rendezvous" if mode == "torch" else "ckpts")
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.engine._rank_worker",
                str(r),
                str(world),
                str(steps),
                mode,
                str(where),
            ],
            cwd=ROOT,
        )
        for r in range(world)
    ]
    for p in procs:
        assert p.wait(timeout=120) == 0
    return [json.loads((tmp_path / f"out-{mode}-{r}.json").read_text()) for r in range(world)]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("mode", ["folder", "torch"])
def test_ranks_gather_and_a_single_rank_resumes(tmp_path: Path, mode: str):
    world, steps = 2, 6  # 6 batches per rank = 3 per lane: a window boundary
    outs = run_ranks(tmp_path, mode, world, steps)
    merged = outs[0]["merged"]
    assert all(o["merged"] == merged for o in outs)  # every rank got the same merge
    assert sorted(merged["lanes"]) == ["0", "1", "2", "3"]
    seen = [(lane, rows) for o in outs for lane, rows in o["seen"]]

    def wire(batches):
        return [(k[0], repr(k[1])) for k in map(key, batches)]

    rest = wire(build(REFERENCE_CFG, runner="inline").restore(merged))
    reference = lane_streams(wire(build(REFERENCE_CFG, runner="inline")))
    assert lane_streams(seen + rest) == reference


def test_folder_gather_times_out_naming_the_missing_rank(tmp_path: Path):
    pipe = build(REFERENCE_CFG, dp_rank=0, dp_world_size=2)
    state = pipe.checkpoint()
    with pytest.raises(CheckpointError, match=r"missing \['rank-00001.json'\]"):
        gather_checkpoints(state, folder=tmp_path, timeout_s=0.05)
