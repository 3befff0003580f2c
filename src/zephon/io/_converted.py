"""Folders written by ``zephon convert``: Megatron ``.bin/.idx`` shards plus two sidecars.

``OUT/zephon-convert.json`` (the manifest) lists the shards; each shard ``NAME`` is
``NAME.bin`` + ``NAME.idx`` (megatron-core reads them as they are), ``NAME.origin.json`` (every
document's source dataset, file, row and line) and, for chat SFT, ``NAME.mask`` (one ``uint8``
loss-mask byte per token, aligned with ``NAME.bin``). Read as a folder format, a row is one
document, ``{"input_ids": tokens}`` plus ``loss_mask`` when the shard has one, and provenance
names the ORIGINAL document (:meth:`ConvertedShard.source_of`), not the converted row.
"""

from __future__ import annotations

import json
from typing import Any, ClassVar

import numpy as np

from zephon.errors import DataFormatError
from zephon.io._blob import Blob
from zephon.io._formats import ReadOptions
from zephon.io._megatron import MegatronFile
from zephon.io._paths import get_fs, split_protocol
from zephon.io._token_files import TokenDocumentShard

MANIFEST_NAME = "zephon-convert.json"
MANIFEST_FORMAT = "zephon-convert"
MANIFEST_VERSION = 1
MASK_SUFFIX = ".mask"
ORIGIN_SUFFIX = ".origin.json"


def _join(entry: str, name: str) -> str:
    return entry.rstrip("/") + "/" + name


def read_manifest(entry: str, storage_options: dict[str, Any] | None = None) -> Any:
    """The manifest of the folder ``entry``, or None when it has none (or not ours)."""
    protocol, path = split_protocol(entry)
    fs = get_fs(protocol, storage_options)
    where = _join(path, MANIFEST_NAME)
    try:
        if not fs.isfile(where):
            return None
        with fs.open(where, "rb") as f:
            data = json.loads(f.read())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("format") == MANIFEST_FORMAT else None


def is_converted(entry: str, storage_options: dict[str, Any] | None) -> bool:
    return read_manifest(entry, storage_options) is not None


class ConvertedFile(MegatronFile):
    """A converted shard's ``.bin/.idx`` with its optional ``.mask`` sidecar."""

    _TRANSIENT: ClassVar[tuple[str, ...]] = ("_memmap", "_spans", "_mask_mm")

    def __init__(
        self,
        idx_url: str,
        has_mask: bool,
        storage_options: dict[str, Any] | None = None,
        cache: Any = None,
    ) -> None:
        self.has_mask = has_mask
        prefix = idx_url[: -len(".idx")]
        self._mask = Blob(prefix + MASK_SUFFIX, storage_options, cache)
        super().__init__(idx_url, storage_options, cache)

    def _init_transient(self) -> None:
        super()._init_transient()
        self._mask_mm: np.ndarray | None = None

    def loss_mask(self, start: int, stop: int) -> np.ndarray | None:
        if not self.has_mask:
            return None
        if self._mask_mm is None:
            n = self.n_tokens
            self._mask_mm = self._mask.local(
                lambda p: np.memmap(p, np.uint8, "r", 0, (n,)) if n else np.zeros(0, np.uint8)
            )
        if self._mask_mm is not None:
            return self._mask_mm[start:stop].view(np.bool_)
        return np.frombuffer(self._mask.read_range(start, stop), np.bool_)


class ConvertedShard(TokenDocumentShard):
    """One converted shard as rows; :meth:`source_of` says where each row came from."""

    def __init__(self, file: ConvertedFile, rows: int, origin_url: str, options: ReadOptions):
        super().__init__(file, rows)
        self._origin = Blob(origin_url, options.storage_options, options.cache)
        self._table: dict[str, Any] | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_table"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._table = None

    def origins(self) -> dict[str, Any]:
        """The ``.origin.json`` sidecar: ``dataset``, ``source``, ``rows``, ``lines``."""
        if self._table is None:
            try:
                raw = self._origin.read_range(0, self._origin.size())
                self._table = json.loads(raw)
            except (OSError, ValueError) as exc:
                raise DataFormatError(
                    f"{self._origin.url}: cannot read the provenance sidecar ({exc}); convert "
                    "the shard again (zephon convert resumes and rewrites unfinished shards)",
                    location=self._origin.url,
                ) from None
        return self._table

    def source_of(self, row: int) -> tuple[str, str, int, int | None]:
        """``(dataset, file, row, line or None)`` of the original document of ``row``."""
        table = self.origins()
        lines = table.get("lines")
        return (
            str(table["dataset"]),
            str(table["source"]),
            int(table["rows"][row]),
            None if lines is None else int(lines[row]),
        )


def converted_shards(entry: str, options: ReadOptions) -> list[Any]:
    """The finished shards of a ``zephon convert`` folder, in the manifest's order."""
    manifest = read_manifest(entry, options.storage_options)
    if manifest is None:
        raise DataFormatError(f"{entry} has no {MANIFEST_NAME}; point at a zephon convert folder")
    if not manifest.get("complete"):
        raise DataFormatError(
            f"{entry}: the conversion has not finished ({len(manifest.get('shards', []))} of "
            f"{manifest.get('planned')} shards); run the same zephon convert again to "
            "finish it",
            location=entry,
        )
    out: list[Any] = []
    for shard in manifest["shards"]:
        prefix = _join(entry, shard["name"])
        file = ConvertedFile(
            prefix + ".idx", bool(shard.get("mask")), options.storage_options, options.cache
        )
        out.append(ConvertedShard(file, int(shard["documents"]), prefix + ORIGIN_SUFFIX, options))
    return out
