"""The RL chaos campaign: the loop's processes SIGKILLed at random, on a seeded schedule.

Each role of :mod:`tests.capture._chaos_roles` and the capture proxy (``zephon capture
serve`` in front of the inference stub) is its own process. A kill is triggered by the data,
never by the clock: the harness waits until the ledger has made ``d`` more member moves
since the last kill (``d`` drawn from the seeded schedule), SIGKILLs the victim (the proxy
with all of its workers) and starts it again at once. After the schedule, the loop runs to
the end of the pass (the trainer exits once every prompt is trained or filtered).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.capture._chaos_roles import STREAM, load_model
from tests.capture.proxy._procs import REPO, Proc, child_env, start_proxy, wait_group_gone
from zephon.capture.ledger import PromptState, StreamLedger
from zephon.capture.rl import view_stream
from zephon.capture.stores import open_store

__all__ = ["ROLES", "Outcome", "run_campaign"]

ROLES = ("trainer", "worker", "proxy", "scorer")
_PASSED = {
    PromptState.ISSUED: 1,
    PromptState.CAPTURED: 2,
    PromptState.SCORED: 3,
    PromptState.TRAINED: 4,
    PromptState.FILTERED: 4,
}


@dataclass
class Outcome:
    kills: Counter[str]
    model: dict[str, Any]
    ledger: StreamLedger
    seconds: float


def _progress(ledger: StreamLedger) -> int:
    """Member moves so far (never decreases: each move passes one more state)."""
    return sum(_PASSED[m.state] for row in ledger.prompts for m in row.members)


class _Loop:
    """The running processes of one campaign and how to kill and restart each."""

    def __init__(self, url: str, workdir: Path, engine_url: str, cfg: dict[str, Any]) -> None:
        self.url, self.workdir, self.engine_url = url, workdir, engine_url
        self.cfg = {**cfg, "url": url, "workdir": str(workdir)}
        self.roles: dict[str, subprocess.Popen[bytes]] = {}
        self.proxy: Proc | None = None

    def start(self, role: str) -> None:
        if role == "proxy":
            self.proxy = start_proxy(self.engine_url, self.url, self.workdir, "--workers", "1")
            tmp = self.workdir / "proxy.url.tmp"
            tmp.write_text(self.proxy.url)
            os.replace(tmp, self.workdir / "proxy.url")
            return
        log = open(self.workdir / f"{role}.log", "ab")  # noqa: SIM115 - the child owns it
        self.roles[role] = subprocess.Popen(
            [sys.executable, "-m", "tests.capture._chaos_roles", role, json.dumps(self.cfg)],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=REPO,
            env=child_env(),
            start_new_session=True,
        )
        log.close()

    def kill(self, role: str) -> None:
        if role == "proxy":
            assert self.proxy is not None
            self.proxy.kill_group()
            return
        child = self.roles[role]
        os.killpg(child.pid, signal.SIGKILL)
        child.wait(30)
        wait_group_gone(child.pid)

    def check_alive(self) -> None:
        """Fail with the log of a role that ended although nobody killed it."""
        for role, child in self.roles.items():
            code = child.poll()
            if code is not None and not (role == "trainer" and code == 0):
                log = (self.workdir / f"{role}.log").read_text()[-3000:]
                raise AssertionError(f"the {role} exited with {code} on its own:\n{log}")
        if self.proxy is not None and self.proxy.popen.poll() is not None:
            raise AssertionError(f"the proxy exited: {self.proxy.log.read_text()[-3000:]}")

    def stop_all(self) -> None:
        for role in self.roles:
            if self.roles[role].poll() is None:
                self.kill(role)
        if self.proxy is not None:
            self.proxy.kill_group()


async def _wait_progress(store: Any, loop: _Loop, target: int, deadline: float) -> None:
    """Until the ledger has ``target`` moves or the trainer finished (a polled condition)."""
    while loop.roles["trainer"].poll() is None:
        ledger_moves: int = await view_stream(store, STREAM, _progress)
        if ledger_moves >= target:
            return
        loop.check_alive()
        assert time.monotonic() < deadline, f"no progress to {target} moves before the deadline"
        await asyncio.sleep(0.02)  # polling a condition of other processes


async def _campaign(
    loop: _Loop, kills: int, seed: int, timeout: float
) -> tuple[Counter[str], StreamLedger]:
    rng = random.Random(seed)
    victims = [ROLES[i % len(ROLES)] for i in range(kills)]
    rng.shuffle(victims)
    store = open_store(loop.url)
    deadline = time.monotonic() + timeout
    done: Counter[str] = Counter()
    try:
        for victim in victims:
            target = await view_stream(store, STREAM, _progress) + rng.randint(2, 9)
            await _wait_progress(store, loop, target, deadline)
            if loop.roles["trainer"].poll() is not None:
                break  # the pass ended before the schedule did
            loop.kill(victim)
            loop.start(victim)
            done[victim] += 1
        while loop.roles["trainer"].poll() is None:
            loop.check_alive()
            assert time.monotonic() < deadline, "the pass did not end before the deadline"
            await asyncio.sleep(0.05)  # polling the trainer's exit
        loop.check_alive()
        return done, await store.stream_ledger(STREAM)
    finally:
        await store.close()


def run_campaign(
    url: str,
    workdir: Path,
    engine_url: str,
    cfg: dict[str, Any],
    *,
    kills: int,
    seed: int,
    timeout: float,
) -> Outcome:
    """Run the loop over one pass with ``kills`` SIGKILLs drawn from ``seed``."""
    workdir.mkdir(parents=True, exist_ok=True)
    loop = _Loop(url, workdir, engine_url, cfg)
    began = time.monotonic()
    try:
        for role in ("proxy", "scorer", "worker", "trainer"):
            loop.start(role)
        done, ledger = asyncio.run(_campaign(loop, kills, seed, timeout))
    finally:
        loop.stop_all()
    return Outcome(done, load_model(workdir), ledger, time.monotonic() - began)
