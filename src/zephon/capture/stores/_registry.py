"""The registry of capture stores: one :class:`StoreSpec` per kind of store URL.

Why one registry: ``open_store``, the CLI's help, the proxy's checks (may a store be shared by
several server processes?), error messages and the docs table all read :func:`store_specs`, so
a store registered with :func:`register_store` is found by URL like the built-ins.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from zephon.errors import ConfigError

__all__ = [
    "StoreSpec",
    "register_store",
    "store_spec",
    "store_specs",
    "stores_markdown",
    "unregister_store",
    "url_forms",
]


@dataclass(frozen=True, slots=True)
class StoreSpec:
    """A kind of capture store: the URL schemes it answers, its class (a ``"module:Class"``
    imported on first use, or the class), how its URLs look, and what it needs.

    The class has a ``from_url(url, *, create)`` classmethod returning a
    :class:`~zephon.capture.protocols.CaptureStore`. ``shared_across_processes`` is False for
    a store that lives in one process (the proxy refuses it with several workers); ``extra``
    is the ``pip install 'zephon[EXTRA]'`` its client library comes with.
    """

    name: str
    schemes: tuple[str, ...]
    store: str | type
    url_form: str
    use: str = ""
    extra: str | None = None
    shared_across_processes: bool = True

    def __post_init__(self) -> None:
        if not self.schemes or any(s != s.lower() or not s for s in self.schemes):
            raise ConfigError(f"store {self.name!r}: schemes must be lower-case, non-empty")

    @property
    def class_name(self) -> str:
        store = self.store
        return store.partition(":")[2] if isinstance(store, str) else store.__name__

    def load(self) -> Any:
        """The store class (its module imported on first use)."""
        if not isinstance(self.store, str):
            return self.store
        module_name, _, class_name = self.store.partition(":")
        return getattr(importlib.import_module(module_name), class_name)


_STORES: dict[str, StoreSpec] = {}
#: URL scheme -> the spec answering it (kept in step with ``_STORES``).
_SCHEMES: dict[str, StoreSpec] = {}


def register_store(spec: StoreSpec, *, replace: bool = False) -> StoreSpec:
    """Add ``spec``; its schemes must be new unless ``replace=True``."""
    taken = [s for s in spec.schemes if s in _SCHEMES and _SCHEMES[s].name != spec.name]
    if (spec.name in _STORES or taken) and not replace:
        raise ConfigError(
            f"store {spec.name!r} or scheme(s) {taken} already registered (pass replace=True)"
        )
    if spec.name in _STORES:
        unregister_store(spec.name)
    _STORES[spec.name] = spec
    _SCHEMES.update(dict.fromkeys(spec.schemes, spec))
    return spec


def unregister_store(name: str) -> None:
    """Remove the store ``name`` and its schemes (a test's cleanup)."""
    spec = _STORES.pop(name)
    for scheme in spec.schemes:
        if _SCHEMES.get(scheme) is spec:
            del _SCHEMES[scheme]


def store_specs() -> tuple[StoreSpec, ...]:
    """Every registered store, in registration order (the built-ins first)."""
    return tuple(_STORES.values())


def store_spec(url: str) -> StoreSpec:
    """The store answering ``url``'s scheme; an unknown one is a ``ValueError`` listing the
    known schemes."""
    scheme = urlsplit(url).scheme.lower()
    spec = _SCHEMES.get(scheme)
    if spec is None:
        known = ", ".join(f"{s}://" for s in _SCHEMES)
        raise ValueError(
            f"unknown capture store URL {url!r}: scheme {scheme + '://' if scheme else '(none)'}"
            f" is not one of {known}"
        )
    return spec


def url_forms(*, shared_only: bool = False) -> str:
    """The registered URL forms in words (``file:///DIR, sqlite:///FILE, ...``)."""
    return ", ".join(
        s.url_form for s in _STORES.values() if s.shared_across_processes or not shared_only
    )


def stores_markdown() -> str:
    """The store table of docs/capture.md, generated from the registry."""
    lines = ["| URL | store | use |", "| --- | --- | --- |"]
    for spec in _STORES.values():
        url = " / ".join([f"`{spec.url_form}`", *(f"`{s}://...`" for s in spec.schemes[1:])])
        lines.append(f"| {url} | `{spec.class_name}` | {spec.use} |")
    return "\n".join(lines) + "\n"
