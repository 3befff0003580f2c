"""One rank of a GRPO job on two processes, started by ``torchrun`` in the TRL tests.

Usage: ``torchrun --nproc-per-node 2 tests/integrations/_trl_job.py OUT STORE_URL TOKENIZER``

Each rank trains :data:`JOB_STEPS` steps from the captured groups of ``STORE_URL`` with
``CapturedRollouts`` over one pipeline (the same on every rank) and writes the groups it was
served (admission, position, trained version) to ``OUT/served-r<RANK>.json``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from transformers import AutoTokenizer

from tests.integrations._launch import rank_exit, record_pid
from tests.integrations._trl_parts import N, grpo_trainer, pipeline, tiny
from zephon.integrations.trl import CapturedRollouts

# Each rank trains 2 groups a step; the test stream holds 4 with a learning signal (rewards not
# all equal) among rank 0's admissions (the even ones), 9 among rank 1's.
JOB_STEPS = 2


def main(out: Path, url: str, tokenizer: str) -> None:
    record_pid(out)
    os.environ["TRL_EXPERIMENTAL_SILENCE"] = "1"
    with rank_exit():
        tok = AutoTokenizer.from_pretrained(tokenizer)
        tok.pad_token = tok.eos_token
        with CapturedRollouts(pipeline(url), url, num_generations=N) as rollouts:
            trainer = grpo_trainer(
                rollouts,
                tiny(len(tok)),
                tok,
                out / "train",
                max_steps=JOB_STEPS,
                save_strategy="no",
            )
            trainer.train()
            served = [
                [g["admission"], g["position"], g["trained_version"]] for g in rollouts.served
            ]
            (out / f"served-r{rollouts.rank}.json").write_text(
                json.dumps({"world": rollouts.world_size, "served": served})
            )


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2], sys.argv[3])
