"""End to end: tool-using rollouts captured by two writer processes into the file store,
resolved across them, frozen, built, fed through a pipeline and batched (plain and packed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import numpy as np
import pytest

from tests.capture._procs import REPO
from zephon import Pipeline
from zephon.capture.dataset import CaptureSource

ROLLOUTS = 6
TURNS = 3


def spawn(url: str) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "src")]))
    return subprocess.Popen(
        [sys.executable, "-m", "tests.capture._e2e_worker", url],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env=env,
    )


def call(worker: subprocess.Popen[str], rollout_id: str, items: list[dict[str, Any]]) -> Any:
    assert worker.stdin is not None and worker.stdout is not None
    worker.stdin.write(json.dumps({"rollout_id": rollout_id, "items": items}) + "\n")
    worker.stdin.flush()
    line = worker.stdout.readline()
    assert line, f"worker {worker.pid} died (exit {worker.poll()})"
    return json.loads(line)


def capture(url: str) -> dict[str, list[dict[str, Any]]]:
    """Play the harness: every turn goes to the other worker process than the previous one."""
    workers = [spawn(url), spawn(url)]
    calls: dict[str, list[dict[str, Any]]] = {}
    items: dict[str, list[dict[str, Any]]] = {}
    try:
        for turn in range(TURNS):
            for r in range(ROLLOUTS):
                rid = f"rollout-{r}"
                if turn == 0:
                    items[rid] = [
                        {"role": "system", "content": "You use tools."},
                        {"role": "user", "content": f"Plan a day in Paris #{r}"},
                    ]
                answer = call(workers[(r + turn) % 2], rid, items[rid])
                calls.setdefault(rid, []).append(answer)
                items[rid] = [*items[rid], *answer["output_items"]]
                for out in answer["output_items"]:
                    if out.get("type") == "function_call":
                        result = f"result of {out['name']} for {rid}"
                        items[rid].append(
                            {
                                "type": "function_call_output",
                                "call_id": out["call_id"],
                                "output": result,
                            }
                        )
    finally:
        for w in workers:
            assert w.stdin is not None
            w.stdin.close()
        for w in workers:
            assert w.wait(timeout=30) == 0
            assert w.stdout is not None
            w.stdout.close()
    return calls


def expected(calls: list[dict[str, Any]]) -> tuple[list[int], list[int], list[float]]:
    last = calls[-1]
    tokens = last["prompt"] + last["generation"]
    mask = [0] * len(tokens)
    lps = [0.0] * len(tokens)
    for c in calls:
        start = len(c["prompt"])
        assert tokens[: start + len(c["generation"])] == c["prompt"] + c["generation"]
        for i, lp in enumerate(c["logprobs"]):
            mask[start + i] = 1
            lps[start + i] = lp
    return tokens, mask, lps


@pytest.mark.timeout(90)
def test_two_writer_processes_to_packed_batches(tmp_path: Any) -> None:
    url = f"file://{tmp_path / 'capture'}"
    calls = capture(url)
    for rid, cs in calls.items():
        assert [c["status"] for c in cs] == ["root", "resolved", "resolved"], rid
        assert [c["parent"] for c in cs[1:]] == [cs[0]["call_id"], cs[1]["call_id"]]

    rids = sorted(calls)
    source = CaptureSource(url, rids, chunk_size=2)
    assert source.masked == [] and source.rollout_ids == rids
    for rid in rids:
        notes = source.builds[rid].notes
        assert notes.roots == 1 and notes.chains == 1 and notes.delivered_fraction == 1.0

    want = {rid: expected(calls[rid]) for rid in rids}
    plain = Pipeline(source).batch(2).options(runner="threads", canonical_replicas=2)
    seen = set()
    for batch in plain:
        assert len(batch.records) == 2
        for rec in batch.records:
            p = rec.payload
            tokens, mask, lps = want[p["rollout_id"]]
            assert p["input_ids"].tolist() == tokens  # exactly the engine's tokens
            assert p["loss_mask"].tolist() == mask  # exactly the generated positions
            np.testing.assert_array_equal(p["logprobs"], np.asarray(lps, dtype=np.float32))
            seen.add(p["rollout_id"])
    assert seen == set(rids)

    width = max(len(w[0]) for w in want.values()) * 2
    packed = Pipeline(source).pack_flat(width, pad_token_id=0).batch(2, drop_last=False)
    segments = []
    for batch in packed.options(runner="inline"):
        for rec in batch.records:
            p = rec.payload
            docs = p["document_ids"]
            for d in np.unique(docs[docs >= 0]):
                sel = docs == d
                segments.append(
                    (p["input_ids"][sel].tolist(), p["loss_mask"][sel].tolist(), p["logprobs"][sel])
                )
            assert np.all(p["loss_mask"][docs < 0] == 0)  # padding never trains
        assert batch.to_training()["input_ids"].shape[1] == width
    assert sorted((s[0], s[1]) for s in segments) == sorted((w[0], w[1]) for w in want.values())
    for tokens, _mask, lps in segments:
        match = next(w for w in want.values() if w[0] == tokens)
        np.testing.assert_array_equal(lps, np.asarray(match[2], dtype=np.float32))
