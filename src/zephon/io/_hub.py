"""Hugging Face Hub datasets: ``hf://org/name[@rev][/config]/split`` -> local shard files.

The revision (a branch, tag or commit; ``main`` by default) is resolved to its commit once, and
every file is downloaded through ``huggingface_hub`` into its own cache and checked to be at
that commit, so a run reads exactly one version of the data. A repository whose split has no
file zephon reads directly (a loading script, an unsupported format) is read from the Hub's
Parquet conversion (the ``refs/convert/parquet`` branch). ``HF_ENDPOINT``, ``HF_HUB_CACHE`` /
``HF_HOME`` and ``HF_HUB_OFFLINE`` are read at each call; offline, only the cache is used.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from zephon._optional import require
from zephon.errors import ConfigError, DataError

SCHEME = "hf://"
PARQUET_BRANCH = "refs/convert/parquet"
_TRUE = {"1", "on", "yes", "true"}


@dataclass(frozen=True)
class HubPath:
    """A parsed ``hf://`` dataset path."""

    repo_id: str
    revision: str
    config: str | None
    split: str

    @property
    def url(self) -> str:
        config = f"/{self.config}" if self.config else ""
        return f"{SCHEME}{self.repo_id}@{self.revision}{config}/{self.split}"


def is_hub_path(entry: str) -> bool:
    return entry.startswith(SCHEME)


def parse_hub_path(entry: str) -> HubPath:
    """``hf://org/name[@rev][/config]/split``; anything else is a one-line error."""
    parts = entry[len(SCHEME) :].strip("/").split("/")
    if len(parts) not in (3, 4) or not all(parts):
        raise ConfigError(
            f"{entry}: a Hub dataset path is hf://ORG/NAME[@REVISION][/CONFIG]/SPLIT, e.g. "
            "hf://org/corpus@v1.0/train"
        )
    name, _, revision = parts[1].partition("@")
    if not name or (revision == "" and "@" in parts[1]):
        raise ConfigError(f"{entry}: empty dataset name or revision after '@'")
    config = parts[2] if len(parts) == 4 else None
    return HubPath(f"{parts[0]}/{name}", revision or "main", config, parts[-1])


def split_files(
    files: Sequence[str], path: HubPath, readable: Callable[[str], bool], *, converted: bool = False
) -> list[str]:
    """The readable files of ``path``'s config and split, in name order.

    A file is in split ``S`` when a folder of its path is ``S`` or its name starts with ``S``
    followed by ``-``, ``_`` or ``.`` (``data/train-00000-of-00002.parquet``, ``train.jsonl``,
    ``default/train/0000.parquet``); a config other than ``default`` is a top-level folder, and
    so is every config of the Parquet conversion (``converted``), ``default`` included.
    """
    config = path.config or ("default" if converted else None)
    pattern = re.compile(rf"(^|/){re.escape(path.split)}([-_./]|$)")
    out = []
    for name in files:
        if not readable(name) or not pattern.search(name):
            continue
        top = name.split("/", 1)[0] if "/" in name else None
        if (converted or config not in (None, "default")) and top != config:
            continue
        out.append(name)
    return sorted(out)


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").lower() in _TRUE


def _cache_dir() -> str | None:
    if os.environ.get("HF_HUB_CACHE"):
        return os.environ["HF_HUB_CACHE"]
    if os.environ.get("HF_HOME"):
        return os.path.join(os.environ["HF_HOME"], "hub")
    return None  # huggingface_hub's default


def _cached(path: HubPath, revision: str) -> list[tuple[str, str]]:
    """``[(file in repo, local path)]`` of ``revision`` as the local cache holds it."""
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.errors import CacheNotFound

    try:
        info = scan_cache_dir(_cache_dir())
    except CacheNotFound:
        return []
    for repo in info.repos:
        if repo.repo_type != "dataset" or repo.repo_id != path.repo_id:
            continue
        for rev in repo.revisions:
            if revision in rev.refs or rev.commit_hash.startswith(revision):
                root = str(rev.snapshot_path)
                return [
                    (os.path.relpath(str(f.file_path), root), str(f.file_path)) for f in rev.files
                ]
    return []


