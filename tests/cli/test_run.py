"""`zephon run`: one-line errors, stop and resume, JSON summary, metrics."""

from __future__ import annotations

import json
import subprocess
import urllib.request
from pathlib import Path

import pytest

from tests.cli.conftest import ZEPHON, without_cut_warning
from zephon.cli import main
from zephon.cli._common import MetricsServer, checkpoint_files


def _zephon(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([ZEPHON, *args], cwd=cwd, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("datasets: [{name: web, path: my-data}\noperators: [x", "invalid YAML"),
        ("datasets: [{name: web, path: missing-folder}]", "datasets[0].path: dataset path"),
        ("datasets: [{name: web, path: my-data}]\noperators: [decode_text, tokenizer]",
         "operators[1]: unknown operator 'tokenizer'"),
        ("datasets: [{name: web, path: my-data}]\noperators: [{op: batch, microbatch_size: x}]",
         "operators[0].microbatch_size: expected int, got 'x'"),
        ("datasets: [{name: web, path: my-data}]\noptions: {canonical_replicas: -2}",
         "options.canonical_replicas: canonical_replicas must be >= 1, got -2"),
        ("datasets: [{name: web, path: my-data}]\noptions: {dp_world_size: 0}",
         "options.dp_world_size: dp_world_size must be >= 1, got 0"),
        ("datasets: [{name: web, path: my-data}]\noptions: {lane_workers: 0}",
         "options.lane_workers: lane_workers must be an integer >= 1, 'auto' or None (off)"),
    ],
)  # fmt: skip
def test_bad_configs_exit_2_with_one_line(workdir: Path, text: str, needle: str) -> None:
    (workdir / "bad.yaml").write_text(text)
    proc = _zephon("run", "bad.yaml", cwd=workdir)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("zephon run: error: bad.yaml: ")
    assert needle in lines[0]
    assert proc.stdout == ""


def test_a_run_failing_on_data_exits_1(workdir: Path) -> None:
    (workdir / "my-data" / "shard-0001.jsonl").write_text('{"text": "ok"}\n{"text": \n')
    proc = _zephon("run", "pipeline.yaml", "--quiet", "--json", cwd=workdir)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1].startswith("zephon run: error: ")
    assert "shard-0001.jsonl" in proc.stderr
    assert json.loads(proc.stdout)["status"] == "failed"


def _ids(path: Path) -> list[list[list[int]]]:
    return [json.loads(line)["ids"] for line in path.read_text().splitlines()]


def test_stop_and_resume_delivers_exactly_the_uninterrupted_run(workdir: Path) -> None:
    def run(*extra: str) -> int:
        return main(["run", str(workdir / "pipeline.yaml"), "--quiet", "--json", *extra])

    assert run("--record", str(workdir / "full.jsonl")) == 0
    ck = workdir / "ck"
    parts = workdir / "parts.jsonl"
    common = ("--checkpoint-dir", str(ck), "--record", str(parts))
    assert run("--max-batches", "7", *common) == 0
    assert [p.name for p in checkpoint_files(ck)] == ["ckpt-0000000007.json"]
    assert run("--resume", "--max-batches", "5", "--checkpoint-every", "2", *common) == 0
    assert checkpoint_files(ck)[-1].name == "ckpt-0000000012.json"
    assert len(checkpoint_files(ck)) == 3  # --keep 3
    assert run("--resume", *common) == 0
    full, resumed = _ids(workdir / "full.jsonl"), _ids(parts)
    assert len(full) > 12
    assert resumed == full
    final = json.loads(checkpoint_files(ck)[-1].read_text())
    assert all(lane["done"] for lane in final["lanes"].values())


