"""Prompt ledgers stored as append-only logs of deltas: exact states, one append per move,
old whole-ledger streams, torn tails, and writers SIGKILLed mid-append."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.capture._pg import pg_dsn, pg_url  # noqa: F401
from tests.capture._procs import REPO, rest_of_output, store_url
from zephon.capture.ledger import LedgerDelta, LedgerTransitionError, PromptState, StreamLedger
from zephon.capture.stores import LogCorruptionError, open_store
from zephon.capture.stores._fsutil import frame
from zephon.capture.stores._streamlog import compact_after, replay, run_tracked

S = PromptState
_KINDS = ["file", "sqlite", "postgres"]


def _random_ops(seed: int, count: int) -> list[tuple[str, tuple[Any, ...]]]:
    """A reproducible mix of issues, moves (some refused) and re-issues."""
    rng = random.Random(seed)
    ops: list[tuple[str, tuple[Any, ...]]] = []
    issued = 0
    for _ in range(count):
        roll = rng.random()
        if issued == 0 or roll < 0.25:
            ops.append(("issue", (issued, rng.randint(1, 3))))
            issued += 1
        elif roll < 0.9:
            refs = [(rng.randrange(issued), rng.randrange(3)) for _ in range(rng.randint(1, 3))]
            to = rng.choice(["captured", "scored", "trained", "filtered"])
            ops.append(("advance", (refs, to)))
        else:
            ops.append(("reissue", (rng.randrange(issued), rng.randrange(3))))
    return ops


def _apply(ledger: StreamLedger, op: tuple[str, tuple[Any, ...]]) -> None:
    """Run one op on ``ledger`` (the pure reference); refusals change nothing."""
    name, args = op
    try:
        if name == "issue":
            position, n = args
            ledger.issue(position, f"k{position}", {"p": [position]}, n, {"after": position}, 3)
        elif name == "advance":
            refs, to = args
            ledger.advance(refs, to, step=len(refs), reason="r" if to == "filtered" else "")
        else:
            position, member = args
            m = ledger.member((position, member))
            ledger.reissue((position, member), m.attempt + 1, 5.0)
    except (LedgerTransitionError, ValueError):
        pass


async def _apply_store(store: Any, op: tuple[str, tuple[Any, ...]]) -> None:
    name, args = op
    try:
        if name == "issue":
            position, n = args
            await store.issue_prompt(
                "s",
                position,
                prompt_key=f"k{position}",
                payload={"p": [position]},
                n=n,
                cursor={"after": position},
                weight_version=3,
            )
        elif name == "advance":
            refs, to = args
            reason = "r" if to == "filtered" else ""
            await store.advance("s", refs, to, step=len(refs), reason=reason)
        else:
            position, member = args
            m = (await store.stream_ledger("s")).member((position, member))
            await store.reissue("s", (position, member), m.attempt + 1, started_at=5.0)
    except (LedgerTransitionError, ValueError):
        pass


def test_replaying_the_deltas_of_random_decisions_rebuilds_the_ledger_exactly() -> None:
    for seed in range(20):
        ledger = StreamLedger(stream="s")
        log: list[bytes] = []
        for op in _random_ops(seed, 120):
            delta, _ = run_tracked(ledger, lambda led, op=op: _apply(led, op), write=True)
            if delta is not None:
                log.append(delta)
        rebuilt = replay(StreamLedger(stream="s"), log)
        assert rebuilt.to_json() == ledger.to_json()
        assert len(log) < 120  # refused and repeated moves append nothing


def test_a_read_that_changes_the_ledger_is_refused() -> None:
    ledger = StreamLedger(stream="s")
    with pytest.raises(AssertionError, match="a read of stream 's' changed its ledger"):
        run_tracked(ledger, lambda led: led.issue(0, "k", None, 1), write=False)


def test_a_delta_that_does_not_fit_the_ledger_is_refused() -> None:
    ledger = StreamLedger(stream="s")
    ledger.issue(0, "k", None, 1)
    row = ledger.prompts[0]
    with pytest.raises(LedgerTransitionError, match="its log issues position 0 after 1"):
        ledger.apply_delta(LedgerDelta(rows=(row,)))
    with pytest.raises(LedgerTransitionError, match="has no position 4"):
        ledger.apply_delta(LedgerDelta(members=((4, row.members[0]),)))


@pytest.mark.parametrize("kind", ["memory", *_KINDS])
def test_clients_taking_turns_hold_exactly_the_ledger_the_decisions_produced(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = store_url(kind, tmp_path, request)
    reference = StreamLedger(stream="s")

    async def go() -> None:
        clients = [open_store(url), open_store(url)]
        for i, op in enumerate(_random_ops(7, 150)):
            _apply(reference, op)
            await _apply_store(clients[i % 2], op)
            if i % 25 == 0:  # each client reads what the other appended since its last look
                for client in clients:
                    assert await client.stream_ledger("s") == reference
        for client in clients:
            await client.close()
        fresh = open_store(url)
        assert await fresh.stream_ledger("s") == reference
        await fresh.close()

    asyncio.run(go())


def test_a_file_ledger_grows_by_one_line_per_move(tmp_path: Path) -> None:
    url = f"file://{tmp_path / 'capture'}"
    path = tmp_path / "capture" / "s.stream"

    async def go() -> None:
        store = open_store(url)
        for position in range(200):
            await store.issue_prompt("s", position, prompt_key=f"k{position}", payload=None, n=2)
        before = path.stat().st_size
        await store.advance("s", [(150, 1)], "captured")
        await store.advance("s", [(150, 1)], "captured")  # a repeat appends nothing
        lines = path.read_bytes().splitlines()
        assert len(lines) == 201 and lines[-1].startswith(b"D ")
        assert path.stat().st_size - before < 300  # the member, not the 200-prompt ledger
        await store.close()

    asyncio.run(go())


def test_the_sqlite_store_appends_one_row_per_move(tmp_path: Path) -> None:
    db = tmp_path / "c.db"

    async def go() -> None:
        store = open_store(f"sqlite://{db}")
        for position in range(20):
            await store.issue_prompt("s", position, prompt_key=f"k{position}", payload=None)
        await store.advance("s", [(3, 0)], "captured")
        await store.advance("s", [(3, 0)], "captured")
        await store.close()

    asyncio.run(go())
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT seq FROM capture_stream_moves ORDER BY seq").fetchall()
        (base,) = conn.execute("SELECT ledger FROM capture_streams").fetchone()
    assert [r[0] for r in rows] == list(range(1, 22)) and base == b""


def _old_ledger() -> StreamLedger:
    ledger = StreamLedger(stream="s")
    ledger.issue(0, "k0", {"q": 1}, 2, {"c": 0})
    ledger.advance([(0, 0)], "captured")
    return ledger


@pytest.mark.parametrize("kind", ["file", "sqlite"])
def test_a_whole_ledger_stored_by_an_earlier_version_is_read_and_moved_on(
    kind: str, tmp_path: Path
) -> None:
    old = _old_ledger()
    if kind == "file":
        (tmp_path / "capture").mkdir()
        (tmp_path / "capture" / "s.stream").write_bytes(frame(b"L", old.to_json()))
        url = f"file://{tmp_path / 'capture'}"
    else:
        url = f"sqlite://{tmp_path / 'c.db'}"
        asyncio.run(open_store(url).close())
        with sqlite3.connect(tmp_path / "c.db") as conn:
            conn.execute("INSERT INTO capture_streams VALUES ('s', ?)", (old.to_json(),))

    async def go() -> None:
        store = open_store(url)
        assert (await store.stream_ledger("s")).to_json() == old.to_json()
        await store.advance("s", [(0, 0), (0, 1)], "filtered", reason="r")
        await store.close()
        store = open_store(url)
        ledger = await store.stream_ledger("s")
        await store.close()
        old.advance([(0, 0), (0, 1)], "filtered", reason="r")
        assert ledger.to_json() == old.to_json()

    asyncio.run(go())


def test_a_torn_last_line_is_ignored_and_cut_by_the_next_move(tmp_path: Path) -> None:
    url = f"file://{tmp_path / 'capture'}"
    path = tmp_path / "capture" / "s.stream"

    async def go() -> None:
        store = open_store(url)
        await store.issue_prompt("s", 0, prompt_key="k0", payload=None, n=2)
        await store.close()
        intact = path.read_bytes()
        with open(path, "ab") as f:  # what a writer killed inside write() leaves
            f.write(frame(b"D", b'{"members":[[0,{"index":1')[:30])
        store = open_store(url)
        assert (await store.stream_ledger("s")).counts()["issued"] == 2
        await store.advance("s", [(0, 1)], "captured")
        await store.close()
        data = path.read_bytes()
        assert data.startswith(intact) and data.count(b"\n") == 2 and data.endswith(b"\n")
        store = open_store(url)
        assert (await store.stream_ledger("s")).member((0, 1)).state is S.CAPTURED
        await store.close()

    asyncio.run(go())


def test_a_read_ledger_is_a_copy_the_store_does_not_share(tmp_path: Path) -> None:
    async def go() -> None:
        store = open_store(f"file://{tmp_path / 'capture'}")
        row = await store.issue_prompt("s", 0, prompt_key="k", payload={"q": [1]})
        row.payload["q"].append(2)
        ledger = await store.stream_ledger("s")
        ledger.prompts[0].payload["q"].append(3)
        ledger.prompts.clear()
        again = await store.stream_ledger("s")
        assert again.prompts[0].payload == {"q": [1]}
        await store.close()

    asyncio.run(go())


def _acks(lines: list[str]) -> list[tuple[int, int, str]]:
    out = []
    for line in lines:
        parts = line.split()
        if len(parts) == 4 and parts[0] == "ack":
            out.append((int(parts[1]), int(parts[2]), parts[3]))
    return out


@pytest.mark.parametrize("kind", _KINDS)
def test_writers_sigkilled_mid_append_lose_no_acknowledged_move(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = store_url(kind, tmp_path, request)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "src")]))
    rng = random.Random(11)
    acked: list[tuple[int, int, str]] = []
    for _ in range(4):
        child = subprocess.Popen(
            [sys.executable, "-m", "tests.capture._ledger_appender", url, "s"],
            stdout=subprocess.PIPE,
            text=True,
            cwd=REPO,
            env=env,
        )
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        lines = [child.stdout.readline() for _ in range(rng.randint(5, 40))]
        child.send_signal(signal.SIGKILL)  # while it is inside its next move
        rest = rest_of_output(child, timeout=120)
        assert child.returncode == -signal.SIGKILL
        acked += _acks(lines + rest.splitlines())

    async def read() -> StreamLedger:
        store = open_store(url)
        ledger = await store.stream_ledger("s")
        await store.close()
        return ledger

    ledger = asyncio.run(read())
    assert len(acked) >= 20
    for position, member, state in acked:
        if member < 0:
            assert ledger.prompts[position].prompt_key == f"k{position}"
        else:
            assert ledger.member((position, member)).passed(PromptState(state))


def test_a_stream_file_put_in_place_of_the_one_a_client_read_is_read_afresh(
    tmp_path: Path,
) -> None:
    url = f"file://{tmp_path / 'capture'}"
    path = tmp_path / "capture" / "s.stream"
    other = _old_ledger()
    other.issue(1, "k1", {"q": "x" * 5000}, 1, {"c": 1})  # longer than what the client read

    async def go() -> None:
        store = open_store(url)
        for position in range(3):
            await store.issue_prompt("s", position, prompt_key=f"x{position}", payload=None)
        assert (await store.stream_ledger("s")).next_position == 3  # cached by this client
        replacement = tmp_path / "replacement"
        replacement.write_bytes(frame(b"L", other.to_json()))
        os.replace(replacement, path)  # a restored backup: another file
        assert await store.stream_ledger("s") == other
        await store.close()

    asyncio.run(go())


def test_damage_before_the_last_line_is_refused_not_cut(tmp_path: Path) -> None:
    url = f"file://{tmp_path / 'capture'}"
    path = tmp_path / "capture" / "s.stream"

    async def go() -> None:
        store = open_store(url)
        for position in range(3):
            await store.issue_prompt("s", position, prompt_key=f"k{position}", payload=None)
        await store.close()
        data = bytearray(path.read_bytes())
        data[20] ^= 0x01  # inside the first of three lines
        path.write_bytes(bytes(data))
        store = open_store(url)
        with pytest.raises(LogCorruptionError, match=r"a line fails its checksum .* at byte 0"):
            await store.stream_ledger("s")
        with pytest.raises(LogCorruptionError):
            await store.advance("s", [(0, 0)], "captured")
        assert path.read_bytes() == bytes(data)
        await store.close()

    asyncio.run(go())


def test_a_sql_stream_missing_a_move_is_refused(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path / 'c.db'}"

    async def fill() -> None:
        store = open_store(url)
        for position in range(3):
            await store.issue_prompt("s", position, prompt_key=f"k{position}", payload=None)
        await store.close()

    asyncio.run(fill())
    with sqlite3.connect(tmp_path / "c.db") as conn:
        conn.execute("DELETE FROM capture_stream_moves WHERE seq = 2")

    async def read() -> None:
        store = open_store(url)
        with pytest.raises(LogCorruptionError, match=r"stream 's' lacks move 2 \(next stored: 3\)"):
            await store.stream_ledger("s")
        await store.close()

    asyncio.run(read())


def _compaction_left(kind: str, url: str, tmp_path: Path) -> tuple[bytes, int]:
    """The start of what the store keeps as the stream's folded ledger, and the moves after."""
    if kind == "file":
        lines = (tmp_path / "capture" / "s.stream").read_bytes().splitlines()
        return lines[0][:2], len(lines) - 1
    if kind == "sqlite":
        with sqlite3.connect(tmp_path / "capture.db") as conn:
            (base,) = conn.execute("SELECT ledger FROM capture_streams").fetchone()
            (moves,) = conn.execute("SELECT count(*) FROM capture_stream_moves").fetchone()
        return bytes(base)[:2], moves
    dsn, schema = url.split("?schema=")
    with psycopg.connect(dsn, options=f"-c search_path={schema}") as conn:
        base = conn.execute("SELECT ledger FROM capture_streams").fetchone()[0]
        moves = conn.execute("SELECT count(*) FROM capture_stream_moves").fetchone()[0]
    return bytes(base)[:2], moves


