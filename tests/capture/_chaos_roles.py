"""The processes of the RL chaos campaign: rollout worker, scorer and trainer, one per process.

``python -m tests.capture._chaos_roles ROLE CONFIG_JSON`` runs one role until it is killed
(worker, scorer) or the pass is trained (trainer). Each can be SIGKILLed at any instant and
started again; everything it needs to resume is in the store's ledger or, for the trainer, in
its durably replaced ``model.json``:

* **worker**: draws prompts with :class:`~zephon.capture.rl.PromptSource` (``backfill``:
  a bounded number in flight, which paces generation), sends each group member as one chat
  call through the capture proxy (whose URL is in ``proxy.url``; the harness restarts the
  proxy on a new port), and marks it ``captured`` once the proxy answered. A call that fails
  (the proxy died) is abandoned: the member gets a new attempt and rollout id, so a capture
  the dead proxy may have written never mixes with the retry.
* **scorer** (the store writer of scores and moves): for each group whose members are all
  captured, puts each member's score (the toy verifier: the parity of the generated token
  count), then, in ONE transaction, filters the group (all rewards equal) or marks it scored.
* **trainer**: reads the :class:`~zephon.capture.streaming.StreamingCaptureSource` pipeline;
  every ``groups_per_step`` groups are one step: marked ``trained`` at the step (one
  transaction), then the model (step, the pipeline checkpoint, the trained groups with their
  rollout lengths) is replaced durably. A restart restores the pipeline from the model, so a
  step marked but not saved is replayed from the admission log and marked again (a no-op).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

import httpx

from zephon import Dataset, MixtureSpec, Pipeline, StaticMixtureWorkSource
from zephon.capture.dataset import run_sync
from zephon.capture.ledger import LedgerTransitionError, PromptRow, PromptState, StreamLedger
from zephon.capture.rl import PromptGroup, PromptSource, view_stream
from zephon.capture.scores import RolloutScore
from zephon.capture.stores import open_store
from zephon.capture.streaming import StreamingCaptureSource

__all__ = ["FILTER_REASON", "STREAM", "load_model", "prompt_pipeline"]

STREAM = "chaos"
FILTER_REASON = "all rewards equal"
_CAP = "/ng-rollout/{rid}/training-token-capture/v1/chat/completions"
_IDLE_S = 0.05  # a role with nothing to do looks again after this (it is a loop, not a test)


def prompt_pipeline(prompts: int) -> Pipeline:
    rows = [{"i": i, "prompt": f"Solve task {i}: " + "think " * (i % 7)} for i in range(prompts)]
    source = StaticMixtureWorkSource(
        datasets=[Dataset.from_records("prompts", rows)],
        mixture=MixtureSpec({"prompts": 1.0}),
        chunk_size=4,
        seed=0,
    )
    return Pipeline(source).shuffle(8, seed=3)


def load_model(workdir: Path) -> dict[str, Any]:
    path = workdir / "model.json"
    if path.exists():
        model: dict[str, Any] = json.loads(path.read_text())
        return model
    return {"step": 0, "state": None, "trained": [], "done": False}


def _save_model(workdir: Path, model: dict[str, Any]) -> None:
    path = workdir / "model.json"
    tmp = workdir / "model.json.tmp"
    with open(tmp, "w") as f:
        json.dump(model, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(workdir, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# -- worker ---------------------------------------------------------------------------------


async def _call(http: httpx.AsyncClient, workdir: Path, rid: str, text: str) -> bool:
    """One chat call through the proxy; False when it failed (the proxy died or restarts)."""
    base = (workdir / "proxy.url").read_text().strip()
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": text}],
        "max_tokens": 64,
        "logprobs": True,
        "return_token_ids": True,
    }
    try:
        resp = await http.post(base + _CAP.format(rid=rid), json=body)
    except httpx.HTTPError:
        return False
    return resp.status_code == 200


async def _generate(http: httpx.AsyncClient, store: Any, workdir: Path, group: PromptGroup) -> None:
    for m in group.members:
        text = f"{group.payload['prompt']} (sample {m.index})"
        while m.state is PromptState.ISSUED:
            if await _call(http, workdir, m.rollout_id, text):
                await store.advance(STREAM, [(group.position, m.index, m.attempt)], "captured")
                break
            print("call failed:", m.rollout_id, flush=True)
            m = await store.reissue(STREAM, (group.position, m.index), m.attempt + 1)
            await asyncio.sleep(_IDLE_S)  # the proxy is being restarted: try it again


async def worker(cfg: dict[str, Any]) -> None:
    workdir = Path(cfg["workdir"])
    store = open_store(cfg["url"])
    source = await PromptSource.open(store, STREAM, prompt_pipeline(cfg["prompts"]), n=cfg["n"])
    async with httpx.AsyncClient(timeout=60) as http:
        while True:
            version = int(load_model(workdir)["step"])
            pace = (cfg["groups_per_step"], cfg["max_staleness"])
            groups = await source.backfill(cfg["in_flight"], weight_version=version, pace=pace)
            for group in groups:
                await _generate(http, store, workdir, group)
            if not groups:
                await asyncio.sleep(_IDLE_S)


# -- scorer ---------------------------------------------------------------------------------


def _captured_groups(ledger: StreamLedger) -> list[PromptRow]:
    return [
        row for row in ledger.pending() if all(m.state is PromptState.CAPTURED for m in row.members)
    ]


async def _score(store: Any, row: PromptRow) -> None:
    rewards = []
    for m in row.members:
        snap = await store.freeze(m.rollout_id)
        generated = sum(len(e.generation_token_ids) for e in snap.entries)
        reward = float(generated % 2)
        await store.put_score(
            RolloutScore(rollout_id=m.rollout_id, verifier="parity", reward=reward)
        )
        rewards.append(reward)
    refs = [(row.position, m.index, m.attempt) for m in row.members]
    try:
        if len(set(rewards)) == 1:
            await store.advance(STREAM, refs, "filtered", reason=FILTER_REASON)
        else:
            await store.advance(STREAM, refs, "scored")
    except LedgerTransitionError:
        pass  # the group moved meanwhile (never with one scorer; kept for safety)


async def scorer(cfg: dict[str, Any]) -> None:
    store = open_store(cfg["url"])
    while True:
        rows = await view_stream(store, STREAM, _captured_groups)
        for row in rows:
            await _score(store, row)
        if not rows:
            await asyncio.sleep(_IDLE_S)


# -- trainer --------------------------------------------------------------------------------


async def _step(store: Any, model: dict[str, Any], batch: list[Any]) -> None:
    refs = sorted({(g["position"], m["index"], m["attempt"]) for g in batch for m in g["members"]})
    await store.advance(STREAM, refs, "trained", step=model["step"])
    for g in batch:
        lengths = sorted(len(m["input_ids"]) for m in g["members"])
        versions = [g["weight_version"], g["trained_version"]]
        model["trained"].append([g["position"], model["step"], versions, lengths])
    model["step"] += 1


def trainer(cfg: dict[str, Any]) -> None:
    workdir = Path(cfg["workdir"])
    store = open_store(cfg["url"])
    model = load_model(workdir)
    source = StreamingCaptureSource(
        store,
        STREAM,
        groups_per_step=cfg["groups_per_step"],
        max_staleness=cfg["max_staleness"],
        prompts=cfg["prompts"],
    )
    pipe = source.pipeline()
    if model["state"] is not None:
        pipe.restore(model["state"])
    batch: list[Any] = []
    for record in pipe:
        batch.append(record.payload)
        if len(batch) == cfg["groups_per_step"]:
            run_sync(_step(store, model, batch))
            model["state"], batch = pipe.checkpoint(), []
            _save_model(workdir, model)
    if batch:
        run_sync(_step(store, model, batch))
        model["state"] = pipe.checkpoint()
    model["done"] = True
    _save_model(workdir, model)
    print("done", flush=True)


if __name__ == "__main__":
    role, config = sys.argv[1], json.loads(sys.argv[2])
    if role == "trainer":
        trainer(config)
    else:
        asyncio.run({"worker": worker, "scorer": scorer}[role](config))
