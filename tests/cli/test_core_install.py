"""With only the core install (every optional dependency blocked in a real subprocess), each
command imports and shows its help, and a feature that needs an extra fails with one line
naming the ``pip install 'zephon[EXTRA]'`` that fixes it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

CORE_ONLY = str(Path(__file__).with_name("_core_only.py"))


def core_only(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, CORE_ONLY, *args], cwd=cwd, capture_output=True, text=True, timeout=120
    )


def test_every_command_imports_and_shows_help_without_extras() -> None:
    proc = core_only("--help-all")
    assert proc.returncode == 0, proc.stderr
    assert "help ok for" in proc.stdout


def test_the_blocker_really_blocks() -> None:
    proc = subprocess.run(
        [sys.executable, "-c",
         f"import runpy, sys; sys.argv = [{CORE_ONLY!r}, '--version']; "
         f"runpy.run_path({CORE_ONLY!r}, run_name='__main__')"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 0 and "zephon" in proc.stdout
    code = (
        "import runpy, sys; sys.argv = ['x', '--version']\n"
        f"mod = runpy.run_path({CORE_ONLY!r})\n"
        "sys.meta_path.insert(0, mod['Blocker']())\n"
        "import jinja2\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert "ModuleNotFoundError: No module named 'jinja2'" in proc.stderr


@pytest.mark.parametrize(
    ("yaml_text", "args", "extra"),
    [
        ("datasets: [{name: d, path: data}]\n"
         "operators: [{op: tokenize_chat, tokenizer: bytes, field: messages, "
         "chat_template: '{{ messages }}'}]\n", ("run", "p.yaml", "--quiet"), "chat"),
        ("datasets: [{name: d, path: 's3://bucket/data.jsonl'}]\n", ("explain", "p.yaml"), "s3"),
        ("datasets: [{name: d, path: data}]\n", ("run", "p.yaml", "--quiet", "--runner", "ray"),
         "ray"),
    ],
)  # fmt: skip
def test_a_missing_extra_is_one_line_naming_it(
    tmp_path: Path, yaml_text: str, args: tuple[str, ...], extra: str
) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "a.jsonl").write_text('{"messages": [], "text": "a"}\n')
    (tmp_path / "p.yaml").write_text(yaml_text)
    proc = core_only(*args, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    (line,) = [ln for ln in proc.stderr.splitlines() if "error:" in ln]
    assert line.endswith(f"which is not installed: pip install 'zephon[{extra}]'"), line
    assert "Traceback" not in proc.stderr


PG = "postgresql://zephon@127.0.0.1:1/none"


@pytest.mark.parametrize("args", [
    ("capture", "inspect", "r", "--store", PG),
    ("capture", "export", "out.jsonl", "--store", PG, "--all"),
    ("capture", "conformance", PG),
])  # fmt: skip
def test_capture_tools_without_psycopg_say_which_extra(tmp_path: Path, args) -> None:
    proc = core_only(*args, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.rstrip().endswith("not installed: pip install 'zephon[postgres]'")


# A benchmark script that needs an extra the core install lacks (blocked as in _core_only).
NEEDS_DATASETS = f"""\
import runpy, sys
sys.meta_path.insert(0, runpy.run_path({CORE_ONLY!r})["Blocker"]())
import datasets
"""


def test_bench_names_the_extra_a_benchmark_and_the_plots_need(tmp_path: Path) -> None:
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "needs_hf.py").write_text(NEEDS_DATASETS)
    proc = core_only("bench", "--benchmarks-dir", "bench", "--only", "needs_hf", cwd=tmp_path)
    assert proc.returncode == 1
    text = " ".join(proc.stderr.split())  # rich may wrap a long line outside a terminal
    assert (
        "needs_hf failed: needs datasets, which is not installed: pip install 'zephon[hf]'" in text
    )
    assert "needs matplotlib, which is not installed: pip install 'zephon[plots]'" in text
