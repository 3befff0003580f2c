"""The proxy records each call's weight version: from the request header, else its config;
a rollout whose calls span versions builds with version segments."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.capture.proxy._procs import Proc, start_proxy
from tests.capture.proxy._token_in import complete
from tests.capture.proxy.conftest import freeze
from zephon.capture.builder import build_rollout

pytestmark = pytest.mark.timeout(120)

VERSION = "x-zephon-weight-version"


@pytest.fixture(scope="module")
def versioned_proxy(engine: Proc, store_url: str, logs: Path) -> Iterator[Proc]:
    proc = start_proxy(engine.url, store_url, logs, "--weight-version", "2")
    yield proc
    assert proc.stop() in (0, -signal.SIGTERM), proc.log.read_text()[-2000:]


def _continue(http: httpx.Client, base: str, rid: str, prompt: list[int], **h: str) -> list[int]:
    resp = complete(http, base, rid, prompt, headers=h or None)
    assert resp.status_code == 200, resp.text
    choice = resp.json()["choices"][0]
    return [*choice["prompt_token_ids"], *choice["token_ids"], 7, 8]


def test_a_rollout_spanning_versions_records_each_call_s_version(
    versioned_proxy: Proc, store_url: str, rid: str
) -> None:
    with httpx.Client(timeout=60) as http:
        prompt = _continue(http, versioned_proxy.url, rid, [5, 6, 7])  # the configured 2
        prompt = _continue(http, versioned_proxy.url, rid, prompt, **{VERSION: "3"})
        _continue(http, versioned_proxy.url, rid, prompt, **{VERSION: "3"})
    snap = freeze(store_url, rid)
    versions = sorted(e.weight_version for e in snap.entries if e.weight_version is not None)
    assert versions == [2, 3, 3] and len(snap.entries) == 3
    traj = build_rollout(snap).trajectory
    assert traj is not None
    assert [v for _, _, v in traj.version_segments] == [2, 3]
    assert traj.oldest_version == 2


@pytest.mark.parametrize("bad", ["x", "-1", "1.5", str(2**63)])
def test_a_bad_version_header_is_refused_before_the_engine(
    proxy: Proc, store_url: str, rid: str, bad: str
) -> None:
    with httpx.Client(timeout=60) as http:
        resp = complete(http, proxy.url, rid, [5, 6, 7], headers={VERSION: bad})
        assert resp.status_code == 400, resp.text
        assert resp.json()["error"]["code"] == "invalid_weight_version"
        assert VERSION in resp.json()["error"]["message"]
        _continue(http, proxy.url, rid, [5, 6, 7])  # no header, no configured version
    (entry,) = freeze(store_url, rid).entries
    assert entry.weight_version is None
