"""YAML pipeline descriptions: what they build, and errors that name the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from zephon.config import ConfigFileError, load_config, parse_config
from zephon.types import SampleBatch


def _error(tmp_path: Path, text: str) -> str:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ConfigFileError) as info:
        load_config(path).build()
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"{path}: ")
    return message[len(f"{path}: ") :]


DATA = "datasets: [{name: web, path: my-data}]\n"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (DATA + "operators:\n  - tokenize\n  - pack_flat: {max_length: abc, pad_token_id: 0}",
         "operators[1].max_length: expected int, got 'abc'"),
        (DATA + "operators: [decode_text, tokenize, {op: batch, microbatch_size: 1.5}]",
         "operators[2].microbatch_size: expected int, got 1.5"),
        (DATA + "operators: [decode_text, tokenise]", "operators[1]: unknown operator 'tokenise'"),
        (DATA + "operators: [{op: shufle}]", "operators[0].op: unknown operator 'shufle'"),
        (DATA + "operators: [{op: batch}]", "operators[0].microbatch_size: required"),
        (DATA + "operators: [{op: shuffle, buffer: 3}]",
         "operators[0].buffer: unknown parameter of shuffle; did you mean 'buffer_size'?"),
        (DATA + "operator: []", "operator: unknown section; did you mean 'operators'?"),
        (DATA + "options: {queue_size: 0}", "options.queue_size: queue_size must be >= 1"),
        (DATA + "options: {qeue_size: 3}", "options.qeue_size: unknown option"),
        (DATA + "runner: fast", "runner: expected one of 'inline', 'threads'"),
        (DATA + "mixture: {wbe: 1}", "mixture.wbe: no dataset is named 'wbe'"),
        (DATA + "source: {chunk_size: -3}", "source: chunk_size must be a positive integer"),
        (DATA + "source: {seed: x}", "source.seed: expected int, got 'x'"),
        ("datasets: [{name: web, path: nowhere}]", "datasets[0].path: dataset path "),
        ("datasets: [{name: web}]", "datasets[0].path: required but missing"),
        ("datasets: [{name: web, path: my-data, cache: {max_bytes: 9}}]",
         "datasets[0].cache.dir: required but missing"),
        ("datasets: [{name: web, path: my-data, cache: {dir: c, size: 9}}]",
         "datasets[0].cache.size: unknown cache key (known: dir, max_bytes)"),
        ("datasets: [{name: web, path: my-data, cache: {dir: c, max_bytes: 0}}]",
         "datasets[0].cache.max_bytes: must be >= 1, got 0"),
        ("datasets: [{name: web, path: my-data, format: csv}]", "datasets[0].format: expected"),
        ("datasets: {name: web}", "datasets: expected a non-empty list"),
        ("operators: [tokenize]", "datasets: required"),
        ("datasets: [{name: a\n  path: x", "line 2, column 7: invalid YAML"),
        ("", "the file is empty"),
        (DATA + "operators: [{op: 'os.path:join'}]",
         "operators[0].op: 'os.path:join' is not a zephon.ops.BaseOp subclass"),
        (DATA + "operators: [{op: map_transform, fn: 'tests.cli._custom_ops:nothing'}]",
         "operators[0].fn: module 'tests.cli._custom_ops' has no attribute 'nothing'"),
        (DATA + "operators: [{op: map_transform, fn: 42}]",
         "operators[0].fn: expected an import path 'module:function', got 42"),
        (DATA + "metrics: {statsd: 'localhost:x'}", "metrics: statsd address 'localhost:x'"),
        (DATA + "metrics: {statds: 'localhost:1'}", "metrics.statds: unknown key (known: statsd"),
        (DATA + "metrics: {interval_s: 0}", "metrics: interval_s must be > 0"),
    ],
)  # fmt: skip
def test_errors_name_the_key(workdir: Path, text: str, expected: str) -> None:
    assert expected in _error(workdir, text)


def test_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigFileError, match=r"absent\.yaml: config file not found"):
        load_config(tmp_path / "absent.yaml")


def test_builds_the_described_pipeline(workdir: Path) -> None:
    config = load_config(workdir / "pipeline.yaml")
    assert [op.name for op in config.operators] == ["decode_text", "tokenize", "pack_flat", "batch"]
    pipe = config.build()
    plan = pipe.explain()
    assert plan.lanes == [0, 1] and plan.runner == "threads"
    assert [s.op_name for s in plan.stages if s.op_name != "replay_filter"] == [
        "fetch", "decode_text", "tokenize", "pack_flat", "batch",
    ]  # fmt: skip
    batches = list(pipe)
    assert batches and all(isinstance(b, SampleBatch) and len(b) == 4 for b in batches)
    assert all(len(r.payload["input_ids"]) == 256 for b in batches for r in b)


def test_relative_paths_are_relative_to_the_file(workdir: Path, tmp_path_factory) -> None:
    elsewhere = tmp_path_factory.mktemp("cwd")
    config = load_config(workdir / "pipeline.yaml")
    assert config.datasets[0].paths == [str(workdir / "my-data")]
    assert elsewhere != workdir


def test_custom_operator_and_import_paths(workdir: Path) -> None:
    config = parse_config(
        {
            "datasets": [{"name": "web", "path": "my-data"}],
            "operators": [
                {"op": "filter", "predicate": "tests.cli._custom_ops:short"},
                {"op": "tests.cli._custom_ops:Tag", "field": "seen", "value": 3},
            ],
            "options": {"runner": "inline"},
        },
        base_dir=workdir,
    )
    records = list(config.build())
    assert records and all(r.payload["seen"] == 3 for r in records)
    assert all(len(r.payload["text"]) < 200 for r in records)
    with pytest.raises(ConfigFileError, match=r"operators\[0\]\.colour: unknown parameter"):
        parse_config(
            {
                "datasets": [{"name": "web", "path": "my-data"}],
                "operators": [{"op": "tests.cli._custom_ops:Tag", "colour": 1}],
            },
            base_dir=workdir,
        )


def test_mixture_and_both_operator_forms_agree(workdir: Path) -> None:
    base = {
        "datasets": [{"name": "a", "path": "my-data"}, {"name": "b", "path": "my-data"}],
        "mixture": {"a": 3, "b": 1},
        "source": {"chunk_size": 64, "seed": 3},
        "options": {"runner": "inline"},
    }
    one = parse_config({**base, "operators": [{"op": "shuffle", "buffer_size": 32}]},
                       base_dir=workdir)  # fmt: skip
    two = parse_config({**base, "operators": [{"shuffle": {"buffer_size": 32}}]},
                       base_dir=workdir)  # fmt: skip
    ids_one = [r.meta.sample_id for r in one.build()]
    ids_two = [r.meta.sample_id for r in two.build()]
    assert ids_one == ids_two and len(ids_one) > 1200  # "a" repeats until "b" finished a pass
    share_a = sum(1 for s in ids_one if s[0] == 0) / len(ids_one)
    assert share_a == pytest.approx(0.75, abs=0.01)


def test_map_batch_may_follow_batch_in_yaml_and_nothing_else():
    from zephon.config import parse_config

    ops = [{"op": "batch", "microbatch_size": 4}, {"op": "map_batch", "fn": "json:dumps"}]
    parse_config({"datasets": [{"name": "d", "path": "."}], "operators": ops})
    ops.append("decode_text")
    with pytest.raises(ConfigFileError, match=r"operators\[2\].*only map_batch may follow"):
        parse_config({"datasets": [{"name": "d", "path": "."}], "operators": ops})


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("datasets: [{name: web, path: my-data, format: jsnl}]",
         "datasets[0].format: expected one of 'jsonl', 'parquet', 'arrow', 'vortex', 'hf', "
         "'lance', 'mds', 'litdata', 'converted', 'megatron', 'datatrove', 'npy', 'webdataset' "
         "or null, got 'jsnl'; "
         "did you mean 'jsonl'?"),
        (DATA + "runner: thread", "runner: expected one of 'inline', 'threads', 'process', "
         "'ray', got 'thread'; did you mean 'threads'?"),
        (DATA + "operators: [{op: tokenize, special_tokens: eso}]",
         "operators[0].special_tokens: expected one of 'bos_eos', 'bos', 'eos', 'none', got "
         "'eso'; did you mean 'eos'?"),
    ],
)  # fmt: skip
def test_enum_values_get_did_you_mean(tmp_path: Path, text: str, expected: str) -> None:
    (tmp_path / "my-data").mkdir()
    (tmp_path / "my-data" / "a.jsonl").write_text('{"text": "a"}\n')
    assert _error(tmp_path, text) == expected


def test_tokenizer_and_template_paths_are_relative_to_the_yaml(tmp_path: Path) -> None:
    data = {
        "datasets": [{"name": "web", "path": "my-data"}],
        "mixture": {
            "weights": {"web": 1},
            "unit": "tokens",
            "calibration": {"tokenizer": "tok/tokenizer.json", "field": "text"},
        },
        "operators": [
            {"op": "tokenize", "tokenizer": "tok/tokenizer.json"},
            {"op": "tokenize_chat", "tokenizer": "bytes", "chat_template": "t/chat.jinja"},
            {"op": "tokenize", "tokenizer": str(tmp_path / "abs.json")},
        ],
    }
    config = parse_config(data, base_dir=tmp_path / "cfg")
    first, chat, absolute = (op.params for op in config.operators)
    assert first["tokenizer"] == str(tmp_path / "cfg" / "tok" / "tokenizer.json")
    assert chat["tokenizer"] == "bytes"
    assert chat["chat_template"] == str(tmp_path / "cfg" / "t" / "chat.jinja")
    assert absolute["tokenizer"] == str(tmp_path / "abs.json")
    calibration = config.mixture.calibration
    assert calibration.tokenizer == str(tmp_path / "cfg" / "tok" / "tokenizer.json")


def test_metrics_section_is_read(workdir: Path) -> None:
    (workdir / "m.yaml").write_text(DATA + "metrics: {statsd: '127.0.0.1:9125', interval_s: 2}\n")
    config = load_config(workdir / "m.yaml")
    assert config.metrics == {
        "statsd": "127.0.0.1:9125",
        "prefix": "zephon",
        "interval_s": 2,
        "max_packet_bytes": 512,
    }
