"""``zephon.convert.convert``: what it writes, how it reads back, how it resumes, its errors."""

from __future__ import annotations

import itertools
import json
import warnings
from pathlib import Path

import numpy as np
import pytest

from tests._kill_mid_write import kill_mid_write
from tests.convert._corpus import (
    ROWS_PER_FILE,
    WIDE_SPECIALS,
    tree_bytes,
    write_chat_pipeline,
    write_pipeline,
    write_text_corpus,
    write_wide_special_tokenizer,
)
from zephon import Pipeline, StaticMixtureWorkSource
from zephon.config import ConfigFileError, load_config
from zephon.convert import ConvertStopped, convert
from zephon.errors import ConfigError, DataFormatError, MissingFieldError
from zephon.io import Dataset

with warnings.catch_warnings():  # it warns that Transformer Engine and Apex are not installed
    warnings.simplefilter("ignore")
    from megatron.core.datasets.indexed_dataset import IndexedDataset


def _reference_tokens(pipeline: Path) -> list[list[int]]:
    """What the pipeline's own decode -> tokenize makes of every document, in file order."""
    config = load_config(pipeline)
    config.operators = config.operators[:2]
    config.source = {"shuffle_shards": False, "stop_after_passes": 1}
    pipe = config.build().options(runner="inline")
    return [np.asarray(r.payload["input_ids"]).tolist() for r in pipe]


def test_the_converted_corpus_holds_the_pipelines_tokens(
    tmp_path: Path, hf_tokenizer_dir: Path
) -> None:
    write_text_corpus(tmp_path)
    pipeline = write_pipeline(tmp_path, hf_tokenizer_dir)
    result = convert(pipeline, tmp_path / "out", workers=1, documents_per_shard=50)
    assert (result.shards, result.converted, result.documents) == (6, 6, 2 * ROWS_PER_FILE)
    manifest = json.loads((tmp_path / "out" / "zephon-convert.json").read_text())
    assert manifest["complete"] and manifest["dtype"] == "uint16" == result.dtype
    assert manifest["tokenizer"]["fingerprint"] and manifest["operator"] == "tokenize"
    ours = Dataset.from_path("converted", tmp_path / "out")
    rows = [
        r["input_ids"].tolist() for s in range(6) for r in ours.read(s, range(len(ours.shards[s])))
    ]
    assert rows == _reference_tokens(pipeline)
    assert result.tokens == sum(len(r) for r in rows)


def test_megatron_core_reads_the_shards_token_for_token(tmp_path: Path) -> None:
    write_text_corpus(tmp_path)
    convert(write_pipeline(tmp_path), tmp_path / "out", workers=1, documents_per_shard=80)
    ours = Dataset.from_path("converted", tmp_path / "out")
    for s, shard in enumerate(ours.shards):
        theirs = IndexedDataset(str(tmp_path / "out" / Path(shard.location).stem))
        assert len(theirs) == len(shard) > 0
        mine = ours.read(s, range(len(shard)))
        assert [theirs[i].tolist() for i in range(len(theirs))] == [
            r["input_ids"].tolist() for r in mine
        ]


def test_provenance_names_the_original_documents(tmp_path: Path) -> None:
    sources = write_text_corpus(tmp_path)
    convert(write_pipeline(tmp_path), tmp_path / "out", workers=1, documents_per_shard=50)
    ours = Dataset.from_path("converted", tmp_path / "out")
    source = StaticMixtureWorkSource([ours], shuffle_shards=True, seed=3, stop_after_passes=1)
    texts = {(str(p), i + 1): json.loads(line)["text"] for p in sources
             for i, line in enumerate(p.read_text().splitlines())}  # fmt: skip
    seen = 0
    for batch in Pipeline(source).batch(8).options(runner="inline"):
        for record, (segment,) in zip(batch.records, batch.provenance(), strict=True):
            assert segment.dataset == "web" and segment.line == segment.source_row + 1
            text = texts[(segment.source, segment.line)]
            assert (
                bytes(record.payload["input_ids"][1:-1].tolist())
                == text.replace("\r\n", "\n").encode()
            )
            seen += 1
    assert seen == 2 * ROWS_PER_FILE


