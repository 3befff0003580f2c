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
