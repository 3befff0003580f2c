"""The RL loop under chaos: trainer, rollout worker, proxy and scorer (the store writer of
scores and moves) SIGKILLed at random over 51 cycles across the file, SQLite and PostgreSQL
stores. Every prompt of the pass is trained exactly once or filtered with its reason, and the
trained rollout lengths are exactly (as a multiset) those of an uninterrupted run."""

from __future__ import annotations

import asyncio
import os
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.capture._chaos import ROLES, Outcome, run_campaign
from tests.capture._chaos_roles import FILTER_REASON
from tests.capture._pg import pg_dsn, pg_url  # noqa: F401
from tests.capture._procs import store_url
from tests.capture.proxy._procs import Proc, start_inference_stub
from tests.capture.proxy.inference_stub import train_tokenizer
from zephon.capture.ledger import PromptState, StreamLedger
from zephon.capture.stores import open_store
from zephon.capture.testing import ChaosError, ProcessRole, ledger_progress, run_chaos

CFG = {"prompts": 24, "n": 2, "groups_per_step": 2, "max_staleness": 1, "in_flight": 4}
KILLS = {"file": 17, "sqlite": 17, "postgres": 17}  # 51 cycles in all
RUN_TIMEOUT_S = 400  # one campaign takes ~60 s on a quiet machine; generous under load


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    tok = train_tokenizer(str(tmp_path_factory.mktemp("tok") / "tokenizer.json"))
    proc = start_inference_stub(Path(tok), tmp_path_factory.mktemp("engine"))
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def uninterrupted(engine: Proc, tmp_path_factory: pytest.TempPathFactory) -> Outcome:
    work = tmp_path_factory.mktemp("quiet")
    url = f"file://{work / 'capture'}"
    return run_campaign(url, work / "run", engine.url, CFG, kills=0, seed=0, timeout=RUN_TIMEOUT_S)


def _lengths(model: dict[str, Any]) -> Counter[tuple[int, ...]]:
    return Counter(tuple(lengths) for _, _, _, lengths in model["trained"])


def _check_exactly_once(out: Outcome) -> None:
    """Every prompt trained once or filtered with its reason; the model agrees with the
    ledger; no trained group older than the bound; none discarded for being slow."""
    ledger, model = out.ledger, out.model
    assert model["done"] and ledger.next_position == CFG["prompts"]
    positions = [p for p, _, _, _ in model["trained"]]
    assert len(positions) == len(set(positions)), "a prompt was trained twice"
    trained, filtered = set(), set()
    for row in ledger.prompts:
        states = {m.state for m in row.members}
        if states == {PromptState.TRAINED}:
            trained.add(row.position)
        else:
            assert states == {PromptState.FILTERED}, (row.position, states)
            assert {m.reason for m in row.members} == {FILTER_REASON}  # never for slowness
            filtered.add(row.position)
    assert set(positions) == trained and not trained & filtered
    assert trained | filtered == set(range(CFG["prompts"])), "a prompt was lost"
    steps = {row.position: row.members[0].step for row in ledger.prompts}
    for position, step, (issued_at, trained_at), _ in model["trained"]:
        assert steps[position] == step == trained_at
        assert issued_at >= 0 and trained_at - issued_at <= CFG["max_staleness"]


@pytest.mark.timeout(2 * RUN_TIMEOUT_S)  # the fixture's run too
def test_the_uninterrupted_run_trains_and_filters_the_whole_pass(uninterrupted: Outcome) -> None:
    _check_exactly_once(uninterrupted)
    assert sum(uninterrupted.kills.values()) == 0
    trained = len(uninterrupted.model["trained"])
    assert 0 < trained < CFG["prompts"]  # both outcomes occur in the pass


@pytest.mark.timeout(2 * RUN_TIMEOUT_S)  # the uninterrupted run (a fixture) may come first
@pytest.mark.parametrize("kind", ["file", "sqlite", "postgres"])
def test_random_sigkills_of_every_process_lose_and_repeat_nothing(
    kind: str,
    uninterrupted: Outcome,
    engine: Proc,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    url = store_url(kind, tmp_path, request)
    seed = {"file": 11, "sqlite": 12, "postgres": 13}[kind]
    out = run_campaign(
        url,
        tmp_path / "run",
        engine.url,
        CFG,
        kills=KILLS[kind],
        seed=seed,
        timeout=RUN_TIMEOUT_S,
    )
    assert sum(out.kills.values()) == KILLS[kind], out.kills
    assert set(out.kills) == set(ROLES), out.kills
    _check_exactly_once(out)
    assert _lengths(out.model) == _lengths(uninterrupted.model)


# -- the kit: zephon.capture.testing.run_chaos -------------------------------------------------

_SLEEPER = [sys.executable, "-c", "import time; time.sleep(600)"]  # a process to kill


class _Counted:
    """A role that counts its starts and remembers each process it ran."""

    def __init__(self, role: ProcessRole) -> None:
        self.role, self.pids = role, []

    def start(self) -> None:
        self.role.start()
        assert self.role.popen is not None
        self.pids.append(self.role.popen.pid)

    def kill(self) -> None:
        self.role.kill()

    def failure(self) -> str | None:
        return self.role.failure()


def test_ledger_progress_counts_every_state_a_member_passed() -> None:
    ledger = StreamLedger(stream="s")
    ledger.issue(0, "k0", None, 2)
    ledger.issue(1, "k1", None, 1)
    assert ledger_progress(ledger) == 3
    ledger.advance([(0, 0)], "captured")
    ledger.advance([(0, 1)], "filtered", reason="r")
    ledger.reissue((1, 0), 1)  # a new attempt moves nothing
    assert ledger_progress(ledger) == 2 + 4 + 1


@pytest.mark.timeout(300)
def test_run_chaos_kills_each_role_on_the_ledgers_progress_and_restarts_it(
    tmp_path: Path,
) -> None:
    roles = {name: _Counted(ProcessRole(_SLEEPER, tmp_path / f"{name}.log")) for name in "ab"}

    async def go() -> Counter[str]:
        store = open_store("memory://chaos-kit")
        for role in roles.values():
            role.start()

        async def moves() -> None:  # the loop's work: one issued prompt at a time
            for position in range(2000):
                await store.issue_prompt("s", position, prompt_key=f"k{position}", payload=None)
                await asyncio.sleep(0.002)  # pacing the workload, not synchronising

        work = asyncio.create_task(moves())
        try:
            return await run_chaos(
                store,
                "s",
                roles,
                kills=4,
                seed=5,
                timeout_s=120,
                finished=lambda: sum(len(r.pids) for r in roles.values()) == 6,
            )
        finally:
            work.cancel()
            for role in roles.values():
                role.kill()

    assert asyncio.run(go()) == Counter({"a": 2, "b": 2})
    for role in roles.values():
        assert len(set(role.pids)) == 3
        for pid in role.pids:
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)  # every process it ran is gone


def test_a_role_that_dies_on_its_own_stops_the_campaign_with_its_log(tmp_path: Path) -> None:
    dies = ProcessRole(
        [sys.executable, "-c", "import sys; print('boom', flush=True); sys.exit(3)"],
        tmp_path / "dies.log",
    )
    dies.start()

    async def go() -> None:
        store = open_store("memory://chaos-dies")
        await run_chaos(
            store, "s", {"d": dies}, kills=1, seed=0, timeout_s=120, finished=lambda: False
        )

    with pytest.raises(ChaosError, match=r"(?s)chaos role 'd' failed: .*exited with 3.*boom"):
        asyncio.run(go())
