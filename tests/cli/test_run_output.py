"""What ``zephon run`` prints into a log file (stdout and stderr not a terminal): no hard wrap,
a whole last progress line that never passes 100 %, a total and ETA after a resume, and the
records and tokens the operators dropped, counted in the summary."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

from tests.cli.conftest import PIPELINE_YAML, ZEPHON
from zephon.config import load_config

# pack_flat without truncation in tokenize: every document over 256 tokens is dropped
DROPPING_YAML = PIPELINE_YAML.replace("    max_length: 256\n    truncation: true\n", "")
PROGRESS = re.compile(r"([\d,]+)/([\d,]+) (samples|items)")


def _run(folder: Path, config: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [ZEPHON, "run", config, *args], cwd=folder, capture_output=True, text=True, timeout=120
    )


def _last_progress(stderr: str) -> tuple[str, int, int]:
    line = [ln for ln in stderr.splitlines() if PROGRESS.search(ln)][-1]
    done, total, _ = PROGRESS.search(line).groups()  # type: ignore[union-attr]
    return line, int(done.replace(",", "")), int(total.replace(",", ""))


def test_a_log_file_gets_whole_lines_and_a_progress_that_ends_at_100_percent(workdir: Path):
    long_name = "a-pipeline-configuration-file-with-a-rather-long-descriptive-name.yaml"
    (workdir / long_name).write_text(PIPELINE_YAML)
    proc = _run(workdir, long_name, "--checkpoint-dir", "ck", "--max-batches", "5")
    assert proc.returncode == 0, proc.stderr
    summary = proc.stdout.splitlines()[0]
    assert summary.startswith("stopped: 5 items, ") and summary.endswith("tokens/s)")
    line, done, total = _last_progress(proc.stderr)
    assert "…" not in line and line.endswith("tokens/s") and long_name in line
    assert done == total == 5 and "5/5 items" in line  # --max-batches: the run's end, in items

    proc = _run(workdir, long_name, "--checkpoint-dir", "ck", "--resume")
    assert proc.returncode == 0, proc.stderr
    line, done, resumed_total = _last_progress(proc.stderr)
    assert resumed_total == done == 600 and " samples " in line  # the pass, all of it done
    assert " eta " in line


def test_the_summary_counts_the_records_and_tokens_dropped(workdir: Path):
    (workdir / "drop.yaml").write_text(DROPPING_YAML)
    proc = _run(workdir, "drop.yaml", "--quiet", "--json")
    assert proc.returncode == 0, proc.stderr
    dropped = json.loads(proc.stdout)["dropped"]
    over = [n for n in _token_counts(workdir) if n > 256]  # what pack_flat cannot fit
    assert over  # the corpus has long documents
    assert dropped["by_reason"]["pack"] == len(over)
    assert set(dropped["by_reason"]) <= {"pack", "drop_last"}  # and the last partial batches
    # the partial batches' packed rows count their real tokens too
    extra = dropped["tokens"] - sum(over)
    assert extra > 0 if "drop_last" in dropped["by_reason"] else extra == 0
    assert dropped["records"] == sum(dropped["by_reason"].values())
    text = _run(workdir, "drop.yaml", "--quiet").stdout.splitlines()
    head = f"dropped: {dropped['records']:,} records ({dropped['tokens']:,} tokens): "
    assert text[1].startswith(head)
    assert f"pack {len(over):,}" in text[1]


def _token_counts(workdir: Path) -> list[int]:
    """Tokens of every document: the same datasets and tokenizer, nothing packed or dropped."""
    tokenize_only = DROPPING_YAML.split("  - pack_flat")[0] + "runner: inline\n"
    (workdir / "tokens.yaml").write_text(tokenize_only)
    return [len(r.payload["input_ids"]) for r in load_config(workdir / "tokens.yaml").build()]
