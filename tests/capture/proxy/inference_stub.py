"""A small deterministic OpenAI-compatible inference server for the proxy tests (vLLM-shaped
answers).

It tokenizes with a real byte-level BPE (trained by :func:`train_tokenizer`), renders chats
with a fixed template whose turns are delimited by special tokens (so a conversation's tokens
are the concatenation of its turns' tokens, as with real chat templates), and "generates" a
reply that is a pure function of the prompt ids: text, or a ``<tool_call>`` when tools are
offered and the last message is the user's. Answers carry ``prompt_token_ids``,
``choices[0].token_ids`` and per-token log-probs exactly like vLLM's ``return_token_ids`` /
``logprobs`` / ``return_tokens_as_token_ids``; ``/tokenize`` answers like vLLM's.

Faults for tests, chosen per request with the extra body field ``test_engine_fault``:
``partial`` (ids without log-probs), ``no_prompt_ids`` (prompt ids only via ``/tokenize``),
``no_token_ids`` (generated ids only via log-prob tokens), ``mismatch`` (the two disagree),
``error500``, ``hold`` (with ``test_engine_hold`` = a token: wait until
``POST /test/release/<token>``, then apply ``test_engine_after_hold`` as the fault;
``GET /test/stats`` counts held calls per token; ``GET /test/headers`` echoes the request's
headers). A chat request tagged with the extra body
field ``test_engine_tag`` is logged once generated: ``GET /test/generated`` maps each tag to
the hex sha256 of its prompt ids (what a test compares the store against). A prompt
longer than ``--max-model-len`` minus ``max_tokens`` gets vLLM's 400 context-length error.

Run: ``python -m tests.capture.proxy.inference_stub --tokenizer FILE [--port 0]``; prints
``ENGINE_PORT <port>`` once it listens on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import socket
import sys
from array import array
from typing import Any

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

SPECIALS = ["<|system|>", "<|user|>", "<|assistant|>", "<|tool|>", "<|end|>"]
WORDS = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "search",
    "result",
    "tool",
    "answer",
    "river",
    "stone",
    "cloud",
    "light",
    "number",
    "seven",
    "eleven",
    "forty",
    "token",
    "capture",
    "proxy",
    "engine",
    "durable",
    "lineage",
    "parent",
    "child",
]
_CORPUS = [
    "The quick brown fox jumps over the lazy dog while the engine streams tokens.",
    "Search results: alpha beta gamma delta; the tool answered with seven numbers.",
    '<tool_call>{"arguments": {"query": "river"}, "name": "search"}</tool_call>',
    "User asks a question, assistant answers, the tool reports a result, continue turn 3.",
    " ".join(WORDS),
]
CREATED = 1_700_000_000
FINGERPRINT = "vllm-0.32.0-stand-in"


def train_tokenizer(
    path: str,
    vocab_size: int = 400,
    specials: list[str] | None = None,
    corpus: list[str] | None = None,
) -> str:
    """Train a tiny byte-level BPE (deterministic for its corpus) and save it to ``path``."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIALS if specials is None else specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator((_CORPUS if corpus is None else corpus) * 20, trainer=trainer)
    tok.save(path)
    return path


