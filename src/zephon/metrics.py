"""Metrics sinks besides Prometheus: push ``pipeline.stats()`` to statsd over UDP.

A sink never slows or stops the pipeline: :class:`MetricsReporter` pushes from its own daemon
thread, and :class:`StatsdSink` sends on a non-blocking UDP socket, packing metrics into
datagrams of at most ``max_packet_bytes`` (so any number of operators fits, in as many
datagrams as needed); a datagram the kernel cannot take at once is dropped, never waited for.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from zephon._optional import require
from zephon.errors import ConfigError

if TYPE_CHECKING:
    from zephon._engine.stats import RunStats
    from zephon.work import MixtureStats

__all__ = ["MetricsReporter", "MetricsSink", "StatsdSink", "metric_values", "parse_address"]

_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")
_OP_FIELDS = (
    "elements_in",
    "elements_out",
    "micro_batches",
    "stalls",
    "queue_depth",
    "bytes_fetched",
    "requests",
    "retries",
    "cache_hits",
)
_OP_TIMES = ("worker_ns", "accumulator_ns", "stall_ns")


class MetricsSink(Protocol):
    def emit(self, stats: RunStats) -> int: ...

    def close(self) -> None: ...


def metric_values(stats: RunStats) -> Iterator[tuple[str, float]]:
    """``(name, value)`` of every metric of a snapshot: run totals, I/O, per operator its
    counters, bytes read and times (milliseconds), and per dataset of a mixture its target
    weight and the samples, tokens and shares of each delivered."""
    yield "delivered", stats.delivered
    yield "tombstones", stats.tombstones
    yield "samples_read", stats.samples_read
    yield "samples_refetched", stats.samples_refetched
    yield "items_per_s", round(stats.items_per_s, 3)
    for name, value in stats.io.to_dict().items():
        yield f"io.{name}", value
    for index, op in enumerate(stats.operators):
        base = f"op.{index}_{_UNSAFE.sub('_', op.name)}"
        for field in _OP_FIELDS:
            yield f"{base}.{field}", getattr(op, field)
        for field in _OP_TIMES:
            yield f"{base}.{field[:-3]}_ms", round(getattr(op, field) / 1e6, 3)
    if stats.mixture is not None:
        yield from _mixture_values(stats.mixture)


def _mixture_values(mixture: MixtureStats) -> Iterator[tuple[str, float]]:
    """``mixture.<dataset>.weight|samples|tokens|sample_share|token_share`` (a share only once
    something was delivered)."""
    sample_shares, token_shares = mixture.sample_shares or {}, mixture.token_shares or {}
    for name, samples in mixture.samples.items():
        base = f"mixture.{_UNSAFE.sub('_', name)}"
        if name in mixture.weights:
            yield f"{base}.weight", mixture.weights[name]
        yield f"{base}.samples", samples
        yield f"{base}.tokens", mixture.tokens.get(name, 0)
        if name in sample_shares:
            yield f"{base}.sample_share", round(sample_shares[name], 6)
        if name in token_shares:
            yield f"{base}.token_share", round(token_shares[name], 6)


class StatsdSink:
    """Gauges of every metric of a snapshot, sent to a statsd server (needs ``zephon[statsd]``).

    Names are ``PREFIX.delivered``, ``PREFIX.io.bytes_fetched``,
    ``PREFIX.op.0_fetch.worker_ms``, ...; the values are the run's totals so far.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 8125,
        *,
        prefix: str = "zephon",
        max_packet_bytes: int = 512,
    ) -> None:
        if max_packet_bytes < 64:
            raise ConfigError(f"max_packet_bytes must be >= 64, got {max_packet_bytes}")
        statsd = require("statsd", "the statsd metrics sink")
        self.client = statsd.StatsClient(host, port, prefix=prefix, maxudpsize=max_packet_bytes)
        sock = getattr(self.client, "_sock", None)
        if sock is not None:
            sock.setblocking(False)  # a full socket buffer drops a datagram, never waits

    def emit(self, stats: RunStats) -> int:
        """Send the snapshot; returns how many metrics it held."""
        pipe = self.client.pipeline()
        count = 0
        for name, value in metric_values(stats):
            pipe.gauge(name, value)
            count += 1
        pipe.send()
        return count

    def close(self) -> None:
        self.client.close()


def parse_address(text: str, default_port: int = 8125) -> tuple[str, int]:
    """``HOST[:PORT]`` -> ``(host, port)``; a bad port is a one-line error."""
    host, _, port = text.rpartition(":") if ":" in text else (text, "", str(default_port))
    try:
        number = int(port)
    except ValueError:
        number = -1
    if not host or not 0 < number < 65536:
        raise ConfigError(f"statsd address {text!r}: expected HOST:PORT, e.g. 127.0.0.1:8125")
    return host, number


class MetricsReporter:
    """Pushes ``snapshot()`` to ``sinks`` every ``interval_s`` from a daemon thread, and once
    more on :meth:`close`. A sink that raises is logged once and the others go on."""

    def __init__(
        self,
        snapshot: Callable[[], RunStats | None],
        sinks: Sequence[MetricsSink],
        *,
        interval_s: float = 10.0,
    ) -> None:
        if interval_s <= 0:
            raise ConfigError(f"interval_s must be > 0, got {interval_s}")
        self._snapshot, self._sinks, self._interval = snapshot, list(sinks), interval_s
        self._stop = threading.Event()
        self._failed: set[int] = set()
        self._thread = threading.Thread(target=self._loop, name="zephon-metrics", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self._interval):
            self.push()

    def push(self) -> None:
        stats = self._snapshot()
        if stats is None:
            return
        for index, sink in enumerate(self._sinks):
            try:
                sink.emit(stats)
            except Exception as exc:  # a sink's own error must never stop the run
                if index not in self._failed:
                    self._failed.add(index)
                    _log().warning("zephon: metrics sink %r failed: %s", sink, exc)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.push()
        for sink in self._sinks:
            sink.close()


def _log() -> Any:
    import logging

    return logging.getLogger("zephon")
