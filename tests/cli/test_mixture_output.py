"""A 70/30 mixture of short and long documents, as every command that describes a run shows it:
``explain`` (text, JSON), ``run``'s summary and ``--json``, its Prometheus file and statsd
datagrams, ``checkpoint inspect`` (text, ``--json``), and after a resume (cumulative counts).

It is 70/30 by samples and about 32/68 by tokens; the expected counts come from running the
same YAML in-process and reading the delivered records' sample ids and token fields.
"""

from __future__ import annotations

import json
import random
import socket
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.cli.conftest import ZEPHON
from zephon.config import load_config

MIXED_YAML = """\
datasets:
  - {name: web, path: web}
  - {name: code, path: code}
mixture: {web: 0.7, code: 0.3}
source: {chunk_size: 50, seed: 3, exhausted_policy: stop}
operators:
  - decode_text
  - {op: tokenize, tokenizer: bytes}
  - {op: shuffle, buffer_size: 64}
  - {op: batch, microbatch_size: 8}
runner: threads
options: {canonical_replicas: 2}
"""
TOKEN_LINE = "mixture by samples: web target 70.0%, delivered {} of samples / {} of tokens; "


def _write(folder: Path, name: str, n: int, low: int, high: int, seed: int) -> None:
    rng = random.Random(seed)
    (folder / name).mkdir()
    lines = [json.dumps({"text": "x" * rng.randint(low, high)}) for _ in range(n)]
    (folder / name / "part-0.jsonl").write_text("\n".join(lines) + "\n")


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("mixed")
    _write(folder, "web", 1400, 10, 30, 1)  # ~20 bytes a document
    _write(folder, "code", 600, 80, 120, 2)  # ~100
    (folder / "m.yaml").write_text(MIXED_YAML)
    return folder


@pytest.fixture(scope="module")
def expected(mixed: Path) -> dict[str, dict[str, int]]:
    """Samples and tokens per dataset of the whole run, read off the delivered records."""
    names = ("web", "code")
    samples: Counter[str] = Counter()
    tokens: Counter[str] = Counter()
    for batch in load_config(mixed / "m.yaml").build():
        for record in batch.records:
            samples[names[record.meta.sample_id[0]]] += 1
            tokens[names[record.meta.sample_id[0]]] += len(record.payload["input_ids"])
    return {"samples": dict(samples), "tokens": dict(tokens)}


def _zephon(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [ZEPHON, *args], cwd=folder, capture_output=True, text=True, timeout=240, check=False
    )


def _shares(counts: dict[str, int]) -> dict[str, float]:
    total = sum(counts.values())
    return {k: v / total for k, v in counts.items()}


def _check(mixture: dict[str, Any], expected: dict[str, dict[str, int]]) -> None:
    assert mixture["unit"] == "samples" and mixture["weights"] == {"web": 0.7, "code": 0.3}
    assert mixture["samples"] == expected["samples"] and mixture["tokens"] == expected["tokens"]
    assert mixture["sample_shares"] == pytest.approx(_shares(expected["samples"]))
    assert mixture["token_shares"] == pytest.approx(_shares(expected["tokens"]))
    assert mixture["sample_shares"]["web"] == pytest.approx(0.7, abs=0.01)
    assert mixture["token_shares"]["web"] == pytest.approx(0.32, abs=0.03)


def _line(expected: dict[str, dict[str, int]]) -> str:
    samples, tokens = _shares(expected["samples"]), _shares(expected["tokens"])
    return TOKEN_LINE.format(f"{samples['web']:.1%}", f"{tokens['web']:.1%}")


def test_explain_shows_the_weights_and_the_unit(mixed: Path):
    text = _zephon(mixed, "explain", "m.yaml")
    assert text.returncode == 0, text.stderr
    assert "mixture by samples: web 70.0%, code 30.0%; delivered shares by samples and by " in (
        text.stdout
    )
    data = _zephon(mixed, "explain", "m.yaml", "--format", "json")
    mixture = json.loads(data.stdout)["mixture"]
    assert mixture["unit"] == "samples" and mixture["weights"] == {"web": 0.7, "code": 0.3}


