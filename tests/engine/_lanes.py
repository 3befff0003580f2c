"""JSONL corpora and the pipelines the lane-worker tests run under every runner.

Each builder takes the run's options last, so one pipeline is built for ``runner="inline"``,
``"threads"``, ``"process"`` and any ``lane_workers`` count alike.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests._corpus import make_docs
from zephon import Dataset, Pipeline, StaticMixtureWorkSource

Build = Callable[..., Pipeline]


def write_jsonl(folder: Path, docs: list[dict[str, Any]], shard_rows: int) -> Path:
    """``docs`` as JSONL shards of ``shard_rows`` lines in ``folder``."""
    folder.mkdir(parents=True)
    for start in range(0, len(docs), shard_rows):
        lines = [json.dumps(doc) for doc in docs[start : start + shard_rows]]
        (folder / f"part-{start // shard_rows:03d}.jsonl").write_text("\n".join(lines) + "\n")
    return folder


def write_corpora(root: Path) -> Path:
    """Two datasets ("web", 240 documents; "code", 120) and "tiny" (5 documents)."""
    write_jsonl(root / "web", make_docs(240, seed=11), 60)
    code = [{**doc, "id": 1000 + i} for i, doc in enumerate(make_docs(120, seed=12))]
    write_jsonl(root / "code", code, 40)
    write_jsonl(root / "tiny", make_docs(5, seed=13), 5)
    return root


def source(root: Path, names: tuple[str, ...] = ("web",), chunk_size: int = 16):
    datasets = [Dataset.from_path(name, root / name) for name in names]
    mixture = {name: 1.0 / len(names) for name in names}
    return StaticMixtureWorkSource(datasets, mixture, chunk_size=chunk_size, seed=5)


def keep(payload: dict[str, Any]) -> bool:
    return int(payload["id"]) % 5 != 2


def packed(root: Path, tok: Path, **options: Any) -> Pipeline:
    """decode -> tokenize -> pack_flat -> batch."""
    return (
        Pipeline(source(root))
        .decode_text()
        .tokenize(tok, max_length=48)
        .pack_flat(64, 0)
        .batch(4)
        .options(**{"canonical_replicas": 4, **options})
    )


def shuffled(root: Path, tok: Path, **options: Any) -> Pipeline:
    """decode -> tokenize -> shuffle -> batch(drop_last=True), six lanes."""
    return (
        Pipeline(source(root))
        .decode_text()
        .tokenize(tok, max_length=48)
        .shuffle(24, seed=3)
        .batch(3, drop_last=True)
        .options(**{"canonical_replicas": 6, **options})
    )


def mixed(root: Path, tok: Path, **options: Any) -> Pipeline:
    """Two datasets, ensure_mixture, three lanes."""
    return (
        Pipeline(source(root, ("web", "code")))
        .decode_text()
        .tokenize(tok, max_length=48)
        .ensure_mixture(mixture={"web": 2, "code": 1}, max_buffer_size=32)
        .batch(4)
        .options(**{"canonical_replicas": 3, "flush_every_k_chunks": 2, **options})
    )


def filtered(root: Path, tok: Path, **options: Any) -> Pipeline:
    """A filter that drops every fifth record, then tokenize -> batch."""
    return (
        Pipeline(source(root))
        .decode_text()
        .filter(keep)
        .tokenize(tok, max_length=48)
        .batch(4)
        .options(**{"canonical_replicas": 4, **options})
    )


def tiny(root: Path, tok: Path, **options: Any) -> Pipeline:
    """Five documents in chunks of two over four lanes: lane lengths 1, 1, 1 and 0 chunks."""
    return (
        Pipeline(source(root, ("tiny",), chunk_size=2))
        .decode_text()
        .tokenize(tok, max_length=48)
        .batch(1)
        .options(**{"canonical_replicas": 4, **options})
    )


PIPELINES: dict[str, Build] = {
    "packed": packed,
    "shuffled": shuffled,
    "mixed": mixed,
    "filtered": filtered,
}
