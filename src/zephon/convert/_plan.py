"""What a conversion does: the pipeline's document operators, the output shards, the identity.

Only the operators up to the last ``tokenize`` / ``tokenize_chat`` run (decode, filter, map,
expand, tokenize): what follows them (shuffle, pack, batch) is how a training run reads the
tokens, not what is stored. Each input shard is cut into parts of ``documents_per_shard``
rows; a part is one output shard and one task, so every core has work and a resume redoes at
most the parts that were not finished.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import xxhash

from zephon._tokenizers import load_tokenizer
from zephon.config import ConfigFileError, OperatorConfig, PipelineConfig, load_config
from zephon.errors import ConfigError

TOKENIZERS = ("tokenize", "tokenize_chat")
#: Operators that change one document at a time, in order: what a stored corpus can hold.
DOCUMENT_OPERATORS = ("decode_text", "map_transform", "filter", "expand_chat", *TOKENIZERS)
DEFAULT_DOCUMENTS_PER_SHARD = 50_000
DTYPES = ("auto", "uint16", "int32", "int64")


@dataclass(frozen=True)
class Task:
    """One output shard: rows ``[start, stop)`` of shard ``shard`` of dataset ``dataset``."""

    name: str
    dataset: int
    shard: int
    start: int
    stop: int


@dataclass(frozen=True)
class Plan:
    """A checked conversion: the config restricted to its document operators, and its tasks."""

    file: str
    config: PipelineConfig
    tokenizer: OperatorConfig
    tasks: tuple[Task, ...]
    sources: tuple[tuple[str, ...], ...]
    dtype: str

    @property
    def output_field(self) -> str:
        return str(self.tokenizer.params.get("output_field", "input_ids"))

    @property
    def mask_field(self) -> str | None:
        if self.tokenizer.name != "tokenize_chat":
            return None
        return str(self.tokenizer.params.get("mask_field", "loss_mask"))


def document_operators(config: PipelineConfig, file: str) -> list[OperatorConfig]:
    """The operators up to the last tokenizer; raises naming the key of what cannot be stored."""
    last = max((i for i, op in enumerate(config.operators) if op.name in TOKENIZERS), default=-1)
    if last < 0:
        raise ConfigFileError(
            "operators",
            "no tokenize or tokenize_chat operator: zephon convert stores token ids; add "
            "'- {op: tokenize, tokenizer: ...}' after the decode steps",
            file=file,
        )
    ops = config.operators[: last + 1]
    for op in ops:
        if op.custom is not None or op.name not in DOCUMENT_OPERATORS:
            raise ConfigFileError(
                op.key,
                f"{op.name} runs before the tokenizer, but zephon convert only runs per-document "
                f"operators there ({', '.join(DOCUMENT_OPERATORS)}); move it after the tokenizer "
                "(it then runs when the converted corpus is read)",
                file=file,
            )
    return ops


def make_plan(
    pipeline: str | os.PathLike[str], documents_per_shard: int, dtype: str = "auto"
) -> Plan:
    """Load ``pipeline``, check it and cut its datasets into tasks (row counts are read)."""
    if documents_per_shard < 1:
        raise ConfigError(f"documents_per_shard must be >= 1, got {documents_per_shard}")
    if dtype not in DTYPES:
        raise ConfigError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    file = os.fspath(pipeline)
    config = load_config(file)
    ops = document_operators(config, file)
    datasets = config.open_datasets()
    tasks: list[Task] = []
    for d, ds in enumerate(datasets):
        for s, rows in enumerate(ds.counts()):
            parts = max(1, -(-rows // documents_per_shard))
            for p in range(parts):
                start, stop = p * documents_per_shard, min(rows, (p + 1) * documents_per_shard)
                tasks.append(Task(f"{ds.name}-{s:05d}-{p:05d}", d, s, start, stop))
    sources = tuple(tuple(sh.location for sh in ds.shards) for ds in datasets)
    restricted = dataclasses.replace(config, operators=list(ops), source={}, fetch={}, options={})
    encoder = load_tokenizer(ops[-1].params.get("tokenizer", "bytes"))
    resolved = str(output_dtype(dtype, encoder, ops[-1].params))
    return Plan(file, restricted, ops[-1], tuple(tasks), sources, resolved)


def _file_digest(h: Any, path: Path) -> None:
    h.update(path.name.encode() + b"\0")
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)


def tokenizer_fingerprint(spec: Any) -> str:
    """xxh64 of the tokenizer's files (``tokenizer.json`` and its config), or of its name."""
    h = xxhash.xxh64()
    path = Path(os.fspath(spec)) if isinstance(spec, str | os.PathLike) else None
    if path is not None and path.is_dir():
        for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
            if (path / name).is_file():
                _file_digest(h, path / name)
    elif path is not None and path.is_file():
        _file_digest(h, path)
    else:
        h.update(repr(spec).encode())
    return h.hexdigest()


def template_fingerprint(op: Any) -> str | None:
    """xxh64 of the chat template text ``tokenize_chat`` renders with; None for ``tokenize``."""
    template = getattr(op, "template", None)
    return None if template is None else xxhash.xxh64(str(template).encode()).hexdigest()


def largest_id(encoder: Any, params: dict[str, Any]) -> int | None:
    """The largest id the tokenizer can emit: its vocabulary including added and special
    tokens, and the BOS/EOS ids the operator adds (``bos_token_id``/``eos_token_id`` may lie
    outside the vocabulary). None when the vocabulary cannot be read (a duck-typed encoder)."""
    specials = [params.get("bos_token_id"), params.get("eos_token_id")]
    specials += [getattr(encoder, "bos_token_id", None), getattr(encoder, "eos_token_id", None)]
    inner = getattr(encoder, "tokenizer", None)
    if inner is not None and hasattr(inner, "get_vocab"):
        vocab = max(inner.get_vocab(with_added_tokens=True).values(), default=-1)
    elif getattr(encoder, "vocab_size", None) is not None:
        vocab = int(encoder.vocab_size) - 1
    else:
        return None
    return max([int(vocab), *(int(i) for i in specials if i is not None)])


def output_dtype(choice: str, encoder: Any, params: dict[str, Any] | None = None) -> np.dtype[Any]:
    """``auto``: ``uint16`` when the largest id the tokenizer can emit fits (see
    :func:`largest_id`), else ``int32``; a vocabulary that cannot be read gets ``int32``.
    A count of the vocabulary is not enough: an added token may have any id."""
    if choice != "auto":
        return np.dtype(choice)
    top = largest_id(encoder, params or {})
    return np.dtype(np.uint16) if top is not None and top <= 65_535 else np.dtype(np.int32)
