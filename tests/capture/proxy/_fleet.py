"""A capture fleet under faults: proxies in front of one engine, all writing to one PostgreSQL.

:class:`Fleet` starts, as real processes on 127.0.0.1, an embedded PostgreSQL server, the
deterministic test engine (``engine.py``) and ``plan.proxies`` ``zephon capture serve``
proxies with ``plan.workers`` workers each. :func:`run_fleet` drives ``plan.rollouts``
multi-turn tool-calling chat rollouts whose turns land on random proxies, and meanwhile
SIGKILLs one whole proxy (supervisor and workers) and restarts it on its port, runs
``zephon capture conformance`` against the same server, and restarts PostgreSQL. Then it
freezes every rollout, builds it and checks the store against what the harness was told and
what the engine generated (see :func:`verify`).

The harness behaves like an OpenAI client with retries: a call without an answer (connection
refused or reset, any 5xx) is sent again, to another random proxy, after a short backoff; an
answered call (200) is never repeated, whatever its capture outcome. Each request is tagged
(``test_engine_tag``) so the engine's log says which calls it generated for.

Used by ``test_fleet.py`` and ``benchmarks/capture_fleet.py``.
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import sys
import time
from array import array
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from hashlib import sha256
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from tests.capture._pg import fresh_schema_url
from tests.capture._pgserver import EmbeddedPostgres
from tests.capture.proxy._harness import CAP, TOOLS_CHAT
from tests.capture.proxy._procs import (
    Proc,
    child_env,
    start_inference_stub,
    start_proxy,
    wait_for_workers,
)
from zephon.capture.builder import RolloutBuild, build_rollout
from zephon.capture.records import TokenCaptureSnapshot
from zephon.capture.stores import open_store

__all__ = ["Fleet", "FleetPlan", "FleetReport", "run_fleet"]

_MAX_ATTEMPTS = 60
_DEADLINE_S = 120.0


@dataclass(frozen=True)
class FleetPlan:
    """What to run: fleet shape, workload, and when the faults are injected."""

    rollouts: int
    proxies: int = 3
    workers: int = 2
    min_turns: int = 2
    max_turns: int = 5
    concurrency: int = 32
    kill_at: float = 0.25  # fraction of the planned calls acknowledged before the proxy kill
    held_back: float = 0.2  # the last rollouts start only once PostgreSQL is down
    seed: int = 20
    probe_calls: int = 40  # sequential calls measured direct and through a proxy

    def turns(self) -> list[int]:
        rng = random.Random(self.seed)
        return [rng.randint(self.min_turns, self.max_turns) for _ in range(self.rollouts)]


@dataclass
class Attempt:
    """One HTTP request of the harness."""

    tag: str
    proxy: int
    status: int  # 0: no HTTP answer (transport error)
    capture: str = ""  # x-zephon-capture
    call_id: str = ""
    error: str = ""
    outage: bool = False  # sent while PostgreSQL was down or restarting

    @property
    def done(self) -> bool:
        return bool(self.status or self.error)


@dataclass
class Turn:
    """An answered call the rollout continued from."""

    attempt: Attempt
    resolution: str
    parent_call_id: str | None
    prompt: list[int]
    generation: list[int]
    logprobs: list[float]

    @property
    def committed(self) -> bool:
        return self.attempt.capture == "committed"


@dataclass(frozen=True)
class Held:
    """Send turn ``turn`` first to proxy ``proxy`` and have the engine hold it (``token``)
    until the fault controller releases it: a call in flight when a fault strikes."""

    turn: int
    proxy: int
    token: str


@dataclass
class FleetRollout:
    rollout_id: str
    planned_turns: int
    held: Held | None = None
    turns: list[Turn] = field(default_factory=list)
    attempts: list[Attempt] = field(default_factory=list)
    gave_up: str = ""


@dataclass
class FleetReport:
    """The numbers of one run (``as_json`` is the benchmark's JSON line)."""

    rollouts: int = 0
    held_rollouts: int = 0  # with a call at the engine when a fault struck
    calls_acknowledged: int = 0
    attempts: int = 0
    failed_attempts: Counter[str] = field(default_factory=Counter)
    rollouts_with_failed_call: int = 0
    masked: int = 0
    mask_reasons: Counter[str] = field(default_factory=Counter)
    lost_generations: int = 0
    cross_proxy_links: int = 0
    resolved_links: int = 0
    drive_seconds: float = 0.0
    calls_per_s: float = 0.0
    direct_p50_ms: float = 0.0
    proxy_p50_ms: float = 0.0
    added_p50_ms: float = 0.0
    added_p99_ms: float = 0.0
    restart_seconds: float = 0.0
    outage_seconds: float = 0.0
    conformance: str = ""
    problems: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        out = {k: v for k, v in vars(self).items() if k not in ("problems", "conformance")}
        out["failed_attempts"] = dict(self.failed_attempts)
        out["mask_reasons"] = dict(self.mask_reasons)
        for key, value in out.items():
            if isinstance(value, float):
                out[key] = round(value, 3)
        return out


class Fleet:
    """The processes of a fleet; :meth:`close` stops all of them."""

    def __init__(self, plan: FleetPlan, tokenizer: Path, workdir: Path) -> None:
        self.plan = plan
        self.tokenizer = tokenizer
        self.workdir = workdir
        self.pg = EmbeddedPostgres()
        self.engine: Proc | None = None
        self.proxies: list[Proc] = []
        self.retired: list[Proc] = []  # proxies killed and replaced (their logs are kept)
        self.url = ""

    def start(self) -> None:
        self.pg.start()
        self.url = fresh_schema_url(self.pg.dsn)
        self.engine = start_inference_stub(self.tokenizer, self.workdir)
        self.proxies = [self._proxy(i) for i in range(self.plan.proxies)]
        for proxy in self.proxies:
            wait_for_workers(proxy, self.plan.workers)

    def spill_dir(self, index: int) -> Path:
        return self.workdir / f"spill-{index}"

    def _proxy(self, index: int, *extra: str) -> Proc:
        assert self.engine is not None
        return start_proxy(
            self.engine.url,
            self.url,
            self.workdir,
            "--workers",
            str(self.plan.workers),
            "--spill-dir",
            str(self.spill_dir(index)),
            "--spill-replay-interval",
            "0.2",
            "--inference-timeout",
            "30",
            *extra,
        )

    def crash(self, index: int) -> None:
        """SIGKILL proxy ``index`` with all its workers (a crash of the whole server)."""
        self.proxies[index].kill_group()

    def restart(self, index: int) -> None:
        """Start crashed proxy ``index`` again on its port, with its spill journal."""
        old = self.proxies[index]
        port = old.url.rsplit(":", 1)[1]
        new = self._proxy(index, "--port", port)
        assert new.url == old.url
        wait_for_workers(new, self.plan.workers)
        self.retired.append(old)
        self.proxies[index] = new

    def journals_left(self) -> int:
        """Spilled marks not yet replayed into the store, over every proxy."""
        count = 0
        for index in range(self.plan.proxies):
            for path in self.spill_dir(index).rglob("*.jsonl"):
                try:
                    count += len(path.read_text().splitlines())
                except FileNotFoundError:  # adopted by another worker meanwhile
                    continue
        return count

    def logs(self) -> str:
        return "".join(p.log.read_text() for p in [*self.retired, *self.proxies])

    def close(self) -> None:
        for proxy in self.proxies:
            proxy.stop()
        if self.engine is not None:
            self.engine.stop()
        self.pg.stop()


def _prompt_hash(ids: list[int]) -> str:
    return sha256(array("Q", ids).tobytes()).hexdigest()


def _next_messages(messages: list[dict[str, Any]], message: dict[str, Any], k: int) -> None:
    """Echo the model's message faithfully, then answer its tool calls or add a user turn."""
    messages.append(message)
    for tc in message.get("tool_calls") or []:
        query = json.loads(tc["function"]["arguments"])["query"]
        messages.append({"role": "tool", "tool_call_id": tc["id"], "content": f"{query}: {k}"})
    if not message.get("tool_calls"):
        messages.append({"role": "user", "content": f"Go on ({k})."})


class Driver:
    """The harness: rollouts through random proxies, and the fault schedule beside them."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self.plan = fleet.plan
        self.rng = random.Random(self.plan.seed + 1)
        self.acked = 0
        self.failures = 0
        self.outage = False
        self.progress = asyncio.Event()
        self.pg_down = asyncio.Event()
        self.report = FleetReport()
        self.runs: list[FleetRollout] = []
        self.held: list[asyncio.Future[FleetRollout]] = []

    def _url(self, proxy: int, rid: str) -> str:
        return self.fleet.proxies[proxy].url + CAP.format(rid=rid) + "/v1/chat/completions"

    async def _send(
        self, client: httpx.AsyncClient, run: FleetRollout, body: dict[str, Any], k: int
    ) -> httpx.Response | None:
        """One turn: send until some proxy answers 200; None if it never does."""
        deadline = time.monotonic() + _DEADLINE_S
        for n in range(_MAX_ATTEMPTS):
            proxy = self.rng.randrange(self.plan.proxies)
            tag = f"{run.rollout_id}/{k}/{n}"
            extra: dict[str, Any] = {"test_engine_tag": tag}
            held = run.held
            if held is not None and (held.turn, n) == (k, 0):
                proxy = held.proxy
                extra |= {"test_engine_fault": "hold", "test_engine_hold": held.token}
            attempt = Attempt(tag, proxy, 0, outage=self.outage)
            run.attempts.append(attempt)
            try:
                resp = await client.post(self._url(proxy, run.rollout_id), json=body | extra)
            except httpx.TransportError as exc:
                attempt.error = type(exc).__name__
            else:
                self.progress.set()
                attempt.status = resp.status_code
                attempt.capture = resp.headers.get("x-zephon-capture", "")
                attempt.call_id = resp.headers.get("x-zephon-model-call-id", "")
                if resp.status_code == 200:
                    return resp
                attempt.error = resp.text[:200]
                if resp.status_code < 500:
                    run.gave_up = f"HTTP {resp.status_code}: {resp.text[:200]}"
                    return None
            self.failures += 1
            self.progress.set()
            if time.monotonic() > deadline:
                break
            await asyncio.sleep(min(0.5, 0.01 * 2**n))  # a client's retry backoff
        run.gave_up = run.gave_up or f"no answer after {len(run.attempts)} attempts"
        return None

    async def rollout(
        self, client: httpx.AsyncClient, index: int, turns: int, held: Held | None = None
    ) -> FleetRollout:
        run = FleetRollout(f"fleet-{self.plan.seed}-{index:05d}", turns, held)
        self.runs.append(run)
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": f"Task {index}: find something."},
        ]
        for k in range(turns):
            body = {
                "model": "tiny",
                "messages": messages,
                "tools": TOOLS_CHAT,
                "max_tokens": 64,
                "logprobs": True,
                "return_token_ids": True,
            }
            resp = await self._send(client, run, body, k)
            if resp is None:
                return run
            data = resp.json()
            choice = data["choices"][0]
            attempt = run.attempts[-1]
            run.turns.append(
                Turn(
                    attempt,
                    resp.headers.get("x-zephon-parent-resolution", ""),
                    resp.headers.get("x-zephon-parent-call-id"),
                    data["prompt_token_ids"],
                    choice["token_ids"],
                    [e["logprob"] for e in choice["logprobs"]["content"]],
                )
            )
            if attempt.capture == "committed":
                self.acked += 1
                self.progress.set()
            _next_messages(messages, choice["message"], k)
        return run

    async def until(
        self, condition: Callable[[], bool], what: str, timeout: float = _DEADLINE_S
    ) -> None:
        """Wait for ``condition()`` (re-checked whenever the harness makes progress)."""
        deadline = time.monotonic() + timeout
        while not condition():
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"timed out waiting for {what}"
            self.progress.clear()
            try:
                await asyncio.wait_for(self.progress.wait(), remaining)
            except TimeoutError:
                continue

    async def _hold(self, client: httpx.AsyncClient, proxies: list[int], name: str) -> list[str]:
        """Start one rollout per proxy in ``proxies`` whose second turn the engine holds;
        returns the hold tokens once the engine holds every one of them."""
        tokens = []
        for proxy in proxies:
            index = self.plan.rollouts + len(self.held)
            tokens.append(f"{name}-{index}")
            held = Held(1, proxy, tokens[-1])
            self.held.append(asyncio.ensure_future(self.rollout(client, index, 3, held)))
        engine = self.fleet.engine
        assert engine is not None
        deadline = time.monotonic() + _DEADLINE_S
        while True:  # polling the engine's state, with a deadline
            held_now = (await client.get(f"{engine.url}/test/stats")).json()["held"]
            if all(held_now.get(t, 0) >= 1 for t in tokens):
                return tokens
            assert time.monotonic() < deadline, f"the engine never held {tokens}"
            await asyncio.sleep(0.02)

    async def _release(self, client: httpx.AsyncClient, tokens: list[str]) -> None:
        engine = self.fleet.engine
        assert engine is not None
        for token in tokens:
            (await client.post(f"{engine.url}/test/release/{token}")).raise_for_status()

    async def faults(self, client: httpx.AsyncClient, planned_calls: int) -> None:
        """Kill one whole proxy while calls are at the engine and restart it, with the
        conformance suite running meanwhile; then stop PostgreSQL while a call per proxy is
        at the engine, and start it again once each of them was answered."""
        await self.until(lambda: self.acked >= self.plan.kill_at * planned_calls, "the kill")
        victim = self.plan.proxies // 2
        tokens = await self._hold(client, [victim, victim], "kill")
        conformance = asyncio.ensure_future(self._conformance())
        started = time.monotonic()
        await asyncio.to_thread(self.fleet.crash, victim)
        await self._release(client, tokens)  # the engine generates for a dead proxy
        await asyncio.to_thread(self.fleet.restart, victim)
        self.report.restart_seconds = time.monotonic() - started
        self.report.conformance = await conformance
        tokens = await self._hold(client, list(range(self.plan.proxies)), "outage")
        started = time.monotonic()
        self.outage = True
        await asyncio.to_thread(self.fleet.pg.pause)
        self.pg_down.set()  # the held-back rollouts start now
        await self._release(client, tokens)
        held = [r for r in self.runs if r.held is not None and r.held.token in tokens]
        await self.until(
            lambda: all(r.attempts[-1].done or len(r.attempts) > 2 for r in held),
            "the held calls' answers",
        )
        await asyncio.to_thread(self.fleet.pg.resume)
        self.outage = False
        self.report.outage_seconds = time.monotonic() - started

    async def _conformance(self) -> str:
        """``zephon capture conformance`` on the fleet's store URL; its output if it failed."""
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "zephon.cli",
            "capture",
            "conformance",
            self.fleet.url,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env=child_env(),
        )
        out, _ = await proc.communicate()
        return "passed" if proc.returncode == 0 else out.decode(errors="replace")[-3000:]

    async def drive(self) -> list[FleetRollout]:
        """Every rollout (the planned ones and the held ones), in index order."""
        turns = self.plan.turns()
        gate = int(len(turns) * (1 - self.plan.held_back))
        slots = asyncio.Semaphore(self.plan.concurrency)

        async def one(client: httpx.AsyncClient, index: int) -> FleetRollout:
            if index >= gate:
                await self.pg_down.wait()
            async with slots:
                return await self.rollout(client, index, turns[index])

        limits = httpx.Limits(max_connections=self.plan.concurrency * 2)
        async with httpx.AsyncClient(timeout=60, limits=limits) as client:
            faults = asyncio.ensure_future(self.faults(client, sum(turns)))
            started = time.monotonic()
            planned = await asyncio.gather(*(one(client, i) for i in range(len(turns))))
            await faults
            held = await asyncio.gather(*self.held)
            self.report.drive_seconds = time.monotonic() - started
        self.report.rollouts = len(planned) + len(held)
        self.report.held_rollouts = len(held)
        return [*planned, *held]


