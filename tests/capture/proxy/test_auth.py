"""Who may talk to a proxy: control and capture tokens, and no open bind without one."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.capture.proxy._procs import REPO, Proc, child_env, start_proxy
from tests.capture.proxy.conftest import freeze
from zephon.capture.proxy.server import exposure_problem

CONTROL = "/training-token-capture/control"
CAP = "/ng-rollout/{rid}/training-token-capture/v1/chat/completions"
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
ROUTES: list[tuple[str, str, Any]] = [
    ("GET", "/health", None),
    ("GET", "/metrics", None),
    ("POST", "/rollouts/{rid}/freeze", None),
    ("GET", "/rollouts/{rid}/manifest", None),
    ("POST", "/rollouts/{rid}/drop", {"snapshot_id": "s", "version": 1}),
    ("POST", "/retire", {"capture_keys": ["{rid}"]}),
    ("POST", "/delete", {"capture_keys": ["{rid}"]}),
]


@pytest.fixture(scope="module")
def guarded(engine: Proc, logs: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    store = f"file://{tmp_path_factory.mktemp('guarded')}"
    tokens = ["--control-token", "ctl-secret", "--capture-token", "cap-secret"]
    proc = start_proxy(engine.url, store, logs, *tokens)
    yield proc, store
    proc.stop()


def test_every_control_route_answers_401_without_the_control_token(
    guarded: Any, http: httpx.Client, rid: str
) -> None:
    proxy, _ = guarded
    wrong = [{}, {"authorization": "Bearer wrong"}, {"authorization": "Bearer cap-secret"}]
    for method, path, body in ROUTES:
        url = proxy.url + CONTROL + path.format(rid=rid)
        payload = {k: [rid] if k == "capture_keys" else v for k, v in (body or {}).items()}
        for headers in wrong:
            resp = http.request(method, url, json=payload or None, headers=headers)
            assert resp.status_code == 401, (method, path, headers)
    ok = {"authorization": "Bearer ctl-secret"}
    assert http.get(f"{proxy.url}{CONTROL}/health", headers=ok).status_code == 200
    assert http.get(f"{proxy.url}{CONTROL}/metrics", headers=ok).status_code == 200


def test_a_capture_without_the_capture_token_is_refused_and_writes_nothing(
    guarded: Any, http: httpx.Client, rid: str
) -> None:
    proxy, store = guarded
    url = proxy.url + CAP.format(rid=rid)
    for headers in (
        {},
        {"x-zephon-capture-token": "wrong"},
        {"authorization": "Bearer cap-secret"},
    ):
        resp = http.post(url, json=CHAT, headers=headers)
        assert resp.status_code == 401 and resp.json()["error"]["code"] == "unauthorized"
    resp = http.post(url, json=CHAT, headers={"x-zephon-capture-token": "cap-secret"})
    assert resp.status_code == 200
    snap = freeze(store, rid)  # only the authorised call is there, and nothing marked
    assert len(snap.entries) == 1 and not snap.incomplete and snap.engine_refusals == ()


def test_a_non_loopback_bind_without_a_control_token_is_refused(
    engine: Proc, tmp_path: Path
) -> None:
    cmd = [sys.executable, "-m", "zephon.cli", "capture", "serve", "--inference-server", engine.url]
    cmd += ["--store", f"file://{tmp_path}", "--host", "0.0.0.0", "--port", "0"]
    proc = subprocess.run(
        cmd, cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2 and "listening" not in proc.stdout
    assert "--control-token" in proc.stderr and "--insecure-no-auth" in proc.stderr
    assert exposure_problem("0.0.0.0", None, insecure=False) is not None
    assert exposure_problem("10.1.2.3", "t", insecure=False) is None
    for host in ("127.0.0.1", "::1", "localhost"):
        assert exposure_problem(host, None, insecure=False) is None
    warning = exposure_problem("0.0.0.0", None, insecure=True)
    assert warning is not None and warning.startswith("warning:")


PASS_THROUGH = ["/v1/chat/completions", "/ng-rollout/{rid}/v1/chat/completions"]


def _worker_routes_refuse_without(proxy: Proc, http: httpx.Client, rid: str, token: str) -> None:
    """Capture and pass-through routes answer 401 without the capture token (nothing reaches
    the engine or the store) and work with it."""
    cap = proxy.url + CAP.format(rid=rid)
    for headers in ({}, {"x-zephon-capture-token": "wrong"}, {"authorization": f"Bearer {token}"}):
        assert http.post(cap, json=CHAT, headers=headers).status_code == 401, headers
        for path in PASS_THROUGH:
            resp = http.post(proxy.url + path.format(rid=rid), json=CHAT, headers=headers)
            assert resp.status_code == 401 and resp.json()["error"]["code"] == "unauthorized"
        assert http.get(proxy.url + "/v1/models", headers=headers).status_code == 401
    ok = {"x-zephon-capture-token": token}
    for path in PASS_THROUGH:
        resp = http.post(proxy.url + path.format(rid=rid), json=CHAT, headers=ok)
        assert resp.status_code == 200 and resp.json()["choices"]
    assert http.get(proxy.url + "/v1/models", headers=ok).status_code == 200
    assert http.post(cap, json=CHAT, headers=ok).status_code == 200


def test_pass_through_routes_need_the_capture_token(
    guarded: Any, http: httpx.Client, rid: str
) -> None:
    proxy, store = guarded
    _worker_routes_refuse_without(proxy, http, rid, "cap-secret")
    snap = freeze(store, rid)
    assert len(snap.entries) == 1 and not snap.incomplete


def test_the_capture_token_is_not_passed_to_the_engine(guarded: Any, http: httpx.Client) -> None:
    proxy, _ = guarded
    sent = {
        "x-zephon-capture-token": "cap-secret",
        "authorization": "Bearer engine-key",
        "x-note": "caf\xe9".encode("latin-1"),
    }
    for path in ("/test/headers", "/ng-rollout/r1/test/headers"):
        resp = http.get(proxy.url + path, headers=sent)
        assert resp.status_code == 200, resp.text
        seen = resp.json()
        assert "x-zephon-capture-token" not in seen
        assert seen["authorization"] == "Bearer engine-key" and seen["x-note"] == "caf\xe9"


@pytest.fixture(scope="module")
def control_only(
    engine: Proc, logs: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Any]:
    """A proxy given only a control token, from a file: what the start-up check asks for."""
    folder = tmp_path_factory.mktemp("control-only")
    token_file = folder / "control-token"
    token_file.write_text("ctl-from-file\n")
    store = f"file://{folder / 'capture'}"
    proc = start_proxy(engine.url, store, logs, "--control-token-file", str(token_file))
    yield proc, store
    proc.stop()


def test_a_control_token_alone_guards_every_route(
    control_only: Any, http: httpx.Client, rid: str
) -> None:
    proxy, store = control_only
    intruder = f"intruder-{rid}"
    _worker_routes_refuse_without(proxy, http, intruder, "ctl-from-file")
    bearer = {"authorization": "Bearer ctl-from-file"}
    assert http.get(f"{proxy.url}{CONTROL}/health").status_code == 401
    assert http.get(f"{proxy.url}{CONTROL}/health", headers=bearer).status_code == 200
    snap = freeze(store, intruder)  # only the call made with the token was captured
    assert len(snap.entries) == 1 and not snap.incomplete


def test_a_token_from_a_file_or_the_environment_is_not_on_the_command_line(
    control_only: Any, engine: Proc, logs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    proxy, _ = control_only
    cmdline = Path(f"/proc/{proxy.popen.pid}/cmdline").read_bytes()
    assert b"ctl-from-file" not in cmdline and b"--control-token-file" in cmdline
    monkeypatch.setenv("ZEPHON_CAPTURE_CONTROL_TOKEN", "ctl-from-env")
    proc = start_proxy(engine.url, f"file://{tmp_path}", logs)
    try:
        assert b"ctl-from-env" not in Path(f"/proc/{proc.popen.pid}/cmdline").read_bytes()
        with httpx.Client(timeout=30) as http:
            url = f"{proc.url}{CONTROL}/health"
            assert http.get(url).status_code == 401
            assert (
                http.get(url, headers={"authorization": "Bearer ctl-from-env"}).status_code == 200
            )
            chat = proc.url + PASS_THROUGH[0]
            assert http.post(chat, json=CHAT).status_code == 401
    finally:
        proc.stop()


def _serve(engine: Proc, tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "zephon.cli", "capture", "serve", "--inference-server", engine.url]
    cmd += ["--store", f"file://{tmp_path}", "--port", "0", *extra]
    return subprocess.run(
        cmd, cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=60
    )


def test_token_files_are_checked_before_listening(engine: Proc, tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.write_text("\n")
    for extra, says in [
        (["--control-token", "a", "--control-token-file", str(empty)], "not both"),
        (["--control-token-file", str(empty)], "is empty"),
        (["--capture-token-file", str(tmp_path / "missing")], "No such file"),
    ]:
        proc = _serve(engine, tmp_path, *extra)
        assert proc.returncode == 2 and "listening" not in proc.stdout, proc.stderr
        assert says in proc.stderr


def test_a_capture_token_alone_does_not_open_a_non_loopback_bind(
    engine: Proc, tmp_path: Path
) -> None:
    proc = _serve(engine, tmp_path, "--host", "0.0.0.0", "--capture-token", "c")
    assert proc.returncode == 2 and "listening" not in proc.stdout
    assert "--control-token" in proc.stderr and "--insecure-no-auth" in proc.stderr
