"""Checkpoint files: atomic writes, every kind of damage refused by name, newest valid found."""

from __future__ import annotations

import json
import os
import resource
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import zephon
from zephon import Dataset, Pipeline, StaticMixtureWorkSource
from zephon.checkpoints import (
    checkpoint_files,
    checkpoint_path,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
    seal,
)
from zephon.errors import CheckpointError


def state_after(items: int) -> dict:
    rows = [{"text": f"doc {i}"} for i in range(64)]
    source = StaticMixtureWorkSource([Dataset.from_records("d", rows)], chunk_size=8)
    pipe = Pipeline(source).decode_text().tokenize("bytes").batch(2).options(runner="inline")
    it = iter(pipe)
    for _ in range(items):
        next(it)
    return pipe.checkpoint()


def test_save_is_atomic_and_round_trips(tmp_path: Path):
    state = state_after(3)
    path = save_checkpoint(checkpoint_path(tmp_path / "new-dir", 3), state)
    assert [p.name for p in (tmp_path / "new-dir").iterdir()] == ["ckpt-0000000003.json"]
    assert load_checkpoint(path) == json.loads(json.dumps(state))


def test_entries_added_by_the_caller_are_covered_by_the_checksum(tmp_path: Path):
    state = {**state_after(1), "mine": {"step": 7}}
    path = save_checkpoint(tmp_path / "c.json", state)  # sealed again on save
    assert load_checkpoint(path)["mine"] == {"step": 7}
    raw = json.loads(path.read_text())
    raw["mine"]["step"] = 8
    path.write_text(json.dumps(raw))
    with pytest.raises(CheckpointError, match="does not match its checksum"):
        load_checkpoint(path)
    assert seal(raw)["checksum"] != raw["checksum"]


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (b"", "the file is empty (0 bytes)"),
        (b"\n  \n", "the file is empty"),
        (b'{"format": "zephon.pipeline-checkpoint", "ver', "not valid JSON"),
        (b"\xff\xfe\x00", "not valid JSON"),
        (b'{"format": "other", "version": 1}', "not a zephon pipeline checkpoint"),
        (b"[1, 2, 3]", "a checkpoint is a dict"),
    ],
)
def test_damaged_files_are_refused_naming_the_file(tmp_path: Path, content: bytes, words: str):
    path = tmp_path / "ckpt-0000000001.json"
    path.write_bytes(content)
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(path)
    assert str(info.value).startswith(f"{path}: ") and words in str(info.value)


def test_a_missing_file_is_named(tmp_path: Path):
    with pytest.raises(CheckpointError, match="no such checkpoint file"):
        load_checkpoint(tmp_path / "absent.json")


def test_latest_checkpoint_skips_damaged_newer_files(tmp_path: Path):
    for n in (2, 4, 6):
        save_checkpoint(checkpoint_path(tmp_path, n), state_after(n))
    checkpoint_path(tmp_path, 6).write_text("{")
    checkpoint_path(tmp_path, 4).write_text("")
    found = latest_checkpoint(tmp_path)
    assert found is not None and found.path == checkpoint_path(tmp_path, 2)
    assert [p.name for p, _ in found.rejected] == ["ckpt-0000000006.json", "ckpt-0000000004.json"]
    assert len(checkpoint_files(tmp_path)) == 3  # looking changes nothing
    found = latest_checkpoint(tmp_path, set_aside=True)
    assert found is not None
    assert [p.name for p in checkpoint_files(tmp_path)] == ["ckpt-0000000002.json"]
    assert sorted(p.name for p in tmp_path.glob("*.invalid")) == [
        "ckpt-0000000004.json.invalid",
        "ckpt-0000000006.json.invalid",
    ]


def test_no_valid_checkpoint_is_an_error_and_nothing_is_set_aside(tmp_path: Path):
    checkpoint_path(tmp_path, 1).write_text("")
    with pytest.raises(CheckpointError, match="no valid checkpoint in"):
        latest_checkpoint(tmp_path, set_aside=True)
    assert checkpoint_path(tmp_path, 1).exists()
    assert latest_checkpoint(tmp_path / "empty-dir") is None


