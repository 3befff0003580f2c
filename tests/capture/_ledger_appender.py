"""A child that issues and moves prompts of a stream until it is killed (the SIGKILL test).

``python -m tests.capture._ledger_appender URL STREAM``: continues the stream from its ledger
(issue the next position with two members, then move each member captured and scored, one
transaction each) and prints ``ack POSITION MEMBER STATE`` after each move returned (MEMBER -1:
the issue), so the parent knows what was accepted when it kills this process.
"""

from __future__ import annotations

import asyncio
import sys

from zephon.capture.stores import open_store


async def main(url: str, stream: str) -> None:
    store = open_store(url)
    ledger = await store.stream_ledger(stream)
    position = ledger.next_position
    print("ready", flush=True)
    while True:
        payload = {"q": f"what is {position} squared?", "pad": "x" * (position % 97)}
        await store.issue_prompt(stream, position, prompt_key=f"k{position}", payload=payload, n=2)
        print(f"ack {position} -1 issued", flush=True)
        for state in ("captured", "scored"):
            for member in (0, 1):
                await store.advance(stream, [(position, member)], state)
                print(f"ack {position} {member} {state}", flush=True)
        position += 1


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
