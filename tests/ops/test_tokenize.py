"""tokenize resolves BOS/EOS when the pipeline is built; a missing one names the key to set."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from tests.cli.conftest import ZEPHON
from zephon import Dataset
from zephon.errors import ConfigError
from zephon.pipeline import Pipeline
from zephon.work import StaticMixtureWorkSource


def _train(folder: Path, specials: list[str]) -> Path:
    """A small real BPE tokenizer.json with exactly ``specials`` as added special tokens."""
    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.BpeTrainer(vocab_size=120, special_tokens=["[UNK]", *specials])
    tok.train_from_iterator(["the data loader reads shards of text"] * 20, trainer)
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    return folder / "tokenizer.json"


def _pipe() -> Pipeline:
    data = Dataset.from_records("d", [{"text": "the data loader"}] * 4)
    return Pipeline(StaticMixtureWorkSource([data], None, chunk_size=4, seed=0)).decode_text()


def test_missing_bos_fails_at_build_time_naming_the_parameter(tmp_path: Path) -> None:
    path = _train(tmp_path / "tok", ["<pad>"])
    with pytest.raises(ConfigError) as info:
        _pipe().tokenize(str(path))
    assert info.value.param == "special_tokens"
    assert "defines no BOS token" in str(info.value)
    assert "special_tokens: none | eos | bos_eos" in str(info.value)
    items = list(_pipe().tokenize(str(path), special_tokens="none").batch(2))
    assert all(len(r.payload["input_ids"]) > 0 for b in items for r in b)


def test_specials_from_config_then_added_tokens(tmp_path: Path) -> None:
    added = _train(tmp_path / "added", ["[BOS]", "[EOS]"])
    op = _pipe().tokenize(str(added)).batch(1)
    (first,) = next(iter(op)).records
    ids = first.payload["input_ids"].tolist()
    vocab = Tokenizer.from_file(str(added)).get_vocab()
    assert (ids[0], ids[-1]) == (vocab["[BOS]"], vocab["[EOS]"])

    cfg = _train(tmp_path / "cfg", ["<pad>", "<go>", "<stop>"])
    (tmp_path / "cfg" / "tokenizer_config.json").write_text(
        json.dumps({"bos_token": "<go>", "eos_token": {"content": "<stop>"}})
    )
    (first,) = next(iter(_pipe().tokenize(str(cfg)).batch(1))).records
    vocab = Tokenizer.from_file(str(cfg)).get_vocab()
    ids = first.payload["input_ids"].tolist()
    assert (ids[0], ids[-1]) == (vocab["<go>"], vocab["<stop>"])


def test_yaml_tokenizer_path_is_relative_to_the_yaml_and_errors_exit_2(
    tmp_path: Path,
) -> None:
    project = tmp_path / "project"
    _train(project / "tok", ["<pad>"])
    (project / "data").mkdir()
    (project / "data" / "a.jsonl").write_text('{"text": "the data"}\n' * 8)
    yaml_text = (
        "datasets: [{name: d, path: data}]\n"
        "operators:\n  - decode_text\n  - {op: tokenize, tokenizer: tok/tokenizer.json}\n"
    )
    (project / "p.yaml").write_text(yaml_text)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    proc = subprocess.run(
        [ZEPHON, "run", str(project / "p.yaml"), "--quiet"],
        cwd=elsewhere, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert "p.yaml: operators[1].special_tokens: tokenize: the tokenizer" in line
    assert "special_tokens: none | eos | bos_eos" in line and "bos_token_id: ID" in line
    (project / "p.yaml").write_text(yaml_text.replace("json}", "json, special_tokens: none}"))
    proc = subprocess.run(
        [ZEPHON, "run", str(project / "p.yaml"), "--quiet", "--json"],
        cwd=elsewhere, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["items"] == 8


class _ListEncoder:
    """A tokenizer that returns Python lists (as HF tokenizers do): one id per character."""

    bos_token_id, eos_token_id = 1, 2

    def encode_many(self, texts: list[str]) -> list[list[int]]:
        return [[10 + ord(c) % 50 for c in text] for text in texts]


@pytest.mark.parametrize("special_tokens", ["bos_eos", "bos", "eos", "none"])
@pytest.mark.parametrize("max_length", [None, 3, 6])
@pytest.mark.parametrize("lists", [True, False])
def test_token_arrays_equal_per_document_encoding(special_tokens, max_length, lists) -> None:
    """The micro-batch is converted in one pass; each record must still hold exactly its own
    ids, truncated and bracketed, as a separate encoding of its text would give."""
    from zephon._ops.tokenize import TokenizeOp
    from zephon.types import SampleMeta, SampleRecord, is_control

    op = TokenizeOp(_ListEncoder() if lists else "bytes", special_tokens=special_tokens,
                    max_length=max_length)  # fmt: skip
    texts = ["", "a", "hello", "tokens!", "xy"]
    elems = [SampleRecord(SampleMeta((0, 0, i), 0, 0, i), {"text": t}) for i, t in enumerate(texts)]
    got = [r.payload["input_ids"] for r in op.process_many(elems) if not is_control(r)]
    for text, ids in zip(texts, got, strict=True):
        alone = op.process_many([SampleRecord(SampleMeta((0, 0, 0), 0, 0, 0), {"text": text})])
        want = alone[0].payload["input_ids"]
        assert ids.dtype == want.dtype and ids.tolist() == want.tolist()
        head = [op._bos] if special_tokens in ("bos_eos", "bos") else []
        tail = [op._eos] if special_tokens in ("bos_eos", "eos") else []
        body = _ListEncoder().encode_many([text])[0] if lists else list(text.encode())
        if max_length is not None:
            body = body[: max_length - len(head) - len(tail)]
        assert ids.tolist() == head + body + tail


@pytest.mark.parametrize("kind", ["bytes", "hf", "custom"])
def test_decode_gives_the_text_of_a_span_without_specials(tmp_path: Path, kind: str) -> None:
    """``TokenizeOp.decode`` turns a row's span back into text (trace previews use it): BOS
    and EOS are left out; an encoder without ``decode`` says so with None."""
    from zephon._ops.tokenize import TokenizeOp

    spec: Any = {"bytes": "bytes", "custom": _ListEncoder()}.get(kind)
    if kind == "hf":
        spec = str(_train(tmp_path / "hf", ["[BOS]", "[EOS]"]))
    op = TokenizeOp(spec)
    (record,) = next(iter(_pipe().tokenize(spec).batch(1))).records
    ids = record.payload["input_ids"]
    if kind == "custom":
        assert op.decode(ids) is None
        return
    assert op.decode(ids) == "the data loader"
    assert op.decode(ids[:2]).strip() in ("t", "the")  # BOS, then the first token
    if kind == "bytes":
        assert op.decode(list("é".encode())[:1]) == "\ufffd"  # a cut character