async def probe_latency(fleet: Fleet, calls: int, report: FleetReport) -> None:
    """Sequential calls, each sent to the engine directly and then through a proxy with the
    same conversation: added latency is the per-call difference."""
    assert fleet.engine is not None
    direct_url = f"{fleet.engine.url}/v1/chat/completions"
    direct: list[float] = []
    added: list[float] = []
    async with httpx.AsyncClient(timeout=60) as client:
        messages: list[dict[str, Any]] = []
        for i in range(calls + 5):  # the first five warm up
            if i % 6 == 0:
                messages = [{"role": "user", "content": f"Probe {i}: look it up."}]
            body = {"model": "tiny", "messages": messages, "tools": TOOLS_CHAT, "max_tokens": 64}
            started = time.perf_counter()
            (await client.post(direct_url, json=body)).raise_for_status()
            mid = time.perf_counter()
            proxy = fleet.proxies[i % len(fleet.proxies)].url
            rid = f"probe-{fleet.plan.seed}-{i // 6}"
            resp = await client.post(
                proxy + CAP.format(rid=rid) + "/v1/chat/completions", json=body
            )
            end = time.perf_counter()
            resp.raise_for_status()
            if i >= 5:
                direct.append(mid - started)
                added.append((end - mid) - (mid - started))
            _next_messages(messages, resp.json()["choices"][0]["message"], i)
    report.direct_p50_ms = statistics.median(direct) * 1e3
    report.proxy_p50_ms = statistics.median(d + a for d, a in zip(direct, added)) * 1e3
    report.added_p50_ms = statistics.median(added) * 1e3
    report.added_p99_ms = sorted(added)[min(len(added) - 1, int(0.99 * len(added)))] * 1e3


