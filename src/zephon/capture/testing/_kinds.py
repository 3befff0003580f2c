"""The registry of store kinds every parametrised store test runs over.

Why derived from the store registry: a test written against "every store" must pick up a new
backend, and a backend nobody taught the tests about must fail loudly rather than be tested as
another store. :data:`STORE_KINDS` has one kind per built-in store of
:mod:`zephon.capture.stores` (a built-in without a kind fails the import), and
:meth:`StoreKind.url` checks that the URL it makes is answered by the store of its name.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterable
from dataclasses import KW_ONLY, dataclass

from zephon.capture.stores import STORE_CLASSES, StoreSpec, store_spec
from zephon.errors import ConfigError

__all__ = ["STORE_KINDS", "StoreKind", "durable_kinds", "store_kinds"]


@dataclass(frozen=True, slots=True)
class StoreKind:
    """A store backend as tests see it: its registry name, whether its data outlives its
    process (crash and restart tests apply), and how to name a fresh, empty one:
    ``fresh_url`` with ``{dir}`` (a fresh directory) and ``{unique}`` (a fresh name), or
    ``needs_server`` (the caller supplies a server URL: a fresh schema or database)."""

    name: str
    durable: bool
    _: KW_ONLY
    fresh_url: str = ""
    needs_server: bool = False

    def url(self, directory: str, server_url: str | None = None) -> str:
        """A URL of a fresh, empty backend of this kind under ``directory``."""
        if self.needs_server:
            if not server_url:
                raise ConfigError(f"store kind {self.name!r} needs a server URL")
            url = server_url
        elif self.fresh_url:
            url = self.fresh_url.format(
                dir=os.path.abspath(directory), unique=f"test-{uuid.uuid4().hex[:12]}"
            )
        else:
            raise ConfigError(
                f"store kind {self.name!r} has no fresh_url: give StoreKind({self.name!r}, "
                f"durable=..., fresh_url='{self.name}://{{dir}}/capture') or needs_server=True"
            )
        answered_by = store_spec(url).name
        if answered_by != self.name:
            raise ConfigError(
                f"store kind {self.name!r}: its URL {url!r} is answered by store "
                f"{answered_by!r}; register store {self.name!r} (zephon.capture.stores."
                "register_store) or fix the kind's fresh_url"
            )
        return url


_KINDS = (
    StoreKind("memory", durable=False, fresh_url="memory://{unique}"),
    StoreKind("file", durable=True, fresh_url="file://{dir}/capture"),
    StoreKind("sqlite", durable=True, fresh_url="sqlite://{dir}/capture.db"),
    StoreKind("postgres", durable=True, needs_server=True),
)


def store_kinds(
    specs: Iterable[StoreSpec], kinds: Iterable[StoreKind] = _KINDS
) -> dict[str, StoreKind]:
    """The test kind of each store in ``specs``, by name, from ``kinds`` (zephon's own by
    default); a store without one is a :class:`~zephon.errors.ConfigError` naming it."""
    by_name = {k.name: k for k in kinds}
    names = [spec.name for spec in specs]
    missing = [name for name in names if name not in by_name]
    if missing:
        raise ConfigError(
            f"capture store(s) {missing} have no test kind: add a StoreKind(name, durable=..., "
            "fresh_url=...) for each to the kinds of zephon/capture/testing/_kinds.py (a store "
            "of your own: pass kinds=[*STORE_KINDS.values(), your_kind])"
        )
    return {name: by_name[name] for name in names}


STORE_KINDS: dict[str, StoreKind] = store_kinds(
    store_spec(f"{scheme}://") for scheme in STORE_CLASSES.values()
)
"""One kind per built-in store, in the registry's order."""


def durable_kinds() -> list[str]:
    """Names of the kinds whose data outlives the process."""
    return [k.name for k in STORE_KINDS.values() if k.durable]
