"""CaptureSource: rows, determinism, checkpoint/restore and retirement after the checkpoint."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import numpy as np
import pytest

from tests.capture._pg import drained, pg_dsn, pg_url, tagged  # noqa: F401
from zephon import Pipeline
from zephon.capture.dataset import CaptureSource
from zephon.capture.protocols import RolloutRetiredError
from zephon.capture.records import ParentResolutionStatus, TokenEntry, compute_digest
from zephon.capture.stores import open_store
from zephon.errors import CheckpointError


def _entry(rid: str, cid: str, prompt: list[int], gen: list[int], parent: str | None) -> TokenEntry:
    full = prompt + gen
    return TokenEntry(
        rollout_id=rid,
        model_call_id=cid,
        prompt_token_ids=prompt,
        generation_token_ids=gen,
        generation_log_probs=[-0.25 - 0.01 * t for t in gen],
        parent_call_id=parent,
        parent_resolution=ParentResolutionStatus.RESOLVED
        if parent
        else ParentResolutionStatus.ROOT,
        cum_len=len(full),
        digest=compute_digest(full),
        created_at=1.0,
    )


def fill(url: str, n: int, *, masked: tuple[int, ...] = ()) -> tuple[list[str], dict[str, Any]]:
    """n two-call rollouts (rollout i uses tokens offset by 100*i); ``masked`` get marked."""
    store = open_store(url)
    ids, expect = [], {}

    async def go() -> None:
        for i in range(n):
            rid = f"r{i:03d}"
            base = 100 * i
            p1, g1, tool, g2 = (
                [base + 1, base + 2],
                [base + 3],
                [base + 4, base + 5],
                [base + 6, base + 7],
            )
            await store.put(_entry(rid, "a", p1, g1, None))
            await store.put(_entry(rid, "b", p1 + g1 + tool, g2, "a"))
            if i in masked:
                await store.mark_incomplete(rid, "lost")
            ids.append(rid)
            expect[rid] = (p1 + g1 + tool + g2, [0, 0, 1, 0, 0, 1, 1])
        await store.close()

    asyncio.run(go())
    return ids, expect


@pytest.fixture
def url() -> str:
    return f"memory://dataset-{uuid.uuid4().hex}"


def rows_of(pipe: Pipeline) -> list[tuple[str, list[int], list[int]]]:
    out = []
    for batch in pipe:
        for rec in batch.records:
            p = rec.payload
            out.append((p["rollout_id"], p["input_ids"].tolist(), p["loss_mask"].tolist()))
    return out


def test_rows_are_the_built_trajectories(url: str) -> None:
    ids, expect = fill(url, 5, masked=(2,))
    source = CaptureSource(url, ids, chunk_size=2)
    assert source.masked == ["r002"] and "capture_incomplete" in source.builds["r002"].mask_reasons
    assert source.rollout_ids == ["r000", "r001", "r003", "r004"]
    got = rows_of(Pipeline(source).batch(2, drop_last=False).options(runner="inline"))
    assert [g[0] for g in got] == source.rollout_ids
    for rid, tokens, mask in got:
        assert (tokens, mask) == expect[rid]


@pytest.mark.parametrize("runner", ["inline", "threads"])
def test_deterministic_across_runners_and_lanes(url: str, runner: str) -> None:
    ids, _ = fill(url, 12)
    source = CaptureSource(url, ids, chunk_size=2, shuffle_seed=7)
    ref = rows_of(Pipeline(source).batch(2).options(runner="inline", canonical_replicas=3))
    again = rows_of(Pipeline(source).batch(2).options(runner=runner, canonical_replicas=3))
    assert again == ref and sorted(r[0] for r in ref) == ids
    other = CaptureSource(url, ids, chunk_size=2, shuffle_seed=8)
    assert rows_of(Pipeline(other).batch(2).options(runner="inline", canonical_replicas=3)) != ref


def test_checkpoint_retire_and_restore(url: str) -> None:
    ids, _ = fill(url, 12)
    source = CaptureSource(url, ids, chunk_size=2)
    opts = {"runner": "inline", "canonical_replicas": 2}
    full = rows_of(Pipeline(source).batch(2).options(**opts))

    pipe = Pipeline(source).batch(2).options(**opts)
    it = iter(pipe)
    head = []
    for _ in range(3):
        head += [r.payload["rollout_id"] for r in next(it).records]
    ckpt = pipe.checkpoint()
    it.close()
    covered = source.covered(ckpt)
    assert covered and set(covered) <= set(head)  # only what was delivered, never more
    manifest = source.manifest()
    report = source.retire_consumed(ckpt)
    assert report.dropped == covered and report.stale == []
    assert source.retire_consumed(ckpt).dropped == []  # idempotent

    store = open_store(url)
    with pytest.raises(RolloutRetiredError):
        asyncio.run(store.freeze(covered[0]))
    untouched = [r for r in ids if r not in covered]
    assert not asyncio.run(store.freeze(untouched[0])).incomplete

    resumed = CaptureSource.from_manifest(url, manifest)
    assert resumed.fingerprint == source.fingerprint
    rest = rows_of(Pipeline(resumed).batch(2).options(**opts).restore(ckpt))
    assert [r[0] for r in full[len(head) :]] == [r[0] for r in rest]
    assert full[len(head) :] == rest


def test_stale_rollout_is_not_dropped(url: str) -> None:
    ids, _ = fill(url, 2)
    source = CaptureSource(url, ids, chunk_size=1)
    pipe = Pipeline(source).batch(1).options(runner="inline")
    list(pipe)
    ckpt = pipe.checkpoint()
    asyncio.run(open_store(url).mark_incomplete("r001", "late"))
    report = source.retire_consumed(ckpt)
    assert report.dropped == ["r000"] and report.stale == ["r001"]
    with pytest.raises(CheckpointError, match="changed since the manifest"):
        CaptureSource.from_manifest(url, {**source.manifest()})


def test_foreign_checkpoint_is_refused(url: str) -> None:
    ids, _ = fill(url, 4)
    a = CaptureSource(url, ids[:2])
    b = CaptureSource(url, ids[2:])
    with pytest.raises(CheckpointError, match="another source"):
        a.covered(Pipeline(b).batch(1).checkpoint())


def test_packed_batches_carry_mask_and_logprobs(url: str) -> None:
    ids, expect = fill(url, 9)
    source = CaptureSource(url, ids, chunk_size=3)
    pipe = Pipeline(source).pack_flat(16, pad_token_id=0).batch(2, drop_last=False)
    seen = []
    for batch in pipe.options(runner="inline"):
        for rec in batch.records:
            p = rec.payload
            for d in np.unique(p["document_ids"][p["document_ids"] >= 0]):
                sel = p["document_ids"] == d
                seen.append((p["input_ids"][sel].tolist(), p["loss_mask"][sel].tolist()))
                lp = p["logprobs"][sel]
                assert np.all(lp[p["loss_mask"][sel] == 0] == 0.0)
                assert np.all(lp[p["loss_mask"][sel] == 1] < 0.0)
        train = batch.to_training()
        assert train["input_ids"].shape[1] == 16
    assert sorted(seen) == sorted(expect.values())


def test_a_group_is_a_row_per_sample_and_retires_once_all_are_delivered(url: str) -> None:
    ids, _ = fill(url, 1)
    store = open_store(url)

    async def go() -> None:
        for k in range(3):
            entry = _entry("grp", f"g-{k}", [7, 8], [20 + k], None)
            await store.put(
                entry.with_extra_fields(zephon_group={"id": "g", "index": k, "size": 3})
            )

    asyncio.run(go())
    source = CaptureSource(url, ["grp", *ids], chunk_size=1)
    assert source.rollout_ids == ["grp", "r000"]
    pipe = Pipeline(source).batch(1).options(runner="inline")
    it = iter(pipe)
    first = [next(it).records[0].payload for _ in range(2)]
    assert [p["group_id"] for p in first] == ["grp/g", "grp/g"]
    assert [p["input_ids"].tolist() for p in first] == [[7, 8, 20], [7, 8, 21]]
    assert source.covered(pipe.checkpoint()) == []  # a sample of the group is still pending
    rest = [b.records[0].payload for b in it]
    assert [p["rollout_id"] for p in rest] == ["grp", "r000"]
    assert source.covered(pipe.checkpoint()) == ["grp", "r000"]


@pytest.mark.filterwarnings("error::ResourceWarning")
@pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning")
def test_a_source_given_a_url_closes_its_clients_and_one_given_a_store_leaves_it_open(
    pg_dsn: str,  # noqa: F811
    pg_url: str,  # noqa: F811
) -> None:
    url, name = tagged(pg_url)
    ids, _ = fill(url, 8)
    assert drained(pg_dsn, name) == 0
    source = CaptureSource(url, ids, chunk_size=2)
    assert drained(pg_dsn, name) == 0  # built: the rows are held, the client closed
    pipe = Pipeline(source).batch(2)
    it = iter(pipe)
    for _ in range(3):
        next(it)
    report = source.retire_consumed(pipe.checkpoint())
    it.close()  # type: ignore[attr-defined]
    assert report.dropped and drained(pg_dsn, name) == 0
    store = open_store(url)
    given = CaptureSource(store, ids[6:], chunk_size=2)
    assert len(rows_of(Pipeline(given).batch(2))) == 2
    assert asyncio.run(store.freeze(ids[7])).entries  # still open: the caller closes it
    asyncio.run(store.close())
