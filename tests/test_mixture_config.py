"""The YAML mixture section: token mixtures, calibration and schedules, with errors naming keys."""

from __future__ import annotations

import pytest
import yaml

from zephon import MixtureSchedule, MixtureSpec, StaticMixtureWorkSource
from zephon.config import ConfigFileError, parse_config

DATA = [{"name": "web", "path": "web.jsonl"}, {"name": "code", "path": "code.jsonl"}]


@pytest.fixture
def folder(tmp_path):
    for name, text in (("web", "the cat sat on the mat"), ("code", "x=1;y=2;")):
        lines = [f'{{"text": "{text} {i}"}}' for i in range(50)]
        (tmp_path / f"{name}.jsonl").write_text("\n".join(lines) + "\n")
    return tmp_path


def build(folder, mixture_yaml: str) -> StaticMixtureWorkSource:
    data = {"datasets": DATA, "mixture": yaml.safe_load(mixture_yaml)}
    source = parse_config(data, base_dir=folder).build().work_source
    assert isinstance(source, StaticMixtureWorkSource)
    return source


def test_token_mixture_with_calibration(folder):
    source = build(
        folder,
        "{weights: {web: 3, code: 1}, unit: tokens, calibration: {tokenizer: bytes, samples: 99}}",
    )
    config = source.state_dict()["config"]
    assert config["unit"] == "tokens"
    # every row measured: 50 rows "<text> <i>", 10 with a one-digit i and 40 with two digits
    mean_digits = (10 * 1 + 40 * 2) / 50
    assert config["tokens_per_sample"] == {
        "web": pytest.approx(len("the cat sat on the mat ") + mean_digits),
        "code": pytest.approx(len("x=1;y=2; ") + mean_digits),
    }
    assert isinstance(source.mixture, MixtureSpec) and source.mixture.unit == "tokens"


def test_token_mixture_measured_by_the_pipelines_tokenize(folder):
    data = {
        "datasets": DATA,
        "mixture": {"weights": {"web": 3, "code": 1}, "unit": "tokens"},
        "operators": ["decode_text", {"op": "tokenize", "tokenizer": "bytes"}],
    }
    source = parse_config(data, base_dir=folder).build().work_source
    assert isinstance(source, StaticMixtureWorkSource)
    mean_digits = (10 * 1 + 40 * 2) / 50  # as above, plus BOS and EOS
    assert source.state_dict()["config"]["tokens_per_sample"] == {
        "web": pytest.approx(len("the cat sat on the mat ") + mean_digits + 2),
        "code": pytest.approx(len("x=1;y=2; ") + mean_digits + 2),
    }


def test_schedule(folder):
    source = build(
        folder,
        "{schedule: [{at: 0, weights: {web: 1}}, {at: 30, weights: {web: 1, code: 1}}],"
        " by: samples}",
    )
    chunk = source.next_chunk()
    assert chunk is not None
    assert set(chunk.pointers[:30, 0].tolist()) == {0}
    assert isinstance(source._mixture.schedule, MixtureSchedule)


@pytest.mark.parametrize(
    ("mixture", "key"),
    [
        ("{weights: {web: 1, cod: 1}}", "mixture.weights.cod: no dataset is named 'cod'"),
        ("{weights: {web: 1, code: 1}, units: tokens}", "mixture.units: unknown key"),
        ("{schedule: [{at: 0, weights: {web: 1}}, {at: x, weights: {code: 1}}]}",
         "mixture.schedule[1].at: expected int, got 'x'"),
        ("{schedule: [{at: 0, weights: {web: -1, code: 1}}]}",
         "mixture.schedule[0].weights.web: weight must be > 0"),
        ("{weights: {web: 1, code: 1}, unit: tokens, calibration: {sample: 3}}",
         "mixture.calibration.sample: unknown parameter of calibration"),
        ("{web: 1}", "mixture: dataset(s) ['code'] have no weight"),
    ],
)  # fmt: skip
def test_errors_name_the_key(folder, mixture, key):
    with pytest.raises(ConfigFileError) as info:
        build(folder, mixture)
    assert key in str(info.value)