async def _freeze_all(url: str, rids: list[str]) -> list[TokenCaptureSnapshot]:
    """Freeze every rollout through a few clients (a trainer's view of the store)."""
    clients = [open_store(url) for _ in range(4)]
    try:

        async def part(j: int) -> list[TokenCaptureSnapshot]:
            return [await clients[j].freeze(r) for r in rids[j :: len(clients)]]

        parts = await asyncio.gather(*(part(j) for j in range(len(clients))))
    finally:
        for client in clients:
            await client.close()
    by_id = {s.rollout_id: s for p in parts for s in p}
    return [by_id[r] for r in rids]


def _expected(run: FleetRollout) -> tuple[list[int], list[int], list[float]]:
    """The trajectory the harness saw: the last answer's tokens, generated spans masked in."""
    last = run.turns[-1]
    ids = [*last.prompt, *last.generation]
    mask = [0] * len(ids)
    lps = [0.0] * len(ids)
    for turn in run.turns:
        start = len(turn.prompt)
        mask[start : start + len(turn.generation)] = [1] * len(turn.generation)
        lps[start : start + len(turn.generation)] = turn.logprobs
    return ids, mask, lps


def _check_acked(run: FleetRollout, snap: TokenCaptureSnapshot, problems: list[str]) -> None:
    by_id = {e.model_call_id: e for e in snap.entries}
    for turn in run.turns:
        if not turn.committed:
            continue
        entry = by_id.get(turn.attempt.call_id)
        if entry is None:
            problems.append(f"{turn.attempt.tag}: acknowledged call {turn.attempt.call_id} lost")
        elif (entry.prompt_token_ids, entry.generation_token_ids, entry.generation_log_probs) != (
            turn.prompt,
            turn.generation,
            turn.logprobs,
        ):
            problems.append(f"{turn.attempt.tag}: stored tokens differ from the engine's")