def test_json_summary_and_resume_without_checkpoint(workdir: Path) -> None:
    proc = _zephon(
        "run", "pipeline.yaml", "--json", "--quiet", "--resume", "--checkpoint-dir", "ck",
        "--max-batches", "3", "--prometheus-file", "metrics.prom", cwd=workdir,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["status"] == "stopped" and summary["items"] == 3
    assert summary["samples"] == 12 and summary["tokens"] > 0
    assert summary["checkpoint"].endswith("ckpt-0000000003.json")
    assert summary["stats"]["operators"][0]["name"] == "fetch"
    prom = (workdir / "metrics.prom").read_text()
    assert 'zephon_pipeline_op_elements_in_total{op="tokenize"}' in prom
    assert without_cut_warning(proc.stderr) == ""  # --quiet: no note about the checkpoint


def test_resume_refuses_a_checkpoint_of_another_config(workdir: Path) -> None:
    assert main(["run", str(workdir / "pipeline.yaml"), "--quiet", "--max-batches", "2",
                 "--checkpoint-dir", str(workdir / "ck")]) == 0  # fmt: skip
    text = (workdir / "pipeline.yaml").read_text().replace("seed: 7", "seed: 8")
    (workdir / "other.yaml").write_text(text)
    proc = _zephon("run", "other.yaml", "--resume", "--checkpoint-dir", "ck", cwd=workdir)
    assert proc.returncode == 2
    assert "cannot resume from ck/ckpt-0000000002.json" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert "source.seed: checkpoint has 7, pipeline has 8" in proc.stderr
    assert "start a new --checkpoint-dir" in proc.stderr


@pytest.mark.parametrize(
    ("text", "extra", "needle"),
    [
        ("datasets: []", (), "bad.yaml: datasets: expected a non-empty list"),
        ("datasets: [{name: web, path: my-data}]", ("--resume",), "--resume needs"),
    ],
)
def test_json_run_refused_at_start_prints_a_json_object(
    workdir: Path, text: str, extra: tuple[str, ...], needle: str
) -> None:
    (workdir / "bad.yaml").write_text(text)
    proc = _zephon("run", "bad.yaml", "--json", *extra, cwd=workdir)
    assert proc.returncode == 2
    summary = json.loads(proc.stdout)
    assert summary["status"] == "failed" and summary["items"] == 0
    assert needle in summary["error"] and summary["config"] == "bad.yaml"
    assert proc.stderr.strip() == f"zephon run: error: {summary['error']}"


def test_stats_table_and_resume_usage_error(workdir: Path, capsys) -> None:
    assert main(["run", str(workdir / "pipeline.yaml"), "--quiet", "--stats"]) == 0
    out = capsys.readouterr().out
    assert "completed:" in out and "pack_flat" in out and "lanes" in out
    assert main(["run", str(workdir / "pipeline.yaml"), "--resume"]) == 2
    assert "--resume needs --checkpoint-dir" in capsys.readouterr().err


def test_metrics_server_serves_prometheus_text() -> None:
    server = MetricsServer(lambda: "zephon_pipeline_delivered_total 5\n")
    try:
        with urllib.request.urlopen(server.url, timeout=10) as resp:
            assert resp.status == 200
            assert resp.read().decode() == "zephon_pipeline_delivered_total 5\n"
        with pytest.raises(urllib.error.HTTPError):
            urllib.request.urlopen(server.url.replace("/metrics", "/other"), timeout=10)
    finally:
        server.close()


def test_epochs_from_the_file_and_the_command_line_resume_within_their_epoch(
    workdir: Path, capsys
) -> None:
    def run(*extra: str, config: str = "pipeline.yaml") -> int:
        return main(["run", str(workdir / config), "--quiet", *extra])

    def samples(path: Path) -> list[tuple[int, ...]]:
        return [tuple(s) for batch in _ids(path) for s in batch]

    assert run("--record", str(workdir / "e0.jsonl")) == 0
    assert run("--epoch", "1", "--record", str(workdir / "e1.jsonl")) == 0
    (workdir / "one.yaml").write_text((workdir / "pipeline.yaml").read_text() + "epoch: 1\n")
    assert run("--record", str(workdir / "file1.jsonl"), config="one.yaml") == 0
    e0, e1 = samples(workdir / "e0.jsonl"), samples(workdir / "e1.jsonl")
    assert e1 != e0 and len(set(e1)) == len(e1)  # (packed rows: ids of their first records)
    assert samples(workdir / "file1.jsonl") == e1
    # epoch 0 to its end, then epoch 1 in two parts, all in one checkpoint folder
    common = ("--checkpoint-dir", str(workdir / "ck"), "--record", str(workdir / "parts.jsonl"))
    assert run(*common) == 0
    assert run("--resume", "--epoch", "1", "--max-batches", "4", *common) == 0
    assert checkpoint_files(workdir / "ck")[-1].name == "ckpt-e000001-0000000004.json"
    capsys.readouterr()
    assert main(["checkpoint", "inspect", str(checkpoint_files(workdir / "ck")[-1]), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["epoch"] == 1
    assert run("--resume", "--epoch", "2", *common) == 2  # epoch 1 is not finished
    assert "middle of epoch 1; call set_epoch(1)" in capsys.readouterr().err
    assert run("--resume", *common) == 0  # no --epoch: the checkpoint's epoch goes on
    assert samples(workdir / "parts.jsonl") == e0 + e1


def test_lane_workers_from_the_config_file_record_the_inline_run_and_resume(
    workdir: Path,
) -> None:
    """``options.lane_workers`` passes through; a checkpoint moves between counts."""
    config = workdir / "pipeline.yaml"
    text = config.read_text().replace("canonical_replicas: 2", "canonical_replicas: 4")
    assert "canonical_replicas: 4" in text

    def run(option: str, *extra: str) -> int:
        config.write_text(text + option)
        return main(["run", str(config), "--quiet", "--json", *extra])

    assert run("  lane_workers: null\n", "--record", str(workdir / "full.jsonl")) == 0
    common = ("--checkpoint-dir", str(workdir / "ck"), "--record", str(workdir / "parts.jsonl"))
    assert run("  lane_workers: 2\n", "--max-batches", "9", *common) == 0
    assert run("  lane_workers: auto\n", "--resume", "--max-batches", "4", *common) == 0
    assert run("  lane_workers: 3\n", "--resume", *common) == 0
    full = _ids(workdir / "full.jsonl")
    assert len(full) > 13
    assert _ids(workdir / "parts.jsonl") == full