def test_chat_sft_loss_masks_come_back_as_loss_mask(tmp_path: Path) -> None:
    pipeline = write_chat_pipeline(tmp_path)
    convert(pipeline, tmp_path / "out", workers=1, documents_per_shard=16)
    config = load_config(pipeline)
    config.source = {"shuffle_shards": False, "stop_after_passes": 1}
    expected = list(config.build().options(runner="inline"))
    ours = Dataset.from_path("converted", tmp_path / "out")
    rows = [r for s in range(len(ours.shards)) for r in ours.read(s, range(len(ours.shards[s])))]
    assert len(rows) == len(expected) == 40
    for row, record in zip(rows, expected, strict=True):
        assert row["input_ids"].tolist() == np.asarray(record.payload["input_ids"]).tolist()
        assert row["loss_mask"].tolist() == np.asarray(record.payload["loss_mask"], bool).tolist()
        assert 0 < row["loss_mask"].sum() < len(row["loss_mask"])
    manifest = json.loads((tmp_path / "out" / "zephon-convert.json").read_text())
    assert manifest["loss_mask"] and manifest["chat_template_fingerprint"]


def test_every_core_writes_the_same_bytes_as_one(tmp_path: Path) -> None:
    write_text_corpus(tmp_path)
    pipeline = write_pipeline(tmp_path)
    convert(pipeline, tmp_path / "one", workers=1, documents_per_shard=30)
    convert(pipeline, tmp_path / "two", workers=2, documents_per_shard=30)
    assert tree_bytes(tmp_path / "one") == tree_bytes(tmp_path / "two")


def test_a_stopped_conversion_resumes_without_redoing_finished_shards(tmp_path: Path) -> None:
    write_text_corpus(tmp_path)
    pipeline = write_pipeline(tmp_path)
    convert(pipeline, tmp_path / "whole", workers=1, documents_per_shard=30)
    finished: list[str] = []
    with pytest.raises(ConvertStopped):
        convert(pipeline, tmp_path / "out", workers=1, documents_per_shard=30,
                stop=lambda: len(finished) >= 3,
                on_shard=lambda entry, done, total: finished.append(entry["name"]))  # fmt: skip
    with pytest.raises(DataFormatError, match=r"has not finished .3 of 8 shards"):
        Dataset.from_path("partial", tmp_path / "out")
    stamps = {n: (tmp_path / "out" / f"{n}.bin").stat().st_mtime_ns for n in finished}
    result = convert(pipeline, tmp_path / "out", workers=1, documents_per_shard=30)
    assert (result.converted, result.skipped) == (5, 3)
    assert stamps == {n: (tmp_path / "out" / f"{n}.bin").stat().st_mtime_ns for n in finished}
    assert tree_bytes(tmp_path / "out") == tree_bytes(tmp_path / "whole")


def test_a_stop_during_a_task_ends_it_before_its_shard_is_written(tmp_path: Path) -> None:
    """``stop()`` is polled inside a task too: a long shard does not hold a Ctrl-C back."""
    write_text_corpus(tmp_path)
    pipeline = write_pipeline(tmp_path)
    convert(pipeline, tmp_path / "whole", workers=1)
    polls = itertools.count()
    with pytest.raises(ConvertStopped):
        convert(pipeline, tmp_path / "out", workers=1, stop=lambda: next(polls) >= 2)
    assert not any("web-" in p.name for p in (tmp_path / "out").iterdir())
    assert convert(pipeline, tmp_path / "out", workers=1).converted == 2
    assert tree_bytes(tmp_path / "out") == tree_bytes(tmp_path / "whole")


