"""Several clients of one capture store per worker; a rollout always uses the same client.

A SQL store client is one connection whose calls queue behind each other, so one client per
worker would serialise every rollout's puts. Pinning a rollout to one client (by a stable hash
of its id) keeps that client's incremental lineage cache warm for the rollout.
"""

from __future__ import annotations

import contextlib
import zlib
from typing import Any

from zephon.capture.protocols import RolloutRetiredError

__all__ = ["StoreClients"]

_PROBE = "zephon-proxy-startup-probe"


class StoreClients:
    def __init__(self, url: str, count: int) -> None:
        from zephon.capture.stores import open_store

        self.url = url
        self.clients: list[Any] = []
        try:
            for _ in range(count):
                self.clients.append(open_store(url))
        except Exception:
            self.clients.clear()
            raise

    @property
    def first(self) -> Any:
        return self.clients[0]

    def of(self, rollout_id: str) -> Any:
        """The client that serves ``rollout_id`` (stable for the life of the worker)."""
        if len(self.clients) == 1:
            return self.clients[0]
        return self.clients[zlib.crc32(rollout_id.encode()) % len(self.clients)]

    def describe(self) -> str:
        first = self.clients[0]
        text = first.describe() if hasattr(first, "describe") else type(first).__name__
        return f"{text} ({len(self.clients)} clients)"

    async def check(self) -> None:
        """A read on every client: an unreachable store fails the worker's startup."""
        for client in self.clients:
            with contextlib.suppress(RolloutRetiredError):
                await client.has_rows(_PROBE)

    async def close(self) -> None:
        for client in self.clients:
            await client.close()
