"""benchmarks/scaling.py: the reference pipeline against the raw tokenizer, and Grain's row."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from tests.benchmarks._scripts import BENCHMARKS, run_script


@pytest.mark.timeout(900)
def test_scaling_reports_cpu_per_document_the_ceiling_and_the_ratios(tmp_path: Path) -> None:
    result, out = run_script(
        "scaling", "--docs", "480", "--workers", "1", "--rounds", "1", "--data", str(tmp_path),
        cwd=tmp_path,
    )  # fmt: skip
    ceiling = result["ceiling"]
    assert ceiling["processes"] == result["cores"] and ceiling["tokens_per_s"] > 0
    assert 0 < ceiling["native_us_per_doc"] <= ceiling["cpu_us_per_doc"]
    (row,) = result["rows"]
    assert row["workers"] == 1 and row["threads_tokens_per_s"] > 0
    assert row["process_vs_threads"] == round(
        row["process_tokens_per_s"] / row["threads_tokens_per_s"], 2
    )
    assert row["lanes_vs_threads"] == round(
        row["lanes_tokens_per_s"] / row["threads_tokens_per_s"], 2
    )
    runners = ("process", "threads", "lanes")
    best = max(row[f"{runner}_tokens_per_s"] for runner in runners)
    assert abs(row["zephon_vs_ceiling"] - best / ceiling["tokens_per_s"]) < 0.01
    # marginal CPU: a difference of two passes, so only the big shares are sure to be positive
    assert row["threads_cpu_us_per_doc"] > 0
    assert row["workers_us_per_doc"] > 0 and row["lanes_workers_us_per_doc"] > 0
    assert (tmp_path / "start-up").is_dir()
    native = result["native_us_per_doc"]
    assert result["engine_pct_of_native"] == round(row["engine_us_per_doc"] / native * 100, 1)
    lanes = row["lanes_engine_us_per_doc"]
    assert result["lanes_engine_pct_of_native"] == round(lanes / native * 100, 1)
    assert result["pipeline"] == "pack" and "load average" in result["load"]
    assert result["grain"] == {"skipped": "no --grain-python given"}
    assert "grain: skipped: no --grain-python given" in out
    assert "project" not in out


@pytest.fixture
def scaling() -> Iterator[ModuleType]:
    """benchmarks/scaling.py as a module (it imports its neighbours as top-level modules)."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        yield importlib.import_module("scaling")
    finally:
        sys.path.remove(str(BENCHMARKS))


def test_a_python_without_grain_skips_its_rows_with_the_reason(
    scaling: ModuleType, tmp_path: Path
) -> None:
    got = scaling.grain_run(sys.executable, tmp_path, tmp_path / "tok.json", 1)
    assert got["skipped"].startswith(f"--grain-python {sys.executable} could not run")
    assert "No module named 'grain'" in got["skipped"]


def test_a_grain_python_that_does_not_exist_is_named(scaling: ModuleType, tmp_path: Path) -> None:
    missing = str(tmp_path / "no-python")
    got = scaling.grain_run(missing, tmp_path, tmp_path / "tok.json", 1)
    assert got == {"skipped": f"--grain-python {missing} cannot be run: No such file or directory"}


def test_cpu_per_document_is_what_the_documents_beyond_the_start_up_subset_cost(
    scaling: ModuleType,
) -> None:
    # 1.0 s of start-up in both passes; 400 more documents cost 0.2 s more here, 2.0 s more below
    full = scaling.Run(wall=3.0, cpu=1.2, others=4.0, docs=500, tokens=1)
    small = scaling.Run(wall=1.0, cpu=1.0, others=2.0, docs=100, tokens=1)
    pair = scaling.Pair(full, small)
    assert pair.marginal_us("cpu") == pytest.approx(500.0)
    assert pair.marginal_us("others") == pytest.approx(5000.0)


def test_the_start_up_subset_is_the_first_quarter_of_the_shards(
    scaling: ModuleType, tmp_path: Path
) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for shard in range(8):
        (corpus / f"part-{shard:03d}.jsonl").write_text(f'{{"id": {shard}}}\n' * (shard + 1))
    (tmp_path / "start-up").mkdir()
    (tmp_path / "start-up" / "part-009.jsonl").write_text("stale\n")  # an earlier run's
    small = scaling.start_up_subset(corpus, tmp_path / "start-up")
    assert sorted(p.name for p in small.iterdir()) == ["part-000.jsonl", "part-001.jsonl"]
    assert (small / "part-001.jsonl").read_text() == (corpus / "part-001.jsonl").read_text()
    assert scaling.line_count(small) == 3 and scaling.line_count(corpus) == 36
