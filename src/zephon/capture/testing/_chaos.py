"""Random SIGKILLs of an RL loop's processes, triggered by the ledger's progress.

Why a kit: an RL loop's exactly-once claim is only as good as the crashes it survived, and
a kill schedule driven by the clock is neither reproducible nor reliable on a loaded machine.
:func:`run_chaos` draws its victims and gaps from a seed and kills a victim once the stream's
ledger made that many more member moves since the last kill (a condition of the data, polled),
then starts the victim again at once. What to check afterwards (each prompt trained once or
filtered, nothing lost) is the loop's own; :func:`ledger_progress` is the trigger's measure.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from zephon.capture.ledger import PromptState, StreamLedger
from zephon.capture.protocols import view_stream
from zephon.errors import ZephonError

__all__ = ["ChaosError", "ChaosRole", "ProcessRole", "ledger_progress", "run_chaos"]

_PASSED = {
    PromptState.ISSUED: 1,
    PromptState.CAPTURED: 2,
    PromptState.SCORED: 3,
    PromptState.TRAINED: 4,
    PromptState.FILTERED: 4,
}
_POLL_S = 0.02


class ChaosError(ZephonError, AssertionError):
    """A chaos campaign could not go on: a role died on its own, or no progress in time."""


class ChaosRole(Protocol):
    """One process (or group) of the loop that :func:`run_chaos` may kill and restart."""

    def start(self) -> None: ...

    def kill(self) -> None:
        """SIGKILL it (and everything it started); return once none of it runs."""

    def failure(self) -> str | None:
        """Why it stopped on its own (with its log's tail), None while it runs or ended well."""


def ledger_progress(ledger: StreamLedger) -> int:
    """Member moves the stream made so far: each member counts the states it passed, so the
    number never decreases (a re-issue moves nothing)."""
    return sum(_PASSED[m.state] for row in ledger.prompts for m in row.members)


class ProcessRole:
    """``argv`` as a process in a session of its own (a kill reaches all it started); its
    output is appended to ``log``. ``ok_codes``: exit codes that are not a failure."""

    def __init__(
        self,
        argv: Sequence[str],
        log: Path,
        *,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        ok_codes: Sequence[int] = (),
    ) -> None:
        self.argv, self.log, self.env, self.cwd = list(argv), log, env, cwd
        self.ok_codes = tuple(ok_codes)
        self.popen: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.log, "ab") as out:
            self.popen = subprocess.Popen(
                self.argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=None if self.env is None else dict(self.env),
                cwd=self.cwd,
                start_new_session=True,
            )

    def exit_code(self) -> int | None:
        return None if self.popen is None else self.popen.poll()

    def kill(self) -> None:
        if self.popen is None:
            return
        with contextlib.suppress(ProcessLookupError):  # it ended by itself
            os.killpg(self.popen.pid, signal.SIGKILL)
        self.popen.wait(60)
        deadline = time.monotonic() + 60
        while _group_alive(self.popen.pid):
            if time.monotonic() > deadline:
                raise ChaosError(f"{self.argv[:3]}: processes of its group outlived SIGKILL")
            time.sleep(_POLL_S)  # polling other processes' exit, not timing anything

    def failure(self) -> str | None:
        code = self.exit_code()
        if code is None or code in self.ok_codes:
            return None
        tail = self.log.read_text(errors="replace")[-3000:] if self.log.exists() else ""
        return f"{self.argv[:4]} exited with {code} on its own; {self.log} ends:\n{tail}"


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def _failed(roles: Mapping[str, ChaosRole]) -> None:
    for name, role in roles.items():
        why = role.failure()
        if why is not None:
            raise ChaosError(f"chaos role {name!r} failed: {why}")


async def _wait(
    store: Any,
    stream: str,
    target: int,
    roles: Mapping[str, ChaosRole],
    finished: Callable[[], bool],
    deadline: float,
) -> None:
    """Until the stream made ``target`` moves or the loop finished (a polled condition)."""
    while not finished():
        if await view_stream(store, stream, ledger_progress) >= target:
            return
        _failed(roles)
        if time.monotonic() > deadline:
            raise ChaosError(
                f"stream {stream!r} did not reach {target} member moves in time; the role "
                "logs say which process is stuck (raise timeout_s on a slow machine)"
            )
        await asyncio.sleep(_POLL_S)


async def run_chaos(
    store: Any,
    stream: str,
    roles: Mapping[str, ChaosRole],
    *,
    kills: int,
    seed: int,
    finished: Callable[[], bool],
    timeout_s: float,
    moves: tuple[int, int] = (2, 9),
) -> Counter[str]:
    """Kill ``kills`` roles of the running loop (each role in turn, in an order shuffled by
    ``seed``), each once the stream made a number of member moves drawn from ``moves`` since
    the last kill, and restart it at once; then wait until ``finished()``. Returns the kills
    per role (fewer in all when the loop finished first). Raises :class:`ChaosError` when a
    role fails on its own or ``timeout_s`` passes. The roles must be started already."""
    rng = random.Random(seed)
    names = sorted(roles)
    victims = [names[i % len(names)] for i in range(kills)]
    rng.shuffle(victims)
    deadline = time.monotonic() + timeout_s
    done: Counter[str] = Counter()
    for victim in victims:
        target = await view_stream(store, stream, ledger_progress) + rng.randint(*moves)
        await _wait(store, stream, target, roles, finished, deadline)
        if finished():
            break
        roles[victim].kill()
        roles[victim].start()
        done[victim] += 1
    while not finished():
        _failed(roles)
        if time.monotonic() > deadline:
            raise ChaosError(f"the loop over stream {stream!r} did not finish in time")
        await asyncio.sleep(_POLL_S)
    _failed(roles)
    return done
