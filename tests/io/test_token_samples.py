"""token_chunks and token_packs: windows and packed rows read from token files, checked against
numpy references, and run through pipelines that stop, restore and change rank counts."""

from __future__ import annotations

import itertools
import json
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.io._token_writers import (
    documents,
    with_eos,
    write_datatrove,
    write_megatron,
    write_npy_raw,
)
from zephon import Pipeline, StaticMixtureWorkSource, merge_checkpoints
from zephon.errors import ConfigError
from zephon.io import Dataset, token_chunks, token_packs
from zephon.testing import run_with_stops
from zephon.types import SampleBatch

L = 16


@pytest.fixture
def corpus(tmp_path: Path) -> tuple[Dataset, list[list[np.ndarray]]]:
    files = [documents(40 + 7 * i, seed=i, lo=1, hi=3 * L) for i in range(3)]
    for i, docs in enumerate(files):
        write_megatron(tmp_path / "mega" / f"part-{i}", docs)
    return Dataset.from_path("web", tmp_path / "mega"), files


def _windows(docs: list[np.ndarray], width: int) -> list[list[int]]:
    """The GPTDataset layout: the file's tokens concatenated, window i at i * L."""
    flat = np.concatenate(docs)
    count = (len(flat) - (width - L)) // L
    return [flat[i * L : i * L + width].tolist() for i in range(count)]


@pytest.mark.parametrize("plus_one", [True, False])
def test_chunks_are_the_gpt_windows_of_each_file(corpus: Any, plus_one: bool) -> None:
    ds, files = corpus
    chunks = token_chunks(ds, L, plus_one=plus_one)
    width = L + 1 if plus_one else L
    for shard, docs in enumerate(files):
        expected = _windows(docs, width)
        assert chunks.counts()[shard] == len(expected)
        rows = chunks.read(shard, list(range(len(expected))))
        assert [r["input_ids"].tolist() for r in rows] == expected


