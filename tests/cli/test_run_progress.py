"""The progress of ``zephon run`` measures the work: a 70/30 token mixture whose faster dataset
repeats, read through a shuffle buffer, shows the right total and ETA at a quarter, half and
three quarters of the run and after a resume; a run that cannot know its total shows none; and
``--log-every`` lines stand on their own lines beside the bar in a terminal."""

from __future__ import annotations

import io
import os
import pty
import re
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from tests.cli.conftest import ZEPHON
from zephon._progress import WorkCount, progress_bar
from zephon.checkpoints import latest_checkpoint
from zephon.cli._report import done_before, show
from zephon.config import load_config
from zephon.demo import make_corpus

MIXED_YAML = """\
datasets:
  - name: web
    path: web
  - name: code
    path: code
mixture: {weights: {web: 0.7, code: 0.3}, unit: tokens}
source:
  chunk_size: 64
  seed: 3
  shuffle_within_shard: true
operators:
  - decode_text
  - op: tokenize
    tokenizer: bytes
    max_length: 256
    truncation: true
  - op: shuffle
    buffer_size: 500
    seed: 5
  - pack_flat: {max_length: 512, pad_token_id: 0}
  - op: batch
    microbatch_size: 4
runner: threads
options:
  canonical_replicas: 2
"""
ROWS = 2000 + 500  # web + code: one pass of each
POINTS = (0.25, 0.5, 0.75)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    here = tmp_path_factory.mktemp("mixed")
    make_corpus(here / "web", docs=2000, shards=3, seed=1)
    make_corpus(here / "code", docs=500, shards=2, seed=2)
    (here / "mixed.yaml").write_text(MIXED_YAML)
    (here / "endless.yaml").write_text(
        MIXED_YAML.replace("  seed: 3\n", "  seed: 3\n  exhausted_policy: repeat\n")
    )
    return here


