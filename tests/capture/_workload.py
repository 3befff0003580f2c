"""Deterministic entries and a writer child process for the crash and concurrency tests.

``python -m tests.capture._workload URL PLAN_JSON`` puts the planned entries in order and
prints ``ok <rollout_id> <call_id>`` (flushed) after each put RETURNS, so the parent knows
exactly which puts were acknowledged when it kills the child. With ``"wait_go": true`` the
child prints ``ready`` and waits for a line on stdin before writing (a start barrier).
Errors are printed as ``err <rollout_id> <call_id> <ExceptionType>`` and the child goes on.
With ``"until_frozen": [rollout_id, prefix, after]`` the child puts ``<prefix>-c0``,
``<prefix>-c1``, ... until a put fails with ``TokenCaptureFrozenError``, then ``after`` more
(each must fail too): a writer that is sure to race a freeze, however loaded the machine.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
from collections.abc import Iterator
from typing import Any

from zephon.capture.records import TokenEntry
from zephon.capture.stores import open_store

__all__ = ["make_entry", "run_child"]


def make_entry(rollout_id: str, call_id: str, *, prompt: int = 64, gen: int = 32) -> TokenEntry:
    """An entry whose bytes depend only on its ids and sizes (a retry is byte-identical)."""
    rng = random.Random(f"{rollout_id}/{call_id}/{prompt}/{gen}")
    return TokenEntry(
        rollout_id=rollout_id,
        model_call_id=call_id,
        model="workload-model",
        prompt_token_ids=[rng.randrange(150_000) for _ in range(prompt)],
        generation_token_ids=[rng.randrange(150_000) for _ in range(gen)],
        generation_log_probs=[-rng.random() * 5 for _ in range(gen)],
        output_items=[{"type": "message", "role": "assistant", "content": []}],
        token_item_index=0,
        response_id=f"resp-{call_id}",
        created_at=1_700_000_000.5,
        parent_resolution="root",  # type: ignore[arg-type]
    )


_FAILED: list[str] = []  # exception type names of the puts that failed, in order
_UNTIL_FROZEN_LIMIT = 1_000_000  # far beyond any run; a store that never freezes ends the loop


def _until_frozen(rollout_id: str, prefix: str, after: int) -> Iterator[tuple[str, str]]:
    for k in range(_UNTIL_FROZEN_LIMIT):
        yield rollout_id, f"{prefix}-c{k}"
        if "TokenCaptureFrozenError" in _FAILED:
            break
    for k in range(_UNTIL_FROZEN_LIMIT, _UNTIL_FROZEN_LIMIT + after):
        yield rollout_id, f"{prefix}-c{k}"


async def _run(url: str, plan: dict[str, Any]) -> None:
    store = open_store(url)
    out = sys.stdout
    if plan.get("wait_go"):
        out.write("ready\n")
        out.flush()
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    prompt, gen = plan.get("prompt", 64), plan.get("gen", 32)
    for rid, cid in plan["puts"] if "puts" in plan else _until_frozen(*plan["until_frozen"]):
        entry = make_entry(rid, cid, prompt=prompt, gen=gen)
        try:
            await store.put(entry)
        except Exception as exc:
            out.write(f"err {rid} {cid} {type(exc).__name__}\n")
            _FAILED.append(type(exc).__name__)
        else:
            out.write(f"ok {rid} {cid}\n")
        out.flush()
    if plan.get("hold"):  # stay alive until stdin closes: a kill never finds the child gone
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    await store.close()
    out.write("done\n")
    out.flush()


def run_child(argv: list[str]) -> None:
    url, plan = argv[0], json.loads(argv[1])
    asyncio.run(_run(url, plan))


if __name__ == "__main__":
    run_child(sys.argv[1:])
