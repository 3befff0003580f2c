"""Shared fixtures: a small JSONL corpus and a pipeline file over it."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from zephon.demo import make_corpus

ZEPHON = str(Path(sys.executable).parent / "zephon")

PIPELINE_YAML = """\
datasets:
  - name: web
    path: my-data
source:
  chunk_size: 128
  seed: 7
operators:
  - decode_text
  - op: tokenize
    tokenizer: bytes
    max_length: 256
    truncation: true
  - pack_flat: {max_length: 256, pad_token_id: 0}
  - op: batch
    microbatch_size: 4
runner: threads
options:
  canonical_replicas: 2
"""


@pytest.fixture(scope="session")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_corpus(tmp_path_factory.mktemp("corpus") / "my-data", docs=600, shards=3)


@pytest.fixture
def workdir(tmp_path: Path, corpus: Path) -> Path:
    shutil.copytree(corpus, tmp_path / "my-data")
    (tmp_path / "pipeline.yaml").write_text(PIPELINE_YAML)
    return tmp_path


@pytest.fixture(scope="module")
def preempt_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.cli._preempt import PREEMPT_YAML  # it imports ZEPHON from here

    folder = tmp_path_factory.mktemp("preempt")
    make_corpus(folder / "my-data", docs=1500, shards=3)
    (folder / "p.yaml").write_text(PREEMPT_YAML)
    return folder


def without_cut_warning(stderr: str) -> str:
    """``stderr`` without the warning that tokenize has cut many tokens: PIPELINE_YAML
    truncates the demo corpus on purpose, and the tests that use it are about other lines."""
    return "".join(line for line in stderr.splitlines(True) if " has cut " not in line)
