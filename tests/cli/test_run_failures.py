"""``zephon run`` on bad data, damaged checkpoints and runs that deliver nothing: every failure
says what went wrong, where, and loses nothing already delivered."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.cli.conftest import PIPELINE_YAML, ZEPHON, without_cut_warning
from tests.engine._gate import WAIT_S, wait_for
from zephon.demo import make_corpus

REPO = Path(__file__).resolve().parents[2]


def zephon(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)])}
    return subprocess.run(
        [ZEPHON, *args], cwd=cwd, capture_output=True, text=True, timeout=120, env=env
    )


def with_fetch(on_error: str) -> str:
    return PIPELINE_YAML.replace("operators:", f"fetch: {{on_error: {on_error}}}\noperators:")


def plant_bad_lines(folder: Path, lines: tuple[int, ...]) -> list[tuple[str, int]]:
    """Break one line in each of the shards; (file name, 1-based line) of each."""
    planted = []
    for shard, line in zip(sorted(folder.glob("*.jsonl")), lines, strict=True):
        rows = shard.read_text().splitlines()
        rows[line - 1] = rows[line - 1][: len(rows[line - 1]) // 2]  # cut mid-record
        shard.write_text("\n".join(rows) + "\n")
        planted.append((shard.name, line))
    return planted


@pytest.mark.timeout(180)
def test_raise_then_resume_with_skip_equals_an_uninterrupted_skip_run(tmp_path: Path):
    workdir = tmp_path
    make_corpus(workdir / "my-data", docs=3000, shards=3)
    planted = plant_bad_lines(workdir / "my-data", (413, 871, 562))
    (workdir / "raise.yaml").write_text(with_fetch("raise"))
    (workdir / "skip.yaml").write_text(with_fetch("skip"))
    clean = zephon("run", "skip.yaml", "--quiet", "--record", "expected.jsonl",
                   "--quarantine", "expected-q.jsonl", cwd=workdir)  # fmt: skip
    assert clean.returncode == 0, clean.stderr

    common = ("--quiet", "--checkpoint-dir", "ck", "--record", "got.jsonl")
    # inline: how far it gets before the bad record does not depend on thread timing; the
    # resume runs on threads (the runner is not part of a checkpoint's configuration)
    failed = zephon("run", "raise.yaml", *common, "--runner", "inline", cwd=workdir)
    assert failed.returncode == 1
    error = failed.stderr.strip().splitlines()[-1]
    assert error.startswith("zephon run: error: ") and "malformed JSON" in error
    assert "`fetch: {on_error: skip}`" in error and "resume" in error  # what the test does next
    assert any(f"{name}, line {line}" in error for name, line in planted)
    delivered = (workdir / "got.jsonl").read_text().count("\n")
    assert delivered > 0  # it failed mid-run, and checkpointed what it had delivered
    assert (workdir / "ck" / f"ckpt-{delivered:010d}.json").exists()

    resumed = zephon("run", "skip.yaml", *common, "--resume", cwd=workdir)
    assert resumed.returncode == 0, resumed.stderr
    assert (workdir / "got.jsonl").read_bytes() == (workdir / "expected.jsonl").read_bytes()
    quarantined = [json.loads(x) for x in (workdir / "ck" / "quarantine.jsonl").read_text()
                   .splitlines()]  # fmt: skip
    assert sorted((Path(q["file"]).name, q["line"]) for q in quarantined) == planted
    assert all("malformed JSON" in q["reason"] for q in quarantined)
    assert not any("on_error" in q["reason"] for q in quarantined)  # the hint: not for a skip
    for name, line in planted:  # logged once each, naming file and line
        assert resumed.stderr.count(f"{name}, line {line}") == 1, resumed.stderr


def checkpoints_of_a_stopped_run(workdir: Path) -> list[Path]:
    args = ("--quiet", "--checkpoint-dir", "ck", "--max-batches", "12", "--checkpoint-every", "4")
    done = zephon("run", "pipeline.yaml", *args, "--record", "got.jsonl", cwd=workdir)
    assert done.returncode == 0, done.stderr
    files = sorted((workdir / "ck").glob("ckpt-*.json"))
    assert [f.name for f in files] == [f"ckpt-{n:010d}.json" for n in (4, 8, 12)]
    return files


def damage(path: Path, how: str) -> str:
    """Damage a checkpoint file; the words the refusal must contain."""
    text = path.read_text()
    if how == "empty":
        path.write_text("")
        return "the file is empty"
    if how == "truncated":
        path.write_text(text[: len(text) // 2])
        return "not valid JSON"
    if how == "edited":
        state = json.loads(text)
        state["lanes"]["0"]["delivered"] += 1
        path.write_text(json.dumps(state))
        return "edited or damaged after it was written"
    path.write_text(json.dumps({"format": "something-else", "version": 1}))
    return "not a zephon pipeline checkpoint"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", ["empty", "truncated", "edited", "foreign"])
def test_a_damaged_newest_checkpoint_falls_back_to_the_one_before(workdir: Path, how: str):
    full = zephon("run", "pipeline.yaml", "--quiet", "--record", "full.jsonl", cwd=workdir)
    assert full.returncode == 0
    newest = checkpoints_of_a_stopped_run(workdir)[-1]
    words = damage(newest, how)

    inspect = zephon("checkpoint", "inspect", str(newest), cwd=workdir)
    assert inspect.returncode == 2
    assert newest.name in inspect.stderr and words in inspect.stderr
    listing = zephon("checkpoint", "inspect", "ck", cwd=workdir)
    assert listing.returncode == 0
    assert "invalid, skipped" in listing.stdout and "ckpt-0000000008.json" in listing.stdout

    resumed = zephon("run", "pipeline.yaml", "--quiet", "--checkpoint-dir", "ck", "--resume",
                     "--record", "got.jsonl", "--json", cwd=workdir)  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr
    assert newest.name in resumed.stderr and words in resumed.stderr
    assert "resuming from the newest valid checkpoint" in resumed.stderr
    assert json.loads(resumed.stdout)["resumed_from"].endswith("ckpt-0000000008.json")
    assert (workdir / "got.jsonl").read_bytes() == (workdir / "full.jsonl").read_bytes()
    assert not newest.exists() and newest.with_name(newest.name + ".invalid").exists()


def test_only_damaged_checkpoints_refuse_to_start_over(workdir: Path):
    for path in checkpoints_of_a_stopped_run(workdir):
        path.write_text("")
    resumed = zephon("run", "pipeline.yaml", "--quiet", "--checkpoint-dir", "ck", "--resume",
                     cwd=workdir)  # fmt: skip
    assert resumed.returncode == 2
    assert "cannot resume: no valid checkpoint in ck" in resumed.stderr


def test_checkpoint_inspect_reports_a_valid_checkpoint(workdir: Path):
    newest = checkpoints_of_a_stopped_run(workdir)[-1]
    shown = zephon("checkpoint", "inspect", str(newest), "--json", cwd=workdir)
    info = json.loads(shown.stdout)
    assert info["valid"] is True and len(info["checksum"]) == 16 and info["delivered"] == 12


def test_checkpoint_every_without_a_directory_is_a_usage_error(workdir: Path):
    done = zephon("run", "pipeline.yaml", "--checkpoint-every", "5", cwd=workdir)
    assert done.returncode == 2
    assert "--checkpoint-every needs --checkpoint-dir" in done.stderr


def test_a_run_that_delivers_nothing_names_the_operator(workdir: Path):
    text = PIPELINE_YAML.replace(
        "  - decode_text\n",
        "  - decode_text\n  - {op: filter, predicate: 'tests.cli._custom_ops:never'}\n",
    )
    (workdir / "none.yaml").write_text(text)
    done = zephon("run", "none.yaml", "--quiet", cwd=workdir)
    assert done.returncode == 0
    assert "the run delivered nothing: operator 'filter' received 600 records" in done.stderr
    strict = zephon("run", "none.yaml", "--quiet", "--strict", cwd=workdir)
    assert strict.returncode == 1 and "operator 'filter'" in strict.stderr


def test_runner_ray_without_ray_is_a_configuration_error(workdir: Path):
    fake = workdir / "no-ray" / "ray"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('ray is not installed here')\n")
    env = {**os.environ, "PYTHONPATH": f"{fake.parent}{os.pathsep}{REPO}"}
    command = [ZEPHON, "run", "pipeline.yaml", "--quiet", "--runner", "ray"]
    done = subprocess.run(command, cwd=workdir, capture_output=True, text=True, env=env, timeout=99)
    assert done.returncode == 2
    assert "pip install 'zephon[ray]'" in done.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize(("value", "shown"), [("null", "null"), ("17", "a number")])
def test_a_non_string_text_field_names_file_line_and_field(
    tmp_path: Path, value: str, shown: str
) -> None:
    data = tmp_path / "my-data"
    data.mkdir()
    rows = ['{"text": "fine"}'] * 5
    rows[3] = '{"text": ' + value + "}"
    (data / "a.jsonl").write_text("\n".join(rows[:2]) + "\n\n" + "\n".join(rows[2:]) + "\n")
    (tmp_path / "pipeline.yaml").write_text(PIPELINE_YAML)
    proc = zephon("run", "pipeline.yaml", "--quiet", cwd=tmp_path)
    assert proc.returncode == 1
    line = proc.stderr.strip().splitlines()[-1]
    assert f"{data / 'a.jsonl'}, line 5: " in line  # row 3 is line 5: a blank line before it
    assert f"field 'text' of record (0, 0, 3) is {shown}, expected str or bytes" in line


@pytest.mark.parametrize(("name", "text", "extra"), [
    ("tokenizer.json", "not json at all", ""),
    ("tokenizer_config.json", '{"model_max_length": 512}', "that is a transformers config"),
])  # fmt: skip
def test_a_broken_tokenizer_file_is_one_line_naming_it(workdir: Path, name, text, extra):
    (workdir / name).write_text(text)
    config = PIPELINE_YAML.replace("tokenizer: bytes", f"tokenizer: {workdir / name}")
    (workdir / "tok.yaml").write_text(config)
    proc = zephon("run", "tok.yaml", "--quiet", cwd=workdir)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert f"tokenizer file {workdir / name} cannot be read" in proc.stderr and extra in proc.stderr


HUNGRY_OP = "  - op: map_transform\n    fn: 'tests.cli._custom_ops:hungry'\n"
HUNGRY_YAML = PIPELINE_YAML.replace("  - pack_flat:", f"{HUNGRY_OP}  - pack_flat:")


@pytest.mark.timeout(180)
@pytest.mark.parametrize("runner", ["threads", "process"])
def test_a_memory_error_in_an_operator_names_it_and_what_to_lower(workdir: Path, runner: str):
    (workdir / "hungry.yaml").write_text(HUNGRY_YAML)
    failed = zephon("run", "hungry.yaml", "--quiet", "--runner", runner, cwd=workdir)
    assert failed.returncode == 1, failed.stderr
    assert "Traceback" not in failed.stderr
    error = failed.stderr.strip().splitlines()[-1]
    assert error.startswith("zephon run: error: operator '") and "map_transform" in error
    assert "MemoryError: out of memory: lower the operator's parallelism" in error
    assert "queue_size and max_inflight" in error and "raise the memory limit" in error


GATE_OP = "  - op: map_transform\n    fn: 'tests.cli._custom_ops:gate'\n"
GATE_YAML = PIPELINE_YAML.replace("  - decode_text\n", f"{GATE_OP}  - decode_text\n")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("runner", ["threads", "process"])
def test_a_shard_renamed_over_during_a_run_stops_it_naming_the_file(workdir: Path, runner: str):
    (workdir / "gate.yaml").write_text(GATE_YAML)
    shards = sorted((workdir / "my-data").glob("*.jsonl"))
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)]),
        "ZEPHON_TEST_GATE": str(workdir),
    }
    command = [ZEPHON, "run", "gate.yaml", "--quiet", "--runner", runner]
    with subprocess.Popen(
        command, cwd=workdir, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    ) as proc:
        try:
            assert wait_for(workdir / "reached")  # the run holds its first records
            for shard in shards:  # same rows, other words, renamed over the shard
                fresh = shard.with_suffix(".new")
                fresh.write_text(shard.read_text().replace("a", "b"))
                os.replace(fresh, shard)
        finally:
            (workdir / "open").touch()
        _, stderr = proc.communicate(timeout=WAIT_S)
    stderr = without_cut_warning(stderr)
    assert proc.returncode == 1, stderr
    assert stderr.count("\n") == 1 and "Traceback" not in stderr, stderr
    assert "was replaced by another file while the run was reading it" in stderr
    assert any(str(shard) in stderr for shard in shards), stderr
