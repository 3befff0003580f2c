"""The real-engine suite's fixture writing, without vLLM: tracked fixtures change only on
request; by default fresh answers go to the run's folder and are compared with them."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

from tests.capture.vllm._fixtures import (
    UPDATE_ENV,
    FixtureRecorder,
    fixture_text,
    update_requested,
)
from tests.capture.vllm.real_engine_suite import FIXTURES, REPO, parse_args


def _doc(body: Any, version: str = "0.32.0") -> dict[str, Any]:
    return {"vllm_version": version, "path": "/v1/x", "request": {}, "status": 200, "body": body}


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_by_default_tracked_fixtures_stay_as_they_are(tmp_path: Path) -> None:
    tracked = tmp_path / "tracked"
    shutil.copytree(FIXTURES, tracked)  # the real tracked fixtures, as a copy
    before = _snapshot(tracked)
    chat = json.loads((tracked / "chat.json").read_text())
    recorder = FixtureRecorder(tracked, tmp_path / "run", update=False)
    assert recorder.save("chat", chat) == "unchanged"
    assert recorder.save("chat_n2", {**chat, "vllm_version": "9.9.9"}) == "values_changed"
    reshaped = {**chat, "body": {**chat["body"], "choices": "gone"}}
    assert recorder.save("chat_stream", reshaped) == "shape_changed"
    assert recorder.save("brand_new", _doc({"a": 1})) == "new"
    assert _snapshot(tracked) == before
    written = _snapshot(tmp_path / "run")
    assert sorted(written) == ["brand_new.json", "chat.json", "chat_n2.json", "chat_stream.json"]
    assert written["chat_stream.json"].decode() == fixture_text(reshaped)
    assert recorder.stale() == ["brand_new", "chat_stream"]
    report = recorder.report()
    assert report["written_to"] == str(tmp_path / "run")
    assert report["verdicts"]["chat_n2"] == "values_changed"


def test_tracked_bytes_round_trip_as_unchanged() -> None:
    """An unchanged answer is byte-identical to what the suite tracks (same serialisation)."""
    for path in sorted(FIXTURES.glob("*.json")):
        assert fixture_text(json.loads(path.read_text())) == path.read_text(), path.name


def test_update_rewrites_the_tracked_fixtures_only(tmp_path: Path) -> None:
    tracked = tmp_path / "tracked"
    tracked.mkdir()
    (tracked / "chat.json").write_text(fixture_text(_doc({"x": 1})))
    recorder = FixtureRecorder(tracked, tmp_path / "run", update=True)
    assert recorder.save("chat", _doc({"x": 2}, version="1.0")) == "written"
    assert json.loads((tracked / "chat.json").read_text())["body"] == {"x": 2}
    assert not (tmp_path / "run").exists() and recorder.stale() == []


def test_update_is_asked_for_by_flag_or_environment() -> None:
    assert parse_args(["--vllm-python", "py"]).update_fixtures is False
    assert parse_args(["--vllm-python", "py", "--update-fixtures"]).update_fixtures is True
    assert update_requested(True, {}) and not update_requested(False, {})
    assert update_requested(False, {UPDATE_ENV: "1"})
    assert update_requested(False, {UPDATE_ENV: " Yes "})
    assert not update_requested(False, {UPDATE_ENV: "0"})
    assert not update_requested(False, {UPDATE_ENV: ""})


def _make_decides(*assignments: str) -> bool:
    """Whether ``make test-vllm`` with these variables would rewrite the tracked fixtures:
    its suite command line (``make -n``, nothing runs), read as the suite reads it."""
    dry = subprocess.run(
        ["make", "-n", "test-vllm", *assignments],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
        env={"PATH": "/usr/bin:/bin"},
    )
    line = next(x for x in dry.stdout.splitlines() if "real_engine_suite" in x)
    words = shlex.split(line)
    env = dict(w.split("=", 1) for w in words[: words.index("-m") - 1])
    argv = words[words.index("-m") + 2 :]
    return update_requested(parse_args(argv).update_fixtures, env)


def test_make_test_vllm_rewrites_fixtures_only_when_asked() -> None:
    assert not _make_decides()
    for value in ("0", "false", "no"):
        assert not _make_decides(f"UPDATE_FIXTURES={value}"), value
    for value in ("1", "true", "yes"):
        assert _make_decides(f"UPDATE_FIXTURES={value}"), value
