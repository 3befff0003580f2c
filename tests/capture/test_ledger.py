"""The prompt ledger's rules (pure) and its storage in every store kind."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.capture._pg import pg_dsn, pg_url  # noqa: F401
from tests.capture._procs import REPO, store_url
from zephon.capture.ledger import (
    LedgerTransitionError,
    PromptState,
    StreamLedger,
    member_rollout_id,
    validate_stream,
)
from zephon.capture.stores import LogCorruptionError, open_store
from zephon.capture.testing import STORE_KINDS

S = PromptState


def _ledger(*ns: int) -> StreamLedger:
    ledger = StreamLedger(stream="s")
    for position, n in enumerate(ns):
        assert ledger.issue(position, f"k{position}", {"p": position}, n, {"after": position})
    return ledger


def test_issue_numbers_positions_without_gaps_and_keeps_the_newest_cursor() -> None:
    ledger = _ledger(2, 1)
    assert ledger.next_position == 2 and ledger.cursor == {"after": 1}
    assert [m.rollout_id for m in ledger.prompts[0].members] == ["s.p0.m0.a0", "s.p0.m1.a0"]
    assert not ledger.issue(0, "k0", {"p": 0}, 2, {"other": "cursor"})  # a retry: no change
    assert ledger.cursor == {"after": 1}
    with pytest.raises(LedgerTransitionError, match=r"position 0 already holds prompt 'k0'"):
        ledger.issue(0, "k0", {"p": 0}, 3)
    with pytest.raises(LedgerTransitionError, match="the next position is 2; positions have no"):
        ledger.issue(5, "k5", None, 1)
    with pytest.raises(ValueError, match="n is 0"):
        ledger.issue(2, "k2", None, 0)
    with pytest.raises(ValueError, match=r"payload is not JSON-safe"):
        ledger.issue(2, "k2", {"x": object()}, 1)
    assert ledger.next_position == 2


def test_members_move_one_state_at_a_time_and_repeats_are_no_ops() -> None:
    ledger = _ledger(2)
    with pytest.raises(
        LedgerTransitionError, match=r"cannot go issued -> scored: mark it captured"
    ):
        ledger.advance([(0, 0)], "scored")
    assert ledger.advance([(0, 0)], "captured")
    assert not ledger.advance([(0, 0)], "captured")
    assert ledger.advance([(0, 0)], S.SCORED)
    assert not ledger.advance([(0, 0)], "captured")  # went through it: a late retry
    assert ledger.advance([(0, 0)], "trained", step=3)
    assert not ledger.advance([(0, 0)], "trained", step=3)
    with pytest.raises(LedgerTransitionError, match="already trained at step 3; a member is"):
        ledger.advance([(0, 0)], "trained", step=4)
    with pytest.raises(LedgerTransitionError, match="already trained at step 3; it cannot"):
        ledger.advance([(0, 0)], "filtered", reason="late")
    with pytest.raises(ValueError, match="needs the trainer step"):
        ledger.advance([(0, 1)], "trained")
    with pytest.raises(ValueError, match="needs a reason"):
        ledger.advance([(0, 1)], "filtered", reason=" ")
    with pytest.raises(LedgerTransitionError, match="issued by issue"):
        ledger.advance([(0, 1)], "issued")
    with pytest.raises(LedgerTransitionError, match="has no member 2"):
        ledger.advance([(0, 2)], "captured")
    with pytest.raises(LedgerTransitionError, match="has no position 1"):
        ledger.advance([(1, 0)], "captured")


def test_a_batch_moves_all_members_or_none() -> None:
    ledger = _ledger(1, 1)
    ledger.advance([(0, 0)], "captured")
    with pytest.raises(LedgerTransitionError):
        ledger.advance([(0, 0), (1, 0)], "scored")  # (1, 0) would skip captured
    assert ledger.member((0, 0)).state is S.CAPTURED


def test_filtered_members_keep_their_reason_and_where_they_were() -> None:
    ledger = _ledger(2)
    ledger.advance([(0, 0), (0, 1)], "captured")
    ledger.advance([(0, 1)], "filtered", reason="truncated")
    member = ledger.member((0, 1))
    assert (member.state, member.reason, member.filtered_from) == (
        S.FILTERED,
        "truncated",
        S.CAPTURED,
    )
    assert not ledger.advance([(0, 1)], "captured")  # it was captured before the filter
    with pytest.raises(LedgerTransitionError, match=r"already filtered \('truncated'\)"):
        ledger.advance([(0, 1)], "filtered", reason="other")
    with pytest.raises(LedgerTransitionError, match=r"is already filtered \(truncated\)"):
        ledger.advance([(0, 1)], "scored")
    assert [row.position for row in ledger.pending()] == [0]  # member 0 is still owed
    ledger.advance([(0, 0)], "filtered", reason="truncated")
    assert ledger.pending() == []
    assert ledger.counts() == {"issued": 0, "captured": 0, "scored": 0, "trained": 0, "filtered": 2}


def test_trained_after_groups_the_steps_a_restored_trainer_redoes() -> None:
    ledger = _ledger(1, 1, 1)
    for position, step in ((0, 1), (1, 2), (2, 2)):
        for to in ("captured", "scored"):
            ledger.advance([(position, 0)], to)
        ledger.advance([(position, 0)], "trained", step=step)
    assert ledger.trained_after(0) == {1: [(0, 0)], 2: [(1, 0), (2, 0)]}
    assert ledger.trained_after(1) == {2: [(1, 0), (2, 0)]}
    assert ledger.trained_after(2) == {}


def test_reissue_gives_an_issued_member_a_new_attempt_and_rollout_id() -> None:
    ledger = _ledger(1)
    assert ledger.reissue((0, 0), 1)
    assert not ledger.reissue((0, 0), 1)
    assert ledger.member((0, 0)).rollout_id == member_rollout_id("s", 0, 0, 1) == "s.p0.m0.a1"
    with pytest.raises(LedgerTransitionError, match="must ask for 2, not 5"):
        ledger.reissue((0, 0), 5)
    with pytest.raises(LedgerTransitionError, match=r"attempt 0 was re-issued as attempt 1"):
        ledger.advance([(0, 0, 0)], "captured")  # the abandoned attempt's worker reports late
    assert ledger.advance([(0, 0, 1)], "captured")
    with pytest.raises(LedgerTransitionError, match="only an issued member is re-issued"):
        ledger.reissue((0, 0), 2)


def test_stream_names_are_checked() -> None:
    assert validate_stream("grpo-run.7") == "grpo-run.7"
    with pytest.raises(ValueError, match="stream 'a/b' is invalid"):
        validate_stream("a/b")
    with pytest.raises(ValueError, match="at most 120"):
        validate_stream("s" * 121)


def test_the_ledger_round_trips_through_json() -> None:
    ledger = _ledger(2, 1)
    ledger.advance([(0, 1)], "filtered", reason="r")
    assert StreamLedger.from_json(ledger.to_json()) == ledger


@pytest.mark.parametrize("kind", sorted(STORE_KINDS))
def test_the_ledger_survives_a_new_client_and_refusals_change_nothing(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = store_url(kind, tmp_path, request)

    async def go() -> None:
        first = open_store(url)
        await first.issue_prompt("s", 0, prompt_key="k", payload=[1, 2], n=2, cursor={"c": 0})
        await first.advance("s", [(0, 0)], "captured")
        with pytest.raises(LedgerTransitionError):
            await first.advance("s", [(0, 0), (0, 1)], "scored")
        await first.close()
        second = open_store(url)
        ledger = await second.stream_ledger("s")
        assert [m.state for m in ledger.prompts[0].members] == [S.CAPTURED, S.ISSUED]
        assert (ledger.prompts[0].payload, ledger.cursor) == ([1, 2], {"c": 0})
        assert (await second.stream_ledger("unused")).prompts == []
        with pytest.raises(ValueError, match=r"member ref \(0,\) is invalid"):
            await second.advance("s", [(0,)], "captured")  # type: ignore[list-item]
        with pytest.raises(ValueError, match="its parts must be integers"):
            await second.advance("s", [(0, "1")], "captured")  # type: ignore[list-item]
        with pytest.raises(ValueError, match=r"stream '\.\./x' is invalid"):
            await second.stream_ledger("../x")
        await second.close()

    asyncio.run(go())


def test_a_damaged_stream_file_is_refused_not_read_as_empty(tmp_path: Path) -> None:
    url = f"file://{tmp_path / 'capture'}"

    async def go() -> None:
        store = open_store(url)
        await store.issue_prompt("s", 0, prompt_key="k", payload=None)
        path = tmp_path / "capture" / "s.stream"
        data = bytearray(path.read_bytes())
        data[-5] ^= 0x01  # one flipped bit inside the JSON
        path.write_bytes(bytes(data))
        await store.close()
        store = open_store(url)  # a client reads the log once; a new one reads the damage
        with pytest.raises(LogCorruptionError, match=r"s\.stream is not an intact zephon stream"):
            await store.stream_ledger("s")
        with pytest.raises(LogCorruptionError):
            await store.issue_prompt("s", 1, prompt_key="k1", payload=None)
        assert path.read_bytes() == bytes(data)  # a refused write leaves the file alone
        await store.close()

    asyncio.run(go())


@pytest.mark.parametrize("kind", ["file", "sqlite", "postgres"])
def test_processes_moving_members_of_one_stream_lose_no_move(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = store_url(kind, tmp_path, request)
    writers, prompts = 3, 20

    async def issue() -> StreamLedger:
        store = open_store(url)
        for position in range(prompts):
            await store.issue_prompt(
                "s", position, prompt_key=f"k{position}", payload=None, n=writers
            )
        ledger = await store.stream_ledger("s")
        await store.close()
        return ledger

    asyncio.run(issue())
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "src")]))
    children = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.capture._ledger_writer", url, "s", str(m), str(prompts)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=REPO,
            env=env,
        )
        for m in range(writers)
    ]
    for child in children:  # every child is connected before any writes
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
    for child in children:
        assert child.stdin is not None
        child.stdin.write("go\n")
        child.stdin.flush()
    for child in children:
        out, _ = child.communicate(timeout=240)
        assert (child.returncode, out.strip()) == (0, "done")

    async def read() -> StreamLedger:
        store = open_store(url)
        ledger = await store.stream_ledger("s")
        await store.close()
        return ledger

    ledger = asyncio.run(read())
    assert ledger.counts()["scored"] == writers * prompts  # no read-modify-write lost a move


def _versioned(*versions: int) -> StreamLedger:
    ledger = StreamLedger(stream="s")
    for position, version in enumerate(versions):
        ledger.issue(position, f"k{position}", None, 2, weight_version=version)
    return ledger


def _score(ledger: StreamLedger, position: int, *, filter_second: bool = False) -> None:
    for to in ("captured", "scored"):
        ledger.advance([(position, 0)], to)
    if filter_second:
        ledger.advance([(position, 1)], "filtered", reason="timed out")
    else:
        for to in ("captured", "scored"):
            ledger.advance([(position, 1)], to)


def test_admit_takes_complete_groups_oldest_first_up_to_the_limit() -> None:
    ledger = _versioned(5, 5, 5, 5)
    for position in (3, 1, 2):
        _score(ledger, position, filter_second=position == 2)
    got = ledger.admit(5, max_staleness=2, limit=2)
    assert [row.position for row in got.groups] == [1, 2]  # 0 is incomplete, 3 over the limit
    assert (got.wait_for, got.stale) == (None, ())
    assert got.refs() == [(1, 0, 0), (1, 1, 0), (2, 0, 0)]  # the filtered member is not trained


def test_admit_waits_for_an_incomplete_group_at_the_staleness_bound() -> None:
    ledger = _versioned(3, 6)
    _score(ledger, 1)
    assert [r.position for r in ledger.admit(4, max_staleness=2, limit=8).groups] == [1]
    at_bound = ledger.admit(5, max_staleness=2, limit=8)  # a step now would make it 3 behind
    assert at_bound.groups == () and at_bound.wait_for is not None
    assert at_bound.wait_for.position == 0
    _score(ledger, 0)  # the slow group arrives: admitted first, none discarded
    assert [r.position for r in ledger.admit(5, max_staleness=2, limit=8).groups] == [0, 1]


def test_admit_reports_complete_groups_past_the_bound_as_stale_and_keeps_them() -> None:
    ledger = _versioned(1, 7, -1)
    for position in range(3):
        _score(ledger, position)
    got = ledger.admit(7, max_staleness=2, limit=8)
    assert [r.position for r in got.groups] == [0, 1, 2]
    assert got.stale == (0,)  # issued at 1, trained at 7: reported, never dropped
    with pytest.raises(ValueError, match="max_staleness >= 0 and limit >= 1"):
        ledger.admit(7, max_staleness=-1, limit=8)


def test_overdue_members_are_filtered_so_a_stuck_rollout_cannot_stall_its_group() -> None:
    ledger = StreamLedger(stream="s")
    ledger.issue(0, "k0", None, 2, weight_version=3, started_at=100.0)
    ledger.issue(1, "k1", None, 1, weight_version=4, started_at=150.0)
    ledger.issue(2, "k2", None, 1)  # no start time: never overdue
    _score_member(ledger, (0, 0))
    assert ledger.overdue(now=160.0, cap_s=60.0) == [(0, 1, 0)]  # (0, 0) is scored already
    assert ledger.admit(5, max_staleness=2, limit=8).wait_for is not None  # stalled at the bound
    ledger.advance(ledger.overdue(now=160.0, cap_s=60.0), "filtered", reason="over the 60 s cap")
    admitted = ledger.admit(5, max_staleness=2, limit=8)
    assert [row.position for row in admitted.groups] == [0]
    assert admitted.refs() == [(0, 0, 0)]
    assert ledger.overdue(now=1e9, cap_s=60.0) == [(1, 0, 0)]
    ledger.reissue((1, 0), 1, started_at=2e9)  # a new attempt starts its own clock
    assert ledger.overdue(now=2e9 + 59, cap_s=60.0) == []
    with pytest.raises(ValueError, match="cap above 0 seconds"):
        ledger.overdue(now=0.0, cap_s=0)


def _score_member(ledger: StreamLedger, ref: tuple[int, int]) -> None:
    for to in ("captured", "scored"):
        ledger.advance([ref], to)


def test_a_copy_equals_the_ledger_and_shares_nothing_mutable() -> None:
    ledger = StreamLedger(stream="s")
    ledger.issue(0, "k0", {"q": [1, 2]}, 2, {"epoch": [0, 1]})
    ledger.issue(1, "k1", "text", 1, None)
    ledger.issue(2, "k2", [{"a": 1}], 1, {"epoch": [0, 3]})
    copy = ledger.copy()
    assert copy == ledger and copy.to_json() == ledger.to_json()
    copy.prompts[0].payload["q"].append(3)
    copy.prompts[2].payload[0]["a"] = 2
    copy.cursor["epoch"].append(9)
    copy.prompts.pop()
    assert ledger.prompts[0].payload == {"q": [1, 2]} and ledger.prompts[2].payload == [{"a": 1}]
    assert ledger.cursor == {"epoch": [0, 3]} and ledger.next_position == 3