def test_explain_of_a_token_mixture_says_tokens(mixed: Path):
    yaml = MIXED_YAML.replace(
        "mixture: {web: 0.7, code: 0.3}",
        "mixture: {weights: {web: 7, code: 3}, unit: tokens, tokens_per_sample: {web: 20, "
        "code: 100}}",
    )
    (mixed / "t.yaml").write_text(yaml)
    text = _zephon(mixed, "explain", "t.yaml")
    assert "mixture by tokens: web 70.0%, code 30.0%;" in text.stdout, text.stderr
    data = json.loads(_zephon(mixed, "explain", "t.yaml", "--format", "json").stdout)
    assert data["mixture"]["tokens_per_sample"] == {"web": 20.0, "code": 100.0}


def test_the_summary_json_and_metrics_show_the_shares(mixed: Path, expected, tmp_path: Path):
    prom = tmp_path / "metrics.prom"
    receiver = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    receiver.bind(("127.0.0.1", 0))
    receiver.settimeout(60)
    port = receiver.getsockname()[1]
    with receiver:
        proc = _zephon(
            mixed, "run", "m.yaml", "--quiet", "--json", "--prometheus-file", str(prom),
            "--statsd", f"127.0.0.1:{port}",
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        _check(json.loads(proc.stdout)["mixture"], expected)
        statsd = _statsd_lines(receiver)
    assert statsd["zephon.mixture.web.weight"] == "0.7|g"
    assert statsd["zephon.mixture.code.samples"] == f"{expected['samples']['code']}|g"
    assert statsd["zephon.mixture.web.tokens"] == f"{expected['tokens']['web']}|g"
    token_share = float(statsd["zephon.mixture.web.token_share"].removesuffix("|g"))
    assert token_share == pytest.approx(_shares(expected["tokens"])["web"], abs=1e-6)
    text = prom.read_text()
    assert 'zephon_pipeline_mixture_weight{dataset="code",unit="samples"} 0.3\n' in text
    assert (
        f'zephon_pipeline_mixture_tokens_total{{dataset="web"}} {expected["tokens"]["web"]}\n'
        in (text)
    )
    assert "# TYPE zephon_pipeline_mixture_token_share gauge\n" in text
    summary = _zephon(mixed, "run", "m.yaml", "--quiet").stdout
    assert _line(expected) in summary


def _statsd_lines(sock: socket.socket) -> dict[str, str]:
    """Every gauge the run pushed (the last value of each), until the mixture's last one."""
    lines: dict[str, str] = {}
    while "zephon.mixture.code.token_share" not in lines:
        for line in sock.recv(65536).decode().splitlines():
            name, _, value = line.partition(":")
            lines[name] = value
    return lines


def test_inspect_and_a_resumed_run_show_the_whole_pass(mixed: Path, expected, tmp_path: Path):
    ck = str(tmp_path / "ck")
    first = _zephon(
        mixed, "run", "m.yaml", "--quiet", "--checkpoint-dir", ck, "--max-batches", "40"
    )
    assert first.returncode == 0, first.stderr
    head = json.loads(_zephon(mixed, "checkpoint", "inspect", ck, "--json").stdout)["mixture"]
    assert sum(head["samples"].values()) == 40 * 8
    rest = _zephon(mixed, "run", "m.yaml", "--quiet", "--json", "--checkpoint-dir", ck, "--resume")
    assert rest.returncode == 0, rest.stderr
    summary = json.loads(rest.stdout)
    assert summary["samples"] < sum(expected["samples"].values())  # this run's part only
    _check(summary["mixture"], expected)  # the whole pass
    text = _zephon(mixed, "run", "m.yaml", "--quiet", "--checkpoint-dir", ck, "--resume")
    assert "(the pass so far, before the resume included)" in text.stdout
    inspected = _zephon(mixed, "checkpoint", "inspect", ck, "--json")
    _check(json.loads(inspected.stdout)["mixture"], expected)
    shown = _zephon(mixed, "checkpoint", "inspect", ck).stdout
    assert _line(expected) in shown