class Clock:
    """The bar's clock: one tick per delivered item, so the true time left is the items left."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _drive(pipe: Any, count: WorkCount) -> list[tuple[int, int | None, float | None]]:
    """Iterate ``pipe`` under a bar; per item (completed, total, eta) as the bar shows them."""
    clock = Clock()
    bar = progress_bar(Console(file=io.StringIO()), "samples", get_time=clock)
    start = count.before or 0
    task = bar.add_task("run", total=count.total, completed=start, rates="", of="")
    seen = []
    for items, _ in enumerate(pipe, start=1):
        clock.now += 1.0
        show(bar, task, count.done(), (items, 0), clock.now)
        shown = bar.tasks[0]
        seen.append((int(shown.completed), shown.total, shown.time_remaining))
    return seen


def _check(seen: list[tuple[int, int | None, float | None]], truth: int, before: int) -> None:
    """At 25/50/75 % of the items: total == the samples the run did, done and ETA within 10 %."""
    n = len(seen)
    for point in POINTS:
        i = round(n * point)
        completed, total, eta = seen[i - 1]
        assert total == truth
        assert abs(completed - before - (truth - before) * i / n) <= 0.1 * (truth - before)
        assert eta is not None and abs(eta - (n - i)) <= 0.1 * (n - i), (point, eta, n - i)


def test_a_token_mixture_with_repeats_and_a_shuffle_shows_the_true_total_and_eta(folder: Path):
    pipe = load_config(folder / "mixed.yaml").build()
    count = WorkCount(pipe)
    seen = _drive(pipe, count)
    truth = count.done()  # every sample the run read, each counted once it was done
    assert truth > ROWS  # the faster dataset repeated (the old total, the rows, was short)
    _check(seen, truth, 0)


def test_after_a_resume_the_bar_starts_at_the_work_done_and_the_eta_is_for_the_rest(
    folder: Path, tmp_path: Path
):
    full = load_config(folder / "mixed.yaml").build()
    items = sum(1 for _ in full)
    config = tmp_path / "mixed.yaml"
    config.write_text(MIXED_YAML.replace("path: ", f"path: {folder}/"))
    stop = [ZEPHON, "run", str(config), "--checkpoint-dir", str(tmp_path / "ck")]
    proc = subprocess.run(
        [*stop, "--max-batches", "140"], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    assert "140/140 items" in proc.stderr  # --max-batches: items against the run's own end

    latest = latest_checkpoint(tmp_path / "ck")
    assert latest is not None
    before = done_before(latest.state)
    resumed = load_config(config).build()
    resumed.restore(latest.state)
    count = WorkCount(resumed, before)
    assert before is not None and count.total is not None
    assert 0.3 * count.total < before < 0.5 * count.total  # 140 of 349 items
    seen = _drive(resumed, count)
    assert len(seen) + 140 == items
    assert count.done() == count.total  # the samples before the checkpoint, then the rest: all
    _check(seen, count.total, before)

    proc = subprocess.run([*stop, "--resume"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    done, total = re.findall(r"([\d,]+)/([\d,]+) samples", proc.stderr)[-1]
    assert done == total == f"{count.total:,}"


def test_a_run_that_cannot_know_its_total_shows_none(folder: Path):
    pipe = load_config(folder / "endless.yaml").build()  # the datasets repeat without end
    assert WorkCount(pipe).total is None
    mixed = load_config(folder / "mixed.yaml").build()
    state = mixed.checkpoint()  # written by the API: it does not say what was done before
    assert done_before(state) is None and WorkCount(mixed, None).total is None

    out = Console(file=io.StringIO(), width=200)
    bar = progress_bar(out, "samples")
    task = bar.add_task("run", total=None, rates="", of="")
    for items, _ in enumerate(pipe, start=1):
        show(bar, task, WorkCount(pipe).done(), (items, 0), 1.0)
        if items == 20:
            break
    line = _render(bar)
    assert "samples" in line and "/" not in line.split("samples")[0] and "eta" not in line


def test_work_past_a_wrong_total_drops_the_total_instead_of_freezing_the_bar():
    bar = progress_bar(Console(file=io.StringIO(), width=200), "samples")
    task = bar.add_task("run", total=100, rates="", of="/100")
    show(bar, task, 90, (1, 0), 1.0)
    assert bar.tasks[0].total == 100 and not bar.tasks[0].finished
    show(bar, task, 130, (2, 0), 2.0)
    assert bar.tasks[0].total is None and bar.tasks[0].completed == 130
    # A state, not a time: rich stops a finished task's clock, so this keeps elapsed running.
    assert not bar.tasks[0].finished
    assert "130 samples" in _render(bar)


def _render(bar: Any) -> str:
    out = Console(width=200, record=True, file=io.StringIO())
    out.print(bar.get_renderable())
    return out.export_text()


def test_log_every_lines_stand_on_their_own_lines_beside_the_bar(folder: Path):
    master, slave = pty.openpty()  # stderr is a terminal: the bar is live
    proc = subprocess.Popen(
        [ZEPHON, "run", "mixed.yaml", "--log-every", "0.001"],
        cwd=folder,
        stdout=subprocess.PIPE,
        stderr=slave,
        env={**os.environ, "COLUMNS": "160", "TERM": "xterm"},
    )
    os.close(slave)
    chunks: list[bytes] = []

    def read() -> None:
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:  # the run closed its terminal
                return
            if not data:
                return
            chunks.append(data)

    reader = threading.Thread(target=read)
    reader.start()
    stdout, _ = proc.communicate(timeout=300)
    reader.join(timeout=60)
    os.close(master)
    assert proc.returncode == 0, stdout
    err = b"".join(chunks).decode("utf-8", "replace")
    logged = list(re.finditer(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} ", err))
    assert logged, err[-2000:]
    for match in logged:
        before = err[: match.start()]
        # what precedes a log line is a line end or the erase of the bar's line, never the bar
        assert before == "" or before.endswith(("\n", "\x1b[2K", "\r")), repr(before[-80:])
        line = err[match.start() :].split("\n", 1)[0]
        assert "samples/s" not in line and "━" not in line, repr(line)
