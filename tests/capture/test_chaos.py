"""The RL loop under chaos: trainer, rollout worker, proxy and scorer (the store writer of
scores and moves) SIGKILLed at random over 51 cycles across the file, SQLite and PostgreSQL
stores. Every prompt of the pass is trained exactly once or filtered with its reason, and the
trained rollout lengths are exactly (as a multiset) those of an uninterrupted run."""

from __future__ import annotations

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
from zephon.capture.ledger import PromptState

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


def test_the_uninterrupted_run_trains_and_filters_the_whole_pass(uninterrupted: Outcome) -> None:
    _check_exactly_once(uninterrupted)
    assert sum(uninterrupted.kills.values()) == 0
    trained = len(uninterrupted.model["trained"])
    assert 0 < trained < CFG["prompts"]  # both outcomes occur in the pass


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
