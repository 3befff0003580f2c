"""The eval sets the evaluation tests read, and the rows each holds (every job builds them alike).

``main`` leaves the four lanes 8, 1, 8 and 8 batches (the last of three lanes a partial one),
so two ranks hold 9 and 16 batches; ``tiny`` has one lane with batches, so one of two ranks
holds none.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

from tests.integrations._corpus import BATCH, build_pipeline_unbatched, row_digest
from zephon import Pipeline
from zephon.torch_data import hf_tensors

EVAL_DOCS = {"main": 50, "tiny": 5}
# Seconds an evaluation job may take: about 20 s of CPU, but over 2 min on a loaded 2-core machine
EVAL_JOB_TIMEOUT_S = 480


def eval_pipeline(name: str) -> Pipeline:
    """The eval set ``name``: the training corpus's pipeline, keeping partial batches."""
    return build_pipeline_unbatched(docs=EVAL_DOCS[name]).batch(BATCH, drop_last=False)


def eval_sets() -> dict[str, Pipeline]:
    return {name: eval_pipeline(name) for name in EVAL_DOCS}


def eval_rows(name: str) -> Counter[str]:
    """Every row digest of eval set ``name``, read in one process."""
    return Counter(row_digest(r) for b in eval_pipeline(name) for r in hf_tensors(b)["input_ids"])


class RecordEval:
    """An eval transform: HF tensors, and one JSON line per batch with the evaluation's label
    (set by the job before each evaluation) in ``OUT/eval-r<RANK>-<PID>.jsonl``."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.label = ""

    def __call__(self, batch: Any) -> dict[str, Any]:
        inputs = hf_tensors(batch)
        rank = os.environ.get("RANK", "0")
        line = {"eval": self.label, "rows": [row_digest(r) for r in inputs["input_ids"]]}
        with open(self.out / f"eval-r{rank}-{os.getpid()}.jsonl", "a", encoding="utf-8") as fh:
            fh.write(json.dumps(line) + "\n")
        return inputs


def evaluated_rows(out: Path) -> dict[str, Counter[str]]:
    """Label -> every row digest evaluated under it, over all ranks and processes."""
    seen: dict[str, Counter[str]] = {}
    for path in sorted(out.glob("eval-r*.jsonl")):
        for text in path.read_text(encoding="utf-8").splitlines():
            line = json.loads(text)
            seen.setdefault(line["eval"], Counter()).update(line["rows"])
    return seen