@pytest.mark.parametrize("kind", _KINDS)
def test_a_long_log_is_folded_into_the_stored_ledger_and_every_client_reads_it(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = store_url(kind, tmp_path, request)
    moves = compact_after(2) + 5

    async def go() -> None:
        writer, reader = open_store(url), open_store(url)
        await writer.issue_prompt("s", 0, prompt_key="k0", payload={"q": 1}, n=2)
        await writer.issue_prompt("s", 1, prompt_key="k1", payload={"q": 2}, n=1)
        before = await reader.stream_ledger("s")  # cached before the fold
        for attempt in range(1, moves + 1):  # a member re-issued again and again
            await writer.reissue("s", (0, 1), attempt)
        head, left = _compaction_left(kind, url, tmp_path)
        assert head in (b"L ", b"@1") and left < 10  # folded, then appended to
        live = await writer.stream_ledger("s")
        assert live.member((0, 1)).attempt == moves and before.member((0, 1)).attempt == 0
        assert await reader.stream_ledger("s") == live
        await reader.advance("s", [(1, 0)], "captured")  # appends after the fold
        await writer.close()
        await reader.close()
        fresh = open_store(url)
        ledger = await fresh.stream_ledger("s")
        assert ledger.member((1, 0)).state is S.CAPTURED
        assert ledger.member((0, 1)).attempt == moves
        await fresh.close()

    asyncio.run(go())


@pytest.mark.timeout(300)  # ~25 s on postgres under load; several thousand durable moves
@pytest.mark.parametrize("kind", _KINDS)
def test_writers_sigkilled_while_their_log_is_folded_lose_no_acknowledged_move(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = store_url(kind, tmp_path, request)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "src")]))
    rng = random.Random(5)
    acked = 0
    while acked < 2 * compact_after(1) + 50:  # at least two folds, kills anywhere around them
        child = subprocess.Popen(
            [sys.executable, "-m", "tests.capture._ledger_appender", url, "s", "reissue"],
            stdout=subprocess.PIPE,
            text=True,
            cwd=REPO,
            env=env,
        )
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        lines = [child.stdout.readline() for _ in range(rng.randint(200, 900))]
        child.send_signal(signal.SIGKILL)
        rest = rest_of_output(child, timeout=120)
        attempts = [a for _, _, a in _acks_of(lines + rest.splitlines())]
        # the first may skip one: the dead child's last move committed before its ack
        assert attempts[0] in (acked + 1, acked + 2)
        assert attempts == list(range(attempts[0], attempts[0] + len(attempts)))
        acked = attempts[-1]

    async def read() -> int:
        store = open_store(url)
        attempt = (await store.stream_ledger("s")).member((0, 0)).attempt
        await store.close()
        return attempt

    read_attempt = asyncio.run(read())
    assert read_attempt in (acked, acked + 1)  # + 1: a move done but killed before its ack
    head, left = _compaction_left(kind, url, tmp_path)
    assert head in (b"L ", b"@1", b"@2") and left <= compact_after(1)


