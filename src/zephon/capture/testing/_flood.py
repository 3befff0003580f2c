"""A hostile-client flood against a running capture proxy, with one well-behaved client.

Why: a proxy's limits only matter if a well-behaved rollout worker keeps being served while
other clients misbehave. :func:`run_flood` drives, over real sockets and for ``duration_s``:
clients sending maximum-size bodies (declared with ``Content-Length`` and chunked), clients
sending their request one byte per ``slow_interval_s``, and connections that send nothing;
meanwhile one client makes capture calls one after another and records each latency and each
acknowledged call id. A sampler records the proxy processes' peak resident memory.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

__all__ = ["FloodPlan", "FloodReport", "run_flood"]

_CHAT = {"model": "m", "messages": [{"role": "user", "content": "flood"}]}


@dataclass(frozen=True)
class FloodPlan:
    """Who floods the proxy, and for how long."""

    duration_s: float = 30.0
    big_clients: int = 8
    big_body_bytes: int = 100 * 2**20
    slow_clients: int = 200
    slow_interval_s: float = 1.0
    idle_connections: int = 500
    headers: dict[str, str] = field(default_factory=dict)  # e.g. the capture token
    request: dict[str, Any] = field(default_factory=lambda: dict(_CHAT))
    rollout_prefix: str = "flood"
    calls_per_rollout: int = 10


@dataclass
class FloodReport:
    """What happened: the good client's latencies and acknowledged calls, the attackers'
    outcomes, and the proxy's peak memory."""

    latencies_s: list[float] = field(default_factory=list)
    acknowledged: dict[str, list[str]] = field(default_factory=dict)
    good_statuses: Counter[int] = field(default_factory=Counter)
    good_refusals: Counter[str] = field(default_factory=Counter)  # error code of each non-200
    big_outcomes: Counter[str] = field(default_factory=Counter)
    slow_closed: int = 0
    idle_closed: int = 0
    peak_rss_bytes: int = 0

    def quantile(self, q: float) -> float:
        ordered = sorted(self.latencies_s)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def _capture_path(rid: str) -> str:
    return f"/ng-rollout/{rid}/training-token-capture/v1/chat/completions"


async def _status_of(reader: asyncio.StreamReader) -> str:
    try:
        line = await asyncio.wait_for(reader.readline(), 5.0)
    except (OSError, TimeoutError):
        return "reset"
    parts = line.split(b" ", 2)
    return parts[1].decode("ascii", "replace") if len(parts) > 1 else "reset"


async def _big_once(host: str, port: int, plan: FloodPlan, chunked: bool) -> str:
    reader, writer = await asyncio.open_connection(host, port)
    size = plan.big_body_bytes
    framing = "transfer-encoding: chunked" if chunked else f"content-length: {size}"
    head = f"POST {_capture_path('flood-big')} HTTP/1.1\r\nhost: proxy\r\n{framing}\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in plan.headers.items()) + "\r\n"
    chunk = b"[" * 2**20
    frame = b"%x\r\n%s\r\n" % (len(chunk), chunk) if chunked else chunk
    try:
        writer.write(head.encode())
        for _ in range(size // len(chunk)):
            writer.write(frame)
            await writer.drain()
        status = await _status_of(reader)
    except OSError:
        status = "reset"
    writer.close()
    return status


async def _big(host: str, port: int, plan: FloodPlan, end: float, out: FloodReport) -> None:
    chunked = False
    while time.monotonic() < end:
        try:
            out.big_outcomes[await _big_once(host, port, plan, chunked)] += 1
        except OSError:
            out.big_outcomes["connect_error"] += 1
        chunked = not chunked


async def _slow(host: str, port: int, plan: FloodPlan, end: float, out: FloodReport) -> None:
    request = "POST /v1/chat/completions HTTP/1.1\r\nhost: proxy\r\ncontent-length: 64\r\n\r\n"
    while time.monotonic() < end:
        reader, writer = await asyncio.open_connection(host, port)
        try:
            for byte in request.encode() + b"{" * 64:
                writer.write(bytes([byte]))
                await writer.drain()
                try:  # one byte per interval, until the proxy closes the connection
                    await asyncio.wait_for(reader.read(1024), plan.slow_interval_s)
                except TimeoutError:
                    continue
                out.slow_closed += 1
                break
        except OSError:
            out.slow_closed += 1
        writer.close()


async def _idle(host: str, port: int, end: float, out: FloodReport) -> None:
    while (left := end - time.monotonic()) > 0:
        reader, writer = await asyncio.open_connection(host, port)
        try:
            await asyncio.wait_for(reader.read(), left)
            out.idle_closed += 1
        except (TimeoutError, OSError):
            pass
        writer.close()


async def _attack(url: str, plan: FloodPlan, end: float, out: FloodReport) -> None:
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    tasks = [_big(host, port, plan, end, out) for _ in range(plan.big_clients)]
    tasks += [_slow(host, port, plan, end, out) for _ in range(plan.slow_clients)]
    tasks += [_idle(host, port, end, out) for _ in range(plan.idle_connections)]
    await asyncio.gather(*tasks, return_exceptions=True)


def _rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _group(pid: int) -> list[int]:
    """``pid`` and its children (a proxy's workers)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [pid, *map(int, f.read().split())]
    except OSError:
        return [pid]


def _sample(pid: int, stop: threading.Event, out: FloodReport) -> None:
    while not stop.wait(0.05):
        out.peak_rss_bytes = max([out.peak_rss_bytes, *map(_rss, _group(pid))])


def _good_client(url: str, plan: FloodPlan, end: float, out: FloodReport) -> None:
    import httpx

    n = 0
    with httpx.Client(timeout=120, headers=plan.headers) as client:
        while time.monotonic() < end:
            rid = f"{plan.rollout_prefix}-{os.getpid()}-{n // plan.calls_per_rollout}"
            started = time.perf_counter()
            resp = client.post(url + _capture_path(rid), json=plan.request)
            out.latencies_s.append(time.perf_counter() - started)
            out.good_statuses[resp.status_code] += 1
            if resp.status_code == 200:
                call_id = resp.headers["x-zephon-model-call-id"]
                out.acknowledged.setdefault(rid, []).append(call_id)
            else:
                out.good_refusals[_error_code(resp)] += 1
            n += 1


def _error_code(resp: Any) -> str:
    """The ``error.code`` of an answer, or its status when it has none."""
    try:
        return str(resp.json()["error"]["code"])
    except (ValueError, KeyError, TypeError):
        return str(resp.status_code)


def run_flood(url: str, proxy_pid: int, plan: FloodPlan) -> FloodReport:
    """Flood the proxy at ``url`` (process ``proxy_pid``) for ``plan.duration_s`` seconds."""
    out = FloodReport()
    end = time.monotonic() + plan.duration_s
    stop = threading.Event()
    sampler = threading.Thread(target=_sample, args=(proxy_pid, stop, out), daemon=True)
    attack = threading.Thread(target=asyncio.run, args=(_attack(url, plan, end, out),))
    sampler.start()
    attack.start()
    try:
        _good_client(url, plan, end, out)
    finally:
        attack.join()
        stop.set()
        sampler.join()
    return out
