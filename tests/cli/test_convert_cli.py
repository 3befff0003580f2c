"""``zephon convert`` as a real process: killed (SIGKILL) or stopped (SIGTERM) at several points,
then run again, it finishes with the bytes of an uninterrupted conversion and never redoes a
finished shard. Also its one-line errors and exit codes."""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import pytest

from tests.cli._preempt import env, wait_for
from tests.cli.conftest import ZEPHON
from tests.convert._corpus import tree_bytes, write_pipeline, write_text_corpus

SHARDS = 24  # 2 files x 240 rows / 20 documents per shard
SLOW = "  - {op: map_transform, fn: 'tests.cli._custom_ops:slow_identity'}\n"


def _start(folder: Path, out: str) -> subprocess.Popen[str]:
    command = [ZEPHON, "convert", "pipeline.yaml", out, "--workers", "2",
               "--documents-per-shard", "20", "--quiet"]  # fmt: skip
    return subprocess.Popen(
        command, cwd=folder, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, start_new_session=True,
    )  # fmt: skip


def _finished(out: Path) -> list[str]:
    try:
        manifest = json.loads((out / "zephon-convert.json").read_text())
    except (OSError, ValueError):
        return []
    return [s["name"] for s in manifest["shards"]]


def _complete(folder: Path, out: str) -> subprocess.CompletedProcess[str]:
    proc = _start(folder, out)
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr
    return subprocess.CompletedProcess(proc.args, 0, stdout, stderr)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("convert")
    write_text_corpus(folder, rows=240)
    write_pipeline(folder, extra=SLOW)
    _complete(folder, "whole")
    return folder


@pytest.mark.parametrize("after", [0, 3, 12])
@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM])
def test_a_killed_or_stopped_convert_resumes_to_identical_bytes(
    corpus: Path, after: int, how: signal.Signals
) -> None:
    out = f"out-{how.name}-{after}"
    proc = _start(corpus, out)
    wait_for(lambda: len(_finished(corpus / out)) >= after and (corpus / out).is_dir(), 120)
    proc.send_signal(how)
    _stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == (-9 if how == signal.SIGKILL else 143), stderr
    if how == signal.SIGTERM:
        assert "run the same command again to resume" in stderr
    done = _finished(corpus / out)
    assert len(done) < SHARDS  # it was stopped part-way
    stamps = {n: (corpus / out / f"{n}.bin").stat().st_mtime_ns for n in done}
    second = _complete(corpus, out)
    assert f"({SHARDS - len(done)} converted, {len(done)} already done)" in second.stdout
    assert stamps == {n: (corpus / out / f"{n}.bin").stat().st_mtime_ns for n in done}
    assert tree_bytes(corpus / out) == tree_bytes(corpus / "whole")


def test_errors_are_one_line_with_exit_2(tmp_path: Path) -> None:
    write_text_corpus(tmp_path, files=1)
    (tmp_path / "p.yaml").write_text("datasets:\n  - {name: web, path: data}\n")
    proc = subprocess.run([ZEPHON, "convert", "p.yaml", "out"], cwd=tmp_path, env=env(),
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1
    assert proc.stderr.startswith("zephon convert: error: p.yaml: operators: no tokenize")


def test_trace_names_the_original_document_of_a_converted_corpus(corpus: Path) -> None:
    (corpus / "train.yaml").write_text(
        "datasets:\n  - {name: tokens, path: whole}\n"
        "source: {seed: 1}\noperators:\n  - {op: batch, microbatch_size: 4}\n"
    )
    proc = subprocess.run([ZEPHON, "trace", "train.yaml", "--step", "2", "--json"], cwd=corpus,
                          env=env(), capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    segments = json.loads(proc.stdout)["segments"]
    texts = {
        (str(p), i + 1): json.loads(line)["text"]
        for p in sorted((corpus / "data").glob("*.jsonl"))
        for i, line in enumerate(p.read_text().splitlines())
    }
    assert len(segments) == 4
    for seg in segments:
        assert (seg["source"], seg["line"]) in texts
        assert seg["source_row"] == seg["line"] - 1 and seg["dataset"] == "web"