class Model:
    """Template, tokenizer and the deterministic 'sampler'."""

    def __init__(self, tokenizer_path: str, max_model_len: int = 4096) -> None:
        self.tok = Tokenizer.from_file(tokenizer_path)
        self.special = {s: self.tok.token_to_id(s) for s in SPECIALS}
        self.max_model_len = max_model_len

    def encode(self, text: str) -> list[int]:
        return list(self.tok.encode(text, add_special_tokens=False).ids) if text else []

    def decode(self, ids: list[int]) -> str:
        return str(self.tok.decode(ids))

    @staticmethod
    def tool_call_text(name: str, arguments: Any) -> str:
        if isinstance(arguments, str):
            arguments = json.loads(arguments) if arguments.strip() else {}
        payload = json.dumps({"arguments": arguments, "name": name}, sort_keys=True)
        return f"<tool_call>{payload}</tool_call>"

    @staticmethod
    def _text(content: Any) -> str:
        if content is None:
            return ""
        if isinstance(content, str):
            return content
        return "".join(b.get("text", "") for b in content if isinstance(b, dict))

    def render_chat(self, messages: list[dict[str, Any]], tools: list[Any] | None) -> list[int]:
        sp = self.special
        ids: list[int] = []
        if tools:
            names = [t.get("function", {}).get("name") for t in tools]
            ids += [sp["<|system|>"], *self.encode("tools: " + json.dumps(names)), sp["<|end|>"]]
        for m in messages:
            role = "system" if m["role"] == "developer" else m["role"]
            ids.append(sp.get(f"<|{role}|>", sp["<|user|>"]))
            if role == "assistant":
                ids += self.encode(self._text(m.get("content")))
                for tc in m.get("tool_calls") or []:
                    fn = tc["function"]
                    ids += self.encode(self.tool_call_text(fn["name"], fn.get("arguments")))
            else:
                ids += self.encode(self._text(m.get("content")))
            ids.append(sp["<|end|>"])
        ids.append(sp["<|assistant|>"])
        return ids

    def generate(
        self,
        prompt: list[int],
        tools: list[Any] | None,
        last_role: str,
        max_tokens: int,
        sample: int = 0,
        style: str = "",
    ) -> tuple[list[int], str, list[dict[str, Any]], str]:
        """(token ids, content, tool calls, finish reason) as a pure function of the prompt
        and the sample index. ``style``: ``noncanonical`` spells a text reply's first word
        one byte token at a time (as a sampler may; re-encoding the text merges them),
        ``textless`` samples an id past the tokenizer's vocabulary (a padded embedding row: no
        text at all)."""
        seed = array("Q", prompt).tobytes() + (bytes([sample]) if sample else b"")
        h = hashlib.sha256(seed).digest()
        if style == "textless":
            return [self.tok.get_vocab_size() + 7, self.special["<|end|>"]], "", [], "stop"
        calls: list[dict[str, Any]] = []
        if tools and last_role == "user":
            name = tools[0].get("function", {}).get("name", "tool")
            args = {"query": WORDS[h[1] % len(WORDS)]}
            text = self.tool_call_text(name, args)
            calls.append(
                {
                    "id": "call_" + h[:6].hex(),
                    "type": "function",
                    "function": {"name": name, "arguments": json.dumps(args)},
                }
            )
            content = ""
        else:
            content = " ".join(WORDS[b % len(WORDS)] for b in h[2 : 4 + h[0] % 9])
            text = content
        ids = [*self.encode(text), self.special["<|end|>"]]
        if style == "noncanonical" and not calls:
            head, _, rest = text.partition(" ")
            spelled = [t for ch in head for t in self.encode(ch)]
            ids = [*spelled, *self.encode(_ + rest), self.special["<|end|>"]]
        finish = "tool_calls" if calls else "stop"
        if len(ids) > max_tokens:
            ids = ids[:max_tokens]
            content, calls, finish = self.decode(ids), [], "length"
        return ids, content, calls, finish

    @staticmethod
    def logprob(token: int, pos: int) -> float:
        return -(((token * 2654435761 + pos * 40503) % 1000) / 997.0) - 0.0001


def _lp_entry(token: int, lp: float, as_ids: bool, model: Model) -> dict[str, Any]:
    text = model.decode([token])  # "bytes" are the token's own, whatever "token" names
    name = f"token_id:{token}" if as_ids else text
    return {"bytes": list(text.encode()), "logprob": lp, "token": name, "top_logprobs": []}


