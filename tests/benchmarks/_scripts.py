"""Run a benchmark script as its own process, as ``python benchmarks/NAME.py`` would."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def run_script(name: str, *args: str, cwd: Path, timeout: float = 600) -> tuple[Any, str]:
    """The script's final JSON line and its whole standard output; fails with its stderr."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*sys.path, str(BENCHMARKS)])}
    proc = subprocess.run(
        [sys.executable, str(BENCHMARKS / f"{name}.py"), *args],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stdout