def test_a_task_that_fails_under_every_core_raises_its_error(tmp_path: Path) -> None:
    """Whichever process (the driver or a pool worker) ran the failing shard, the call
    raises its error and records no shard it did not finish."""
    write_text_corpus(tmp_path, files=4)
    (tmp_path / "data" / "part-2.jsonl").write_text('{"text": "fine"}\n{"text": 7}\n')
    with pytest.raises(MissingFieldError, match="decode_text: field 'text' of record"):
        convert(write_pipeline(tmp_path), tmp_path / "out", workers=2, documents_per_shard=20)
    manifest = json.loads((tmp_path / "out" / "zephon-convert.json").read_text())
    assert "web-00002-00000" not in [s["name"] for s in manifest["shards"]]
    assert not manifest["complete"]


def test_partial_files_of_a_killed_task_are_removed_and_redone(tmp_path: Path) -> None:
    write_text_corpus(tmp_path)
    pipeline = write_pipeline(tmp_path)
    convert(pipeline, tmp_path / "whole", workers=1, documents_per_shard=60)
    with pytest.raises(ConvertStopped):
        convert(pipeline, tmp_path / "out", workers=1, documents_per_shard=60, stop=lambda: True)
    partial = tmp_path / "out" / "web-00000-00000.tmp-12345.bin"
    partial.write_bytes(b"half a shard")
    convert(pipeline, tmp_path / "out", workers=1, documents_per_shard=60)
    assert not partial.exists()
    assert tree_bytes(tmp_path / "out") == tree_bytes(tmp_path / "whole")


