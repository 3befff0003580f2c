"""``zephon run --provenance``, ``zephon trace`` (by step and by document) and ``zephon diff``
on a two-dataset mixture, through the real command line."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.cli.conftest import ZEPHON
from tests.provenance._mixture import make_mixture
from zephon.checkpoints import load_checkpoint, refetch_counts
from zephon.cli import main
from zephon.config import load_config
from zephon.provenance import diff, read_log

DOCS = 200


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two identical runs on different runners, one with another shuffle seed."""
    root = tmp_path_factory.mktemp("runs")
    out: dict[str, Path] = {}
    for name, seed, runner in (("a", 11, "threads"), ("b", 11, "inline"), ("c", 12, "threads")):
        yaml = make_mixture(root / name, DOCS, shuffle_seed=seed, runner=runner)
        args = [str(yaml), "--quiet", "--provenance", str(root / name / "prov.parquet"),
                "--record", str(root / name / "record.jsonl")]  # fmt: skip
        if name == "a":
            args += ["--checkpoint-dir", str(root / "a" / "ckpt"), "--checkpoint-every", "40"]
            args += ["--keep", "100"]
        assert main(["run", *args]) == 0
        out[name] = root / name
    return out


def test_log_holds_every_step_once(runs: dict[str, Path]) -> None:
    table = read_log(runs["a"] / "prov.parquet")
    steps = table["step"].to_pylist()
    records = (runs["a"] / "record.jsonl").read_text().splitlines()
    assert sorted(set(steps)) == list(range(len(records)))
    firsts = [f for f in table["fingerprint"].to_pylist() if f]
    assert firsts == [json.loads(line)["fingerprint"] for line in records]


