"""`zephon explain`, `checkpoint inspect/diff`, `bench`, and the command list."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.cli.conftest import ZEPHON, without_cut_warning
from zephon.cli import build_parser, main


def test_every_documented_command_is_registered() -> None:
    help_text = build_parser().format_help()
    for name in ("run", "explain", "index", "cache", "checkpoint", "bench", "capture", "demo"):
        assert name in help_text
    sub = build_parser().parse_args(["capture", "export", "o.jsonl", "--store", "memory://"])
    assert sub.func.__module__ == "zephon.cli._capture_tools"
    serve = build_parser().parse_args(
        ["capture", "serve", "--inference-server", "http://e", "--store", "x"]
    )
    assert serve.func.__name__ == "_serve"


def test_explain_formats(workdir: Path, capsys) -> None:
    cfg = str(workdir / "pipeline.yaml")
    assert main(["explain", cfg]) == 0
    text = capsys.readouterr().out
    assert "web (3 jsonl shards, rows counted when run)" in text and "pack_flat" in text
    assert "lanes=[0, 1]" in text and "* added by the engine: fetch" in text
    assert main(["index", str(workdir / "my-data")]) == 0  # index.json: rows known up front
    assert main(["explain", cfg, "--format", "json"]) == 0
    plan = json.loads(capsys.readouterr().out.split("\n", 1)[1])
    web = {"name": "web", "shards": 3, "formats": ["jsonl"], "rows": 600}
    assert plan["canonical_replicas"] == 2 and plan["datasets"] == [web]
    assert plan["stages"][0]["op_name"] == "fetch"
    assert main(["explain", cfg, "--format", "mermaid"]) == 0
    mermaid = capsys.readouterr().out
    assert mermaid.startswith("flowchart LR") and "s0 --> s1" in mermaid
    assert main(["explain", cfg, "--format", "dot"]) == 0
    dot = capsys.readouterr().out
    assert dot.startswith("digraph zephon {") and "s0 -> s1" in dot and dot.rstrip().endswith("}")
    (workdir / "bad.yaml").write_text("datasets: [{name: web, path: my-data}]\nrunner: 3\n")
    assert main(["explain", str(workdir / "bad.yaml")]) == 2
    assert "runner: expected one of" in capsys.readouterr().err


def test_explain_says_how_auto_chose(
    workdir: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ZEPHON_CPUS", "3")
    cfg = workdir / "pipeline.yaml"
    assert main(["explain", str(cfg)]) == 0
    assert "   tokenize: auto: 3 of 3 usable cores (ZEPHON_CPUS)" in capsys.readouterr().out
    yaml = cfg.read_text()
    cfg.write_text(yaml.replace("  - decode_text\n", "  - decode_text: {parallelism: auto}\n"))
    assert main(["explain", str(cfg), "--format", "json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    auto = {s["op_name"]: (s["parallelism"], s["auto"]) for s in plan["stages"] if s["auto"]}
    assert auto == {  # fused into one worker task: one share
        "decode_text": (3, "auto: 3 of 3 usable cores (ZEPHON_CPUS)"),
        "tokenize": (3, "auto: 3 of 3 usable cores (ZEPHON_CPUS)"),
    }
    cfg.write_text(yaml.replace("  - decode_text\n", "  - decode_text: {parallelism: fast}\n"))
    assert main(["explain", str(cfg)]) == 2
    assert "operators[0].parallelism" in capsys.readouterr().err


def _run(workdir: Path, ck: str, *extra: str) -> None:
    assert main(["run", str(workdir / "pipeline.yaml"), "--quiet", "--checkpoint-dir",
                 str(workdir / ck), *extra]) == 0  # fmt: skip


def test_checkpoint_inspect_and_diff(workdir: Path, capsys) -> None:
    _run(workdir, "a", "--max-batches", "4")
    _run(workdir, "a", "--resume", "--max-batches", "6")
    capsys.readouterr()
    a, b = sorted((workdir / "a").glob("ckpt-*.json"))
    assert main(["checkpoint", "inspect", str(workdir / "a"), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["file"] == str(b) and info["delivered"] == 10
    assert [lane["lane"] for lane in info["lanes"]] == [0, 1]
    assert info["operators"] == ["fetch", "decode_text", "tokenize", "pack_flat", "batch"]
    # still inside the first chunk: lane 0 delivered its first cut (32 records) and nothing
    # after it, lane 1 no cut yet; the file holds the held records' payloads, so a restore
    # re-reads none
    assert [(lane["restart_chunk"], lane["restart_offset"]) for lane in info["lanes"]] == [
        (0, 32),
        (0, 0),
    ]
    assert [lane["replay_cursor"] is None for lane in info["lanes"]] == [True, False]
    assert [lane["refetch"] for lane in info["lanes"]] == [0, 0]
    assert main(["checkpoint", "inspect", str(a)]) == 0
    shown = capsys.readouterr().out
    assert "lanes (4 items delivered)" in shown and "re-fetch" in shown

    assert main(["checkpoint", "diff", str(a), str(a)]) == 0
    assert "identical" in capsys.readouterr().out
    assert main(["checkpoint", "diff", str(a), str(b)]) == 1
    out = capsys.readouterr().out
    assert "first difference: lanes.0.delivered: A has 2, B has 5" in out
    assert "B is 6 items ahead of A" in out

    text = (workdir / "pipeline.yaml").read_text()
    text = text.replace("max_length: 256, pad", "max_length: 300, pad")
    (workdir / "pipeline.yaml").write_text(text)
    _run(workdir, "c", "--max-batches", "4")
    capsys.readouterr()
    (c,) = (workdir / "c").glob("ckpt-*.json")
    assert main(["checkpoint", "diff", str(a), str(c), "--json"]) == 1
    result = json.loads(capsys.readouterr().out)
    assert result["config_difference"] == {
        "key": "config.operators[3].config.max_length", "a": 256, "b": 300,
    }  # fmt: skip
    assert result["verdict"].startswith("different configurations")

    (workdir / "broken.json").write_text('{"format": "zephon.pipeline-checkpoint", "version": 1}')
    assert main(["checkpoint", "inspect", str(workdir / "broken.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("zephon checkpoint inspect: error:") and "broken.json" in err
    assert main(["checkpoint", "diff", str(a), str(workdir / "nothing.json")]) == 2


def test_bench_collects_json_lines_and_draws_plots(tmp_path: Path, capsys) -> None:
    out = tmp_path / "report.json"
    assert main(["bench", "--only", "sources", "--out", str(out), "--quiet"]) == 0
    report = json.loads(out.read_text())
    entry = report["benchmarks"]["sources"]
    assert entry["returncode"] == 0 and entry["args"] == ["--quick"]
    assert entry["result"]["benchmark"] == "sources"
    assert report["plots"] == [str(tmp_path / "bench-plots" / "sources.png")]
    assert (tmp_path / "bench-plots" / "sources.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["bench", "--only", "nope", "--out", str(out)]) == 2
    assert "unknown benchmark(s) ['nope']" in capsys.readouterr().err


@pytest.mark.parametrize(
    "command",
    [
        ["explain", "pipeline.yaml"],
        ["checkpoint", "inspect", "ck"],
        ["demo", "--docs", "64", "--shards", "1", "--data", "demo-data", "--runner", "inline"],
        ["run", "pipeline.yaml", "--quiet", "--max-batches", "2", "--stats"],
    ],
    ids=lambda command: command[0] if command[0] != "checkpoint" else "checkpoint-inspect",
)
def test_a_reader_that_goes_away_is_no_traceback(workdir: Path, command: list[str]) -> None:
    """``zephon explain p.yaml | head -1``: the pipe is closed before the output is written;
    every command stops quietly with the status of a tool killed by SIGPIPE."""
    if command[0] == "checkpoint":
        assert main(["run", str(workdir / "pipeline.yaml"), "--quiet", "--max-batches", "2",
                     "--checkpoint-dir", str(workdir / "ck")]) == 0  # fmt: skip
    read, write = os.pipe()
    os.close(read)  # every write now fails with EPIPE, whatever the timing
    proc = subprocess.run(
        [ZEPHON, *command], cwd=workdir, stdout=write,
        stderr=subprocess.PIPE, text=True, timeout=240,
    )  # fmt: skip
    os.close(write)
    assert proc.returncode == 141, proc.stderr
    assert without_cut_warning(proc.stderr) == ""  # no traceback, no broken-pipe noise


def test_checkpoint_inspect_names_each_lanes_pass(tmp_path: Path, capsys) -> None:
    """A merged checkpoint of ranks in different passes (format version 6)."""
    from tests.checkpoints.test_passes import uneven_state

    merged, _ = uneven_state()
    path = tmp_path / "merged.json"
    path.write_text(json.dumps(merged))
    assert main(["checkpoint", "inspect", str(path), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["epoch"] == 0 and [lane["epoch"] for lane in info["lanes"]] == [0, 1, 0, 1]
    assert main(["checkpoint", "inspect", str(path)]) == 0
    assert capsys.readouterr().out.count("in epoch 1") == 2
