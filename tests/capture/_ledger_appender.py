"""A child that issues and moves prompts of a stream until it is killed (the SIGKILL test).

``python -m tests.capture._ledger_appender URL STREAM``: continues the stream from its ledger
(issue the next position with two members, then move each member captured and scored, one
transaction each) and prints ``ack POSITION MEMBER STATE`` after each move returned (MEMBER -1:
the issue), so the parent knows what was accepted when it kills this process. With a third
argument ``reissue`` it re-issues member 0 of prompt 0 again and again instead (many moves on a
short ledger, so the log is folded often) and prints ``ack 0 0 ATTEMPT``.
"""

from __future__ import annotations

import asyncio
import sys

from zephon.capture.stores import open_store


async def reissue(url: str, stream: str) -> None:
    store = open_store(url)
    await store.issue_prompt(stream, 0, prompt_key="k0", payload={"q": 0}, n=1)
    attempt = (await store.stream_ledger(stream)).member((0, 0)).attempt
    print("ready", flush=True)
    while True:
        attempt += 1
        await store.reissue(stream, (0, 0), attempt)
        print(f"ack 0 0 {attempt}", flush=True)


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
    run = reissue if sys.argv[3:] == ["reissue"] else main
    asyncio.run(run(sys.argv[1], sys.argv[2]))
