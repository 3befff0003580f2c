"""Four gloo ranks train from zephon batches, checkpoint model and data, are killed, and resume
on two ranks and on four: each lane continues exactly where the checkpoint left it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests._ports import free_port
from tests.engine.test_checkpoint_stateful import REFERENCE_CFG, build, key

ROOT = Path(__file__).resolve().parents[1]
CHECKPOINT_AT = 3  # batches per rank on 4 ranks: 3 per lane, a window boundary


def launch(out: Path, world: int, steps: int, mode: str) -> list[subprocess.Popen[str]]:
    """``world`` rank processes with torchrun's environment, on loopback."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]),  # this checkout first
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "WORLD_SIZE": str(world),
        "GLOO_SOCKET_IFNAME": "lo",
        "OMP_NUM_THREADS": "1",
    }
    argv = [sys.executable, "-m", "tests._train_rank", str(out), str(steps), str(CHECKPOINT_AT)]
    return [
        subprocess.Popen(
            [*argv, mode],
            cwd=ROOT,
            env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for r in range(world)
    ]


def close_pipes(procs: list[subprocess.Popen[str]]) -> None:
    for p in procs:
        for stream in (p.stdin, p.stdout):
            if stream is not None:
                stream.close()


def seen(out: Path, mode: str, world: int) -> list[list[dict[str, Any]]]:
    """Per rank: the header line (start step, parameters) then one line per step."""
    files = [out / f"seen-{mode}-w{world}-r{r}.jsonl" for r in range(world)]
    return [[json.loads(line) for line in f.read_text().splitlines()] for f in files]


def lanes(lines: list[dict[str, Any]]) -> dict[int, list[str]]:
    streams: dict[int, list[str]] = {}
    for line in lines:
        streams.setdefault(line["lane"], []).append(line["rows"])
    return streams


@pytest.mark.timeout(240)
def test_killed_ranks_resume_on_two_and_on_four_ranks(tmp_path: Path) -> None:
    reference = lanes(
        [{"lane": lane, "rows": repr(rows)} for lane, rows in map(key, build(REFERENCE_CFG))]
    )
    first = launch(tmp_path, 4, 6, "fresh-then-wait")
    try:
        for p in first:  # each rank trained 6 steps (checkpoint after 3) and now waits
            assert p.stdout is not None and p.stdout.readline().strip() == "trained"
        first[1].send_signal(signal.SIGKILL)  # one rank dies, then the job is torn down
        for p in first:
            p.kill()
            assert p.wait(timeout=30) == -signal.SIGKILL
    finally:
        close_pipes(first)
    before = [lines[1:] for lines in seen(tmp_path, "fresh-then-wait", 4)]
    for r, lines in enumerate(before):  # rank r of 4 owns lane r
        assert [x["rows"] for x in lines] == reference[r][:6]
    saved_params = before[0][CHECKPOINT_AT - 1]["params"]

    resumes = {world: launch(tmp_path, world, 3 * 4 // world, "resume") for world in (2, 4)}
    for world, procs in resumes.items():
        try:
            for p in procs:
                assert p.wait(timeout=120) == 0
        finally:
            close_pipes(procs)
        resumed = seen(tmp_path, "resume", world)
        assert all(
            lines[0] == {"start": CHECKPOINT_AT, "params": saved_params} for lines in resumed
        )
        after = [lines[1:] for lines in resumed]
        # every lane continues exactly after the checkpoint, whoever runs it now
        assert lanes([x for lines in after for x in lines]) == {
            lane: rows[CHECKPOINT_AT:6] for lane, rows in reference.items()
        }
        owned = [[x["lane"] for x in lines] for lines in after]
        per_rank = 4 // world
        assert sorted(lane for o in owned for lane in o[:per_rank]) == [0, 1, 2, 3]
        for o in owned:  # a rank deals its own lanes in strict round-robin
            assert o == o[:per_rank] * CHECKPOINT_AT
    # on the same world size, training itself continues bit for bit (model restored with data)
    four = [lines[1:] for lines in seen(tmp_path, "resume", 4)]
    assert [[(x["loss"], x["params"]) for x in lines] for lines in four] == [
        [(x["loss"], x["params"]) for x in lines[CHECKPOINT_AT:]] for lines in before
    ]


EXIT_RANK_SCRIPT = """
import atexit, pathlib, sys
from zephon.distributed import exit_rank

out = pathlib.Path(sys.argv[1])

class Finalised:
    def __del__(self):
        (out / "finalised").touch()

keep = Finalised()  # a module global: only interpreter finalisation would delete it
atexit.register(lambda: (out / "hooks-ran").touch())
print("written before the exit", end="")  # no newline: still in the buffer of a pipe
exit_rank(7)
print("never")
"""


def test_exit_rank_runs_exit_hooks_flushes_and_leaves_without_finalising(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    done = subprocess.run(
        [sys.executable, "-c", EXIT_RANK_SCRIPT, str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 7, done.stderr
    assert done.stdout == "written before the exit"
    assert (tmp_path / "hooks-ran").exists()
    assert not (
        tmp_path / "finalised"
    ).exists()  # finalisation, where gloo's threads abort, never ran
