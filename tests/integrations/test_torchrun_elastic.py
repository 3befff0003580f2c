"""Real ``torchrun`` ranks with the default options: 2 ranks x grad-accum 1 checkpoint every 3
steps and are SIGKILLed; the job resumes on 1 rank x grad-accum 2 and on 4
ranks, and every later optimizer step trains on the samples the uninterrupted run trained on.
The 4-rank and 4 -> 2 cases also run in-process in tests/engine/test_global_order.py."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.integrations._corpus import build_pipeline, row_digest
from tests.integrations._launch import (
    JOB_TIMEOUT_S,
    json_lines,
    run_job,
    run_until_parked_then_kill,
    torchrun_argv,
)

STEPS = 12
SAVED_AT = 6  # the newest checkpoint when the ranks are killed after step 7
SCRIPT = "_elastic_job.py"


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


@pytest.mark.timeout(4 * JOB_TIMEOUT_S)
def test_sigkill_then_resume_on_one_and_on_four_ranks_keeps_every_step(tmp_path: Path) -> None:
    killed = tmp_path / "killed"
    run_until_parked_then_kill(torchrun_argv(SCRIPT, killed, "park", 1, STEPS), killed)
    reference = reference_steps(2, 1, STEPS)
    assert trained_steps(killed, "park", 2) == dict(enumerate(reference[:7], start=1))
    for world in (1, 4):
        resume_and_check(killed, tmp_path / f"resumed-{world}", world, reference)


def resume_and_check(
    killed: Path, resumed: Path, world: int, reference: list[frozenset[str]]
) -> None:
    """Resume the step-6 checkpoint on ``world`` ranks with the same global batch of 2."""
    shutil.copytree(killed / "ckpt", resumed / "ckpt")
    grad_accum = 2 // world if world < 2 else 1
    steps = STEPS if world == 1 else SAVED_AT + 3
    done = run_job(torchrun_argv(SCRIPT, resumed, "resume", grad_accum, steps, nproc=world),
                   resumed)  # fmt: skip
    assert "regroup" not in done.stdout + done.stderr  # nothing is regrouped, nothing said
    got = trained_steps(resumed, "resume", world)
    if world == 1:  # the same global batch: every later step is the same set
        expected = reference[SAVED_AT:]
    else:  # a step of 4 ranks takes the batches of two steps of the uninterrupted run
        expected = [reference[i] | reference[i + 1] for i in range(SAVED_AT, STEPS, 2)]
    assert got == dict(enumerate(expected, start=SAVED_AT + 1)), f"resumed on {world} ranks"
