"""Prometheus metrics of the proxy, summed over the worker processes of one server.

Each worker keeps plain counters and histograms in memory. With several workers (a
``metrics_dir`` is set) every worker also writes its own totals to
``<dir>/<pid>-<token>.json`` about once a second and at every scrape; a scrape of any
worker sums all files, so the numbers do
not depend on which worker answered. Counters are cumulative, so a dead worker's last file
still counts (as in Prometheus' own multi-process mode).
"""

from __future__ import annotations

import bisect
import json
import os
import threading
import uuid
from collections.abc import Iterable
from typing import Any

from zephon._atomic import write_atomic

__all__ = ["BUCKETS", "Metrics"]

BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

_HELP = {
    "zephon_proxy_requests_total": ("counter", "HTTP requests answered, by route and status"),
    "zephon_proxy_capture_failures_total": (
        "counter",
        "model calls whose capture failed (rollout marked incomplete), by reason",
    ),
    "zephon_proxy_engine_refusals_total": ("counter", "engine refusals recorded, by code"),
    "zephon_proxy_parent_resolution_total": (
        "counter",
        "request-time lineage decisions, by status",
    ),
    "zephon_proxy_put_seconds": ("histogram", "TokenSink.put latency"),
    "zephon_proxy_engine_seconds": ("histogram", "engine call latency (capture routes)"),
    "zephon_proxy_capture_seconds": ("histogram", "whole capture call latency"),
}

Key = tuple[str, tuple[tuple[str, str], ...]]


def _labels(labels: tuple[tuple[str, str], ...], extra: str = "") -> str:
    parts = [f'{k}="{v}"' for k, v in labels]
    if extra:
        parts.append(extra)
    return "{" + ",".join(parts) + "}" if parts else ""


class Metrics:
    """Counters and histograms of one worker, renderable as Prometheus text."""

    def __init__(self, shared_dir: str | None = None) -> None:
        self._lock = threading.Lock()
        self._counters: dict[Key, float] = {}
        self._hists: dict[Key, list[float]] = {}  # bucket counts..., count, sum
        self._dir = shared_dir
        self._token = uuid.uuid4().hex[:8]  # one file per Metrics (a replaced worker adds one)
        if shared_dir:
            os.makedirs(shared_dir, exist_ok=True)

    def inc(self, name: str, amount: float = 1.0, **labels: str) -> None:
        key = (name, tuple(sorted(labels.items())))
        with self._lock:
            self._counters[key] = self._counters.get(key, 0.0) + amount

    def observe(self, name: str, seconds: float, **labels: str) -> None:
        key = (name, tuple(sorted(labels.items())))
        with self._lock:
            hist = self._hists.get(key)
            if hist is None:
                hist = self._hists[key] = [0.0] * (len(BUCKETS) + 2)
            hist[bisect.bisect_left(BUCKETS, seconds)] += 1
            hist[-1] += seconds

    def counter(self, name: str, **labels: str) -> float:
        """This worker's value of one counter (tests and health)."""
        return self._counters.get((name, tuple(sorted(labels.items()))), 0.0)

    # -- sharing between workers --------------------------------------------------------------

    def _dump(self) -> dict[str, Any]:
        with self._lock:
            return {
                "counters": [[n, list(map(list, lb)), v] for (n, lb), v in self._counters.items()],
                "hists": [[n, list(map(list, lb)), h] for (n, lb), h in self._hists.items()],
            }

    def flush(self) -> None:
        """Write this worker's totals for the other workers' scrapes (atomic replace)."""
        if not self._dir:
            return
        path = os.path.join(self._dir, f"{os.getpid()}-{self._token}.json")
        write_atomic(path, json.dumps(self._dump()), durable=False)

    def _all_dumps(self) -> Iterable[dict[str, Any]]:
        if not self._dir:
            yield self._dump()
            return
        self.flush()
        for name in sorted(os.listdir(self._dir)):
            if not name.endswith(".json"):
                continue
            try:
                with open(os.path.join(self._dir, name), encoding="utf-8") as f:
                    yield json.load(f)
            except (OSError, ValueError):
                continue  # a file being replaced right now; its worker is counted next scrape

    def render(self) -> str:
        """Prometheus text exposition (version 0.0.4) of all workers' sums."""
        counters: dict[Key, float] = {}
        hists: dict[Key, list[float]] = {}
        for dump in self._all_dumps():
            for name, lb, value in dump["counters"]:
                key = (name, tuple((k, v) for k, v in lb))
                counters[key] = counters.get(key, 0.0) + value
            for name, lb, hist in dump["hists"]:
                key = (name, tuple((k, v) for k, v in lb))
                acc = hists.setdefault(key, [0.0] * len(hist))
                for i, v in enumerate(hist):
                    acc[i] += v
        lines: list[str] = []
        for name, (kind, text) in _HELP.items():
            lines.append(f"# HELP {name} {text}")
            lines.append(f"# TYPE {name} {kind}")
            if kind == "counter":
                for (n, lb), v in sorted(counters.items()):
                    if n == name:
                        lines.append(f"{name}{_labels(lb)} {v:g}")
                continue
            for (n, lb), h in sorted(hists.items()):
                if n != name:
                    continue
                cumulative = 0.0
                for bound, count in zip(BUCKETS, h):
                    cumulative += count
                    le = _labels(lb, 'le="' + format(bound, "g") + '"')
                    lines.append(f"{name}_bucket{le} {cumulative:g}")
                cumulative += h[len(BUCKETS)]
                le = _labels(lb, 'le="+Inf"')
                lines.append(f"{name}_bucket{le} {cumulative:g}")
                lines.append(f"{name}_count{_labels(lb)} {cumulative:g}")
                lines.append(f"{name}_sum{_labels(lb)} {h[-1]:.6f}")
        return "\n".join(lines) + "\n"
