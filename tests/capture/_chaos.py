"""The RL chaos campaign: the loop's processes SIGKILLed at random, on a seeded schedule.

Each role of :mod:`tests.capture._chaos_roles` and the capture proxy (``zephon capture
serve`` in front of the inference stub) is its own process;
:func:`zephon.capture.testing.run_chaos` kills them, each kill triggered by the ledger's
progress (never by the clock), and restarts the victim at once. After the schedule the loop
runs to the end of the pass (the trainer exits once every prompt is trained or filtered).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.capture._chaos_roles import STREAM, load_model
from tests.capture.proxy._procs import REPO, Proc, child_env, start_proxy
from zephon.capture.ledger import StreamLedger
from zephon.capture.stores import open_store
from zephon.capture.testing import ProcessRole, run_chaos

__all__ = ["ROLES", "Outcome", "run_campaign"]

ROLES = ("proxy", "scorer", "trainer", "worker")


@dataclass
class Outcome:
    kills: Counter[str]
    model: dict[str, Any]
    ledger: StreamLedger
    seconds: float


class _ProxyRole:
    """``zephon capture serve`` with its workers; each start publishes its URL in
    ``proxy.url`` (written atomically) for the rollout worker."""

    def __init__(self, engine_url: str, store_url: str, workdir: Path) -> None:
        self.engine_url, self.store_url, self.workdir = engine_url, store_url, workdir
        self.proc: Proc | None = None

    def start(self) -> None:
        self.proc = start_proxy(self.engine_url, self.store_url, self.workdir, "--workers", "1")
        tmp = self.workdir / "proxy.url.tmp"
        tmp.write_text(self.proc.url)
        os.replace(tmp, self.workdir / "proxy.url")

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill_group()

    def failure(self) -> str | None:
        if self.proc is None or self.proc.popen.poll() is None:
            return None
        return f"the proxy exited: {self.proc.log.read_text()[-3000:]}"


def _role(name: str, cfg: dict[str, Any], workdir: Path) -> ProcessRole:
    argv = [sys.executable, "-m", "tests.capture._chaos_roles", name, json.dumps(cfg)]
    ok = (0,) if name == "trainer" else ()
    return ProcessRole(argv, workdir / f"{name}.log", env=child_env(), cwd=REPO, ok_codes=ok)


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
    full = {**cfg, "url": url, "workdir": str(workdir)}
    trainer = _role("trainer", full, workdir)
    roles: dict[str, Any] = {
        "proxy": _ProxyRole(engine_url, url, workdir),
        "scorer": _role("scorer", full, workdir),
        "worker": _role("worker", full, workdir),
        "trainer": trainer,
    }

    async def go() -> tuple[Counter[str], StreamLedger]:
        store = open_store(url)
        try:
            done = await run_chaos(
                store,
                STREAM,
                roles,
                kills=kills,
                seed=seed,
                # 1-3 moves between kills: a kill and restart lets the other roles move on
                # (more so on a loaded machine), and every kill must land before the pass ends
                moves=(1, 3),
                finished=lambda: trainer.exit_code() == 0,
                timeout_s=timeout,
            )
            return done, await store.stream_ledger(STREAM)
        finally:
            await store.close()

    began = time.monotonic()
    try:
        for role in roles.values():
            role.start()
        done, ledger = asyncio.run(go())
    finally:
        for role in roles.values():
            role.kill()
    return Outcome(done, load_model(workdir), ledger, time.monotonic() - began)
