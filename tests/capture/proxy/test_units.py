"""The proxy's pure parts: token extraction, request translation, output items, metrics."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from zephon.capture.lineage import (
    assistant_fingerprint,
    chain_hint_item,
    split_chain_hint,
    token_prompt_chain_of,
    token_prompt_item,
)
from zephon.capture.proxy import ProxyConfig
from zephon.capture.proxy._capture import refusal_code
from zephon.capture.proxy._inference import InferenceAnswer
from zephon.capture.proxy._metrics import Metrics
from zephon.capture.proxy._requests import BadRequest, prepare_call
from zephon.capture.proxy._responses import output_items_of, token_item_index
from zephon.capture.proxy._tokens import TokenDataError, extract_generation, prompt_ids_of


def _chat(token_ids: Any = None, lps: Any = None, tokens: Any = None, **top: Any) -> dict:
    content = None
    if lps is not None:
        toks = tokens if tokens is not None else ["x"] * len(lps)
        content = [{"token": t, "logprob": lp} for t, lp in zip(toks, lps)]
    choice = {"message": {"role": "assistant", "content": "hi"}, "token_ids": token_ids}
    choice["logprobs"] = {"content": content} if content is not None else None
    return {"choices": [choice], **top}


def test_generation_from_token_ids_and_logprobs() -> None:
    got = extract_generation(_chat([5, 6], [-0.5, -1.0]), chat=True)
    assert (got.token_ids, got.log_probs) == ([5, 6], [-0.5, -1.0])
    only_lp = _chat(None, [-0.5, -1.0], ["token_id:5", "token_id:6"])
    assert extract_generation(only_lp, chat=True).token_ids == [5, 6]
    assert prompt_ids_of(_chat([1], [-1.0], prompt_token_ids=[9, 8]), chat=True) == [9, 8]
    assert prompt_ids_of(_chat([1], [-1.0]), chat=True) is None


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        (_chat([5, 6], None), "no log-probs"),
        (_chat([5, 6], [-0.5]), "2 generated token ids but 1 log-probs"),
        (_chat([5, 6], [-0.5, -1.0], ["token_id:5", "token_id:7"]), "disagree at position 1"),
        (_chat([5], [math.inf]), "needs a number"),
        (_chat([5], [None]), "needs a number"),
        (_chat(None, [-0.5], ["hello"]), "no generated token ids"),
        (_chat([-1], [-0.5]), "non-negative integers"),
        ({"choices": []}, "0 choices"),
        ({"choices": [{}, {}]}, "2 choices"),
    ],
)
def test_partial_or_inconsistent_token_data_is_refused(answer: dict, message: str) -> None:
    with pytest.raises(TokenDataError, match=message):
        extract_generation(answer, chat=True)


def test_completions_token_shapes() -> None:
    answer = {
        "choices": [
            {
                "text": "ab",
                "prompt_token_ids": [1, 2],
                "token_ids": None,
                "logprobs": {"tokens": ["token_id:3", "token_id:4"], "token_logprobs": [-1, -2]},
            }
        ]
    }
    got = extract_generation(answer, chat=False)
    assert (got.token_ids, got.log_probs) == ([3, 4], [-1.0, -2.0])
    assert prompt_ids_of(answer, chat=False) == [1, 2]


def test_chat_request_asks_the_engine_for_exact_tokens() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True}
    call = prepare_call("chat", body)
    eb = call.engine_body
    assert eb["return_token_ids"] is True and eb["stream"] is False
    assert eb["logprobs"] is True and eb["top_logprobs"] == 0
    assert eb["return_tokens_as_token_ids"] is True
    assert call.stream and not call.want_logprobs and not call.want_token_ids
    assert body == {"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True}
    mine = prepare_call("chat", {**body, "logprobs": True, "top_logprobs": 3})
    assert mine.engine_body["top_logprobs"] == 3
    assert "return_tokens_as_token_ids" not in mine.engine_body  # the client sees text tokens


@pytest.mark.parametrize(
    ("dialect", "body", "code"),
    [
        ("chat", {"messages": [{"role": "user", "content": "x"}], "n": 0}, "unsupported_n"),
        ("chat", {"messages": [{"role": "user", "content": "x"}], "n": 65}, "unsupported_n"),
        ("responses", {"input": "x", "n": 2}, "unsupported_n"),
        ("chat", {"messages": [{"role": "user", "content": "x"}], "n": "1"}, "unsupported_n"),
        ("chat", {"messages": [{"role": "user"}], "best_of": 3}, "unsupported_best_of"),
        ("chat", {"messages": ["hi"]}, "invalid_request"),
        ("chat", [], "invalid_json"),
        ("completions", {"prompt": [[1], [2]]}, "unsupported_prompt"),
        ("completions", {"prompt": [1, -2]}, "unsupported_prompt"),
        ("completions", {"prompt": [True]}, "unsupported_prompt"),
        ("responses", {"input": 5}, "invalid_request"),
        ("responses", {"input": [{"type": "web_search_call"}]}, "invalid_request"),
        ("responses", {"input": "x", "tools": [{"type": "file_search"}]}, "invalid_request"),
    ],
)
def test_bad_requests(dialect: Any, body: Any, code: str) -> None:
    with pytest.raises(BadRequest) as info:
        prepare_call(dialect, body)
    assert info.value.code == code and info.value.status == 400


def test_a_named_chain_rides_on_the_token_prompt_item_or_a_resolution_hint() -> None:
    call = prepare_call("completions", {"model": "m", "prompt": [[5, 6]]}, "abc-1")
    assert call.request_items == [token_prompt_item([5, 6], chain_of="abc-1")]
    assert call.resolve_items == call.request_items
    assert token_prompt_chain_of(call.request_items) == "abc-1"
    assert "chain_of" not in call.engine_body and call.token_in
    plain = prepare_call("completions", {"model": "m", "prompt": [5, 6]})
    assert plain.request_items == [token_prompt_item([5, 6])]
    # a text request keeps its items (they are stamped and hashed); only resolution is told
    for dialect, body in (
        ("chat", {"messages": [{"role": "user", "content": "x"}]}),
        ("responses", {"input": "x"}),
    ):
        text = prepare_call(dialect, body, "abc-2")  # type: ignore[arg-type]
        assert text.chain_of == "abc-2" and "zephon" not in json.dumps(text.engine_body)
        assert text.resolve_items == [*text.request_items, chain_hint_item("abc-2")]
        assert split_chain_hint(text.resolve_items) == (text.request_items, "abc-2")
        assert prepare_call(dialect, body).resolve_items == text.request_items  # type: ignore[arg-type]
    refused = [
        ("completions", {"prompt": "text"}, "abc", "token-in"),
        ("completions", {"prompt": [1]}, "", "model call id"),
        ("completions", {"prompt": [1]}, "x" * 257, "model call id"),
        ("completions", {"prompt": [1]}, "a\tb", "model call id"),
        ("chat", {"messages": [{"role": "user", "content": "x"}]}, "a b", "model call id"),
        ("responses", {"input": "x"}, "", "model call id"),
    ]
    for dialect, body, value, says in refused:
        with pytest.raises(BadRequest, match=says) as info:
            prepare_call(dialect, body, value)  # type: ignore[arg-type]
        assert info.value.code == "unsupported_parent_hint" and info.value.status == 400


def test_responses_request_translates_to_chat() -> None:
    body = {
        "model": "m",
        "instructions": "be brief",
        "input": [
            {"role": "developer", "content": [{"type": "input_text", "text": "dev"}]},
            {"role": "user", "content": "q"},
            {"type": "reasoning", "summary": []},
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "a"}],
            },
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
            {"type": "function_call", "call_id": "c2", "name": "g", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": {"ok": 1}},
        ],
        "tools": [{"type": "function", "name": "f", "parameters": {}}],
        "tool_choice": {"type": "function", "name": "f"},
        "max_output_tokens": 7,
        "temperature": 0.5,
        "store": True,
    }
    call = prepare_call("responses", body)
    assert call.request_items[0] == {"role": "system", "content": "be brief"}
    eb = call.engine_body
    assert eb["messages"] == [
        {"role": "system", "content": "be brief"},
        {"role": "system", "content": "dev"},
        {"role": "user", "content": "q"},
        {
            "role": "assistant",
            "content": "a",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}},
                {"id": "c2", "type": "function", "function": {"name": "g", "arguments": "{}"}},
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": '{"ok": 1}'},
    ]
    assert eb["tools"] == [{"type": "function", "function": {"name": "f", "parameters": {}}}]
    assert eb["tool_choice"] == {"type": "function", "function": {"name": "f"}}
    assert eb["max_tokens"] == 7 and eb["temperature"] == 0.5
    assert "store" not in eb and "input" not in eb and "instructions" not in eb


def test_output_items_fingerprint_like_the_echoed_chat_message() -> None:
    """The entry stores Responses-shaped items; a chat harness echoes the chat message. Both
    must fingerprint alike, or no chat continuation could ever resolve."""
    message = {
        "role": "assistant",
        "content": "let me look",
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "s", "arguments": '{"q": 1}'}}
        ],
    }
    call = prepare_call("chat", {"messages": [{"role": "user", "content": "x"}]})
    items = output_items_of({"choices": [{"message": message}]}, call, "cid")
    assert [i["type"] for i in items] == ["message", "function_call"]
    assert token_item_index(items) == 0
    assert assistant_fingerprint(items) == assistant_fingerprint([message])
    tool_only = dict(message, content=None)
    items = output_items_of({"choices": [{"message": tool_only}]}, call, "cid")
    assert [i["type"] for i in items] == ["function_call"] and token_item_index(items) == 0
    assert assistant_fingerprint(items) == assistant_fingerprint([tool_only])


def test_refusal_codes() -> None:
    ctx = b'{"message": "This model\'s maximum context length is 10 tokens."}'
    assert refusal_code(InferenceAnswer(400, ctx, "application/json")) == "context_length_exceeded"
    assert refusal_code(InferenceAnswer(400, b'{"message": "bad"}', "")) == "http_400"
    assert refusal_code(InferenceAnswer(404, b"", "")) == "http_404"


def test_metrics_sum_over_workers(tmp_path: Path) -> None:
    a, b = Metrics(str(tmp_path)), Metrics(str(tmp_path))
    a.inc("zephon_proxy_requests_total", route="chat", code="200")
    b.inc("zephon_proxy_requests_total", 2, route="chat", code="200")
    a.observe("zephon_proxy_put_seconds", 0.003)
    b.observe("zephon_proxy_put_seconds", 20.0)
    b.flush()
    text = a.render()
    assert 'zephon_proxy_requests_total{code="200",route="chat"} 3' in text
    assert 'zephon_proxy_put_seconds_bucket{le="0.0025"} 0' in text
    assert 'zephon_proxy_put_seconds_bucket{le="0.005"} 1' in text
    assert 'zephon_proxy_put_seconds_bucket{le="10"} 1' in text
    assert 'zephon_proxy_put_seconds_bucket{le="+Inf"} 2' in text
    assert "zephon_proxy_put_seconds_count 2" in text


def test_config_validation_and_env_round_trip() -> None:
    cfg = ProxyConfig(engine_url="http://127.0.0.1:8000/v1/", store_url="file:///tmp/x")
    assert cfg.engine_url == "http://127.0.0.1:8000"
    env = {"ZEPHON_CAPTURE_PROXY_CONFIG": cfg.to_env()}
    assert ProxyConfig.from_env(env) == cfg
    with pytest.raises(ValueError, match="not an http"):
        ProxyConfig(engine_url="127.0.0.1:8000", store_url="memory://x")
    with pytest.raises(ValueError, match="unknown keys"):
        ProxyConfig.from_env({"ZEPHON_CAPTURE_PROXY_CONFIG": '{"engine_url": "http://a", "x": 1}'})
    with pytest.raises(RuntimeError, match="zephon capture serve"):
        ProxyConfig.from_env({})


@pytest.mark.parametrize("bad", [-1, True, 1.5, 2**63])
def test_a_configured_weight_version_is_checked_and_travels_to_workers(bad: object) -> None:
    cfg = ProxyConfig(engine_url="http://a", store_url="memory://x", weight_version=7)
    assert ProxyConfig.from_env({"ZEPHON_CAPTURE_PROXY_CONFIG": cfg.to_env()}).weight_version == 7
    with pytest.raises(ValueError, match="--weight-version must be an integer >= 0"):
        ProxyConfig(engine_url="http://a", store_url="memory://x", weight_version=bad)  # type: ignore[arg-type]


def test_cli_refuses_a_process_local_store_with_several_workers(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from zephon.cli._capture import main

    argv = [
        "serve",
        "--inference-server",
        "http://127.0.0.1:9",
        "--store",
        "memory://x",
        "--workers",
        "2",
    ]
    assert main(argv) == 2
    assert "use a shared store" in capsys.readouterr().err
    assert main(["serve", "--inference-server", "http://127.0.0.1:9", "--store", "s3://b/x"]) == 2
    assert "unknown capture store URL" in capsys.readouterr().err


def test_serve_is_registered_in_the_capture_group() -> None:
    import argparse

    from zephon.cli._capture import register

    parser = argparse.ArgumentParser(prog="zephon")
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(
        [
            "capture",
            "serve",
            "--inference-server",
            "http://e:1",
            "--store",
            "file:///x",
            "--workers",
            "3",
            "--engine",
            "http://e:2",
        ]
    )
    assert (args.inference_server, args.store, args.workers, args.port) == (
        ["http://e:1", "http://e:2"],  # a fleet: each URL given (either name) is kept
        "file:///x",
        3,
        8100,
    )
    assert args.func.__module__ == "zephon.cli._capture_serve"
    conf = parser.parse_args(["capture", "conformance", "memory://x"])
    assert conf.func.__name__ == "_conformance"  # the group's existing command is unchanged


def test_serve_keeps_the_former_engine_flags_as_deprecated_aliases(
    capsys: pytest.CaptureFixture[str],
) -> None:
    import argparse

    from zephon.cli._capture import register

    parser = argparse.ArgumentParser(prog="zephon")
    register(parser.add_subparsers(dest="command"))
    argv = [
        "capture",
        "serve",
        "--engine",
        "http://e:1",
        "--engine-timeout",
        "5",
        "--store",
        "x",
    ]
    args = parser.parse_args(argv)
    assert (args.inference_server, args.inference_timeout) == (["http://e:1"], 5.0)
    err = capsys.readouterr().err
    assert "--engine is deprecated; use --inference-server" in err
    assert "--engine-timeout is deprecated; use --inference-timeout" in err
    new = parser.parse_args(
        ["capture", "serve", "--inference-server", "http://e:1", "--store", "x"]
    )
    assert new.inference_server == ["http://e:1"] and new.inference_timeout == 600.0
    assert "deprecated" not in capsys.readouterr().err