def test_a_pipeline_without_a_tokenizer_is_refused(tmp_path: Path) -> None:
    write_text_corpus(tmp_path)
    path = tmp_path / "p.yaml"
    path.write_text("datasets:\n  - {name: web, path: data}\noperators:\n  - {op: decode_text}\n")
    with pytest.raises(ConfigFileError, match="no tokenize or tokenize_chat operator"):
        convert(path, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_an_operator_that_is_not_per_document_before_the_tokenizer_is_refused(
    tmp_path: Path,
) -> None:
    write_text_corpus(tmp_path)
    pipeline = write_pipeline(tmp_path, extra="  - {op: shuffle, buffer_size: 8}\n")
    with pytest.raises(ConfigFileError, match=r"operators\[0\]: shuffle runs before the tokenizer"):
        convert(pipeline, tmp_path / "out")


def test_out_of_another_pipeline_or_a_foreign_folder_is_refused(tmp_path: Path) -> None:
    write_text_corpus(tmp_path)
    pipeline = write_pipeline(tmp_path)
    convert(pipeline, tmp_path / "out", workers=1, documents_per_shard=60)
    with pytest.raises(ConfigError, match="holds a conversion of another pipeline"):
        convert(pipeline, tmp_path / "out", workers=1, documents_per_shard=30)
    with pytest.raises(ConfigError, match="is not a zephon convert output"):
        convert(pipeline, tmp_path / "data", workers=1)
    assert sorted(p.name for p in (tmp_path / "data").iterdir()) == ["part-0.jsonl", "part-1.jsonl"]


def test_a_folder_left_by_a_kill_before_the_first_manifest_is_resumed(tmp_path: Path) -> None:
    """Killed while writing its first manifest: only the lock and a temp file are there."""
    write_text_corpus(tmp_path)
    pipeline = write_pipeline(tmp_path)
    convert(pipeline, tmp_path / "whole", workers=1, documents_per_shard=60)
    out = tmp_path / "out"
    kill_mid_write(out / "zephon-convert.json", '{"format": "zephon')  # the writer's leftover
    for lock in (tmp_path / "whole").glob("*lock*"):
        (out / lock.name).touch()
    convert(pipeline, out, workers=1, documents_per_shard=60)
    assert sorted(p.name for p in out.iterdir()) == sorted(
        p.name for p in (tmp_path / "whole").iterdir()
    )
    for path in (tmp_path / "whole").iterdir():
        if path.suffix in (".bin", ".idx"):
            assert (out / path.name).read_bytes() == path.read_bytes()


def test_token_ids_that_do_not_fit_the_dtype_are_refused(tmp_path: Path) -> None:
    write_text_corpus(tmp_path, files=1)
    pipeline = tmp_path / "p.yaml"
    pipeline.write_text(
        "datasets:\n  - {name: web, path: data}\n"
        "operators:\n  - {op: tokenize, tokenizer: bytes, bos_token_id: 70000}\n"
    )
    with pytest.raises(
        DataFormatError,
        match=r"^shard web-00000-00000 \(from .*part-0.jsonl\): token id 70000 does not fit "
        r"dtype uint16; set the dtype option to int32 \(zephon convert --dtype int32",
    ):
        convert(pipeline, tmp_path / "out", workers=1, dtype="uint16")
    assert not any("web-" in p.name for p in (tmp_path / "out").iterdir())
    with pytest.raises(ConfigError, match="dtype must be one of auto, uint16, int32, int64"):
        convert(pipeline, tmp_path / "out2", workers=1, dtype="uint8")


def _read_back(out: Path) -> list[list[int]]:
    """Every document of ``out``, read by zephon and checked against megatron-core."""
    ours = Dataset.from_path("converted", out)
    docs = []
    for s, shard in enumerate(ours.shards):
        theirs = IndexedDataset(str(out / Path(shard.location).stem))
        mine = [r["input_ids"].tolist() for r in ours.read(s, range(len(shard)))]
        assert [theirs[i].tolist() for i in range(len(theirs))] == mine
        docs += mine
    return docs


def test_auto_dtype_counts_special_token_ids_above_the_vocabulary_size(tmp_path: Path) -> None:
    """Five tokens, but BOS/EOS are 70000/70001: a dtype chosen from the vocabulary's size
    (uint16) would wrap them; auto picks int32 and they come back whole."""
    write_text_corpus(tmp_path, files=1, rows=20)
    tokenizer = write_wide_special_tokenizer(tmp_path / "tok")
    pipeline = write_pipeline(tmp_path, tokenizer)
    result = convert(pipeline, tmp_path / "out", workers=1, documents_per_shard=8)
    assert result.dtype == "int32"
    docs = _read_back(tmp_path / "out")
    assert docs == _reference_tokens(pipeline) and len(docs) == 20
    assert {(d[0], d[-1]) for d in docs} == {(70_000, 70_001)}


def test_auto_dtype_counts_the_operators_own_bos_id(tmp_path: Path) -> None:
    write_text_corpus(tmp_path, files=1, rows=10)
    pipeline = tmp_path / "p.yaml"
    pipeline.write_text(
        "datasets:\n  - {name: web, path: data}\n"
        "operators:\n  - {op: tokenize, tokenizer: bytes, bos_token_id: 70000}\n"
    )
    assert convert(pipeline, tmp_path / "out", workers=1).dtype == "int32"
    docs = _read_back(tmp_path / "out")
    assert {(d[0], d[-1]) for d in docs} == {(70_000, 257)} and len(docs) == 10


def test_auto_dtype_stays_uint16_when_every_id_fits(tmp_path: Path) -> None:
    write_text_corpus(tmp_path, files=1, rows=10)
    result = convert(write_pipeline(tmp_path), tmp_path / "out", workers=1)
    assert result.dtype == "uint16"
    assert {(d[0], d[-1]) for d in _read_back(tmp_path / "out")} == {(256, 257)}


def test_auto_dtype_counts_a_chat_templates_special_tokens(tmp_path: Path) -> None:
    """``tokenize_chat`` writes ``<|im_start|>``/``<|im_end|>`` (70002/70003) from the template."""
    tokenizer = write_wide_special_tokenizer(tmp_path / "tok")
    pipeline = write_chat_pipeline(tmp_path, n=8, tokenizer=str(tokenizer))
    assert convert(pipeline, tmp_path / "out", workers=1).dtype == "int32"
    docs = _read_back(tmp_path / "out")
    config = load_config(pipeline)
    config.source = {"shuffle_shards": False, "stop_after_passes": 1}
    expected = [np.asarray(r.payload["input_ids"]).tolist() for r in config.build()]
    assert docs == expected and len(docs) == 8
    assert all(d.count(WIDE_SPECIALS["<|im_start|>"]) >= 2 for d in docs)
