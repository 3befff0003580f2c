"""``token_chunks(order="megatron")`` and ``megatron_blend`` against megatron-core itself: the
oracle is its ``GPTDataset`` / ``BlendedDataset``, built by ``BlendedMegatronDatasetBuilder``
on CPU over ``.bin/.idx`` files the test writes."""

from __future__ import annotations

import pickle
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.io._s3 import S3
from tests.io._token_writers import documents, write_megatron
from zephon import Pipeline, StaticMixtureWorkSource
from zephon.errors import ConfigError
from zephon.io import Dataset, megatron_blend, token_chunks
from zephon.io._blend_index import blend_indices

with warnings.catch_warnings():  # it warns that Transformer Engine and Apex are not installed
    warnings.simplefilter("ignore")
    from megatron.core.datasets.blended_megatron_dataset_builder import (
        BlendedMegatronDatasetBuilder,
    )
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig

N = 10_000


class _Tokenizer:
    """What ``GPTDatasetConfig`` reads of a tokenizer (no pad: megatron-core then pads with -1,
    outside every test vocabulary)."""

    vocab_size = 120
    eod = 0
    unique_identifiers = {"class": "test tokenizer"}  # megatron-core hashes it into its cache key


def _megatron(
    tmp_path: Path,
    prefixes: list[Path],
    weights: list[float] | None,
    *,
    seed: int,
    seq_length: int,
    samples: int,
    split: str = "1,0,0",
    plus_one: bool = True,
) -> Any:
    blend = ([str(p) for p in prefixes], weights)
    config = GPTDatasetConfig(
        random_seed=seed,
        sequence_length=seq_length,
        blend=blend,
        split=split,
        # Its BlendedDataset caches only under torch.distributed: without a cache folder its
        # GPTDatasets cache next to their files.
        path_to_cache=str(tmp_path / "megatron-cache") if weights is None else None,
        tokenizer=_Tokenizer(),
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=False,
        create_attention_mask=False,
        add_extra_token_to_sequence=plus_one,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        built = BlendedMegatronDatasetBuilder(
            GPTDataset, [samples, 0, 0], lambda: True, config
        ).build()
    return built[0]


def _theirs_row(dataset: Any, i: int) -> np.ndarray:
    """Megatron's sample ``i`` as its ``seq_length + 1`` token window."""
    s = dataset[i]
    return np.concatenate((s["tokens"].numpy(), s["labels"].numpy()[-1:]))


def _theirs(dataset: Any, n: int) -> np.ndarray:
    """Megatron's first ``n`` samples as ``seq_length + 1`` token windows."""
    return np.stack([_theirs_row(dataset, i) for i in range(n)])


def _ours(ds: Dataset, n: int) -> np.ndarray:
    return np.stack([r["input_ids"].astype(np.int64) for r in ds.read(0, range(n))])


def _corpus(tmp_path: Path, name: str, n: int, seed: int, lo: int = 1) -> Path:
    prefix = tmp_path / "data" / name
    write_megatron(prefix, documents(n, seed=seed, lo=lo), 8)
    return prefix


@pytest.mark.parametrize("seed", [1234, 7])
@pytest.mark.parametrize("seq_length", [128, 257])
def test_gpt_dataset_order(tmp_path: Path, seed: int, seq_length: int) -> None:
    prefix = _corpus(tmp_path, "web", 1500, seed=3)  # ~45k tokens: 10,000 samples span epochs
    theirs = _megatron(tmp_path, [prefix], None, seed=seed, seq_length=seq_length, samples=N)
    ours = token_chunks(
        Dataset.from_path(f"{prefix}.idx"), seq_length, order="megatron", seed=seed, samples=N
    )
    assert len(ours) == len(theirs)
    assert ours.shards[0].epochs > 1  # type: ignore[attr-defined]
    assert np.array_equal(_ours(ours, N), _theirs(theirs, N))


@pytest.mark.parametrize("samples", [None, 700, 1390])
def test_final_epoch_shuffled_apart_or_not(tmp_path: Path, samples: int | None) -> None:
    """One epoch, a final epoch under 80% full (shuffled apart) and one nearly full (not)."""
    prefix = _corpus(tmp_path, "web", 300, seed=5)  # ~9k tokens, ~70 samples of 128 per epoch
    ours = token_chunks(
        Dataset.from_path(f"{prefix}.idx"), 128, order="megatron", seed=11, samples=samples
    )
    theirs = _megatron(tmp_path, [prefix], None, seed=11, seq_length=128, samples=samples or 1)
    if samples is None:  # megatron-core asked for 1 sample builds one epoch: the same order
        assert ours.shards[0].epochs == 1  # type: ignore[attr-defined]
    assert len(ours) == len(theirs)
    assert np.array_equal(_ours(ours, len(ours)), _theirs(theirs, len(theirs)))


def test_without_the_extra_token(tmp_path: Path) -> None:
    """``plus_one=False`` is ``add_extra_token_to_sequence=False``: windows of ``L`` tokens."""
    prefix = _corpus(tmp_path, "web", 300, seed=5)
    ours = token_chunks(
        Dataset.from_path(f"{prefix}.idx"),
        100,
        order="megatron",
        seed=4,
        samples=500,
        plus_one=False,
    )
    theirs = _megatron(
        tmp_path, [prefix], None, seed=4, seq_length=100, samples=500, plus_one=False
    )
    assert len(ours) == len(theirs)
    expected = np.stack([theirs[i]["tokens"].numpy() for i in range(500)])
    assert np.array_equal(_ours(ours, 500), expected)


def test_split_part(tmp_path: Path) -> None:
    """The valid part of ``"80,15,5"``: the same document range and order as megatron-core's."""
    prefix = _corpus(tmp_path, "web", 801, seed=9)
    ours = token_chunks(
        Dataset.from_path(f"{prefix}.idx"),
        64,
        order="megatron",
        seed=3,
        samples=500,
        split="80,15,5",
        part="valid",
    )
    oracle = _megatron(tmp_path, [prefix], None, seed=3, seq_length=64, samples=1, split="80,15,5")
    config = oracle.config
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        built = BlendedMegatronDatasetBuilder(
            GPTDataset, [1, 500, None], lambda: True, config
        ).build()
    assert np.array_equal(_ours(ours, 500), _theirs(built[1], 500))


def test_blended_dataset_order(tmp_path: Path) -> None:
    prefixes = [
        _corpus(tmp_path, "web", 900, seed=1),
        _corpus(tmp_path, "code", 400, seed=2, lo=0),  # empty documents too
        _corpus(tmp_path, "math", 200, seed=4),
    ]
    weights = [0.5, 0.3, 0.2]
    theirs = _megatron(tmp_path, prefixes, weights, seed=1234, seq_length=128, samples=N)
    ours = megatron_blend(
        [Dataset.from_path(f"{p}.idx") for p in prefixes], weights, 128, seed=1234, samples=N
    )
    assert len(ours) == len(theirs)
    assert np.array_equal(_ours(ours, N), _theirs(theirs, N))


def test_blend_index_of_a_million_samples_is_megatron_cores(tmp_path: Path) -> None:
    """The index arrays themselves, at a million samples: which dataset and which of its
    samples, element for element (ties included: two of the weights are equal)."""
    prefixes = [
        _corpus(tmp_path, "web", 900, seed=1),
        _corpus(tmp_path, "code", 400, seed=2),
        _corpus(tmp_path, "math", 200, seed=4),
        _corpus(tmp_path, "books", 300, seed=6),
    ]
    weights, size = [0.4, 0.2, 0.2, 0.2], 1_000_000
    theirs = _megatron(tmp_path, prefixes, weights, seed=5, seq_length=32, samples=size)
    ours = megatron_blend(
        [Dataset.from_path(f"{p}.idx") for p in prefixes], weights, 32, seed=5, samples=size
    )
    shard = ours.shards[0]
    which, number = blend_indices(shard.weights, shard.size)  # type: ignore[attr-defined]
    assert len(which) == len(theirs.dataset_index) == size
    assert np.array_equal(which, theirs.dataset_index)
    assert np.array_equal(number, theirs.dataset_sample_index)
    picks = [0, 1, 2, 3, size // 2, size - 1]
    got = np.stack([r["input_ids"].astype(np.int64) for r in ours.read(0, picks)])
    assert np.array_equal(got, np.stack([_theirs_row(theirs, i) for i in picks]))


def test_pipeline_reads_megatron_order(tmp_path: Path) -> None:
    """One lane, no shuffle: the pipeline's records are megatron-core's samples in order."""
    prefix = _corpus(tmp_path, "web", 300, seed=5)
    ours = token_chunks(
        Dataset.from_path(f"{prefix}.idx"), 128, order="megatron", seed=7, samples=300
    )
    source = StaticMixtureWorkSource([ours], chunk_size=64, seed=1)
    got = []
    for batch in Pipeline(source).batch(8):
        got.extend(r.payload["input_ids"].astype(np.int64) for r in batch.records)
        if len(got) >= 300:
            break
    theirs = _megatron(tmp_path, [prefix], None, seed=7, seq_length=128, samples=300)
    assert np.array_equal(np.stack(got[:300]), _theirs(theirs, 300))


def test_remote_file_reads_the_same_samples(s3: S3, tmp_path: Path) -> None:
    """Over S3 the windows come from ranged reads instead of the memory map."""
    prefix = _corpus(tmp_path, "web", 300, seed=5)
    url = s3.upload(tmp_path / "data", "megatron-order")
    local, remote = (
        token_chunks(Dataset.from_path(p), 64, order="megatron", seed=2, samples=300)
        for p in (f"{prefix}.idx", url)
    )
    assert remote.shards[0].file.tokens() is None  # type: ignore[attr-defined]
    assert np.array_equal(_ours(remote, 300), _ours(local, 300))


def test_pickled_shard_reads_the_same(tmp_path: Path) -> None:
    prefix = _corpus(tmp_path, "web", 300, seed=5)
    ours = token_chunks(
        Dataset.from_path(f"{prefix}.idx"), 64, order="megatron", seed=1, samples=50
    )
    first = _ours(ours, 50)
    assert np.array_equal(_ours(pickle.loads(pickle.dumps(ours)), 50), first)


def test_refusals(tmp_path: Path) -> None:
    a, b = _corpus(tmp_path, "a", 20, seed=1), _corpus(tmp_path, "b", 20, seed=2)
    both = Dataset.from_path(tmp_path / "data")
    with pytest.raises(ConfigError, match=r"has 2 shards.*megatron_blend"):
        token_chunks(both, 16, order="megatron", seed=1)
    one = Dataset.from_path(f"{a}.idx")
    with pytest.raises(ConfigError, match="give seed="):
        token_chunks(one, 16, order="megatron")
    with pytest.raises(ConfigError, match="order must be 'file' or 'megatron'"):
        token_chunks(one, 16, order="random")
    with pytest.raises(ConfigError, match="fewer than one window"):
        token_chunks(one, 10_000, order="megatron", seed=1)
    with pytest.raises(ConfigError, match="gives the test part no documents"):
        token_chunks(one, 16, order="megatron", seed=1, part="test")
    with pytest.raises(ConfigError, match="one positive weight per dataset"):
        megatron_blend([one, Dataset.from_path(f"{b}.idx")], [1.0], 16, seed=1, samples=10)


def test_yaml_megatron_order(tmp_path: Path) -> None:
    from zephon.config import parse_config

    prefix = _corpus(tmp_path, "web", 300, seed=5)
    samples = {"view": "chunks", "order": "megatron", "seq_length": 128, "seed": 7, "samples": 40}
    config = {
        "datasets": [{"name": "web", "path": "data/web.idx", "samples": samples}],
        "source": {"chunk_size": 16, "seed": 1},
        "operators": [{"op": "batch", "microbatch_size": 4}],
    }
    pipe = parse_config(config, base_dir=tmp_path).build()
    got = []
    for batch in pipe:
        got.extend(r.payload["input_ids"].astype(np.int64) for r in batch.records)
        if len(got) >= 40:
            break
    theirs = _megatron(tmp_path, [prefix], None, seed=7, seq_length=128, samples=40)
    assert np.array_equal(np.stack(got[:40]), _theirs(theirs, 40))