def _check_lineage(run: FleetRollout, snap: TokenCaptureSnapshot, report: FleetReport) -> None:
    """Every committed continuation of a committed turn resolved to it (across proxies)."""
    by_id = {e.model_call_id: e for e in snap.entries}
    for prev, turn in zip(run.turns, run.turns[1:]):
        if not (prev.committed and turn.committed):
            continue
        entry = by_id.get(turn.attempt.call_id)
        if entry is not None and entry.parent_resolution_reason == "lookup_error":
            continue  # the store was down when the parent was looked up: a safe UNRESOLVED
        parent = turn.parent_call_id
        if turn.resolution != "resolved" or not _same_call(by_id, parent, prev.attempt.call_id):
            report.problems.append(
                f"{turn.attempt.tag}: parent {turn.parent_call_id} ({turn.resolution}), "
                f"expected {prev.attempt.call_id}"
            )
            continue
        report.resolved_links += 1
        report.cross_proxy_links += prev.attempt.proxy != turn.attempt.proxy


def _same_call(by_id: dict[str, Any], parent: str | None, acked: str) -> bool:
    """``parent`` is the acknowledged call, or an identical sibling of it: a proxy that died
    after committing a call but before answering leaves one when the client retries."""
    if parent == acked:
        return True
    got, want = by_id.get(parent or ""), by_id.get(acked)
    return (
        got is not None
        and want is not None
        and (got.rollout_id, got.prompt_token_ids, got.generation_token_ids)
        == (want.rollout_id, want.prompt_token_ids, want.generation_token_ids)
    )


