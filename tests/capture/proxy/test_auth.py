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
