"""Real ``torchrun`` ranks with the default options: 2 ranks x grad-accum 1 checkpoint every 3
steps and are SIGKILLed; the job resumes on 1 rank x grad-accum 2 and on 4 ranks, and every
later optimizer step trains on the samples the uninterrupted run trained on."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.integrations._corpus import build_pipeline, row_digest
from tests.integrations._launch import (
    JOB_TIMEOUT_S,
    ROOT,
    job_env,
    json_lines,
    kill_ranks,
    run_until_parked_then_kill,
    torchrun_argv,
)

STEPS = 12
SAVED_AT = 6  # the newest checkpoint when the ranks are killed after step 7


def reference_steps(world: int, grad_accum: int, steps: int) -> list[frozenset[str]]:
    """The global sample set of each step of an uninterrupted run (the ranks' pipelines)."""
    ranks = [iter(build_pipeline(dp_rank=r, dp_world_size=world)) for r in range(world)]
    return [
        frozenset(
            row_digest(row.payload["input_ids"])
            for it in ranks
            for _ in range(grad_accum)
            for row in next(it).records
        )
        for _ in range(steps)
    ]


def trained_steps(out: Path, mode: str, world: int) -> dict[int, frozenset[str]]:
    steps: dict[int, set[str]] = {}
    for rank in range(world):
        for line in json_lines(out / f"{mode}-r{rank}.jsonl"):
            steps.setdefault(line["step"], set()).update(line["rows"])
    return {step: frozenset(rows) for step, rows in steps.items()}


@pytest.mark.timeout(2 * JOB_TIMEOUT_S)
def test_sigkill_then_resume_on_one_and_on_four_ranks_keeps_every_step(tmp_path: Path) -> None:
    killed = tmp_path / "killed"
    script = "_elastic_job.py"
    run_until_parked_then_kill(torchrun_argv(script, killed, "park", 1, STEPS), killed)
    reference = reference_steps(2, 1, STEPS)
    assert trained_steps(killed, "park", 2) == dict(enumerate(reference[:7], start=1))

    jobs = {}
    for world, grad_accum, steps in ((1, 2, STEPS), (4, 1, SAVED_AT + 3)):
        out = tmp_path / f"on-{world}"
        shutil.copytree(killed / "ckpt", out / "ckpt")
        argv = torchrun_argv(script, out, "resume", grad_accum, steps, nproc=world)
        jobs[world] = (out, subprocess.Popen(argv, cwd=ROOT, env=job_env(), text=True,
                                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT))  # fmt: skip
    try:
        logs = {world: proc.communicate(timeout=JOB_TIMEOUT_S)[0] for world, (_, proc) in jobs.items()}
    finally:
        for out, proc in jobs.values():
            if proc.poll() is None:
                proc.kill()
            kill_ranks(out)
    for world, (out, proc) in jobs.items():
        assert proc.returncode == 0, logs[world][-4000:]
        assert "regroup" not in logs[world]  # nothing is regrouped, and nothing says so
    # 1 rank x grad-accum 2: the same global batch, so every later step is the same set
    one = trained_steps(tmp_path / "on-1", "resume", 1)
    assert one == dict(enumerate(reference[SAVED_AT:], start=SAVED_AT + 1))
    # 4 ranks: a step takes 4 batches, the samples of two steps of the uninterrupted run
    four = trained_steps(tmp_path / "on-4", "resume", 4)
    pairs = [reference[i] | reference[i + 1] for i in range(SAVED_AT, STEPS, 2)]
    assert four == dict(enumerate(pairs, start=SAVED_AT + 1))