def test_trace_from_a_checkpoint_replays_only_from_it(
    runs: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    yaml = runs["a"] / "pipeline.yaml"
    capsys.readouterr()
    code = main(["trace", str(yaml), "--step", "93", "--checkpoint-dir",
                 str(runs["a"] / "ckpt"), "--json"])  # fmt: skip
    assert code == 0
    traced = json.loads(capsys.readouterr().out)
    assert traced["restored_from"].endswith("ckpt-0000000080.json")
    assert traced["replayed"] == 14
    line = (runs["a"] / "record.jsonl").read_text().splitlines()[93]
    assert traced["fingerprint"] == json.loads(line)["fingerprint"]
    table = read_log(runs["a"] / "prov.parquet").to_pylist()
    logged = [
        (
            r["row"],
            r["segment"],
            r["source"],
            r["line"],
            r["source_row"],
            r["start"],
            r["end"],
            r["source_start"],
            r["source_end"],
        )
        for r in table
        if r["step"] == 93
    ]
    shown = [
        (
            s["row"],
            s["segment"],
            s["source"],
            s["line"],
            s["source_row"],
            s["start"],
            s["end"],
            s["source_start"],
            s["source_end"],
        )
        for s in traced["segments"]
    ]
    assert shown == logged
    assert all(s["preview"] for s in traced["segments"])


def test_run_writes_held_records_and_trace_restores_either_form(
    runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``zephon run`` checkpoints hold the payloads of the records buffers hold (nothing to
    re-read at a restore); ``--no-held-records`` writes them by meta; both trace alike."""
    yaml = runs["a"] / "pipeline.yaml"
    held = load_checkpoint(runs["a"] / "ckpt" / "ckpt-0000000080.json")
    assert held["version"] == 5 and set(refetch_counts(held).values()) == {0}
    lean_dir = tmp_path / "lean"
    args = ["run", str(yaml), "--quiet", "--max-batches", "80", "--no-held-records"]
    assert main([*args, "--checkpoint-dir", str(lean_dir)]) == 0
    lean = load_checkpoint(lean_dir / "ckpt-0000000080.json")
    assert lean["version"] == 4 and sum(refetch_counts(lean).values()) > 0
    line = (runs["a"] / "record.jsonl").read_text().splitlines()[93]
    for directory in (runs["a"] / "ckpt", lean_dir):
        capsys.readouterr()
        code = main(["trace", str(yaml), "--step", "93", "--checkpoint-dir", str(directory),
                     "--json"])  # fmt: skip
        assert code == 0
        traced = json.loads(capsys.readouterr().out)
        assert traced["restored_from"].endswith("ckpt-0000000080.json")
        assert traced["fingerprint"] == json.loads(line)["fingerprint"]


def test_find_names_the_steps_that_trained_on_a_line(runs: dict[str, Path]) -> None:
    table = read_log(runs["a"] / "prov.parquet").to_pylist()
    seg = next(r for r in table if r["line"] is not None and r["step"] > 20)
    query = f"{seg['source']}:{seg['line']}"
    result = subprocess.run(
        [ZEPHON, "trace", str(runs["a"] / "prov.parquet"), "--find", query, "--json"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    hits = json.loads(result.stdout)["hits"]
    expected = {(r["step"], r["rank"]) for r in table
                if r["source"] == seg["source"] and r["line"] == seg["line"]}  # fmt: skip
    assert {(h["step"], h["rank"]) for h in hits} == expected
    assert (seg["step"], seg["rank"]) in expected


def test_find_by_sample_id_and_a_miss(
    runs: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    table = read_log(runs["a"] / "prov.parquet").to_pylist()
    parquet = next(r for r in table if r["line"] is None)
    sid = f"{parquet['dataset_id']}:{parquet['shard']}:{parquet['source_row']}"
    capsys.readouterr()
    assert main(["trace", str(runs["a"] / "prov.parquet"), "--find", sid]) == 0
    assert f"step {parquet['step']} " in capsys.readouterr().out
    assert main(["trace", str(runs["a"] / "prov.parquet"), "--find", "nowhere.jsonl:1"]) == 1


def test_find_by_dataset_name_and_by_a_row_typed_as_file_colon_row(
    runs: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    table = read_log(runs["a"] / "prov.parquet").to_pylist()
    parquet = next(r for r in table if r["line"] is None and r["step"] > 10)
    log = str(runs["a"] / "prov.parquet")
    expected = {(r["step"], r["rank"]) for r in table if r["source"] == parquet["source"]
                and r["source_row"] == parquet["source_row"]}  # fmt: skip
    for query in (
        f"{parquet['dataset']}:{parquet['shard']}:{parquet['source_row']}",
        f"{parquet['source']}:{parquet['source_row']}",
    ):
        capsys.readouterr()
        assert main(["trace", log, "--find", query, "--json"]) == 0, query
        hits = json.loads(capsys.readouterr().out)["hits"]
        assert {(h["step"], h["rank"]) for h in hits} == expected, query
    assert main(["trace", log, "--find", f"{parquet['source']}:{parquet['source_row']}"]) == 0
    assert f"{parquet['source']}#{parquet['source_row']} " in capsys.readouterr().out


def test_a_miss_answers_with_the_accepted_forms(
    runs: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    capsys.readouterr()
    assert main(["trace", str(runs["a"] / "prov.parquet"), "--find", "nosuch:0:12"]) == 1
    out = capsys.readouterr().out.strip()
    assert out.startswith("nosuch:0:12: not in the logged steps") and len(out.splitlines()) == 1
    names = sorted({r["dataset"] for r in read_log(runs["a"] / "prov.parquet").to_pylist()})
    assert "FILE#ROW" in out and "DATASET:SHARD:ROW" in out and ", ".join(names) in out


def test_diff_identical_runs_on_other_runners_and_another_seed(
    runs: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    for kind in ("prov.parquet", "record.jsonl"):
        assert diff(runs["a"] / kind, runs["b"] / kind) is None
        found = diff(runs["a"] / kind, runs["c"] / kind)
        assert found is not None and (found.only_a or found.only_b)
    capsys.readouterr()
    assert main(["diff", str(runs["a"] / "prov.parquet"), str(runs["c"] / "prov.parquet")]) == 1
    out = capsys.readouterr().out
    found = diff(runs["a"] / "prov.parquet", runs["c"] / "prov.parquet")
    assert found is not None and f"first difference at step {found.step} " in out
    assert main(["diff", str(runs["a"] / "prov.parquet"), str(runs["b"] / "prov.parquet")]) == 0


def _rewritten(log: Path, out: Path, change: Any) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = read_log(log)
    pq.write_table(pa.Table.from_pylist(change(table.to_pylist()), schema=table.schema), out)
    return out


def test_diff_reports_rows_moved_within_a_step_as_moves(
    tmp_path: Path, runs: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    log = runs["a"] / "prov.parquet"
    step = 17

    def swap_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        swap = {0: 1, 1: 0}
        for r in rows:
            if r["step"] == step and r["rank"] == 0 and r["row"] in swap:
                r["row"] = swap[r["row"]]
        return rows

    moved = _rewritten(log, tmp_path / "moved.parquet", swap_rows)
    found = diff(log, moved)
    assert found is not None and (found.step, found.only_a, found.only_b) == (step, [], [])
    logged = [r for r in read_log(log).to_pylist() if r["step"] == step and r["rank"] == 0]
    assert sorted((m["row_a"], m["row_b"]) for m in found.moved) == sorted(
        (r["row"], 1 - r["row"]) for r in logged if r["row"] in (0, 1)
    )
    assert found.stops is None
    capsys.readouterr()
    assert main(["diff", str(log), str(moved)]) == 1
    out = capsys.readouterr().out
    assert "only in" not in out and out.count("  moved: ") == len(found.moved)


@pytest.mark.parametrize("kind", ["prov.parquet", "record.jsonl"])
def test_diff_of_a_run_and_its_prefix_says_where_the_prefix_stops(
    tmp_path: Path, runs: dict[str, Path], capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    full = runs["a"] / kind
    if kind == "record.jsonl":
        prefix = tmp_path / "prefix.jsonl"
        prefix.write_text("".join(full.read_text().splitlines(keepends=True)[:30]))
    else:
        keep = _rewritten(full, tmp_path / "p.parquet", lambda rows: [r for r in rows
                          if r["step"] < 30])  # fmt: skip
        prefix = keep
    for a, b, stopper in ((full, prefix, "B"), (prefix, full, "A")):
        found = diff(a, b)
        assert found is not None and (found.step, found.stops) == (30, stopper)
        capsys.readouterr()
        assert main(["diff", str(a), str(b)]) == 1
        out = capsys.readouterr().out
        assert f"{stopper} stops at step 30" in out and "None" not in out


def test_diff_names_a_later_first_step(tmp_path: Path, runs: dict[str, Path]) -> None:
    """Runs equal up to a step and different after it: diff names exactly that step."""
    lines = (runs["a"] / "record.jsonl").read_text().splitlines()
    other = (runs["c"] / "record.jsonl").read_text().splitlines()
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text("\n".join(lines[:57] + other[57:]) + "\n")
    found = diff(runs["a"] / "record.jsonl", mixed)
    assert found is not None and found.step == 57


def test_resume_cuts_the_log_back_to_the_checkpoint(tmp_path: Path) -> None:
    yaml = make_mixture(tmp_path, DOCS)
    log, ckpt = tmp_path / "prov.parquet", tmp_path / "ckpt"
    base = [str(yaml), "--quiet", "--provenance", str(log), "--checkpoint-dir", str(ckpt)]
    assert main(["run", *base, "--max-batches", "30"]) == 0
    # steps logged past the checkpoint (a crash after a flush) are cut on resume
    from zephon.provenance import ProvenanceLog

    extra = ProvenanceLog(log, start_step=10**6)
    extra.write(next(iter(load_config(yaml).build())), step=30)
    extra.close()
    assert main(["run", *base, "--resume"]) == 0
    whole = tmp_path / "whole.parquet"
    assert main(["run", str(yaml), "--quiet", "--provenance", str(whole)]) == 0
    assert diff(log, whole) is None


def test_trace_errors_are_one_line(
    runs: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    yaml = runs["a"] / "pipeline.yaml"
    assert main(["trace", str(yaml)]) == 2
    assert main(["trace", str(yaml), "--step", "3", "--rank", "4"]) == 2
    assert main(["trace", str(yaml), "--step", "100000", "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all(e.startswith("zephon trace: error: ") for e in err)
    assert "rank 4" in err[1] and "ends before step 100000" in err[2]
