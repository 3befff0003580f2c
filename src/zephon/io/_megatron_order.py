"""megatron-core's ``GPTDataset`` and ``BlendedDataset`` sample order, element for element.

Why: a run read through zephon can then be compared sample by sample with a Megatron run of the
same seed, sequence length and split. ``GPTDataset`` concatenates the documents of its split in
a seeded order over as many epochs as the requested samples need (the *document index*), cuts
that stream every ``L`` tokens into windows ``L + 1`` long, and permutes the windows (the
*shuffle index*); both permutations come from one ``numpy.random.RandomState(seed)``, in that
order, and a final epoch holding fewer than 80% of an epoch's samples is shuffled apart from the
others. ``BlendedDataset`` deals samples to the dataset whose drawn share lags its weight most.
A row here is the window Megatron returns at the same index (before it splits inputs from
labels), so the row order *is* the Megatron order: read it in one lane without shuffling.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Sequence
from typing import ClassVar

import numpy as np

from zephon.errors import ConfigError
from zephon.io._blend_index import blend_indices
from zephon.io._dataset import Dataset, Row, checked_indices
from zephon.io._file_shard import LazyShard
from zephon.io._token_files import INPUT_IDS, TokenFile, TokenFileShard

SEPARATE_FINAL_EPOCH_BELOW = 0.80  # of an epoch's samples (megatron-core's threshold)
BLEND_SURPLUS = 0.005  # megatron-core's default ``mid_level_dataset_surplus``
PARTS = ("train", "valid", "test")


def _normalized(weights: Sequence[float]) -> list[float]:
    w = np.array(weights, dtype=np.float64)
    out: list[float] = (w / np.sum(w)).tolist()
    return out


def split_documents(split: str, part: str, documents: int) -> tuple[int, int]:
    """The document range ``[begin, end)`` of ``part`` under Megatron's ``split`` string
    (``"969,30,1"``: train, valid and test weights), rounded as megatron-core rounds it."""
    if part not in PARTS:
        raise ConfigError(f"megatron order: part must be one of {', '.join(PARTS)}, got {part!r}")
    vector = [float(x) for x in re.findall(r"[.0-9]+", split)]
    vector += [0.0] * (len(PARTS) - len(vector))
    if len(vector) != len(PARTS) or sum(vector) <= 0:
        raise ConfigError(f"megatron order: split {split!r} is not 'train,valid,test' weights")
    vector = _normalized(vector)
    bounds = functools.reduce(lambda a, b: [*a, a[-1] + b], vector, [0.0])
    i = PARTS.index(part)
    if vector[i] == 0:
        raise ConfigError(f"megatron order: split {split!r} gives the {part} part no documents")
    return round(bounds[i] * documents), round(bounds[i + 1] * documents)


def _document_index(
    documents: np.ndarray, epochs: int, rng: np.random.RandomState, separate: bool
) -> np.ndarray:
    """The split's documents repeated ``epochs`` times and shuffled (the last epoch on its own
    when ``separate``)."""
    if separate and epochs > 1:
        first = _document_index(documents, epochs - 1, rng, False)
        return np.concatenate((first, _document_index(documents, 1, rng, False)))
    out = np.tile(documents.astype(np.int32), epochs)
    rng.shuffle(out)
    return out


def _shuffle_index(first: int, total: int, rng: np.random.RandomState) -> np.ndarray:
    head = np.arange(first, dtype=np.int64)
    rng.shuffle(head)
    if first == total:
        return head
    tail = np.arange(first, total, dtype=np.int64)
    rng.shuffle(tail)
    return np.concatenate((head, tail))


class MegatronOrderShard(TokenFileShard):
    """``GPTDataset``'s windows of one token file, in its order (see :func:`megatron_chunks`)."""

    _TRANSIENT: ClassVar[tuple[str, ...]] = ("_plan",)

    def __init__(
        self,
        file: TokenFile,
        seq_length: int,
        *,
        seed: int,
        samples: int | None,
        plus_one: bool,
        documents: tuple[int, int],
    ) -> None:
        self.file, self.seq_length, self.seed = file, seq_length, seed
        self.extra = int(plus_one)
        self.documents = documents
        lengths = file.spans()[1][documents[0] : documents[1]]
        self.epoch_tokens = int(lengths.sum())
        L, T = seq_length, self.epoch_tokens
        if T - self.extra < L:
            raise ConfigError(
                f"token_chunks(order='megatron'): {file.location} documents {documents} hold "
                f"{T} tokens, fewer than one window of {L + self.extra}; lower seq_length"
            )
        wanted = (samples * L + self.extra) if samples is not None else T
        self.epochs = max(1, -(-wanted // T))
        self.samples = (self.epochs * T - self.extra) // L
        self.asked = samples if samples is not None else self.samples
        self._init_transient()

    def _init_transient(self) -> None:
        self._plan: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

    def __len__(self) -> int:
        return self.samples

    def plan(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The shuffle index, the document index and each of its documents' stream offset."""
        if self._plan is None:
            L, T, E, extra = self.seq_length, self.epoch_tokens, self.epochs, self.extra
            per_epoch = (T - extra) // L
            before_final = ((E - 1) * T - extra) // L
            # The final epoch is shuffled apart when it serves under 80% of an epoch.
            final = self.asked - before_final
            separate = E > 1 and final < int(SEPARATE_FINAL_EPOCH_BELOW * per_epoch)
            rng = np.random.RandomState(self.seed)
            docs = np.arange(*self.documents, dtype=np.int32)
            doc_index = _document_index(docs, E, rng, separate)
            shuffle = _shuffle_index(before_final if separate else self.samples, self.samples, rng)
            lengths = self.file.spans()[1][doc_index]
            offsets = np.concatenate(([0], np.cumsum(lengths, dtype=np.int64)))
            self._plan = (shuffle, doc_index, offsets)
        return self._plan

    def read(self, indices: Sequence[int]) -> list[Row]:
        idx = checked_indices(indices, len(self), self.location)
        shuffle, doc_index, offsets = self.plan()
        starts, lengths = self.file.spans()
        tokens = self.file.tokens()
        width = self.seq_length + self.extra
        rows: list[Row] = []
        for sample in shuffle[idx].tolist():
            lo = sample * self.seq_length
            out = np.empty(width, dtype=self.file.dtype)
            d = int(np.searchsorted(offsets, lo, side="right")) - 1
            at = 0
            while at < width:
                doc = int(doc_index[d])
                skip = lo + at - int(offsets[d])
                n = min(int(lengths[doc]) - skip, width - at)
                s = int(starts[doc]) + skip
                out[at : at + n] = (
                    tokens[s : s + n] if tokens is not None else self.file.read_tokens(s, s + n)
                )
                at += n
                d += 1
            rows.append({INPUT_IDS: out})
        return rows


def megatron_shard(
    file: TokenFile,
    seq_length: int,
    *,
    seed: int,
    samples: int | None,
    plus_one: bool = True,
    split: str = "1,0,0",
    part: str = "train",
) -> MegatronOrderShard:
    """A ``GPTDataset`` over ``file`` asked for ``samples`` (``None``: one epoch)."""
    if samples is not None and samples < 1:
        raise ConfigError(f"token_chunks(order='megatron'): samples must be >= 1, got {samples}")
    documents = split_documents(split, part, len(file.spans()[1]))
    return MegatronOrderShard(
        file, seq_length, seed=seed, samples=samples, plus_one=plus_one, documents=documents
    )


class MegatronBlendShard(LazyShard):
    """``BlendedDataset``'s samples over several :class:`MegatronOrderShard` (see
    :func:`megatron_blend`)."""

    _TRANSIENT: ClassVar[tuple[str, ...]] = ("_index",)

    def __init__(self, parts: list[MegatronOrderShard], weights: list[float], size: int) -> None:
        self.parts, self.weights, self.size = parts, weights, size
        self._init_transient()

    def _init_transient(self) -> None:
        self._index: tuple[np.ndarray, np.ndarray] | None = None

    @property
    def location(self) -> str:
        return "+".join(p.location for p in self.parts)

    def pin(self) -> None:
        for p in self.parts:
            p.pin()

    def check_unchanged(self) -> None:
        for p in self.parts:
            p.check_unchanged()

    def __len__(self) -> int:
        return self.size

    def read(self, indices: Sequence[int]) -> list[Row]:
        idx = checked_indices(indices, len(self), self.location)
        if self._index is None:
            self._index = blend_indices(self.weights, self.size)
        which, number = self._index[0][idx].tolist(), self._index[1][idx].tolist()
        return [self.parts[k].read([n])[0] for k, n in zip(which, number, strict=True)]


def blend_sizes(weights: Sequence[float], size: int) -> tuple[list[float], list[int], list[int]]:
    """The builder's arithmetic: normalized weights, the samples each dataset serves (summing to
    the blend's size) and the samples each is built with (``BLEND_SURPLUS`` more)."""
    normal = _normalized(weights)
    served = [math.ceil(size * w) for w in normal]
    built = [math.ceil(n * (1 + BLEND_SURPLUS)) for n in served]
    return normal, served, built


def megatron_blend_shard(
    parts: list[MegatronOrderShard], weights: Sequence[float], size: int
) -> MegatronBlendShard:
    """The blend of ``parts``, each built with its ``blend_sizes`` count: ``BlendedDataset``
    normalizes the builder's normalized weights again, and its size is the served sum."""
    normal, served, _ = blend_sizes(weights, size)
    return MegatronBlendShard(parts, _normalized(normal), sum(served))


def _only_file(dataset: Dataset, view: str) -> TokenFile:
    """The one token file of ``dataset``: a Megatron dataset is one ``.bin/.idx`` prefix."""
    files = [getattr(s, "file", None) for s in dataset.shards]
    if len(files) != 1 or not isinstance(files[0], TokenFile):
        raise ConfigError(
            f"{view}: dataset {dataset.name!r} has {len(files)} shards; Megatron order reads one "
            "pre-tokenized file per dataset (open each .idx with Dataset.from_path and blend "
            "them with megatron_blend)"
        )
    return files[0]


def megatron_chunks(
    dataset: Dataset,
    seq_length: int,
    *,
    seed: int,
    samples: int | None,
    plus_one: bool = True,
    split: str = "1,0,0",
    part: str = "train",
) -> Dataset:
    """``GPTDataset``'s samples of ``dataset``'s one token file, row ``i`` its sample ``i``."""
    file = _only_file(dataset, "token_chunks(order='megatron')")
    shard = megatron_shard(
        file, seq_length, seed=seed, samples=samples, plus_one=plus_one, split=split, part=part
    )
    return Dataset(dataset.name, [shard])


def megatron_blend(
    datasets: Sequence[Dataset],
    weights: Sequence[float],
    seq_length: int,
    *,
    seed: int,
    samples: int,
    plus_one: bool = True,
    split: str = "1,0,0",
    part: str = "train",
) -> Dataset:
    """megatron-core's ``BlendedDataset`` of ``datasets`` (one Megatron ``.bin/.idx`` file
    each) with ``weights``, as ``BlendedMegatronDatasetBuilder`` builds it for ``samples``
    samples, ``seed``, ``seq_length`` and ``split``: row ``i`` is its sample ``i`` (its
    ``tokens`` and ``labels`` are ``input_ids[:-1]`` and ``input_ids[1:]``). Read it in order:
    one lane, no shuffle."""
    if len(datasets) != len(weights) or not datasets or min(weights) <= 0:
        raise ConfigError(
            f"megatron_blend: give one positive weight per dataset, got {len(datasets)} "
            f"datasets and weights {list(weights)}"
        )
    if samples < 1:
        raise ConfigError(f"megatron_blend: samples must be >= 1, got {samples}")
    built = blend_sizes(weights, samples)[2]
    parts = [
        megatron_shard(
            _only_file(ds, "megatron_blend"),
            seq_length,
            seed=seed,
            samples=n,
            plus_one=plus_one,
            split=split,
            part=part,
        )
        for ds, n in zip(datasets, built, strict=True)
    ]
    name = "+".join(ds.name for ds in datasets)
    return Dataset(name, [megatron_blend_shard(parts, weights, samples)])
