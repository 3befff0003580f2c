"""A child that moves its own member of every prompt of a stream (the concurrency test).

``python -m tests.capture._ledger_writer URL STREAM MEMBER PROMPTS``: waits for a line on stdin
(a start barrier), then for each position moves member ``MEMBER`` captured then scored, one
transaction each, and prints ``done``.
"""

from __future__ import annotations

import asyncio
import sys

from zephon.capture.stores import open_store


async def main(url: str, stream: str, member: int, prompts: int) -> None:
    store = open_store(url)
    print("ready", flush=True)
    sys.stdin.readline()
    for position in range(prompts):
        for to in ("captured", "scored"):
            await store.advance(stream, [(position, member)], to)
    await store.close()
    print("done", flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])))