def build_app(model: Model) -> Any:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response, StreamingResponse
    from starlette.routing import Route

    stats: dict[str, Any] = {"chat": 0, "completions": 0, "tokenize": 0, "held": {}}
    releases: dict[str, asyncio.Event] = {}
    generated: dict[str, str] = {}

    def too_long(prompt: list[int], max_tokens: int) -> Response | None:
        if len(prompt) + max_tokens <= model.max_model_len:
            return None
        msg = (
            f"This model's maximum context length is {model.max_model_len} tokens. However, "
            f"you requested {len(prompt) + max_tokens} tokens ({len(prompt)} in the messages, "
            f"{max_tokens} in the completion). Please reduce the length of the messages or "
            "completion."
        )
        return error(msg, 400, "BadRequestError", "input_tokens")

    def error(message: str, code: int, kind: str, param: str | None = None) -> Response:
        body = {"error": {"code": code, "message": message, "param": param, "type": kind}}
        return JSONResponse(body, code)

    async def common(body: dict[str, Any]) -> Response | None:
        fault = body.get("test_engine_fault")
        if fault == "error500":
            return error("boom", 500, "InternalServerError")
        if fault == "hold":
            token = str(body.get("test_engine_hold", ""))
            stats["held"][token] = stats["held"].get(token, 0) + 1
            await releases.setdefault(token, asyncio.Event()).wait()
            body["test_engine_fault"] = after = body.get("test_engine_after_hold")
            if after == "error500":
                return error("boom", 500, "InternalServerError")
        return None

    def choice_tokens(
        body: dict[str, Any], gen: list[int], chat: bool
    ) -> tuple[Any, list[int] | None]:
        fault = body.get("test_engine_fault")
        as_ids = bool(body.get("return_tokens_as_token_ids"))
        lps = [model.logprob(t, i) for i, t in enumerate(gen)]
        logprobs: Any = None
        wants_lp = body.get("logprobs") if chat else body.get("logprobs") is not None
        if wants_lp and fault != "partial":
            ids_for_lp = list(gen)
            if fault == "mismatch" and ids_for_lp:
                ids_for_lp[0] += 1
            if chat:
                logprobs = {
                    "content": [_lp_entry(t, lp, as_ids, model) for t, lp in zip(ids_for_lp, lps)]
                }
            else:
                names = [f"token_id:{t}" if as_ids else model.decode([t]) for t in ids_for_lp]
                logprobs = {
                    "text_offset": [0] * len(gen),
                    "token_logprobs": lps,
                    "tokens": names,
                    "top_logprobs": [{n: lp} for n, lp in zip(names, lps)],
                }
        token_ids = gen if body.get("return_token_ids") and fault != "no_token_ids" else None
        return logprobs, token_ids

    def usage(prompt: list[int], gens: list[list[int]]) -> dict[str, Any]:
        done = sum(len(g) for g in gens)
        return {
            "completion_tokens": done,
            "completion_tokens_details": None,
            "prompt_tokens": len(prompt),
            "prompt_tokens_details": None,
            "total_tokens": len(prompt) + done,
        }

    def samples(
        body: dict[str, Any], prompt: list[int], tools: Any, last_role: str, max_tokens: int
    ) -> list[tuple[list[int], str, list[dict[str, Any]], str]]:
        n = int(body.get("n") or 1)
        style = str(body.get("test_engine_style") or "")
        greedy = body.get("top_k") == 1  # as vLLM: only the likeliest id, every sample alike
        return [
            model.generate(
                prompt, tools, last_role, max_tokens, sample=0 if greedy else k, style=style
            )
            for k in range(n)
        ]

    async def chat(request: Request) -> Response:
        stats["chat"] += 1
        body = await request.json()
        early = await common(body)
        if early is not None:
            return early
        messages = body["messages"]
        tools = body.get("tools")
        prompt = model.render_chat(messages, tools)
        max_tokens = int(body.get("max_tokens") or 256)
        refusal = too_long(prompt, max_tokens)
        if refusal is not None:
            return refusal
        drawn = samples(body, prompt, tools, messages[-1]["role"], max_tokens)
        prompt_hash = hashlib.sha256(array("Q", prompt).tobytes()).hexdigest()
        if body.get("test_engine_tag"):
            generated[str(body["test_engine_tag"])] = prompt_hash
        choices = []
        for k, (gen, content, calls, finish) in enumerate(drawn):
            logprobs, token_ids = choice_tokens(body, gen, chat=True)
            message: dict[str, Any] = {
                "annotations": None,
                "audio": None,
                "content": content,
                "function_call": None,
                "reasoning": None,
                "refusal": None,
                "role": "assistant",
            }
            if calls:  # vLLM leaves the key out when there are none
                message["tool_calls"] = calls
            choices.append(
                {
                    "finish_reason": finish,
                    "index": k,
                    "logprobs": logprobs,
                    "message": message,
                    "routed_experts": None,
                    "stop_reason": None,
                    "token_ids": token_ids,
                }
            )
        fault = body.get("test_engine_fault")
        want_prompt = body.get("return_token_ids") and fault != "no_prompt_ids"
        answer = {
            "choices": choices,
            "created": CREATED,
            "ec_transfer_params": None,
            "id": "chatcmpl-" + prompt_hash[:16],
            "kv_transfer_params": None,
            "metrics": None,
            "model": body.get("model") or "tiny",
            "object": "chat.completion",
            "prompt_logprobs": None,
            "prompt_text": None,
            "prompt_token_ids": prompt if want_prompt else None,
            "service_tier": None,
            "system_fingerprint": FINGERPRINT,
            "usage": usage(prompt, [d[0] for d in drawn]),
        }
        if body.get("stream"):
            gens = [d[0] for d in drawn]
            stream = _chat_stream(answer, model, gens)
            return StreamingResponse(stream, media_type="text/event-stream")
        return JSONResponse(answer)

    def completion_prompt(raw: Any) -> list[int]:
        if isinstance(raw, list) and len(raw) == 1 and isinstance(raw[0], str | list):
            raw = raw[0]
        return model.encode(raw) if isinstance(raw, str) else [int(t) for t in raw]

    async def completions(request: Request) -> Response:
        stats["completions"] += 1
        body = await request.json()
        early = await common(body)
        if early is not None:
            return early
        prompt = completion_prompt(body["prompt"])
        max_tokens = int(body.get("max_tokens") or 16)
        refusal = too_long(prompt, max_tokens)
        if refusal is not None:
            return refusal
        drawn = samples(body, prompt, None, "user", max_tokens)
        fault = body.get("test_engine_fault")
        want_prompt = body.get("return_token_ids") and fault != "no_prompt_ids"
        choices = []
        for k, (gen, content, _calls, finish) in enumerate(drawn):
            logprobs, token_ids = choice_tokens(body, gen, chat=False)
            choices.append(
                {
                    "finish_reason": finish,
                    "index": k,
                    "logprobs": logprobs,
                    "prompt_logprobs": None,
                    "prompt_token_ids": prompt if want_prompt else None,
                    "routed_experts": None,
                    "stop_reason": None,
                    "text": content,
                    "token_ids": token_ids,
                }
            )
        answer = {
            "choices": choices,
            "created": CREATED,
            "ec_transfer_params": None,
            "id": "cmpl-" + hashlib.sha256(array("Q", prompt).tobytes()).hexdigest()[:16],
            "kv_transfer_params": None,
            "metrics": None,
            "model": body.get("model") or "tiny",
            "object": "text_completion",
            "service_tier": None,
            "system_fingerprint": FINGERPRINT,
            "usage": usage(prompt, [d[0] for d in drawn]),
        }
        return JSONResponse(answer)

    async def tokenize(request: Request) -> Response:
        stats["tokenize"] += 1
        body = await request.json()
        if "messages" in body:
            ids = model.render_chat(body["messages"], body.get("tools"))
            if not body.get("add_generation_prompt", True):
                ids = ids[:-1]
        else:
            ids = model.encode(body["prompt"])
        return JSONResponse(
            {
                "count": len(ids),
                "max_model_len": model.max_model_len,
                "token_strs": None,
                "tokens": ids,
            }
        )

    async def models_(_request: Request) -> Response:
        return JSONResponse(
            {"object": "list", "data": [{"id": "tiny", "object": "model", "created": CREATED}]}
        )

    async def health(_request: Request) -> Response:
        return Response(b"", 200)

    async def get_stats(_request: Request) -> Response:
        return JSONResponse(stats)

    async def get_generated(_request: Request) -> Response:
        return JSONResponse(generated)

    async def echo_headers(request: Request) -> Response:
        return JSONResponse(
            {k.decode("latin-1"): v.decode("latin-1") for k, v in request.headers.raw}
        )

    async def do_release(request: Request) -> Response:
        releases.setdefault(request.path_params["token"], asyncio.Event()).set()
        return JSONResponse({"released": True})

    return Starlette(
        routes=[
            Route("/v1/chat/completions", chat, methods=["POST"]),
            Route("/v1/completions", completions, methods=["POST"]),
            Route("/tokenize", tokenize, methods=["POST"]),
            Route("/v1/models", models_, methods=["GET"]),
            Route("/health", health, methods=["GET"]),
            Route("/test/stats", get_stats, methods=["GET"]),
            Route("/test/generated", get_generated, methods=["GET"]),
            Route("/test/release/{token}", do_release, methods=["POST"]),
            Route("/test/headers", echo_headers, methods=["GET"]),
        ]
    )


