"""Four writer processes on one backend lose or duplicate nothing (per store).

Each writer puts into two shared rollouts (its own call ids), into a rollout of its own, and
re-puts the same identical entries as every other writer into a third shared rollout (racing
idempotent retries). All start together (a stdin barrier). Afterwards every rollout holds
exactly the union of what was put, once, byte-identical, and its version counts each stored
entry exactly once.
"""

from __future__ import annotations

import asyncio
import zlib
from pathlib import Path

import pytest

from tests.capture._pg import pg_dsn, pg_url  # noqa: F401
from tests.capture._procs import read_acks, spawn_writer, store_url
from tests.capture._workload import make_entry
from zephon.capture.records import TokenCaptureSnapshot
from zephon.capture.stores import open_store
from zephon.capture.testing import durable_kinds

WRITERS = 4
PER_SHARED = 10
OWN = 6
DUPS = 5


def _plan(w: int) -> list[tuple[str, str]]:
    puts = [(f"shared-{s}", f"w{w}-c{k}") for k in range(PER_SHARED) for s in range(2)]
    puts += [(f"own-{w}", f"c{k}") for k in range(OWN)]
    puts += [("dup", f"d{k}") for k in range(DUPS)]
    # Interleave so the writers collide on the same rollouts at the same time.
    return sorted(puts, key=lambda p: (zlib.crc32(f"{w}{p}".encode()) % 97, p))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", durable_kinds())
def test_four_processes_lose_and_duplicate_nothing(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = store_url(kind, tmp_path, request)
    children = [spawn_writer(url, {"puts": _plan(w), "wait_go": True}) for w in range(WRITERS)]
    for child in children:
        assert child.stdout is not None
        assert child.stdout.readline() == "ready\n"
    for child in children:  # start barrier
        assert child.stdin is not None
        child.stdin.write("go\n")
        child.stdin.flush()
    acked: set[tuple[str, str]] = set()
    for child in children:
        out, _ = child.communicate(timeout=100)
        assert child.returncode == 0
        lines = out.splitlines()
        assert lines[-1] == "done"
        got, errors = read_acks(lines)
        assert not errors, errors
        acked |= got
    expected = {p for w in range(WRITERS) for p in _plan(w)}
    assert acked == expected
    asyncio.run(_verify(url, expected))


async def _verify(url: str, expected: set[tuple[str, str]]) -> None:
    store = open_store(url)
    try:
        for rid in sorted({r for r, _ in expected}):
            snap = await store.freeze(rid)
            ids = [e.model_call_id for e in snap.entries]
            want = {c for r, c in expected if r == rid}
            assert len(ids) == len(set(ids)), f"{rid}: duplicated entries"
            assert set(ids) == want, f"{rid}: lost {want - set(ids)}, extra {set(ids) - want}"
            assert snap.version == len(want) + 1  # one per stored put, plus the freeze
            assert not snap.incomplete
            for entry in snap.entries:
                assert (
                    entry.canonical_bytes()
                    == make_entry(rid, entry.model_call_id).canonical_bytes()
                )
    finally:
        await store.close()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", durable_kinds())
def test_freeze_racing_writers_is_a_strict_fence(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Writers keep putting while the parent freezes: the snapshot holds exactly the puts that
    returned successfully; every put after a writer's first refused one failed with
    TokenCaptureFrozenError too. Each writer puts until it is refused, so the freeze always
    races live writers, however loaded the machine is."""
    url = store_url(kind, tmp_path, request)
    rid = "fence"
    after = 3
    children = [spawn_writer(url, {"until_frozen": [rid, f"w{w}", after]}) for w in range(3)]
    first = children[0]
    assert first.stdout is not None
    lines = [first.stdout.readline() for _ in range(5)]  # freeze once writing is under way
    snap = asyncio.run(_freeze(url, rid))
    ok: set[str] = set()
    frozen: set[str] = set()
    for i, child in enumerate(children):
        if i == 0:
            # readline() may have buffered lines ahead; communicate() reads the raw pipe and
            # would miss them, so finish reading through the same buffered stream.
            assert child.stdin is not None and child.stdout is not None
            child.stdin.close()
            out = child.stdout.read()
            child.stdout.close()
            child.wait(timeout=100)
        else:
            out, _ = child.communicate(timeout=100)
        for line in (lines if i == 0 else []) + out.splitlines():
            parts = line.split()
            if parts and parts[0] == "ok":
                ok.add(parts[2])
            elif parts and parts[0] == "err":
                assert parts[3] == "TokenCaptureFrozenError", line
                frozen.add(parts[2])
        assert out.splitlines()[-1] == "done"
    assert len(frozen) == len(children) * (after + 1)  # each writer's first refusal and the rest
    assert {e.model_call_id for e in snap.entries} == ok
    assert snap.version == len(ok) + 1 and not snap.incomplete


async def _freeze(url: str, rid: str) -> TokenCaptureSnapshot:
    store = open_store(url)
    try:
        snap: TokenCaptureSnapshot = await store.freeze(rid)
        return snap
    finally:
        await store.close()
