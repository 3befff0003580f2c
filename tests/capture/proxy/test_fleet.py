"""A capture fleet under faults: 3 proxies x 2 workers, one engine, one PostgreSQL server.

Rollouts land turn by turn on random proxies while one whole proxy is SIGKILLed (with calls
at the engine) and restarted, ``zephon capture conformance`` runs against the same server,
and PostgreSQL is stopped (with a call per proxy at the engine) and started again. See
``_fleet.py`` for what is checked. The 1,000-rollout variant is marked ``slow``, deselected
by default: ``pytest -m slow tests/capture/proxy/test_fleet.py``.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from tests.capture.proxy._fleet import FleetPlan, FleetReport, run_fleet


def _run(plan: FleetPlan, tokenizer: Path, tmp_path: Path) -> FleetReport:
    report = asyncio.run(run_fleet(plan, tokenizer, tmp_path))
    print(json.dumps({"fleet": report.as_json()}))  # shown with -s: the run's numbers
    assert report.conformance == "passed", report.conformance
    assert not report.problems, "\n".join(report.problems[:20])
    assert report.calls_acknowledged >= plan.rollouts * plan.min_turns
    # The faults struck: calls were refused by the dead proxy and by the missing store.
    assert report.failed_attempts["ConnectError"] > 0, report.failed_attempts
    assert report.failed_attempts["503/-"] + report.failed_attempts["200/incomplete"] > 0
    # Each call at the engine when a fault struck lost its entry, and masked its rollout.
    assert report.lost_generations >= report.held_rollouts == plan.proxies + 2
    assert report.masked >= report.held_rollouts
    # Continuations resolved across proxies (a turn's parent was served by another one).
    assert report.cross_proxy_links > report.resolved_links // 2
    return report


@pytest.mark.timeout(240)
def test_fleet_keeps_every_acknowledged_call_through_a_proxy_kill_and_a_postgres_restart(
    tokenizer: Path, tmp_path: Path
) -> None:
    _run(FleetPlan(rollouts=250), tokenizer, tmp_path)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_fleet_of_1000_rollouts(tokenizer: Path, tmp_path: Path) -> None:
    _run(FleetPlan(rollouts=1000, concurrency=48), tokenizer, tmp_path)
