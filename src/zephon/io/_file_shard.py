"""The common shell of shards stored in one file: URL, bytes, projection, lazy handles.

Open handles and loaded metadata are *transient*: named in ``_TRANSIENT``, dropped when the
shard is pickled and rebuilt lazily by ``_init_transient`` in the receiving process.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from zephon.io._blob import Blob, OneBlob
from zephon.io._cache import CacheOptions
from zephon.io._dataset import Shard
from zephon.io._identity import stale_count_error


class LazyShard(Shard):
    """A shard that pickles without its ``_TRANSIENT`` attributes."""

    _TRANSIENT: ClassVar[tuple[str, ...]] = ()

    def _init_transient(self) -> None:
        """Set every ``_TRANSIENT`` attribute to its unopened value."""

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in self._TRANSIENT}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._init_transient()


class FileShard(OneBlob, LazyShard):
    """One file (local, remote or node-cached); ``columns`` projects its rows."""

    def __init__(
        self,
        url: str,
        rows: int | None = None,
        *,
        columns: Sequence[str] | None = None,
        storage_options: dict[str, Any] | None = None,
        cache: CacheOptions | None = None,
    ) -> None:
        self._url = url
        self._blob = Blob(url, storage_options, cache)
        self._columns = None if columns is None else list(columns)
        self._rows = rows
        self._indexed = rows is not None  # the count came from index.json
        self._init_transient()
        self._rows = rows if rows is not None else self._count()

    def _count(self) -> int:
        """Rows in the file (opens it); used when no index gave the count."""
        raise NotImplementedError

    @property
    def location(self) -> str:
        return self._url

    @property
    def columns(self) -> list[str] | None:
        return None if self._columns is None else list(self._columns)

    def __len__(self) -> int:
        assert self._rows is not None
        return self._rows

    def _check_rows(self, found: int) -> None:
        """A count (from ``index.json`` or counted earlier) the file no longer matches is an
        error: a change during the run says what changed, else the index is stale."""
        if self._rows is not None and self._rows != found:
            self._blob.check_unchanged()
            indexed = getattr(self, "_indexed", True)
            raise stale_count_error(self._url, found, self._rows, indexed=indexed)
