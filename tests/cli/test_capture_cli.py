"""`zephon capture inspect` and `zephon capture export` over a real file store."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from zephon.capture import ParentResolutionStatus, TokenEntry, compute_digest
from zephon.capture.stores import open_store
from zephon.capture.testing import STORE_KINDS
from zephon.cli import main


def _entry(rid: str, cid: str, prompt: list[int], gen: list[int], parent: str | None):
    full = prompt + gen
    status = ParentResolutionStatus.RESOLVED if parent else ParentResolutionStatus.ROOT
    return TokenEntry(
        rollout_id=rid, model_call_id=cid, prompt_token_ids=prompt,
        generation_token_ids=gen, generation_log_probs=[-0.5] * len(gen),
        parent_call_id=parent, parent_resolution=status,
        cum_len=len(full), digest=compute_digest(full),
    )  # fmt: skip


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    url = (tmp_path / "store").as_uri()
    store = open_store(url)

    async def fill() -> None:
        q, a1, tool, a2 = list(b"2+2?"), list(b"hmm"), list(b"[4]"), list(b"4")
        await store.put(_entry("good", "c1", q, a1, None))
        await store.put(_entry("good", "c2", q + a1 + tool, a2, "c1"))
        await store.put(_entry("lost", "c1", q, a1, None))
        await store.mark_incomplete("lost", "c2")
        await store.close()

    asyncio.run(fill())
    return url


def test_inspect_shows_the_trajectory_and_mask(store_url: str, capsys) -> None:
    assert main(["capture", "inspect", "good", "--store", store_url, "--json"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert row["input_ids"] == list(b"2+2?hmm[4]4")
    assert row["loss_mask"] == [0] * 4 + [1] * 3 + [0] * 3 + [1]
    assert row["logprobs"][4:7] == [-0.5] * 3 and row["logprobs"][0] == 0.0
    assert row["masked"] is False and row["call_ids"] == ["c1", "c2"]
    assert main(["capture", "inspect", "good", "--store", store_url, "--tokenizer", "bytes"]) == 0
    out = capsys.readouterr().out
    assert "trainable" in out and "2+2?hmm[4]4" in out and "verdict: trainable" in out
    assert main(["capture", "inspect", "lost", "--store", store_url]) == 0
    assert "MASKED: capture_incomplete" in capsys.readouterr().out


def test_inspect_never_fences_an_unknown_rollout(store_url: str, tmp_path: Path, capsys) -> None:
    assert main(["capture", "inspect", "typo", "--store", store_url]) == 1
    assert "no rollout 'typo'" in capsys.readouterr().err
    assert not (tmp_path / "store" / "typo.log").exists()


def test_export_jsonl_and_parquet(store_url: str, tmp_path: Path, capsys) -> None:
    out = tmp_path / "rl.jsonl"
    assert main(["capture", "export", str(out), "--store", store_url, "--all", "--quiet"]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["rollout_id"] for r in rows] == ["good"]
    assert "1 masked left out" in capsys.readouterr().out
    pq_out = tmp_path / "rl.parquet"
    args = ["capture", "export", str(pq_out), "--store", store_url, "--rollout", "good",
            "--rollout", "lost", "--include-masked", "--json", "--quiet"]  # fmt: skip
    assert main(args) == 0
    assert json.loads(capsys.readouterr().out)["masked"] == ["lost"]
    table = pq.read_table(pq_out).to_pylist()
    assert [(r["rollout_id"], r["masked"]) for r in table] == [("good", False), ("lost", True)]
    assert table[0]["input_ids"] == rows[0]["input_ids"]
    assert table[0]["loss_mask"] == rows[0]["loss_mask"]
    assert main(["capture", "export", str(out), "--store", "memory://x"]) == 2
    assert main(["capture", "export", str(out), "--store", "memory://x", "--all"]) == 2


def _live_rollout(url: str) -> None:
    """A rollout whose agent is still running: one committed call, one admitted."""

    async def go() -> None:
        store = open_store(url)
        await store.put(_entry("live", "c1", list(b"q"), list(b"a"), None))
        await store.begin_call("live", "c2")
        await store.close()

    asyncio.run(go())


@pytest.mark.parametrize("kind", ["file", "sqlite"])
def test_inspect_and_export_read_without_freezing(kind: str, tmp_path: Path, capsys) -> None:
    url = STORE_KINDS[kind].url(str(tmp_path))
    _live_rollout(url)
    files = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    assert main(["capture", "inspect", "live", "--store", url, "--json"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert row["snapshot_id"] == "" and row["mask_reasons"] == ["capture_incomplete"]
    out = tmp_path / "out.jsonl"
    args = ["capture", "export", str(out), "--store", url, "--rollout", "live", "--quiet"]
    assert main([*args, "--include-masked"]) == 0
    assert "exported 1 rollout(s)" in capsys.readouterr().out
    if kind == "file":  # the log is not touched at all
        assert {p: p.read_bytes() for p in files} == files

    async def agent_continues() -> None:
        store = open_store(url)
        await store.put(_entry("live", "c2", list(b"qa?"), list(b"b"), "c1"))  # no 409
        snap = await store.freeze("live")
        assert {e.model_call_id for e in snap.entries} == {"c1", "c2"} and not snap.incomplete
        await store.close()

    asyncio.run(agent_continues())
    assert main(["capture", "inspect", "live", "--store", url, "--json", "--freeze"]) == 0
    assert json.loads(capsys.readouterr().out)["snapshot_id"] != ""


@pytest.mark.parametrize("kind", ["file", "sqlite"])
def test_a_missing_store_is_an_error_and_is_not_created(kind: str, tmp_path: Path, capsys) -> None:
    url = STORE_KINDS[kind].url(str(tmp_path / "typo"))
    assert main(["capture", "inspect", "r1", "--store", url]) == 2
    err = capsys.readouterr().err
    assert "does not exist" in err and str(tmp_path / "typo") in err
    assert main(["capture", "export", str(tmp_path / "o.jsonl"), "--store", url, "--all"]) == 2
    assert not (tmp_path / "typo").exists()


def test_inspect_decodes_byte_level_tokens_to_text(tmp_path: Path, hf_tokenizer_dir: Path, capsys):
    from tokenizers import Tokenizer

    tok_path = hf_tokenizer_dir / "tokenizer.json"
    tok = Tokenizer.from_file(str(tok_path))
    prompt = tok.encode("data token lane").ids
    answer = tok.encode(" chunk batch shard").ids
    url = (tmp_path / "s").as_uri()
    store = open_store(url)

    async def fill() -> None:
        await store.put(_entry("r", "c1", prompt, answer, None))
        await store.close()

    asyncio.run(fill())
    args = ["capture", "inspect", "r", "--store", url, "--tokenizer", str(tok_path)]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "data token lane chunk batch shard" in out and "Ġ" not in out
    assert main([*args, "--ids"]) == 0
    assert " ".join(map(str, answer)) in capsys.readouterr().out


def test_export_all_after_every_rollout_was_retired(store_url: str, tmp_path: Path, capsys):
    async def retire(*ids: str) -> None:
        store = open_store(store_url)
        for rid in ids:
            await store.freeze(rid)
            await store.retire(rid)
        await store.close()

    asyncio.run(retire("good"))
    out = tmp_path / "one.jsonl"
    assert main(["capture", "export", str(out), "--store", store_url, "--all", "--quiet"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nothing to export of 2 rollout(s): 1 retired, 1 masked" in err[0]
    assert not out.exists()
    both = tmp_path / "both.jsonl"
    args = ["capture", "export", str(both), "--store", store_url, "--all", "--quiet"]
    assert main([*args, "--include-masked", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["retired"] == ["good"] and summary["rows"] == 1 and summary["failed"] == []