def _acks_of(lines: list[str]) -> list[tuple[int, int, int]]:
    out = []
    for line in lines:
        parts = line.split()
        if len(parts) == 4 and parts[0] == "ack":
            out.append((int(parts[1]), int(parts[2]), int(parts[3])))
    return out


def test_the_index_of_prompts_in_flight_follows_every_decision_and_replay() -> None:
    for seed in range(20):
        ledger, replica = StreamLedger(stream="s"), StreamLedger(stream="s")
        for op in _random_ops(seed, 120):
            delta, _ = run_tracked(ledger, lambda led, op=op: _apply(led, op), write=True)
            if delta is not None:
                replay(replica, [delta])
            scanned = [row for row in StreamLedger.from_json(ledger.to_json()).prompts]
            want = [row.position for row in scanned if not row.done]
            assert [row.position for row in ledger.pending()] == want
            assert [row.position for row in replica.pending()] == want
            whole = sum(all(m.state is S.FILTERED for m in row.members) for row in scanned)
            assert ledger.unfiltered == replica.unfiltered == len(scanned) - whole


def test_the_memory_store_appends_one_delta_per_move_and_never_rewrites(tmp_path: Path) -> None:
    async def go() -> None:
        store = open_store("memory://ledger-append")
        for position in range(200):
            await store.issue_prompt("s", position, prompt_key=f"k{position}", payload=None, n=2)
        assert len(store.stream_log("s")) == 200
        await store.advance("s", [(150, 1)], "captured")
        await store.advance("s", [(150, 1)], "captured")  # a repeat appends nothing
        with pytest.raises(LedgerTransitionError):  # refused: nothing appended, nothing changed
            await store.advance("s", [(150, 0)], "trained", step=1)
        log = store.stream_log("s")
        assert len(log) == 201 and len(log[-1]) < 300  # the member, not the 200-prompt ledger
        ledger = await store.stream_ledger("s")
        assert replay(StreamLedger(stream="s"), log) == ledger
        assert ledger.member((150, 1)).state is S.CAPTURED
        assert ledger.member((150, 0)).state is S.ISSUED
        await store.close()

    asyncio.run(go())