def test_items_of_many_windows_cover_every_window_once(corpus: Any) -> None:
    ds, files = corpus
    plain = token_chunks(ds, L)
    items = token_chunks(ds, L, rows_per_item=4, seed=11)
    for shard, docs in enumerate(files):
        expected = _windows(docs, L + 1)
        assert items.counts()[shard] == -(-len(expected) // 4)
        got = [
            row.tolist()
            for item in items.read(shard, list(range(items.counts()[shard])))
            for row in item["input_ids"]
        ]
        assert sorted(got) == sorted(expected) and got != expected  # permuted, all there
    assert plain.read(0, [0])[0]["input_ids"].flags.writeable  # a copy, not the memmap


def test_chunk_positions_restart_at_document_starts(corpus: Any) -> None:
    ds, files = corpus
    chunks = token_chunks(ds, L, positions=True, rows_per_item=3)
    docs = files[1]
    doc_of = np.repeat(np.arange(len(docs)), [len(d) for d in docs])
    item = chunks.read(1, [2])[0]
    for row in range(3):
        start = (6 + row) * L
        ids = doc_of[start : start + L + 1]
        first = np.r_[True, ids[1:] != ids[:-1]]
        expected = np.arange(L + 1) - np.maximum.accumulate(np.where(first, np.arange(L + 1), 0))
        assert item["position_ids"][row].tolist() == expected.tolist()
    bounds = [
        b
        for row in range(3)
        for b in np.flatnonzero(item["position_ids"][row] == 0) + row * (L + 1)
    ]
    assert item["cu_seqlens"].tolist() == [*bounds, 3 * (L + 1)]


def test_packs_hold_every_document_once_within_the_length(tmp_path: Path) -> None:
    docs = documents(300, seed=5, lo=1, hi=2 * L + 5)  # some longer than a row: cut in pieces
    write_datatrove(tmp_path / "a.ds", docs)
    packs = token_packs(Dataset.from_path(tmp_path), L, rows_per_item=2, pad_id=7)
    pieces: list[list[int]] = []
    used = 0
    padded = Counter[bool]()
    for item in packs.read(0, list(range(packs.counts()[0]))):
        flat_ids = item["input_ids"].reshape(-1)
        cu = item["cu_seqlens"].tolist()
        padded[bool((item["num_tokens"] < L).any())] += 1
        for row, n in enumerate(item["num_tokens"].tolist()):
            assert (item["input_ids"][row, n:] == 7).all()
            used += n
        for a, b in itertools.pairwise(cu):
            if (a % L) < item["num_tokens"][a // L]:  # not the padding segment
                pieces.append(flat_ids[a:b].tolist())
                assert item["position_ids"].reshape(-1)[a:b].tolist() == list(range(b - a))
    expected = [d[i : i + L].tolist() for d in docs for i in range(0, len(d), L)]
    assert sorted(pieces) == sorted(expected)
    total = sum(len(d) for d in docs)
    assert used == total and packs.total() * 2 * L < total * 1.2  # best fit wastes little
    assert padded[True] and padded[False]  # items with padding and items without
    rows = token_packs(Dataset.from_path(tmp_path), L, pad_id=7)
    for row in rows.read(0, list(range(rows.counts()[0]))):
        assert (row["input_ids"][row["num_tokens"] :] == 7).all()


@pytest.mark.parametrize("seed", [None, 5])
def test_packed_items_are_the_rows_of_the_same_order_stacked(tmp_path: Path, seed: Any) -> None:
    docs = documents(201, seed=9, lo=1, hi=2 * L + 3)
    write_megatron(tmp_path / "p", docs)
    ds = Dataset.from_path(tmp_path)
    rows = token_packs(ds, L, seed=seed, pad_id=3)
    items = token_packs(ds, L, rows_per_item=3, seed=seed, pad_id=3)
    one = rows.read(0, list(range(rows.counts()[0])))
    assert rows.counts()[0] % 3 and items.counts()[0] == -(-len(one) // 3)
    for i, item in enumerate(items.read(0, list(range(items.counts()[0])))):
        mine = one[3 * i : 3 * i + 3]
        for key in ("input_ids", "position_ids", "num_tokens"):
            assert item[key].tolist() == [r[key].tolist() for r in mine], key
        cu = [int(c) + k * L for k, r in enumerate(mine) for c in r["cu_seqlens"][:-1]]
        assert item["cu_seqlens"].tolist() == [*cu, len(mine) * L]


def test_big_endian_tokens_give_the_samples_little_endian_ones_give(tmp_path: Path) -> None:
    docs = documents(80, seed=3, lo=1, hi=2 * L)
    views = []
    for order in "<>":
        folder = tmp_path / ("le" if order == "<" else "be")
        write_npy_raw(folder / "part-0.npy", docs, f"{order}u2", metadata=True)
        ds = Dataset.from_path(folder, format_options={"token_dtype": f"{order}u2"})
        views.append((token_chunks(ds, L, rows_per_item=2), token_packs(ds, L, rows_per_item=2)))
    assert views[1][0].shards[0].file.dtype.byteorder == ">"
    for little, big in zip(*views, strict=True):
        items = list(range(little.counts()[0]))
        assert [x["input_ids"].tolist() for x in big.read(0, items)] == [
            x["input_ids"].tolist() for x in little.read(0, items)
        ]
    assert (
        views[0][0].read(0, [0])[0]["input_ids"][0].tolist()
        == np.concatenate(docs)[: L + 1].tolist()
    )


def test_views_refuse_other_datasets_and_bad_lengths(corpus: Any) -> None:
    ds, _ = corpus
    with pytest.raises(ConfigError, match="not a pre-tokenized file"):
        token_chunks(Dataset.from_records("t", [{"text": "x"}]), L)
    with pytest.raises(ConfigError, match="seq_length must be >= 1"):
        token_packs(ds, 0)


def _build(ds: Dataset, **options: Any) -> Pipeline:
    source = StaticMixtureWorkSource([ds], chunk_size=8, seed=3, shuffle_within_shard=True)
    return (
        Pipeline(source)
        .batch(2, drop_last=False)
        .options(canonical_replicas=4, runner="inline", **options)
    )


def _key(batch: SampleBatch) -> Any:
    return (batch.lane_id, tuple(r.payload["input_ids"].tobytes() for r in batch.records))


def test_pipeline_resumes_exactly_and_delivers_every_window_once(corpus: Any) -> None:
    ds, files = corpus
    chunks = token_chunks(ds, L)
    full = [_key(b) for b in _build(chunks)]
    delivered = Counter(w for _, ws in full for w in ws)
    expected = Counter(
        np.array(w, dtype=np.uint16).tobytes() for docs in files for w in _windows(docs, L + 1)
    )
    assert delivered == expected
    stopped = run_with_stops(lambda: _build(chunks), _key, [1, 2, 5, 9, 17, 30])
    assert stopped == full


def _views(ds: Dataset) -> dict[str, Dataset]:
    """The views as training reads them: items of several rows, seeded, positions on."""
    return {
        "packs": token_packs(ds, L, rows_per_item=2, seed=7),
        "chunks": token_chunks(ds, L, rows_per_item=3, seed=7, positions=True),
    }


@pytest.mark.parametrize("view", ["packs", "chunks"])
def test_twenty_stops_and_restores_deliver_the_uninterrupted_run(corpus: Any, view: str) -> None:
    ds, _ = corpus
    items = _views(ds)[view]
    full = [_key(b) for b in _build(items)]
    direct = [
        x["input_ids"].tobytes()
        for shard, n in enumerate(items.counts())
        for x in items.read(shard, list(range(n)))
    ]
    assert Counter(x for _, b in full for x in b) == Counter(direct)  # every item once
    stops = np.linspace(1, len(full) - 1, 20).astype(int).tolist()
    assert len(set(stops)) == 20
    assert run_with_stops(lambda: _build(items), _key, stops) == full


def _rank_batches(
    view: Dataset, world: int, take: int | None, state: dict[str, Any] | None = None
) -> tuple[list[list[Any]], list[dict[str, Any]]]:
    """Each rank's batches (the first ``take``, or all), restored from ``state`` when given,
    and each rank's checkpoint through JSON."""
    streams, states = [], []
    for rank in range(world):
        pipe = _build(view, dp_rank=rank, dp_world_size=world)
        if state is not None:
            pipe.restore(state)
        it = iter(pipe)
        streams.append([_key(b) for b in itertools.islice(it, take)])
        states.append(json.loads(json.dumps(pipe.checkpoint())))
        it.close()  # type: ignore[attr-defined]
    return streams, states


def _steps(streams: list[list[Any]], accum: int, count: int) -> list[frozenset[Any]]:
    """The batches of each optimizer step: ``accum`` from every rank."""
    return [
        frozenset(b for s in streams for b in s[i * accum : (i + 1) * accum]) for i in range(count)
    ]


@pytest.mark.parametrize("view", ["packs", "chunks"])
def test_elastic_resume_and_another_global_batch_deliver_every_sample_once(
    corpus: Any, view: str
) -> None:
    ds, _ = corpus
    items = _views(ds)[view]
    reference, _ = _rank_batches(items, 2, None)  # 2 ranks, a global batch of 2
    assert min(len(s) for s in reference) >= 9
    steps = _steps(reference, 1, 9)
    before, states = _rank_batches(items, 2, 5)
    merged = merge_checkpoints(states)
    everything = sorted(b for s in reference for b in s)
    # 1 rank x grad-accum 2: the same global batch, the same steps
    one, _ = _rank_batches(items, 1, None, merged)
    assert _steps(one, 2, 4) == steps[5:9]
    # 4 ranks: a global batch of 4, each step the batches of two steps of the 2-rank run
    four, _ = _rank_batches(items, 4, None, merged)
    assert _steps(four, 1, 2) == [steps[5] | steps[6], steps[7] | steps[8]]
    for after in (one, four):
        assert sorted(b for s in before + after for b in s) == everything


def test_yaml_reads_token_files_as_samples(tmp_path: Path) -> None:
    from zephon.config import ConfigFileError, parse_config

    docs = documents(60, seed=2, lo=5, hi=40)
    write_npy_raw(tmp_path / "olmo" / "part-0.npy", with_eos(docs, 0), "uint16", metadata=False)
    config = {
        "datasets": [
            {
                "name": "olmo",
                "path": "olmo",
                "format_options": {"token_dtype": "uint16", "eos_id": 0},
                "samples": {"view": "packs", "seq_length": L, "rows_per_item": 2},
            }
        ],
        "source": {"chunk_size": 4, "seed": 1},
        "operators": [{"op": "batch", "microbatch_size": 1}],
    }
    items = [b.records[0].payload for b in parse_config(config, base_dir=tmp_path).build()]
    assert sum(int(i["num_tokens"].sum()) for i in items) == sum(len(d) + 1 for d in docs)
    assert {i["input_ids"].shape[1] for i in items} == {L}
    assert sum(i["input_ids"].shape[0] != 2 for i in items) <= 1  # the file's last item
    config["datasets"][0]["samples"] = {"view": "packs", "seq_length": L, "plus_one": True}
    with pytest.raises(ConfigFileError, match=r"datasets\[0\]\.samples\.plus_one"):
        parse_config(config, base_dir=tmp_path)
    config["datasets"][0]["samples"] = {"view": "chunks"}
    with pytest.raises(ConfigFileError, match=r"samples\.seq_length.*required"):
        parse_config(config, base_dir=tmp_path)


def test_a_copied_corpus_keeps_its_seeded_order(corpus: Any, tmp_path: Path) -> None:
    ds, _ = corpus
    copy = tmp_path / "elsewhere"
    shutil.copytree(Path(ds.shards[0].location).parent, copy)
    for view in (token_chunks, token_packs):
        here, there = (view(d, L, rows_per_item=3, seed=4) for d in (ds, Dataset.from_path(copy)))
        assert [x["input_ids"].tolist() for x in here.read(2, [0, 1])] == [
            x["input_ids"].tolist() for x in there.read(2, [0, 1])
        ]