def _from_cache(path: HubPath, readable: Callable[[str], bool]) -> list[str]:
    """Offline: the split's files from the cache (the revision, else its Parquet conversion)."""
    for revision in (path.revision, PARQUET_BRANCH):
        cached = dict(_cached(path, revision))
        chosen = split_files(list(cached), path, readable, converted=revision == PARQUET_BRANCH)
        if chosen:
            return [cached[name] for name in chosen]
    raise DataError(
        f"{path.url}: HF_HUB_OFFLINE is set and the cache ({_cache_dir() or 'default'}) holds no "
        "file of this split at this revision; run once online, or unset HF_HUB_OFFLINE"
    )


def _listing(api: Any, path: HubPath, revision: str) -> tuple[str, list[str]] | None:
    """``(commit, files)`` of ``revision``, or None when the revision does not exist."""
    from huggingface_hub.errors import RevisionNotFoundError

    try:
        info = api.dataset_info(path.repo_id, revision=revision)
    except RevisionNotFoundError:
        return None
    return str(info.sha), [s.rfilename for s in info.siblings or []]


def _resolve_online(path: HubPath, readable: Callable[[str], bool]) -> list[str]:
    from huggingface_hub import HfApi, hf_hub_download
    from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError

    endpoint = os.environ.get("HF_ENDPOINT") or None
    api = HfApi(endpoint=endpoint)
    try:
        listing = _listing(api, path, path.revision)
        if listing is None:
            raise DataError(f"{path.url}: the dataset has no revision {path.revision!r}")
        revision, (commit, files) = path.revision, listing
        chosen = split_files(files, path, readable)
        if not chosen:  # nothing readable: the Hub's Parquet conversion, if it has one
            converted = _listing(api, path, PARQUET_BRANCH)
            if converted is not None:
                revision, (commit, files) = PARQUET_BRANCH, converted
                chosen = split_files(files, path, readable, converted=True)
        if not chosen:
            raise DataError(
                f"{path.url}: no file of split {path.split!r}"
                f"{' in config ' + repr(path.config) if path.config else ''} that zephon reads "
                f"(JSONL, Parquet, Arrow) at {commit[:12]}, and no Parquet conversion of it; "
                f"files: {', '.join(files[:8]) or 'none'}"
            )
        local = [
            hf_hub_download(
                path.repo_id,
                name,
                repo_type="dataset",
                revision=revision,  # by name, so the cache maps it to its commit (offline)
                endpoint=endpoint,
                cache_dir=_cache_dir(),
            )
            for name in chosen
        ]
    except RepositoryNotFoundError:
        raise DataError(
            f"{path.url}: no such dataset at {endpoint or 'the Hub'} (or it is private: log in "
            "with `hf auth login` or set HF_TOKEN)"
        ) from None
    except HfHubHTTPError as e:
        raise DataError(f"{path.url}: the Hub refused a request ({e})".splitlines()[0]) from None
    moved = [p for p in local if f"{os.sep}snapshots{os.sep}{commit}{os.sep}" not in p]
    if moved:
        raise DataError(
            f"{path.url}: {revision!r} moved to another commit while downloading (it was "
            f"{commit[:12]}); run again, or pin the commit: hf://{path.repo_id}@{commit}/..."
        )
    return local


def hub_files(entry: str, readable: Callable[[str], bool]) -> list[str]:
    """Local paths of the files of the ``hf://`` dataset split ``entry``, downloaded if needed."""
    require("huggingface_hub", "hf:// dataset paths")
    path = parse_hub_path(entry)
    if _offline():
        return _from_cache(path, readable)
    return _resolve_online(path, readable)