async def _chat_stream(answer: dict[str, Any], model: Model, gens: list[list[int]]) -> Any:
    """vLLM's chunks: the role (with the prompt ids), then one chunk per generated token (its
    text, log-prob and id; ``{}`` for a token with no text), the last one with the finish."""
    base = {k: answer[k] for k in ("created", "id", "model", "object")}
    base["object"] = "chat.completion.chunk"

    def chunk(obj: dict[str, Any]) -> bytes:
        return f"data: {json.dumps(obj)}\n\n".encode()

    for choice, ids in zip(answer["choices"], gens, strict=True):
        k = choice["index"]
        first = {"delta": {"content": "", "role": "assistant"}, "finish_reason": None, "index": k}
        first["logprobs"] = None
        head = {"prompt_text": None, "prompt_token_ids": answer["prompt_token_ids"]}
        yield chunk({**base, "choices": [first], **head})
        entries = (choice["logprobs"] or {}).get("content") or [None] * len(ids)
        for i, (t, lp) in enumerate(zip(ids, entries, strict=True)):
            text = model.decode([t])
            c: dict[str, Any] = {"delta": {"content": text} if text else {}, "index": k}
            c.update(finish_reason=None, logprobs={"content": [lp]} if lp else None)
            if choice["token_ids"] is not None:
                c["token_ids"] = [t]
            tail: dict[str, Any] = {}
            if i == len(ids) - 1:
                c.update(finish_reason=choice["finish_reason"], stop_reason=None)
                tail["system_fingerprint"] = answer["system_fingerprint"]
            yield chunk({**base, "choices": [c], **tail})
    yield b"data: [DONE]\n\n"


def main(argv: list[str] | None = None) -> int:
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--max-model-len", type=int, default=4096)
    args = parser.parse_args(argv)
    model = Model(args.tokenizer, args.max_model_len)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", args.port))
    sock.listen(1024)
    print(f"ENGINE_PORT {sock.getsockname()[1]}", flush=True)
    config = uvicorn.Config(build_app(model), log_level="warning", access_log=False)
    uvicorn.Server(config).run(sockets=[sock])
    return 0


if __name__ == "__main__":
    sys.exit(main())
