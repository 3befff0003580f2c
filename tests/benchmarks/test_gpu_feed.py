"""benchmarks/gpu_feed.py on CPU with the tiny model: every mode trains, against the ceiling."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.benchmarks._scripts import run_script


@pytest.mark.timeout(900)
def test_gpu_feed_times_every_mode_against_the_ceiling_on_cpu(tmp_path: Path) -> None:
    result, out = run_script(
        "gpu_feed", "--device", "cpu", "--steps", "2", "--warmup", "1", "--seq-len", "128",
        "--batch-size", "2", "--workers", "1", "--data", str(tmp_path), cwd=tmp_path,
    )  # fmt: skip
    assert result["device"] == "cpu" and result["model_size"] == "tiny"
    assert 0 < result["parameters"] < 2_000_000 and result["batch"] == [2, 128]
    modes = [row["mode"] for row in result["rows"]]
    expected = ["ceiling", "in-process", "engine_process", "PipelineDataLoader", "lane_workers"]
    assert modes == expected
    ceiling = result["rows"][0]["step_ms"]
    for row in result["rows"]:
        assert row["step_ms"] > 0 and row["vs_ceiling"] == round(row["step_ms"] / ceiling, 3)
        assert row["mode"] in out
