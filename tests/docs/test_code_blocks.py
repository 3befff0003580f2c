"""Every code block of docs/ runs (docs/index.md, "How the examples are tested").

Each page runs in its own fresh temp dir that holds ``my-data/`` exactly as
``zephon demo --data my-data --docs 2000 --shards 4`` leaves it (the documented setup), with
the installed ``zephon`` command first on PATH.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.docs._blocks import KINDS, blocks
from tests.docs._run_page import PROGRESS
from zephon.demo import make_corpus

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted((ROOT / "docs").glob("*.md"))
# Seconds a page may take: a few start real multi-process jobs (torchrun, accelerate launch).
PAGE_TIMEOUT_S = {"training-loop.md": 900}
DEFAULT_PAGE_TIMEOUT_S = 110
SITE = Path(__file__).with_name("_extras_site")
RUNNER = Path(__file__).with_name("_run_page.py")
INSTALL = re.compile(r"^Install: `pip install (zephon|'zephon\[([a-z0-9,]+)\]')`")


def page_extras(page: Path) -> list[str]:
    """The extras a page declares on its ``Install:`` line (none: the core install)."""
    found = [m for line in page.read_text().splitlines() if (m := INSTALL.match(line))]
    assert len(found) == 1, f"{page.name}: needs one line `Install: \\`pip install ...\\``"
    return found[0].group(2).split(",") if found[0].group(2) else []


def _page_param(page: Path) -> object:
    limit = PAGE_TIMEOUT_S.get(page.name, DEFAULT_PAGE_TIMEOUT_S)
    return pytest.param(page, id=page.name, marks=pytest.mark.timeout(limit + 10))


@pytest.fixture(scope="session")
def demo_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_corpus(tmp_path_factory.mktemp("docs-data") / "my-data", docs=2000, shards=4)


def test_every_block_has_a_known_kind() -> None:
    unknown = [
        f"{b.where} (```{b.lang})" for page in PAGES for b in blocks(page) if b.kind == "unknown"
    ]
    assert not unknown, (
        f"code blocks need one of {sorted(KINDS)} (docs/index.md explains which runs): {unknown}"
    )


def test_pages_have_runnable_examples() -> None:
    names = {p.name for p in PAGES}
    for page in (
        "index.md", "yaml.md", "cli.md", "training-loop.md", "capture-quickstart.md",
        "capture.md", "capture-proxy.md", "capture-stores.md", "lineage.md",
        "datasets.md", "packing.md", "work-sources.md", "sft.md",
    ):  # fmt: skip
        assert page in names
        assert any(b.kind in ("python", "shell") for b in blocks(ROOT / "docs" / page)), page


def test_every_page_names_the_install_it_needs() -> None:
    extras = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    ) - {"dev"}
    for page in PAGES:
        assert set(page_extras(page)) <= extras, f"{page.name}: not extras of pyproject.toml"


def run_plan(plan: list[dict], cwd: Path, extras: list[str], timeout: float) -> str | None:
    """Run PLAN's blocks in CWD as a page's test does; the failure, or None when every block ran."""
    (cwd / ".plan.json").write_text(json.dumps(plan))
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    # only the page's extras importable; this checkout's source first
    env["PYTHONPATH"] = os.pathsep.join([str(SITE), str(ROOT / "src"), str(ROOT)])
    env["ZEPHON_DOCS_EXTRAS"] = ",".join(extras)
    env["ZEPHON_CACHE_DIR"] = str(cwd / ".cache")
    proc = subprocess.run(
        [sys.executable, str(RUNNER), ".plan.json"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if proc.returncode != 0:
        return proc.stderr[-6000:]
    progress_file = cwd / PROGRESS
    progress = json.loads(progress_file.read_text()) if progress_file.exists() else None
    if progress is None or progress["ran"] != len(plan):
        where = progress["where"] if progress else "the first block"
        return (
            f"{where}: the page's process ended (exit 0) inside this block, so the later blocks "
            "never ran: a block must not end the interpreter (os._exit, "
            "zephon.distributed.exit_rank); run that only where the script is launched, "
            'e.g. under `if "RANK" in os.environ:`'
        )
    return None


@pytest.mark.parametrize("page", [_page_param(p) for p in PAGES])
def test_page_blocks_run(page: Path, tmp_path: Path, demo_data: Path) -> None:
    todo = [b for b in blocks(page) if b.kind != "unknown"]
    if not any(b.kind in ("python", "shell", "yaml", "json") or b.file for b in todo):
        assert all(b.kind == "text" for b in todo)
    shutil.copytree(demo_data, tmp_path / "my-data")
    plan = [{"where": b.where, "kind": b.kind, "code": b.code, "file": b.file} for b in todo]
    timeout = PAGE_TIMEOUT_S.get(page.name, DEFAULT_PAGE_TIMEOUT_S)
    failure = run_plan(plan, tmp_path, page_extras(page), timeout)
    assert failure is None, failure


def test_a_block_that_ends_the_process_fails_its_page(tmp_path: Path) -> None:
    plan = [
        {"where": "page.md:1", "kind": "python", "code": "x = 1\n", "file": None},
        {"where": "page.md:5", "kind": "python", "code": "import os\nos._exit(0)\n", "file": None},
        {"where": "page.md:9", "kind": "shell", "code": "touch later-ran\n", "file": None},
    ]
    failure = run_plan(plan, tmp_path, [], DEFAULT_PAGE_TIMEOUT_S)
    assert failure is not None and failure.startswith("page.md:5: the page's process ended")
    assert not (tmp_path / "later-ran").exists()
    plan[1]["code"] = "import os\n"
    assert run_plan(plan, tmp_path, [], DEFAULT_PAGE_TIMEOUT_S) is None
    assert (tmp_path / "later-ran").exists()