def _check_build(
    run: FleetRollout,
    snap: TokenCaptureSnapshot,
    build: RolloutBuild,
    generated: dict[str, str],
    report: FleetReport,
) -> None:
    problems = report.problems
    rid = run.rollout_id
    made = Counter(h for t, h in generated.items() if t.startswith(rid + "/"))
    made.subtract(_prompt_hash(e.prompt_token_ids) for e in snap.entries)
    lost = sum(n for n in made.values() if n > 0)  # generations the store has no entry for
    report.lost_generations += lost
    failed = [a for a in run.attempts if a.capture != "committed"]
    report.rollouts_with_failed_call += bool(failed)
    if build.masked:
        report.masked += 1
        report.mask_reasons.update(build.mask_reasons)
    if lost and not build.masked:
        problems.append(f"{rid}: trainable although {lost} of its generations were not stored")
    answered = any(a.status == 200 and a.capture != "committed" for a in run.attempts)
    if answered and not build.masked:
        problems.append(f"{rid}: a call answered without its capture, yet trainable")
    clean = not failed and all(t.resolution == "resolved" for t in run.turns[1:])
    if clean and build.masked:
        problems.append(f"{rid}: clean rollout masked ({build.mask_reasons})")
    if build.masked or not run.turns:
        return
    traj = build.trajectory
    assert traj is not None
    ids, mask, lps = _expected(run)
    if (
        traj.input_ids.tolist() != ids
        or traj.loss_mask.tolist() != mask
        or not np.array_equal(traj.logprobs, np.asarray(lps, dtype=np.float32))
    ):
        problems.append(f"{rid}: trajectory differs from the engine's tokens")


