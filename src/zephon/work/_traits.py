"""Optional facts a work source may offer the engine, as typed protocols.

A :class:`~zephon.work.WorkSource` subclass that has a ``seed`` (operators' seeds derive from
it), a ``fingerprint`` (a checkpoint from another configuration is refused) or a ``mixture``
(``ensure_mixture``'s default target) declares it as a property of that name and type; mypy
checks it against these protocols, and the engine reads it only through the helpers below.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol, runtime_checkable

from zephon.work._mixture import MixtureSpec


@runtime_checkable
class SeededSource(Protocol):
    """A source whose order depends on a seed; every operator's seed is derived from it."""

    @property
    def seed(self) -> int: ...


@runtime_checkable
class FingerprintedSource(Protocol):
    """A source that hashes its configuration; checkpoints record and compare the hash."""

    @property
    def fingerprint(self) -> str: ...


@runtime_checkable
class MixtureSource(Protocol):
    """A source that draws from datasets by a target mixture."""

    @property
    def mixture(self) -> MixtureSpec: ...


@runtime_checkable
class TokenMeasuredSource(Protocol):
    """A source whose token mixture is measured through the pipeline's first tokenizer."""

    def needs_measuring(self) -> bool: ...

    def measure_tokens(self, count: Callable[[list[Any]], list[int]]) -> bool: ...


def source_seed(source: object) -> int:
    """The source's seed (``SeededSource``), else 0."""
    if isinstance(source, SeededSource):
        seed = source.seed
        if isinstance(seed, int):
            return seed
    return 0


def source_fingerprint(source: object) -> str | None:
    """The source's configuration hash (``FingerprintedSource``), else ``None``."""
    return source.fingerprint if isinstance(source, FingerprintedSource) else None


def source_mixture(source: object) -> MixtureSpec | None:
    """The source's target mixture (``MixtureSource``), else ``None``; a user source may hold
    plain weights (a mapping of name to weight), read as a mixture by samples."""
    mixture = source.mixture if isinstance(source, MixtureSource) else None
    if isinstance(mixture, MixtureSpec) or mixture is None:
        return mixture
    if isinstance(mixture, Mapping):
        return MixtureSpec({str(k): float(v) for k, v in mixture.items()})
    return None
