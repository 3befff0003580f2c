"""``zephon trace --find ORIGINAL:LINE`` over a run that read a ``zephon convert`` corpus: the
provenance log names the original file, row and line of every segment (as
``batch.provenance()`` does), so a document is found by where it was before conversion."""

from __future__ import annotations

import itertools
import json
import subprocess
from pathlib import Path

import pytest

from tests.cli.conftest import ZEPHON
from tests.convert._corpus import ROWS_PER_FILE, write_pipeline, write_text_corpus
from zephon.cli import main
from zephon.convert import convert
from zephon.provenance import find, read_log

RUN_YAML = """\
datasets:
  - {name: 2024.notes, path: converted}
source: {seed: 5, stop_after_passes: 1}
operators:
  - {op: shuffle, buffer_size: 16, seed: 2}
  - pack_flat: {max_length: 48, pad_token_id: 0, algorithm: wrap}
  - {op: batch, microbatch_size: 2}
runner: inline
"""


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two JSON Lines files converted into 6 shards, then trained on with a provenance log."""
    folder = tmp_path_factory.mktemp("converted-run")
    write_text_corpus(folder)
    convert(write_pipeline(folder), folder / "converted", workers=1, documents_per_shard=50)
    (folder / "run.yaml").write_text(RUN_YAML)
    log = str(folder / "prov.parquet")
    assert main(["run", str(folder / "run.yaml"), "--quiet", "--provenance", log]) == 0
    return folder


def test_every_original_line_is_found_whole(run: Path) -> None:
    table = read_log(run / "prov.parquet").to_pylist()
    assert {Path(r["source"]).parent for r in table} == {run / "data"}
    for part in sorted((run / "data").iterdir()):
        for line in range(1, ROWS_PER_FILE + 1):
            hits = find(run / "prov.parquet", f"{part}:{line}")
            assert hits and {(h.dataset, h.source, h.line, h.source_row) for h in hits} == {
                ("web", str(part), line, line - 1)
            }
            spans = sorted((h.source_start, h.source_end) for h in hits)
            assert spans[0][0] == 0 and all(a[1] == b[0] for a, b in itertools.pairwise(spans))
            text = json.loads(part.read_text().splitlines()[line - 1])["text"]
            assert spans[-1][1] == len(text.replace("\r\n", "\n").encode()) + 2  # BOS, EOS


def test_trace_find_agrees_with_trace_step_and_the_sample_id(
    run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    part = run / "data" / "part-1.jsonl"
    found = subprocess.run(
        [ZEPHON, "trace", "prov.parquet", "--find", "data/part-1.jsonl:77", "--json"],
        cwd=run, capture_output=True, text=True, check=True,
    )  # fmt: skip
    hits = json.loads(found.stdout)["hits"]
    assert hits and all(h["source"] == str(part) and h["line"] == 77 for h in hits)
    hit = hits[0]
    capsys.readouterr()
    assert main(["trace", str(run / "run.yaml"), "--step", str(hit["step"]), "--json"]) == 0
    segments = json.loads(capsys.readouterr().out)["segments"]
    seg = next(s for s in segments if (s["row"], s["segment"]) == (hit["row"], hit["segment"]))
    assert (seg["source"], seg["line"], seg["source_row"]) == (str(part), 77, 76)
    sample = ":".join(map(str, seg["sample_id"]))
    assert seg["sample_id"] == [0, 4, 26]  # the converted row: shard 4 holds rows 50-99
    expected = {(h["step"], h["row"], h["segment"]) for h in hits}
    by_id = find(run / "prov.parquet", sample)
    assert {(h.step, h.row, h.segment) for h in by_id} == expected
    # By the run's name for the dataset (a digit first and a dot in it): the sample id is the
    # run's, so is the name, though the log names the original dataset (``web``).
    by_name = find(run / "prov.parquet", "2024.notes:4:26")
    assert {(h.step, h.row, h.segment) for h in by_name} == expected
    assert {h.dataset for h in by_name} == {"web"}
    assert find(run / "prov.parquet", "web:4:26") == []  # not the run's name for it
    capsys.readouterr()
    assert main(["trace", str(run / "prov.parquet"), "--find", "2024.notes:4:26", "--json"]) == 0
    found_cli = json.loads(capsys.readouterr().out)["hits"]
    assert {(h["step"], h["row"], h["segment"]) for h in found_cli} == expected