def verify(
    runs: list[FleetRollout],
    snaps: list[TokenCaptureSnapshot],
    generated: dict[str, str],
    report: FleetReport,
) -> None:
    """Fill ``report`` and its ``problems`` (empty when every claim holds)."""
    for run, snap in zip(runs, snaps):
        report.attempts += len(run.attempts)
        report.calls_acknowledged += sum(t.committed for t in run.turns)
        for a in run.attempts:
            if a.capture != "committed":
                kind = a.error if a.status == 0 else f"{a.status}/{a.capture or '-'}"
                report.failed_attempts[kind.split(":")[0][:40]] += 1
        if run.gave_up:
            report.problems.append(f"{run.rollout_id}: gave up: {run.gave_up}")
        _check_acked(run, snap, report.problems)
        _check_lineage(run, snap, report)
        _check_build(run, snap, build_rollout(snap), generated, report)
    report.calls_per_s = report.calls_acknowledged / max(report.drive_seconds, 1e-9)


async def run_fleet(plan: FleetPlan, tokenizer: Path, workdir: Path) -> FleetReport:
    """Start a fleet, drive it under faults, measure, verify; the report says what held."""
    fleet = Fleet(plan, tokenizer, workdir)
    try:
        await asyncio.to_thread(fleet.start)
        driver = Driver(fleet)
        runs = await driver.drive()
        report = driver.report
        deadline = time.monotonic() + 60
        while fleet.journals_left():  # spilled marks land once the store is back
            assert time.monotonic() < deadline, "spilled marks were never replayed"
            await asyncio.sleep(0.05)  # polling the journals' state, not timing
        await probe_latency(fleet, plan.probe_calls, report)
        snaps = await _freeze_all(fleet.url, [r.rollout_id for r in runs])
        assert fleet.engine is not None
        async with httpx.AsyncClient(timeout=60) as client:
            generated = (await client.get(f"{fleet.engine.url}/test/generated")).json()
        verify(runs, snaps, generated, report)
        if "Traceback" in fleet.logs():
            report.problems.append("a proxy logged a traceback:\n" + fleet.logs()[-3000:])
        return report
    finally:
        await asyncio.to_thread(fleet.close)
