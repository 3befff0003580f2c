"""The registry of store kinds every parametrised store test runs over.

Why one registry: a test written against "every store" must pick up a new backend without
anyone editing a hand-kept list; adding a kind here adds it to every such test.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass

__all__ = ["STORE_KINDS", "StoreKind", "durable_kinds"]


@dataclass(frozen=True, slots=True)
class StoreKind:
    """A store backend as tests see it."""

    name: str
    durable: bool  # survives its process (crash and restart tests apply)
    needs_server: bool = False  # the caller supplies a server URL (a fresh schema or database)

    def url(self, directory: str, server_url: str | None = None) -> str:
        """A URL of a fresh, empty backend of this kind under ``directory``."""
        if self.needs_server:
            if not server_url:
                raise ValueError(f"store kind {self.name!r} needs a server URL")
            return server_url
        if self.name == "memory":
            return f"memory://test-{uuid.uuid4().hex[:12]}"
        if self.name == "file":
            return f"file://{os.path.join(directory, 'capture')}"
        return f"sqlite://{os.path.join(directory, 'capture.db')}"


STORE_KINDS: dict[str, StoreKind] = {
    k.name: k
    for k in (
        StoreKind("memory", durable=False),
        StoreKind("file", durable=True),
        StoreKind("sqlite", durable=True),
        StoreKind("postgres", durable=True, needs_server=True),
    )
}


def durable_kinds() -> list[str]:
    """Names of the kinds whose data outlives the process."""
    return [k.name for k in STORE_KINDS.values() if k.durable]