# -- what the system refuses: real errors from the kernel, in a process of their own -----------

SAVE = """\
import json, os, sys
from zephon.checkpoints import CheckpointWriteError, save_checkpoint
state = json.load(open(sys.argv[2]))
if len(sys.argv) > 3:
    os.setuid(int(sys.argv[3]))  # another user from here on
try:
    save_checkpoint(sys.argv[1], state)
except CheckpointWriteError as exc:
    print(exc)
"""


def _save_elsewhere(tmp_path: Path, target: Path, *extra: str, **popen: Any) -> str:
    """Save a real checkpoint to ``target`` from a child process; what it printed."""
    state = tmp_path / "state.json"
    state.write_text(json.dumps(state_after(2)))
    env = {**os.environ, "PYTHONPATH": str(Path(zephon.__file__).parents[1])}
    done = subprocess.run(
        [sys.executable, "-c", SAVE, str(target), str(state), *extra], env=env, capture_output=True,
        text=True, timeout=120, **popen,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_a_folder_this_user_cannot_write_names_the_file_and_the_fix(tmp_path: Path):
    folder = tmp_path / "theirs"
    folder.mkdir(mode=0o755)
    target = folder / "ckpt-0000000002.json"
    if os.geteuid() == 0:  # root writes anywhere: save as another user
        said = _save_elsewhere(tmp_path, target, "65534")
    else:
        folder.chmod(0o555)
        said = _save_elsewhere(tmp_path, target)
    assert said == (
        f"cannot write the checkpoint {target}: Permission denied; make the folder writable "
        "by this user, or write checkpoints elsewhere, then resume (the newest checkpoint "
        "already written is intact)"
    )
    assert list(folder.iterdir()) == []


def test_a_file_size_limit_below_the_checkpoint_names_the_file_and_the_limit(tmp_path: Path):
    target = tmp_path / "ckpt-0000000002.json"

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (512, 512))  # EFBIG past 512 bytes

    said = _save_elsewhere(tmp_path, target, preexec_fn=limit)
    assert said.startswith(f"cannot write the checkpoint {target}: File too large; the file ")
    assert "(ulimit -f)" in said and not target.exists()
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]  # no temporary file left


def test_a_read_only_file_system_names_the_file_and_the_fix(tmp_path: Path):
    (tmp_path / "ro").mkdir()
    target = tmp_path / "ro" / "ckpt-0000000002.json"
    state = tmp_path / "state.json"
    state.write_text(json.dumps(state_after(2)))
    own = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
    script = (
        f"mount -t tmpfs -o size=1m,ro tmpfs {tmp_path / 'ro'} && "
        f"{shlex.quote(sys.executable)} -c {shlex.quote(SAVE)} {target} {state}"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(zephon.__file__).parents[1])}
    done = subprocess.run(
        ["unshare", *own, "--mount", "bash", "-c", script], env=env, capture_output=True,
        text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (
        f"cannot write the checkpoint {target}: Read-only file system; the file system is "
        "mounted read-only: remount it read-write, or write checkpoints elsewhere, then resume "
        "(the newest checkpoint already written is intact)"
    )


@pytest.mark.parametrize(
    ("edit", "words"),
    [
        (lambda _: {"step": 7}, "not a zephon pipeline checkpoint (format=None)"),
        (lambda s: {**s, "lanes": "none"}, "'lanes' has type str"),
    ],
)
def test_save_refuses_what_a_restart_would_refuse_naming_the_file(
    tmp_path: Path, edit: Any, words: str
):
    path = tmp_path / "ckpt" / "ckpt-0000000001.json"
    with pytest.raises(CheckpointError) as info:
        save_checkpoint(path, edit(state_after(1)))
    message = str(info.value)
    assert message.startswith(f"cannot save {path}: ") and words in message
    assert "pipeline.checkpoint()" in message
    assert not path.exists() and latest_checkpoint(tmp_path / "ckpt") is None
