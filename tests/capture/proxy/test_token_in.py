"""Token-in/token-out through the proxy: prompts sent as ids are captured exactly and continue
the recorded call whose ids they extend, so no re-tokenisation can drift.

The engine samples non-canonical token splits (``noncanonical``: re-encoding the text merges
them) and ids with no text at all (``textless``), and the harness encodes its own turns with a
tokenizer that does not match the engine's. Text requests drift on such calls and are masked;
token-in requests never are.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import httpx
import pytest
from tokenizers import Tokenizer

from tests.capture.proxy._harness import CAP, chat_rollout, verify_rollout
from tests.capture.proxy._procs import Proc
from tests.capture.proxy._token_in import complete, token_in_rollout
from tests.capture.proxy.conftest import freeze
from tests.capture.proxy.inference_stub import train_tokenizer
from zephon.capture.builder import build_rollout
from zephon.capture.records import ParentResolutionStatus

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def harness_encode(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], list[int]]:
    """A tokenizer that is not the engine's (another vocabulary: digits merge differently)."""
    path = train_tokenizer(str(tmp_path_factory.mktemp("htok") / "harness.json"), vocab_size=300)
    tok = Tokenizer.from_file(path)
    return lambda text: list(tok.encode(text, add_special_tokens=False).ids)


def test_token_in_chains_never_drift_where_text_chains_do(
    proxy: Proc, store_url: str, harness_encode: Callable[[str], list[int]], rid: str
) -> None:
    with httpx.Client(timeout=60) as http:
        runs = [
            token_in_rollout(
                http, proxy.url, f"{rid}-t{i}", 4, harness_encode, test_engine_style="noncanonical"
            )
            for i in range(6)
        ]
    for run in runs:
        verify_rollout(freeze(store_url, run.rollout_id), run)  # exact ids, each turn resolved
    masked = [r.rollout_id for r in runs if build_rollout(freeze(store_url, r.rollout_id)).masked]
    assert masked == []

    async def text_runs() -> list[str]:
        async with httpx.AsyncClient(timeout=60) as client:
            ids = [f"{rid}-c{i}" for i in range(3)]
            for r in ids:
                await chat_rollout(client, proxy.url, r, 3, test_engine_style="noncanonical")
            return ids

    drifted = [build_rollout(freeze(store_url, r)) for r in asyncio.run(text_runs())]
    # The same engine behaviour drifts every text continuation: the builder refuses to link.
    assert all(b.masked for b in drifted)
    assert all(b.notes.parent_link_failures.get("parent_digest_mismatch") for b in drifted)


def test_text_less_ids_resolve_by_ids_and_are_named_when_sent_as_text(
    proxy: Proc, store_url: str, engine: Proc, harness_encode: Callable[[str], list[int]], rid: str
) -> None:
    with httpx.Client(timeout=60) as http:
        first = complete(
            http, proxy.url, rid, harness_encode("say nothing"), test_engine_style="textless"
        )
        assert first.status_code == 200, first.text
        choice = first.json()["choices"][0]
        assert choice["text"] == "" and len(choice["token_ids"]) == 2
        nxt = [*choice["prompt_token_ids"], *choice["token_ids"], *harness_encode(" again")]
        second = complete(http, proxy.url, rid, nxt)
        assert second.headers["x-zephon-parent-resolution"] == "resolved"
        assert second.headers["x-zephon-parent-call-id"] == first.headers["x-zephon-model-call-id"]
        build = build_rollout(freeze(store_url, rid))
        assert not build.masked, build.mask_reasons
        assert build.trajectory is not None
        assert build.trajectory.input_ids.tolist()[: len(nxt)] == nxt  # the text-less id kept

        # The same reply sent back as text cannot carry the id: named, not an ambiguity.
        url = proxy.url + CAP.format(rid=rid + "-chat") + "/v1/chat/completions"
        msgs = [{"role": "user", "content": "say nothing"}]
        body = {"model": "tiny", "messages": msgs, "test_engine_style": "textless"}
        reply = http.post(url, json=body).json()["choices"][0]["message"]
        assert reply["content"] == ""
        msgs += [{"role": "assistant", "content": ""}, {"role": "user", "content": "again"}]
        assert http.post(url, json={"model": "tiny", "messages": msgs}).status_code == 200
    build = build_rollout(freeze(store_url, rid + "-chat"))
    assert build.masked
    assert build.notes.parent_link_failures == {"parent_digest_mismatch": 1}
    assert len(build.notes.textless_parent_calls) == 1
    assert any("token-in" in d for d in build.notes.decisions)


def test_token_prompt_shapes(proxy: Proc, store_url: str, rid: str) -> None:
    with httpx.Client(timeout=60) as http:
        wrapped = complete(http, proxy.url, rid, [[5, 6, 7]])  # type: ignore[list-item]
        assert wrapped.status_code == 200, wrapped.text
        assert wrapped.json()["choices"][0]["prompt_token_ids"] == [5, 6, 7]
        for bad in ([[1], [2]], [1, -2], [], [1, "a"]):
            resp = complete(http, proxy.url, rid, bad)  # type: ignore[arg-type]
            assert resp.status_code == 400 and resp.json()["error"]["code"] == "unsupported_prompt"
            assert resp.headers["x-should-retry"] == "false"
    (entry,) = freeze(store_url, rid).entries
    assert entry.prompt_token_ids == [5, 6, 7]
    assert entry.parent_resolution is ParentResolutionStatus.ROOT
